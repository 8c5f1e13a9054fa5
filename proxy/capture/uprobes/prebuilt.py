"""The prebuilt BPF object this version of the package loads (written by build.py:
do not edit). bpf.py opens ``OBJECT_NAME`` next to this file and refuses it unless
its bytes hash to ``OBJECT_SHA256``."""

SOURCE_SHA256 = "3ae6c760ffa5ccb44eb7177c03de92fd5f5fc51878a5424943454a4d8d9dba31"  # uprobes.bpf.c
OBJECT_SHA256 = "fb1adf6ac6ab35179bd806382455ddbd7fcfca5bd9d9d816324b688cfdb442a9"
OBJECT_NAME = "uprobes-3ae6c760ffa5.bpf.o"
CLANG = "Debian clang version 14.0.6"  # the compiler that built it (the reproducibility test needs the same)
