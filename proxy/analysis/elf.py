"""An ELF file opened safely: symbols (demangled), build-id, PIE, entry, bytes by address.

``open_elf`` reads the file's headers (struct; pyelftools reads DWARF and CFI
through ``stream()``): a file that is not an ELF or whose header is cut off
raises ``AnalysisError``; sections that run past the end of the file are
dropped with a warning (``ElfImage.warnings``), so a truncated binary still
gives what it has.

The file is neither read whole nor mapped: ``FileBytes`` reads the parts asked
for with ``pread`` (a debug build is 80 MB, of which the analysis keeps a
part). A mapping would let a file truncated in place while in use (``cp`` over
it; a running program's file cannot be: ETXTBSY) fault the proxy (SIGBUS,
which Python cannot catch); a read comes back short instead, and ``FileBytes``
turns that, or a changed size or modification time, into one ``AnalysisError``.
"""

from __future__ import annotations

import functools
import io
import operator
import os
import stat
import struct
import weakref
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from .demangle import demangle
from .errors import AnalysisError


AT_NULL = 0
AT_PHDR = 3
AT_ENTRY = 9


class Symbol(NamedTuple):
    """A symbol table entry. A tuple: a debug build has ~50,000, made with one
    ``tuple.__new__`` each (a frozen dataclass's ``__init__`` took 4x as long)."""

    name: str  # as in the symbol table (mangled)
    addr: int
    size: int
    is_func: bool

    @property
    def demangled(self) -> str:
        """Demangled (lazily: ~20 µs a symbol adds up over 50,000 symbols), or the name."""
        return _demangled(self.name)


@dataclass(frozen=True, slots=True)
class Segment:
    vaddr: int
    memsz: int
    offset: int
    filesz: int
    flags: int


