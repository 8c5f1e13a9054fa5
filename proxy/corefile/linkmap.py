"""The file mappings of a core that does not list them (no ``NT_FILE``), found the way
gdb's solib-svr4 finds a core's shared libraries.

A core from qemu-user (qemu-aarch64 7.2) has no ``NT_FILE`` and no bytes for the
executable mappings of files, so without this the program's code, and which library a
thread stopped in, would be unknown. What the core does hold is enough:

* the program: its path is ``AT_EXECFN`` (a string on the initial stack, which the core
  holds), its load bias ``AT_PHDR`` minus the address its ``PT_PHDR`` (or the ``PT_LOAD``
  holding its program headers) gives, else ``AT_ENTRY`` minus ``e_entry``;
* the shared objects: the program's ``DT_DEBUG`` entry (its ``.dynamic`` is writable: in
  the core) points to the dynamic linker's ``struct r_debug``, whose ``r_map`` heads the
  chain of ``struct link_map`` (``l_addr`` the load bias, ``l_name`` the path,
  ``l_next``); the program itself is the entry with an empty name;
* each file's ``PT_LOAD`` segments at its bias give what it maps: [start, end) from the
  page holding ``p_vaddr`` to the end of ``p_filesz``, from the page-aligned
  ``p_offset``, as the loader's ``mmap`` does.

Sans-IO: memory is read through ``memory(files)`` (the core's segments, then the files
found so far) and files opened with ``open_file(path) -> buffer | None``; a path that does not open (another host's
library) is left out, and its memory then reads as unavailable.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from proxy.analysis.elf import parse_auxv

from .elfcore import MappedFile

Buffer = bytes | memoryview
Read = Callable[[int, int], bytes]
AT_PHDR, AT_PAGESZ, AT_ENTRY, AT_EXECFN = 3, 6, 9, 31
PT_LOAD, PT_DYNAMIC, PT_PHDR = 1, 2, 6
DT_NULL, DT_DEBUG = 0, 21
MAX_OBJECTS = 512  # a link_map chain longer than this is taken as corrupt
MAX_PATH = 4096


class _Headers:
    """The program headers of an ELF file (64-bit little-endian): what is loaded where."""

    def __init__(self, data: Buffer) -> None:
        self.entry = 0
        self.phoff = 0
        self.loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
        self.dynamic: int | None = None
        self.phdr: int | None = None
        if len(data) < 64 or bytes(data[:4]) != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            return
        self.entry, self.phoff = struct.unpack_from("<QQ", data, 24)
        phentsize, phnum = struct.unpack_from("<HH", data, 54)
        if phentsize < 56 or self.phoff + phnum * phentsize > len(data):
            return
        for i in range(phnum):
            at = self.phoff + i * phentsize
            p_type, _flags, offset, vaddr, _paddr, filesz = struct.unpack_from("<IIQQQQ", data, at)
            if p_type == PT_LOAD:
                self.loads.append((vaddr, offset, filesz))
            elif p_type == PT_DYNAMIC:
                self.dynamic = vaddr
            elif p_type == PT_PHDR:
                self.phdr = vaddr

    def phdr_vaddr(self) -> int | None:
        if self.phdr is not None:
            return self.phdr
        return next((v + self.phoff - o for v, o, n in self.loads if o <= self.phoff < o + n), None)

    def mappings(self, bias: int, path: str, page: int) -> list[MappedFile]:
        out = []
        for vaddr, offset, filesz in self.loads:
            start = (bias + vaddr) & ~(page - 1)
            end = -(-(bias + vaddr + filesz) // page) * page
            if filesz:
                out.append(MappedFile(start, end, offset & ~(page - 1), path))
        return out


def _cstring(read: Read, addr: int) -> str | None:
    out = b""
    while len(out) < MAX_PATH:
        chunk = read(addr + len(out), 256)
        if not chunk:
            return None
        end = chunk.find(b"\0")
        if end >= 0:
            return (out + chunk[:end]).decode(errors="replace")
        out += chunk
    return None


def _word(read: Read, addr: int) -> int | None:
    data = read(addr, 8)
    return int.from_bytes(data, "little") if len(data) == 8 else None


def _r_debug(read: Read, dynamic: int) -> int | None:
    for i in range(0, 4096, 16):
        tag, val = _word(read, dynamic + i), _word(read, dynamic + i + 8)
        if tag is None or val is None or tag == DT_NULL:
            return None
        if tag == DT_DEBUG:
            return val or None
    return None


def mapped_files(auxv: bytes, memory: Callable[[list[MappedFile]], Read], open_file: Callable[[str], Buffer | None],
                 program: str | None = None) -> tuple[str | None, list[MappedFile]]:
    """(the program's path, the file mappings of it and of every shared object the
    dynamic linker lists); ``memory(files)`` reads the core's memory with ``files``
    mapped (the dynamic linker's own name is a string in the program's code: its
    PT_INTERP); ``program`` replaces the path ``AT_EXECFN`` names."""
    vec = parse_auxv(auxv)
    page = vec.get(AT_PAGESZ) or 4096
    read = memory([])
    path = program or (_cstring(read, vec[AT_EXECFN]) if vec.get(AT_EXECFN) else None)
    data = open_file(path) if path else None
    if path is None or data is None:
        return path, []
    main = _Headers(data)
    phdr = main.phdr_vaddr()
    if vec.get(AT_PHDR) and phdr is not None:
        bias = vec[AT_PHDR] - phdr
    elif vec.get(AT_ENTRY):
        bias = vec[AT_ENTRY] - main.entry
    else:
        return path, []
    out = main.mappings(bias, path, page)
    read = memory(out)
    at = _r_debug(read, bias + main.dynamic) if main.dynamic is not None else None
    lm = _word(read, at + 8) if at is not None else None  # r_debug.r_map (after the int r_version)
    seen: set[int] = set()
    while lm and lm not in seen and len(seen) < MAX_OBJECTS:
        seen.add(lm)
        l_addr, l_name, l_next = _word(read, lm), _word(read, lm + 8), _word(read, lm + 24)
        if l_addr is None or l_name is None:
            break
        name = _cstring(read, l_name) if l_name else ""
        lib = open_file(name) if name and name.startswith("/") else None
        if lib is not None:
            out += _Headers(lib).mappings(l_addr, name, page)
        lm = l_next
    return path, out
