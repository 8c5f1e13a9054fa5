"""Lazy access to a binary's DWARF: which unit holds an address, one unit's DIEs, file names, ranges.

Theory of operation: nothing is read until asked. ``unit_at(addr)`` uses
``.debug_aranges`` (pyelftools); ``unit(offset)`` reads one unit with the fast
reader of ``dies.py`` and keeps it; ``die(offset)`` finds the unit that holds
any section offset (a ``DW_FORM_ref_addr`` may point into another unit, as in
LTO builds) and loads it. File tables come from the unit's line program
header (pyelftools), range lists are decoded here (``.debug_ranges`` of
DWARF 4, ``.debug_rnglists`` of DWARF 5).
"""

from __future__ import annotations

import os
import struct
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterator
from typing import Any

from typing import TYPE_CHECKING

from . import dies as D
from .elf import ElfImage

if TYPE_CHECKING:
    from elftools.dwarf.dwarfinfo import DWARFInfo

# pyelftools is imported where it is used (line programs of DWARF 5, file tables it alone
# reads): a cold analysis imports it after its unit walker has started (~30 ms)


def _pyelf_errors() -> tuple[type[Exception], ...]:
    from elftools.common.exceptions import DWARFError, ELFError, ELFParseError

    return (DWARFError, ELFError, ELFParseError, struct.error, ValueError, IndexError, KeyError, AttributeError)


