"""The prebuilt BPF object this version of the package loads (written by build.py:
do not edit). bpf.py opens ``OBJECT_NAME`` next to this file and refuses it unless
its bytes hash to ``OBJECT_SHA256``."""

SOURCE_SHA256 = "8b40878e8a98a0fe4dc3ed1032f0f51f175bb333bb10978991278d09d29b9052"  # uprobes.bpf.c
OBJECT_SHA256 = "b086487039dd5a10fbb46edfd141e44d35e9779ead9fa72dd729550c066d3652"
OBJECT_NAME = "uprobes-8b40878e8a98.bpf.o"
CLANG = "Debian clang version 14.0.6"  # the compiler that built it (the reproducibility test needs the same)
