"""The prebuilt BPF object this version of the package loads (written by build.py:
do not edit). bpf.py opens ``OBJECT_NAME`` next to this file and refuses it unless
its bytes hash to ``OBJECT_SHA256``."""

SOURCE_SHA256 = "26bf44d49c8216c0cc53084939605ddaf42a1328f113479aebcf351e17f40d5f"  # uprobes.bpf.c
OBJECT_SHA256 = "0ff43e2513aa445432cea9f75cf733edf710767b8757e32ae50319aeac816c0c"
OBJECT_NAME = "uprobes-26bf44d49c82.bpf.o"
CLANG = "Debian clang version 14.0.6"  # the compiler that built it (the reproducibility test needs the same)