class DwarfView:
    def __init__(self, elf: ElfImage, warnings: list[str], keep_tags: frozenset[int] | None = None) -> None:
        self.elf = elf
        self.warnings = warnings
        self.keep_tags = KEEP_TAGS if keep_tags is None else keep_tags
        sections = _Sections(elf)
        self.reader = D.DieReader(sections)
        self.sections = sections
        self.unit_offsets = self.reader.iter_unit_offsets()
        self._units: dict[int, D.Unit] = {}
        self._files: dict[int, list[str]] = {}
        self._pyelf: DWARFInfo | None = None
        self._aranges: Any = None
        self._aranges_tried = False
        self._prefetch: Any = None  # unitwalk.Prefetch while a second process walks units
        self._held: dict[int, str] = {}  # a unit walked ahead of the scan -> its error

    @staticmethod
    def open(elf: ElfImage, warnings: list[str], keep_tags: frozenset[int] | None = None) -> DwarfView | None:
        if not elf.has_section(".debug_info") or not elf.has_section(".debug_abbrev"):
            return None
        try:
            return DwarfView(elf, warnings, keep_tags)
        except D.DwarfFormatError as e:
            warnings.append(f"DWARF unreadable: {e}")
            return None

    # -- pyelftools for line programs and aranges ------------------------------------
    def pyelf(self) -> DWARFInfo:
        """pyelftools' DWARF reader (line programs), over the file's sections where they
        lie: ``ELFFile.get_dwarf_info`` would copy every debug section first (~80 MB for
        an 80 MB debug build, for a few line programs)."""
        if self._pyelf is None:
            self._pyelf = self._pyelf_in_place()
            if self._pyelf is None:
                from elftools.elf.elffile import ELFFile

                self._pyelf = ELFFile(self.elf.stream()).get_dwarf_info(relocate_dwarf_sections=False)
        return self._pyelf

    def _pyelf_in_place(self) -> DWARFInfo | None:
        from elftools.dwarf.dwarfinfo import DebugSectionDescriptor, DWARFInfo, DwarfConfig

        from .elf import _BufferStream

        def sec(name: str) -> Any:
            s = self.elf.sections.get(name)
            data = self.elf.section_window(name) if s is not None else None
            if s is None or data is None:
                return None
            return DebugSectionDescriptor(stream=_BufferStream(data), name=name, global_offset=s[1], size=s[2],
                                          address=s[0])

        names = ("info", "aranges", "abbrev", "frame", None, "str", "loc", "ranges", "line", "pubtypes",
                 "pubnames", "addr", "str_offsets", "line_str", "loclists", "rnglists", "sup", None, "types")
        try:
            return DWARFInfo(DwarfConfig(little_endian=True, machine_arch="x64", default_address_size=8),
                             *(sec(f".debug_{n}") if n else None for n in names))
        except (TypeError, *_pyelf_errors()):  # another pyelftools: its own way
            return None

    def has_aranges(self) -> bool:
        return self._get_aranges() is not None

    def _get_aranges(self) -> Any:
        if not self._aranges_tried:
            self._aranges_tried = True
            # parsed once per image (~0.1 s for a debug build's ~80,000 ranges), its
            # error said by every view that asks
            got = self.elf.derived.get("aranges")
            if got is None:
                got = (None, None)
                data = self.sections.get(".debug_aranges")
                if data:
                    try:
                        got = (_parse_aranges(data), None)
                    except (struct.error, IndexError, ValueError) as e:
                        got = (None, f".debug_aranges unreadable ({e}): reading every unit")
                self.elf.derived["aranges"] = got
            self._aranges, error = got
            if error:
                self.warnings.append(error)
        return self._aranges

    def unit_offset_at(self, addr: int) -> int | None:
        ar = self._get_aranges()
        if ar is None:
            return self._unit_offset_at_slow(addr)
        starts, highs, offs = ar
        i = bisect_right(starts, addr) - 1
        if i >= 0 and addr < highs[i]:
            return int(offs[i])
        return None

    def _unit_offset_at_slow(self, addr: int) -> int | None:
        for off in self.unit_offsets:
            u = self.unit(off)
            if u is not None and any(lo <= addr < hi for lo, hi in self.die_ranges(u, u.top_die)):
                return off
        return None

    # -- units and DIEs --------------------------------------------------------------
    def prefetch(self, offsets: list[int], sieve: Callable[[], tuple[Any, Any]] | None = None) -> None:
        """Have a second process walk these units, in this order, while this one scans
        the ones already walked (``proxy.analysis.unitwalk``); ``end_prefetch`` stops it.
        ``sieve``: it sieves them too, with the symbol tables this makes once the second
        process has started (``Dies.picked``; ``unitwalk.Prefetch.start``)."""
        from .elf import FileBytes
        from .unitwalk import Prefetch

        self.end_prefetch()
        if isinstance(self.elf.data, FileBytes):
            todo = [o for o in offsets if o not in self._units and self._handed(o, take=False) is None]
            self._prefetch = Prefetch.start(self.elf.data.fd, self.elf.sections, self.reader, todo,
                                            self.keep_tags, self._walk_ahead, sieve)

    def end_prefetch(self) -> None:
        if self._prefetch is not None:
            self._prefetch.close()
            self._prefetch = None

    # -- walks handed from one view to the next ------------------------------------------
    def hand_over(self) -> None:
        """Leave this view's units' walks (``Dies``' four arrays) to the next view of the
        same image that keeps the same tags (``ElfImage.derived``): it takes a unit's walk
        instead of walking it again (the first stack discovery after a cold inventory: ~25
        of the inventory's units, ~0.5 s of walking on the axum debug build). Until
        ``drop_handed``, the arrays stay (16 bytes a kept DIE)."""
        walks = {off: u.dies.walk_arrays() for off, u in self._units.items() if isinstance(u.dies, D.Dies)}
        self.elf.derived["walks"] = (self.keep_tags, walks)

    def drop_handed(self) -> None:
        """Let the walks handed over (``hand_over``) and not taken go."""
        self.elf.derived.pop("walks", None)

    def _handed(self, offset: int, take: bool = True) -> tuple[Any, ...] | None:
        got = self.elf.derived.get("walks")
        if got is None or got[0] != self.keep_tags:
            return None
        arrays = got[1].pop(offset, None) if take else got[1].get(offset)
        return (*arrays, None) if arrays is not None else None

    def unit(self, offset: int) -> D.Unit | None:
        u = self._units.get(offset)
        if u is None:
            walked = self._handed(offset)
            if walked is None and self._prefetch is not None:
                walked = self._prefetch.take(offset)
            u = self._units.get(offset)  # walked here meanwhile (Prefetch.take)
            if u is None:
                u = self._read(offset, walked)
        if self._held and offset in self._held:  # its error, said in the order units are asked for
            self.warnings.append(self._held.pop(offset))
        return u if u.top >= 0 else None

    def _walk_ahead(self, offset: int) -> None:
        """Walk a unit the scan will ask for later (``Prefetch``): its error waits till then."""
        if offset not in self._units:
            n = len(self.warnings)
            self._read(offset, None)
            if len(self.warnings) > n:
                self._held[offset] = self.warnings.pop()

    def _read(self, offset: int, walked: tuple[Any, ...] | None) -> D.Unit:
        try:
            if walked is not None:
                u = self.reader.unit_from_walk(offset, self.keep_tags, walked[:4])
                if walked[4] is not None and isinstance(u.dies, D.Dies):
                    u.dies.picked = walked[4].tolist()
            else:
                u = self.reader.read_unit(offset, self.keep_tags)
        except D.DwarfFormatError as e:
            self.warnings.append(str(e))
            u = D.Unit(offset, 0, 8, {}, -1, offset)
        self._units[offset] = u
        return u

    def trim(self) -> None:
        """Bound the memory of a long scan: decoded DIEs are dropped (the units' compact
        arrays stay)."""
        for u in self._units.values():
            if isinstance(u.dies, D.Dies):
                u.dies.forget()

    def containing_unit_offset(self, offset: int) -> int | None:
        i = bisect_right(self.unit_offsets, offset) - 1
        return self.unit_offsets[i] if i >= 0 else None

    def die(self, offset: int | None) -> D.Die | None:
        if offset is None:
            return None
        uo = self.containing_unit_offset(offset)
        if uo is None:
            return None
        u = self.unit(uo)
        return u.dies.get(offset) if u is not None else None

    def origin(self, die: D.Die, limit: int = 8) -> D.Die:
        """The DIE that holds a declaration's names and types: follow
        DW_AT_abstract_origin / DW_AT_specification (inlined copies,
        concrete instances, out-of-line definitions), at most `limit` hops."""
        for _ in range(limit):
            ref = die.get(D.AT_ABSTRACT_ORIGIN, die.get(D.AT_SPECIFICATION))
            nxt = self.die(ref) if ref is not None else None
            if nxt is None:
                break
            die = nxt
        return die

    def origin_name(self, ref: int) -> str:
        """The name of ``origin(die(ref))``, read with ``Dies.peek``: no DIE on the way is
        decoded when their attributes lie at fixed places."""
        name = None
        for _ in range(8):
            uo = self.containing_unit_offset(ref)
            u = self.unit(uo) if uo is not None else None
            dies = u.dies if u is not None else None
            if not isinstance(dies, D.Dies):
                die = dies.get(ref) if dies is not None else None
                return (self.origin(die).get(D.AT_NAME) or "") if die is not None else (name or "")
            i = dies.index(ref)
            if i < 0:
                break
            name = dies.peek(i, D.AT_NAME)
            nxt = dies.peek(i, D.AT_ABSTRACT_ORIGIN)
            if nxt is None:
                nxt = dies.peek(i, D.AT_SPECIFICATION)
            if nxt is None:
                break
            ref = nxt
        return name or ""

    def unit_of(self, die: D.Die) -> D.Unit | None:
        uo = self.containing_unit_offset(die.offset)
        return self.unit(uo) if uo is not None else None

    # -- file names --------------------------------------------------------------------
    def file_name(self, unit: D.Unit, index: int | None) -> str | None:
        if index is None:
            return None
        files = self._files.get(unit.offset)
        if files is None:
            files = self._files[unit.offset] = self._read_files(unit)
        i = index if unit.version >= 5 else index - 1
        return files[i] if 0 <= i < len(files) else None

    def _read_files(self, unit: D.Unit) -> list[str]:
        top = unit.top_die
        if D.AT_STMT_LIST not in top.attrs:
            return []
        try:
            files = _v4_line_files(self.sections.get(".debug_line", b""), top.attrs[D.AT_STMT_LIST],
                                   top.get(D.AT_COMP_DIR) or "")
        except (IndexError, struct.error, ValueError) as e:
            self.warnings.append(f"line table of unit {unit.offset:#x} unreadable: {e}")
            return []
        if files is not None:
            return files
        try:
            cu = self.pyelf().get_CU_at(unit.offset)
            lp = self.pyelf().line_program_for_CU(cu)
        except _pyelf_errors() as e:
            self.warnings.append(f"line table of unit {unit.offset:#x} unreadable: {e}")
            return []
        if lp is None:
            return []
        return line_program_files(lp, top.get(D.AT_COMP_DIR) or "")

    # -- ranges ------------------------------------------------------------------------
    def die_ranges(self, unit: D.Unit, die: D.Die) -> list[tuple[int, int]]:
        low = die.get(D.AT_LOW_PC)
        if low is not None and (D.AT_HIGH_PC in die.attrs or D.AT_HIGH_PC_OFFSET in die.attrs):
            high = die.get(D.AT_HIGH_PC)
            if high is None:
                high = low + die.attrs[D.AT_HIGH_PC_OFFSET]
            return [(low, high)] if low else []
        if D.AT_RANGES in die.attrs or D.AT_RANGES_INDEX in die.attrs:
            try:
                return [(lo, hi) for lo, hi in self._ranges(unit, die) if lo and hi > lo]
            except (IndexError, struct.error) as e:
                self.warnings.append(f"range list of DIE {die.offset:#x} unreadable: {e}")
        return []

    def _ranges(self, unit: D.Unit, die: D.Die) -> list[tuple[int, int]]:
        top = unit.top_die
        base = top.get(D.AT_LOW_PC) or 0
        if unit.version < 5:
            return _debug_ranges(self.sections.get(".debug_ranges", b""), die.attrs[D.AT_RANGES], base)
        data = self.sections.get(".debug_rnglists", b"")
        if D.AT_RANGES_INDEX in die.attrs:
            rbase = top.get(D.AT_RNGLISTS_BASE, 12)
            (rel,) = struct.unpack_from("<I", data, rbase + 4 * die.attrs[D.AT_RANGES_INDEX])
            off = rbase + rel
        else:
            off = die.attrs[D.AT_RANGES]
        return _rnglist(data, off, base, self._addrx_reader(unit))

    def location_at(self, unit: D.Unit, off: int, pc: int) -> bytes | None:
        """The expression of the location list at `off` (DW_FORM_sec_offset) whose
        entry covers `pc`, or None (DWARF 4 .debug_loc, 5 .debug_loclists)."""
        base = unit.top_die.get(D.AT_LOW_PC) or 0
        if unit.version < 5:
            entries = _v4_list(self.sections.get(".debug_loc", b""), off, base, exprs=True)
        else:
            entries = _v5_list(self.sections.get(".debug_loclists", b""), off, base,
                               self._addrx_reader(unit), exprs=True)
        try:
            for _, (lo, hi, expr) in zip(range(4096), entries):
                if lo <= pc < hi:
                    return expr
        except (IndexError, struct.error):
            return None  # an unknown entry kind or a list running off its section
        return None

    def _addrx_reader(self, unit: D.Unit) -> Any:
        addr = self.sections.get(".debug_addr", b"")
        abase = unit.top_die.get(D.AT_ADDR_BASE, 8)

        def read(i: int) -> int:
            (v,) = struct.unpack_from("<Q", addr, abase + 8 * i)
            return int(v)

        return read