@dataclass(slots=True)
class ElfImage:
    path: str
    data: bytes | FileBytes  # the file, read where asked (bytes for an empty or unseekable file)
    machine: str
    pie: bool
    entry: int
    build_id: str | None
    phoff: int
    segments: tuple[Segment, ...]
    sections: dict[str, tuple[int, int, int]]  # name -> (addr, offset, size), only those inside the file
    symbol_list: list[Symbol] | None  # sorted by address; None until ``symbols`` is asked for
    warnings: list[str] = field(default_factory=list)
    _addrs: list[int] = field(default_factory=list)
    _copies: dict[str, bytes] = field(default_factory=dict)  # debug_section
    _windows: dict[str, Window] = field(default_factory=dict)  # section_window
    # what readers derive from the file, kept once for every reader of this image (the
    # inventory, stack discovery and line lookups each keep a DwarfView): the aranges table
    derived: dict[str, Any] = field(default_factory=dict)
    # the symbol tables' entries (_symbol_entries) until ``symbols`` is made from them
    _entries: list[tuple[bytes, int, int, bool]] | None = None

    # -- sections and bytes --------------------------------------------------
    def section_data(self, name: str) -> bytes | None:
        s = self.sections.get(name)
        if s is None:
            return None
        self.check()
        return self.data[s[1] : s[1] + s[2]]

    def debug_section(self, name: str) -> bytes | None:
        """A DWARF section's bytes, copied once for every reader of this image (the
        inventory, stack discovery and line lookups each keep a ``DwarfView``: a debug
        build's .debug_info is 23 MB)."""
        got = self._copies.get(name)
        if got is None:
            got = self.section_data(name)
            if got is None:
                return None
            self._copies[name] = got
        else:
            self.check()
        return got

    def section_window(self, name: str) -> bytes | Window | None:
        """A section's bytes without copying them out of the file (``Window``: strings
        read where asked); a copy when the file was read whole."""
        s = self.sections.get(name)
        if s is None:
            return None
        if not isinstance(self.data, FileBytes):
            return self.data[s[1] : s[1] + s[2]]
        win = self._windows.get(name)
        if win is None:  # one per section and image: its recent blocks serve every reader
            win = self._windows[name] = Window(self.data, s[1], s[2])
        return win

    def check(self) -> None:
        """Raise ``AnalysisError`` when the file changed on disk since it was opened (a
        read past its new end raises it anyway: this catches a file rewritten in place)."""
        if isinstance(self.data, FileBytes):
            self.data.check()

    def stream(self) -> io.RawIOBase:
        """A file object over the image's bytes for pyelftools (no copy of the file)."""
        return _BufferStream(self.data)

    def has_section(self, name: str) -> bool:
        return name in self.sections

    def read(self, addr: int, size: int) -> bytes | None:
        """File-backed bytes at a link-time address (None where the file has none)."""
        self.check()
        for seg in self.segments:
            if seg.vaddr <= addr and addr + size <= seg.vaddr + seg.filesz:
                off = seg.offset + addr - seg.vaddr
                out = self.data[off : off + size]
                return out if len(out) == size else None
        return None

    @property
    def text_range(self) -> tuple[int, int] | None:
        s = self.sections.get(".text")
        return (s[0], s[0] + s[2]) if s else None

    # -- symbols ---------------------------------------------------------------
    @property
    def symbols(self) -> list[Symbol]:
        """Every symbol (``.symtab``, ``.dynsym``), sorted by address, made when first asked
        for: a cold analysis starts its unit walker first (``function_addresses``)."""
        if self.symbol_list is None:
            self.symbol_list = _symbols(self._entries or [])
            self._entries = None
        return self.symbol_list

    def function_addresses(self, test: Callable[[str], bool], parts: tuple[bytes, ...]) -> set[int]:
        """The addresses of the function symbols whose name passes ``test``, asked only of
        names holding one of ``parts`` (a name ``test`` accepts must hold one): without the
        symbol list when it is not made yet (a debug build's 50,000 symbols take ~0.1 s,
        after the unit walker has started)."""
        if self.symbol_list is not None:
            return {s.addr for s in self.symbol_list if s.is_func and test(s.name)}
        funcs = [e for e in self._entries or () if e[3]]
        # the names joined once, each part found with bytes.find (memchr speed), a hit
        # mapped back to its name: far fewer names than symbols hold a part
        blob = b"\0".join(e[0] for e in funcs) + b"\0"
        starts = [0]
        for e in funcs:
            starts.append(starts[-1] + len(e[0]) + 1)
        hits: set[int] = set()
        for part in parts:
            pos = blob.find(part)
            while pos >= 0:
                i = bisect_right(starts, pos) - 1
                hits.add(i)
                pos = blob.find(part, starts[i + 1])  # the next name on
        return {funcs[i][1] for i in hits if test(funcs[i][0].decode("utf-8", "replace"))}

    def symbol_at(self, addr: int) -> Symbol | None:
        """The function symbol that contains addr."""
        if not self._addrs:
            self._addrs = [s.addr for s in self.symbols]
        i = bisect_right(self._addrs, addr) - 1
        for j in range(i, max(i - 16, -1), -1):
            s = self.symbols[j]
            if s.is_func and s.addr <= addr < s.addr + max(s.size, 1):
                return s
        return None

    def has_rust_symbols(self) -> bool:
        """A Rust-mangled symbol (legacy `_ZN...17h<hash>E` or v0 `_R`): the
        program has Rust code. (C++ shares `_ZN`: it answers yes too.)"""
        return any(s.name.startswith(("_ZN", "_R")) for s in self.symbols)

    def symbols_named(self, name: str) -> list[Symbol]:
        return [s for s in self.symbols if s.name == name or s.name.split("@", 1)[0] == name]


# The images this process parsed, by file identity: one session asks for the
# program's image several times (probes, capture, source lines, identity), and
# pyelftools builds its structures anew for each ELFFile (~50 ms each).
_IMAGES: dict[tuple[str, int, int, int, int], ElfImage] = {}
_IMAGES_KEPT = 4


