"""Programs that do not run: core files (and copies of live processes) as data.

* `elfcore` - parse an x86-64 or AArch64 ELF core (sans-IO): segments, threads, notes.
* `regs`    - a thread's registers as the proxy's ``g`` block (the CPU's, proxy/arch/core.py).
* `linkmap` - the file mappings of a core without NT_FILE (qemu-user's): program headers, r_debug.
* `image`   - `ProgramImage`: threads, registers, memory, auxv, regions.
* `load`    - open a core file from disk (mmap) into a `ProgramImage`.
* `stub`    - `CoreStub`: a read-only RSP stub serving an image (sans-IO).
* `program` - reflection over an image (analysis, bias, tokio adapter).
"""

from .elfcore import CoreError, parse_core
from .image import ProgramImage
from .load import open_core

__all__ = ["CoreError", "ProgramImage", "open_core", "parse_core"]