class _Sections:
    """The ``.debug*`` sections by name, each copied out of the file when first asked for
    (a debug build's .debug_loc or .debug_line may never be), one copy per image."""

    def __init__(self, elf: ElfImage) -> None:
        self._elf = elf
        self._got: dict[str, bytes] = {}

    def get(self, name: str, default: bytes | None = None) -> bytes | None:
        got = self._got.get(name)
        if got is None:
            if not name.startswith(".debug") or name not in self._elf.sections:
                return default
            if name == ".debug_str":  # ~30 MB of which a scan reads scattered names: read where asked
                got = self._elf.section_window(name) or b""
            else:
                got = self._elf.debug_section(name) or b""
            self._got[name] = got  # type: ignore[assignment]
        return got

    def __getitem__(self, name: str) -> bytes:
        got = self.get(name)
        if got is None:
            raise KeyError(name)
        return got

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.startswith(".debug") and name in self._elf.sections


KEEP_TAGS = frozenset(
    {
        D.TAG_COMPILE_UNIT, D.TAG_NAMESPACE, D.TAG_STRUCTURE, D.TAG_UNION, D.TAG_ENUMERATION,
        D.TAG_MEMBER, D.TAG_VARIANT_PART, D.TAG_VARIANT, D.TAG_SUBPROGRAM, D.TAG_FORMAL_PARAMETER,
        D.TAG_INLINED_SUBROUTINE, D.TAG_POINTER, D.TAG_BASE_TYPE, D.TAG_ARRAY, D.TAG_SUBRANGE,
        D.TAG_TYPEDEF, D.TAG_SUBROUTINE_TYPE,
    }
)
# what stack discovery reads too (proxy.reflect.stacks): a frame's variables and scopes; the
# inventory walks with these, so that the first stack discovery takes its units' walks
# (DwarfView.hand_over) instead of walking them again
STACK_TAGS = KEEP_TAGS | {D.TAG_VARIABLE, D.TAG_LEXICAL_BLOCK, D.TAG_TEMPLATE_TYPE_PARAM}