def open_elf(path: str | Path) -> ElfImage:
    """The parsed image of `path` (the same object again while the file is unchanged)."""
    try:
        st = os.stat(path)
        key: tuple[str, int, int, int, int] | None = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    if _IMAGES_KEPT and key is not None and key in _IMAGES:
        return _IMAGES[key]
    image = _open_elf(path)
    if key is not None and _IMAGES_KEPT:
        if len(_IMAGES) >= _IMAGES_KEPT:
            _IMAGES.pop(next(iter(_IMAGES)))
        _IMAGES[key] = image
    return image


def _open_elf(path: str | Path) -> ElfImage:
    p = Path(path)
    data: bytes | FileBytes
    try:
        with p.open("rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size and stat.S_ISREG(st.st_mode):
                data = FileBytes(os.dup(f.fileno()), str(p), st)
            else:  # empty, or not a regular file
                data = f.read()
    except OSError as e:
        raise AnalysisError(f"{p}: cannot read: {e.strerror or e}") from e
    if data[:4] != b"\x7fELF":
        raise AnalysisError(f"{p}: not an ELF file")
    try:
        return _parse(str(p), data)
    except AnalysisError:
        raise
    except (struct.error, ValueError, IndexError, KeyError) as e:
        raise AnalysisError(f"{p}: unreadable ELF ({type(e).__name__}: {e}); the file may be truncated") from e
    except (OverflowError, MemoryError, UnicodeError) as e:
        # a corrupt header or section table (a bit-flipped binary; the garbage
        # tests in tests/proxy/analysis/test_garbage_binaries.py)
        raise AnalysisError(f"{p}: corrupt ELF ({type(e).__name__}: {str(e)[:120]})") from e


# The headers are read with struct, not pyelftools: every session opens the
# program's file (probes, identity, the has-Rust check), and importing
# pyelftools alone cost ~70 ms of each proxy start (GDB's own testsuite starts
# 93). pyelftools stays the reader of DWARF, CFI and relocations
# (inventory.py, dwarf.py, unwind.py), which only Rust programs need;
# tests/proxy/analysis/test_elf.py checks this reader against it.
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_PT_LOAD, _SHT_NOTE, _SHT_NOBITS, _ET_DYN = 1, 7, 8, 3
_NT_GNU_BUILD_ID = 3
_SHN_XINDEX, _PN_XNUM = 0xFFFF, 0xFFFF
_MACHINES = {3: "EM_386", 40: "EM_ARM", 62: "EM_X86_64", 183: "EM_AARCH64", 243: "EM_RISCV"}


@dataclass(frozen=True, slots=True)
class _Section:
    name: str
    type: int
    addr: int
    offset: int
    size: int
    link: int
    align: int


def _parse(path: str, data: bytes | FileBytes) -> ElfImage:
    if len(data) < _EHDR.size:
        raise AnalysisError(f"{path}: unreadable ELF (the header is cut off); the file may be truncated")
    (ident, e_type, e_machine, _version, entry, phoff, shoff, _flags, _ehsize, phentsize, phnum,
     shentsize, shnum, shstrndx) = _EHDR.unpack_from(data[:_EHDR.size], 0)
    if ident[4] != 2 or ident[5] != 1:
        raise AnalysisError(f"{path}: only 64-bit little-endian ELF is supported")
    warnings: list[str] = []
    raw = _section_headers(path, data, shoff, shnum, shentsize)
    if raw:  # the extended numbers live in section 0 (ELF gABI)
        if shstrndx == _SHN_XINDEX:
            shstrndx = raw[0][6]
        if phnum == _PN_XNUM:
            phnum = raw[0][7]
    segments = []
    if phnum:
        if phentsize < _PHDR.size or phoff + phnum * phentsize > len(data):
            raise AnalysisError(f"{path}: unreadable ELF (program headers past the end of the file); "
                                "the file may be truncated")
        phdrs = bytes(data[phoff : phoff + phnum * phentsize])  # one read
        for i in range(phnum):
            p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, _align = \
                _PHDR.unpack_from(phdrs, i * phentsize)
            if p_type == _PT_LOAD:
                if p_offset + p_filesz > len(data):
                    warnings.append(f"a PT_LOAD segment at {p_vaddr:#x} runs past the end of the file (truncated?)")
                segments.append(Segment(p_vaddr, p_memsz, p_offset, p_filesz, p_flags))
    names = b""
    if raw:
        if shstrndx >= len(raw):
            raise AnalysisError(f"{path}: unreadable ELF (no section name table {shstrndx}); "
                                "the file may be truncated")
        _n, _t, _f, _a, str_off, str_size, *_ = raw[shstrndx]
        names = bytes(data[str_off : str_off + str_size])
    table = []
    for sh_name, sh_type, _sh_flags, sh_addr, sh_offset, sh_size, sh_link, _info, sh_align, _entsize in raw:
        end = names.find(b"\0", sh_name)
        name = names[sh_name : end if end >= 0 else len(names)].decode("utf-8", "replace") if sh_name < len(names) else ""
        table.append(_Section(name, sh_type, sh_addr, sh_offset, sh_size, sh_link, sh_align))
    sections: dict[str, tuple[int, int, int]] = {}
    for sec in table:
        if sec.type == _SHT_NOBITS or not sec.name:
            continue
        if sec.offset + sec.size > len(data):
            warnings.append(f"section {sec.name} runs past the end of the file (truncated?): ignored")
            continue
        sections[sec.name] = (sec.addr, sec.offset, sec.size)  # the last of a name, as pyelftools
    image = ElfImage(
        path=path,
        data=data,
        machine=_MACHINES.get(e_machine, f"EM_{e_machine}"),
        pie=e_type == _ET_DYN,
        entry=entry,
        build_id=_build_id(data, table, sections),
        phoff=phoff,
        segments=tuple(segments),
        sections=sections,
        symbol_list=None,
        warnings=warnings,
    )
    image._entries = _symbol_entries(data, table, sections, warnings)
    if image.machine not in ("EM_X86_64", "EM_AARCH64"):  # exits_aarch64.py, unwind.py's AARCH64_CFI
        warnings.append(f"machine {image.machine}: only x86-64 code is disassembled and unwound")
    return image


def _section_headers(path: str, data: bytes | FileBytes, shoff: int, shnum: int, shentsize: int) -> list[tuple]:
    if shoff == 0:
        return []
    if shentsize < _SHDR.size or shoff + _SHDR.size > len(data):
        raise AnalysisError(f"{path}: unreadable ELF (section headers past the end of the file); "
                            "the file may be truncated")
    if shnum == 0:  # more than 0xff00 sections: the count is section 0's size
        shnum = _SHDR.unpack_from(data[shoff : shoff + _SHDR.size], 0)[5]
    if shoff + shnum * shentsize > len(data):
        raise AnalysisError(f"{path}: unreadable ELF (section headers past the end of the file); "
                            "the file may be truncated")
    shdrs = bytes(data[shoff : shoff + shnum * shentsize])  # one read
    return [_SHDR.unpack_from(shdrs, i * shentsize) for i in range(shnum)]


def _build_id(data: bytes | FileBytes, table: list[_Section], sections: dict[str, tuple[int, int, int]]) -> str | None:
    """The GNU build-id note's bytes in hex (readelf -n's "Build ID")."""
    for sec in table:
        if sec.type != _SHT_NOTE or sec.name not in sections:
            continue
        found = note_build_id(bytes(data[sec.offset : sec.offset + sec.size]), 8 if sec.align == 8 else 4)
        if found is not None:
            return found.hex()
    return None


class NoteOverrun(ValueError):
    """An ELF note that runs past the end of its section or segment."""

    def __init__(self, kind: int) -> None:
        super().__init__(f"note {kind:#x} runs past its section")
        self.kind = kind


def iter_notes(data: bytes, align: int = 4) -> Iterator[tuple[bytes, int, bytes]]:
    """(owner, type, descriptor) of each note in an ELF note section or PT_NOTE segment
    (the owner without its NULs; fields padded to 4 bytes, or 8 in an 8-aligned note
    section); ``NoteOverrun`` at a note that runs past the end. The one reader of notes:
    build-ids of files (here, ``proxy.host.identity``) and a core's notes (``proxy.corefile``)."""
    pad = align - 1
    pos = 0
    while pos + 12 <= len(data):
        namesz, descsz, kind = struct.unpack_from("<III", data, pos)
        name_at = pos + 12
        desc_at = (name_at + namesz + pad) & ~pad
        if desc_at + descsz > len(data):
            raise NoteOverrun(kind)
        yield data[name_at : name_at + namesz].rstrip(b"\0"), kind, data[desc_at : desc_at + descsz]
        pos = (desc_at + descsz + pad) & ~pad


def note_build_id(data: bytes, align: int = 4) -> bytes | None:
    """The GNU build-id (NT_GNU_BUILD_ID of owner "GNU") among these notes, or None
    (also when a note before it runs past the end: the notes are corrupt)."""
    try:
        for owner, kind, desc in iter_notes(data, align):
            if kind == _NT_GNU_BUILD_ID and owner == b"GNU":
                return desc
    except NoteOverrun:
        pass
    return None


_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_SYM_TYPES = {0, 1, 2, 10}  # NOTYPE, OBJECT, FUNC, GNU_IFUNC


def _symbol_entries(data: bytes | FileBytes, table: list[_Section], sections: dict[str, tuple[int, int, int]],
                    warnings: list[str]) -> list[tuple[bytes, int, int, bool]]:
    """.symtab's and .dynsym's entries with a name and an address, in file order: (name,
    address, size, is a function), decoded with struct (pyelftools takes ~50 µs a symbol)."""
    out: list[tuple[bytes, int, int, bool]] = []
    by_name = {sec.name: sec for sec in table}  # the last of a name, as pyelftools
    for secname in (".symtab", ".dynsym"):
        sec = by_name.get(secname)
        if sec is None or secname not in sections or sec.link >= len(table):
            continue
        strsec = table[sec.link]
        strtab = bytes(data[strsec.offset : strsec.offset + strsec.size])
        _, off, size = sections[secname]
        raw = bytes(data[off : off + size - size % 24])
        find = strtab.find
        for st_name, st_info, _other, shndx, value, st_size in struct.iter_unpack("<IBBHQQ", raw):
            st_type = st_info & 0xF
            if st_type not in _SYM_TYPES or shndx == 0 or value == 0 or st_name == 0:
                continue
            end = find(b"\0", st_name)
            if end < 0:
                warnings.append(f"{secname}: a symbol name runs past its string table")
                continue
            if end > st_name:
                out.append((strtab[st_name:end], value, st_size, st_type == _STT_FUNC or st_type == _STT_GNU_IFUNC))
    return out


def _symbols(entries: list[tuple[bytes, int, int, bool]]) -> list[Symbol]:
    """The symbols of ``_symbol_entries``: one per name and address (the first), sorted."""
    seen: dict[tuple[str, int], Symbol] = {}
    new = tuple.__new__
    for raw, value, size, is_func in entries:
        name = raw.decode("utf-8", "replace")
        key = (name, value)
        if key not in seen:
            seen[key] = new(Symbol, (name, value, size, is_func))
    # by address, the larger first at one address: two stable sorts by one attribute each
    # (a key tuple per symbol took ~30 ms of a debug build's 50,000)
    out = sorted(seen.values(), key=_SIZE, reverse=True)
    out.sort(key=_ADDR)
    return out


_SIZE, _ADDR = operator.itemgetter(2), operator.itemgetter(1)  # Symbol.size, Symbol.addr


class FileBytes:
    """A file's bytes, read with ``pread`` where asked (``len``, slices, ``find``): what the
    ELF and DWARF readers need of ``bytes`` without holding the file in memory or mapping
    it. A short read (the file truncated meanwhile) or a changed size or modification time
    (``check``) raises one ``AnalysisError``."""

    __slots__ = ("fd", "path", "_size", "_mtime", "_ino", "__weakref__")

    def __init__(self, fd: int, path: str, st: os.stat_result) -> None:
        self.fd, self.path = fd, path
        self._size, self._mtime, self._ino = st.st_size, st.st_mtime_ns, st.st_ino
        weakref.finalize(self, os.close, fd)

    def __len__(self) -> int:
        return self._size

    def identity(self) -> tuple[int, int, int]:
        return self._ino, self._size, self._mtime

    def check(self) -> None:
        try:
            st = os.fstat(self.fd)
        except OSError as e:
            raise AnalysisError(f"{self.path}: unreadable: {e.strerror or e}") from e
        if (st.st_ino, st.st_size, st.st_mtime_ns) != (self._ino, self._size, self._mtime):
            raise self._changed()

    def _changed(self) -> AnalysisError:
        return AnalysisError(f"{self.path}: the file changed on disk while in use (truncated or rewritten"
                             " in place); open it again")

    def read(self, off: int, n: int) -> bytes:
        """``n`` bytes at ``off`` (fewer only past the end as opened)."""
        n = max(0, min(n, self._size - off))
        if n == 0 or off < 0:
            return b""
        try:
            out = os.pread(self.fd, n, off)
            while len(out) < n:  # a huge read may come back in parts
                more = os.pread(self.fd, n - len(out), off + len(out))
                if not more:
                    raise self._changed()
                out += more
        except OSError as e:
            raise AnalysisError(f"{self.path}: unreadable: {e.strerror or e}") from e
        return out

    def __getitem__(self, k: int | slice) -> Any:
        if isinstance(k, int):
            if k < 0:
                k += self._size
            if not 0 <= k < self._size:
                raise IndexError(k)
            return self.read(k, 1)[0]
        start, stop, step = k.indices(self._size)
        if step != 1:
            raise ValueError("FileBytes: slices with a step are not supported")
        return self.read(start, stop - start)

    def find(self, sub: bytes, start: int = 0, end: int | None = None, chunk: int = 256) -> int:
        """Like ``bytes.find``, reading ``chunk`` bytes at a time (doubling): a DWARF string
        is read with one or two reads."""
        end = self._size if end is None else min(end, self._size)
        pos = max(start, 0)
        keep = len(sub) - 1
        while pos < end:
            got = self.read(pos, min(chunk, end - pos))
            i = got.find(sub)
            if i >= 0:
                return pos + i
            if len(got) <= keep:
                return -1
            pos += len(got) - keep
            chunk = min(chunk * 2, 1 << 20)
        return -1

    def cstring(self, off: int, end: int) -> bytes | None:
        """The NUL-terminated bytes at ``off`` (without the NUL), searching no further than
        ``end``: one read for a short string; None when unterminated."""
        n = 256
        while True:
            got = self.read(off, min(n, end - off))
            i = got.find(b"\0")
            if i >= 0:
                return got[:i]
            if off + len(got) >= end or not got:
                return None
            n *= 4


class Window:
    """A section of the file, addressed from the section's start: what the DWARF
    string readers need of ``bytes`` (``find``, slices, ``cstring``), without the copy.
    Reads go through the 256 most recently read 8 KB blocks (a unit's names lie close
    together; one ``pread`` a name cost ~2-15 µs, more on a loaded machine). The axum debug
    build's analysis: 7,700 reads, 60 MB; with 32 blocks of 64 KB it was 18,600 reads and
    1.2 GB copied (a block read for a name or two, then evicted)."""

    __slots__ = ("_buf", "_base", "_size", "_blocks")

    def __init__(self, buf: FileBytes, base: int, size: int) -> None:
        self._buf, self._base, self._size = buf, base, size
        self._blocks: dict[int, bytes] = {}  # block number -> bytes, oldest first

    def __len__(self) -> int:
        return self._size

    def _block(self, k: int) -> bytes:
        got = self._blocks.pop(k, None)
        if got is None:
            start = k << _BLOCK_BITS
            got = self._buf.read(self._base + start, min(_BLOCK, self._size - start))
            if len(self._blocks) >= _BLOCKS_KEPT:
                try:  # the oldest (another thread may be evicting too: either way is fine)
                    del self._blocks[next(iter(self._blocks))]
                except (KeyError, RuntimeError, StopIteration):
                    pass
        self._blocks[k] = got  # the most recent last
        return got

    def find(self, sub: bytes, start: int = 0) -> int:
        if start < 0 or start >= self._size:
            return -1
        i = self._buf.find(sub, self._base + start, self._base + self._size)
        return i - self._base if i >= 0 else -1

    def cstring(self, off: int) -> bytes | None:
        if off < 0 or off >= self._size:
            return None
        blk = self._block(off >> _BLOCK_BITS)
        at = off & (_BLOCK - 1)
        end = blk.find(b"\0", at)
        if end >= 0:
            return blk[at:end]
        return self._buf.cstring(self._base + off, self._base + self._size)  # across blocks

    def __getitem__(self, k: slice) -> bytes:
        start = 0 if k.start is None else k.start
        stop = self._size if k.stop is None else min(k.stop, self._size)
        if 0 <= start < stop and (start >> _BLOCK_BITS) == ((stop - 1) >> _BLOCK_BITS):
            at = start & (_BLOCK - 1)
            return self._block(start >> _BLOCK_BITS)[at:at + stop - start]
        return self._buf.read(self._base + start, max(start, stop) - start)


_BLOCK_BITS = 13
_BLOCK = 1 << _BLOCK_BITS
_BLOCKS_KEPT = 256  # 2 MB


class _BufferStream(io.RawIOBase):
    """A read-only, seekable file object over a bytes-like buffer (``FileBytes`` or bytes),
    each with its own position: pyelftools reads ELF structures through it."""

    def __init__(self, buffer: bytes | FileBytes) -> None:
        super().__init__()
        self.buffer = buffer
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = 0 if whence == io.SEEK_SET else self._pos if whence == io.SEEK_CUR else len(self.buffer)
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        end = len(self.buffer) if size is None or size < 0 else self._pos + size
        out = self.buffer[self._pos : end]
        self._pos += len(out)
        return bytes(out)

    def readinto(self, b: Any) -> int:
        out = self.read(len(b))
        b[: len(out)] = out
        return len(out)


@functools.lru_cache(maxsize=65536)
def _demangled(name: str) -> str:
    return demangle(name) or name


# -- load bias ---------------------------------------------------------------------


def load_bias(elf: ElfImage, runtime_entry: int) -> int:
    """The PIE load bias from the entry point seen at run time (0 for non-PIE)."""
    return runtime_entry - elf.entry


def parse_auxv(blob: bytes) -> dict[int, int]:
    """An ``/proc/PID/auxv`` (or ``qXfer:auxv:read``) blob of 64-bit pairs."""
    out: dict[int, int] = {}
    for i in range(0, len(blob) - 15, 16):
        key, val = struct.unpack_from("<QQ", blob, i)
        if key == AT_NULL:
            break
        out[key] = val
    return out


def load_bias_from_auxv(elf: ElfImage, auxv: bytes) -> int:
    """The load bias from an auxv blob: AT_ENTRY, else AT_PHDR."""
    vec = parse_auxv(auxv)
    if AT_ENTRY in vec:
        return load_bias(elf, vec[AT_ENTRY])
    if AT_PHDR in vec:
        phdr_vaddr = _phdr_vaddr(elf)
        if phdr_vaddr is not None:
            return vec[AT_PHDR] - phdr_vaddr
    raise AnalysisError("auxv has neither AT_ENTRY nor AT_PHDR")


def _phdr_vaddr(elf: ElfImage) -> int | None:
    for seg in elf.segments:
        if seg.offset <= elf.phoff < seg.offset + seg.filesz:
            return seg.vaddr + elf.phoff - seg.offset
    return None
