"""The prebuilt BPF object this version of the package loads (written by build.py:
do not edit). bpf.py opens ``OBJECT_NAME`` next to this file and refuses it unless
its bytes hash to ``OBJECT_SHA256``."""

SOURCE_SHA256 = "3b626841ebba9eab54738f54e0fb432bd066e39d40425920d2928ec3fc9763f3"  # uprobes.bpf.c
OBJECT_SHA256 = "20f7f825947d9c296cc19296348f6c87e95876470d2861a852bd152f31283744"
OBJECT_NAME = "uprobes-3b626841ebba.bpf.o"
CLANG = "Debian clang version 14.0.6"  # the compiler that built it (the reproducibility test needs the same)