def line_program_files(lp: Any, comp_dir: str) -> list[str]:
    """File names of a pyelftools line program, joined with their directories."""
    hdr = lp.header
    version = hdr["version"]
    dirs = [_s(d) for d in hdr["include_directory"]]
    out: list[str] = []
    for fe in hdr["file_entry"]:
        name = _s(fe.name)
        di = fe.dir_index
        if version >= 5:
            d = dirs[di] if di < len(dirs) else ""
        else:
            d = comp_dir if di == 0 else (dirs[di - 1] if di - 1 < len(dirs) else "")
        full = os.path.join(d, name) if d and not name.startswith("/") else name
        if not full.startswith("/") and comp_dir:
            full = os.path.join(comp_dir, full)
        out.append(os.path.normpath(full))
    return out


def _v4_line_files(data: bytes, off: int, comp_dir: str) -> list[str] | None:
    """The file table of a DWARF 2-4 line program header, as ``line_program_files`` gives
    it (pyelftools would first copy every .debug section: ~60 MB for a debug tokio
    binary); None for DWARF 5 (its entry formats are left to pyelftools)."""
    length, version = struct.unpack_from("<IH", data, off)
    if length >= 0xFFFFFFF0 or version >= 5:
        return None
    if version < 2:
        raise ValueError(f"line program version {version}")
    pos = off + 11  # past length, version, header_length, minimum_instruction_length
    if version >= 4:
        pos += 1  # maximum_operations_per_instruction
    opcode_base = data[pos + 3]
    pos += 4 + opcode_base - 1
    dirs: list[str] = []
    while data[pos]:
        e = data.index(b"\0", pos)
        dirs.append(data[pos:e].decode("utf-8", "replace"))
        pos = e + 1
    pos += 1
    out: list[str] = []
    while data[pos]:
        e = data.index(b"\0", pos)
        name = data[pos:e].decode("utf-8", "replace")
        di, pos = D._uleb(data, e + 1)
        _, pos = D._uleb(data, pos)  # mtime
        _, pos = D._uleb(data, pos)  # length
        d = comp_dir if di == 0 else (dirs[di - 1] if di - 1 < len(dirs) else "")
        full = os.path.join(d, name) if d and not name.startswith("/") else name
        if not full.startswith("/") and comp_dir:
            full = os.path.join(comp_dir, full)
        out.append(os.path.normpath(full))
    return out


def _s(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _parse_aranges(data: bytes) -> tuple[array[int], array[int], array[int]]:
    """``.debug_aranges`` -> (lows, highs, unit offsets), sorted, in arrays (a debug build's
    ~80,000 ranges: 2 MB, against 5 MB as tuples)."""
    entries: list[tuple[int, int, int]] = []
    pos = 0
    while pos + 12 <= len(data):
        length, _version, unit_off, addr_size, _seg = struct.unpack_from("<IHIBB", data, pos)
        if length >= 0xFFFFFFF0 or addr_size != 8:
            raise ValueError(f"aranges set at {pos:#x}: unsupported format")
        end = pos + 4 + length
        p = pos + 16  # header is 12 bytes, tuples are aligned to 16
        while p + 16 <= end:
            lo, n = struct.unpack_from("<QQ", data, p)
            p += 16
            if lo == 0 and n == 0:
                break
            if lo:
                entries.append((lo, lo + n, unit_off))
        pos = end
    entries.sort()
    return (array("Q", [e[0] for e in entries]), array("Q", [e[1] for e in entries]),
            array("Q", [e[2] for e in entries]))


def _debug_ranges(data: bytes, off: int, base: int) -> list[tuple[int, int]]:
    return [(lo, hi) for lo, hi, _ in _v4_list(data, off, base, exprs=False)]


def _rnglist(data: bytes, off: int, base: int, addrx: Any) -> list[tuple[int, int]]:
    return [(lo, hi) for lo, hi, _ in _v5_list(data, off, base, addrx, exprs=False)]


def _v4_list(data: bytes, off: int, base: int, *, exprs: bool) -> Iterator[tuple[int, int, bytes]]:
    """DWARF 4 ``.debug_ranges`` / ``.debug_loc`` entries: (lo, hi, expression;
    b"" for ranges), base-address selections applied."""
    while True:
        lo, hi = struct.unpack_from("<QQ", data, off)
        off += 16
        if lo == 0 and hi == 0:
            return
        if lo == 0xFFFFFFFFFFFFFFFF:
            base = hi
            continue
        expr = b""
        if exprs:
            (n,) = struct.unpack_from("<H", data, off)
            expr, off = data[off + 2:off + 2 + n], off + 2 + n
        yield base + lo, base + hi, expr


def _v5_list(data: bytes, off: int, base: int, addrx: Any, *,
             exprs: bool) -> Iterator[tuple[int, int, bytes]]:
    """DWARF 5 ``.debug_rnglists`` (DW_RLE_*) / ``.debug_loclists`` (DW_LLE_*)
    entries: (lo, hi, expression; b"" for ranges). The two encodings are the
    same but for DW_LLE_default_location (5), which shifts the later kinds."""
    while True:
        kind = data[off]
        off += 1
        if not exprs and kind >= 5:
            kind += 1  # DW_RLE_base_address (5) is DW_LLE_base_address (6), ...
        if kind == 0:  # end_of_list
            return
        if kind == 1:  # base_addressx
            i, off = D._uleb(data, off)
            base = addrx(i)
            continue
        if kind == 6:  # base_address
            (base,) = struct.unpack_from("<Q", data, off)
            off += 8
            continue
        if kind == 2:  # startx_endx
            a, off = D._uleb(data, off)
            b, off = D._uleb(data, off)
            lo, hi = addrx(a), addrx(b)
        elif kind == 3:  # startx_length
            a, off = D._uleb(data, off)
            n, off = D._uleb(data, off)
            lo = addrx(a)
            hi = lo + n
        elif kind == 4:  # offset_pair
            a, off = D._uleb(data, off)
            b, off = D._uleb(data, off)
            lo, hi = base + a, base + b
        elif kind == 5:  # default_location (location lists only)
            lo, hi = 0, 1 << 64
        elif kind == 7:  # start_end
            lo, hi = struct.unpack_from("<QQ", data, off)
            off += 16
        elif kind == 8:  # start_length
            (lo,) = struct.unpack_from("<Q", data, off)
            n, off = D._uleb(data, off + 8)
            hi = lo + n
        else:
            raise IndexError(f"unknown DW_{'LLE' if exprs else 'RLE'} {kind}")
        expr = b""
        if exprs:
            n, off = D._uleb(data, off)
            expr, off = data[off:off + n], off + n
        yield lo, hi, expr
