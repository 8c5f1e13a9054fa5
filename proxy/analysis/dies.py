"""A small, fast reader for the DIEs of selected DWARF units.

Theory of operation: pyelftools decodes every attribute of every DIE through
``construct`` (about 10 µs per DIE here, 11–19 s for a debug tokio binary).
The inventory needs a handful of tags and attributes from a few units, so
this module decodes ``.debug_abbrev`` itself, compiles each abbreviation into
a plan ("skip 9 bytes, read a uleb as DW_AT_name, skip a cstring, ..."), and
runs that plan over the unit's bytes. DIEs whose tag is not asked for are
still walked (their bytes must be skipped, their children may matter) but
not stored. Each stored DIE keeps its tag, its parent and the attributes in
``KEEP_ATTRS`` as plain ints/bytes; strings are resolved to ``str``.

Only little-endian, 32-bit DWARF 2–5 is read (what rustc and gcc emit on
x86-64); anything else raises ``DwarfFormatError`` which callers turn into an
``Inventory`` warning. pyelftools stays the reader for line programs, range
lists and CFI, where it is fast enough.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .dwarfwalk import (  # noqa: F401 - the walk's part of the reader, re-exported
    _BLOCK1, _BLOCK2, _BLOCK4, _BLOCK_ULEB, _CSTR, _FIXED, _FORMS, _IMPLICIT, _INDIRECT, _SLEB, _ULEB,
    DwarfFormatError, _Abbrev, _sleb, _uleb, parse_abbrevs, skip_table, walk,
)
from .sieve import Sieve, peek_loc, read_at

# DW_TAG_*
TAG_ARRAY = 0x01
TAG_ENUMERATION = 0x04
TAG_FORMAL_PARAMETER = 0x05
TAG_LEXICAL_BLOCK = 0x0B
TAG_MEMBER = 0x0D
TAG_POINTER = 0x0F
TAG_COMPILE_UNIT = 0x11
TAG_STRUCTURE = 0x13
TAG_SUBROUTINE_TYPE = 0x15
TAG_TYPEDEF = 0x16
TAG_UNION = 0x17
TAG_VARIANT = 0x19
TAG_INLINED_SUBROUTINE = 0x1D
TAG_SUBRANGE = 0x21
TAG_BASE_TYPE = 0x24
TAG_SUBPROGRAM = 0x2E
TAG_TEMPLATE_TYPE_PARAM = 0x2F
TAG_VARIABLE = 0x34
TAG_NAMESPACE = 0x39
TAG_VARIANT_PART = 0x33

# DW_AT_*
AT_LOCATION = 0x02
AT_NAME = 0x03
AT_BYTE_SIZE = 0x0B
AT_STMT_LIST = 0x10
AT_LOW_PC = 0x11
AT_HIGH_PC = 0x12
AT_COMP_DIR = 0x1B
AT_UPPER_BOUND = 0x2F
AT_ABSTRACT_ORIGIN = 0x31
AT_COUNT = 0x37
AT_DATA_MEMBER_LOCATION = 0x38
AT_DECL_FILE = 0x3A
AT_DECL_LINE = 0x3B
AT_ARTIFICIAL = 0x34
AT_DISCR = 0x15
AT_DISCR_VALUE = 0x16
AT_SPECIFICATION = 0x47
AT_TYPE = 0x49
AT_RANGES = 0x55
AT_ENTRY_PC = 0x52
AT_CALL_FILE = 0x58
AT_CALL_LINE = 0x59
AT_LINKAGE_NAME = 0x6E
AT_MIPS_LINKAGE_NAME = 0x2007
AT_STR_OFFSETS_BASE = 0x72
AT_ADDR_BASE = 0x73
AT_RNGLISTS_BASE = 0x74
AT_ALIGNMENT = 0x88
AT_FRAME_BASE = 0x40
AT_HIGH_PC_OFFSET = -AT_HIGH_PC  # pseudo attribute: DW_AT_high_pc given as a length
AT_RANGES_INDEX = -AT_RANGES  # pseudo attribute: DW_AT_ranges given as a DW_FORM_rnglistx index
AT_LOCATION_INDEX = -AT_LOCATION  # pseudo attribute: DW_AT_location given as a DW_FORM_loclistx index

KEEP_ATTRS = frozenset(
    {
        AT_NAME, AT_BYTE_SIZE, AT_LOW_PC, AT_HIGH_PC, AT_UPPER_BOUND, AT_ABSTRACT_ORIGIN,
        AT_COUNT, AT_DATA_MEMBER_LOCATION, AT_DECL_FILE, AT_DECL_LINE, AT_ARTIFICIAL,
        AT_DISCR, AT_DISCR_VALUE, AT_SPECIFICATION, AT_TYPE, AT_RANGES, AT_ENTRY_PC,
        AT_CALL_FILE, AT_CALL_LINE, AT_LINKAGE_NAME, AT_MIPS_LINKAGE_NAME, AT_STMT_LIST,
        AT_COMP_DIR, AT_STR_OFFSETS_BASE, AT_ADDR_BASE, AT_RNGLISTS_BASE, AT_ALIGNMENT,
        AT_LOCATION, AT_FRAME_BASE,  # variables on the stack (proxy.reflect.stacks)
    }
)
_STRING_ATTRS = frozenset({AT_NAME, AT_LINKAGE_NAME, AT_MIPS_LINKAGE_NAME, AT_COMP_DIR})

FORM_STRP = 0x0E

_REF_FORMS = frozenset({0x11, 0x12, 0x13, 0x14, 0x15})  # unit-relative references
_STRX_FORMS = frozenset({0x1A, 0x25, 0x26, 0x27, 0x28})
_ADDRX_FORMS = frozenset({0x1B, 0x29, 0x2A, 0x2B, 0x2C})
_SIGNED_FORMS = frozenset({0x0D})
# data1/2/4/8, flag, sec_offset: stored as plain ints (DW_AT_high_pc is never one of
# these in a plan: its data forms must become AT_HIGH_PC_OFFSET, see _store)
_PLAIN_INT_FORMS = frozenset({0x05, 0x06, 0x07, 0x0B, 0x0C, 0x17})
_K_INT, _K_REF, _K_STRP = 100, 101, 102


@dataclass(slots=True)
class Die:
    offset: int  # section offset
    tag: int
    parent: int | None
    attrs: dict[int, Any]
    children: list[int] = field(default_factory=list)

    def get(self, attr: int, default: Any = None) -> Any:
        return self.attrs.get(attr, default)


@dataclass(slots=True)
class Unit:
    """The stored DIEs of one unit, by section offset."""

    offset: int
    version: int
    addr_size: int
    dies: Dies | dict[int, Die]
    top: int  # offset of the unit DIE
    end: int = 0  # offset just past the unit

    @property
    def top_die(self) -> Die:
        return self.dies[self.top]


def _uleb_bytes(v: int) -> bytes:
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class _Plans(dict[int, tuple[int, bool, bool, tuple[Any, ...]]]):
    """Decoding plans by abbreviation code: (tag, has_children, keep, steps). A step is an
    int (bytes to skip: runs of fixed-size attributes merged) or a tuple (kind, size,
    form, attr or None) for a variable-size or wanted attribute. Made on first lookup;
    an unknown code raises KeyError."""

    def __init__(self, abbrevs: dict[int, _Abbrev], addr_size: int, keep_tags: frozenset[int] | None) -> None:
        super().__init__()
        self.abbrevs = abbrevs
        self.addr_size = addr_size
        self.keep_tags = keep_tags

    def __missing__(self, code: int) -> tuple[int, bool, bool, tuple[Any, ...]]:
        ab = self.abbrevs[code]
        keep_tags, addr_size = self.keep_tags, self.addr_size
        keep = keep_tags is None or ab.tag in keep_tags or ab.tag == TAG_COMPILE_UNIT
        steps: list[Any] = []
        for attr, form, implicit in ab.specs:
            kind, size = _FORMS.get(form, (-1, 0))
            if kind == _FIXED and size < 0:
                size = addr_size
            want = keep and attr in KEEP_ATTRS
            if kind == _FIXED and not want:
                if steps and isinstance(steps[-1], int):
                    steps[-1] += size
                else:
                    steps.append(size)
            elif kind == _IMPLICIT:
                if want:
                    steps.append((kind, implicit, form, attr))
            elif want and kind == _FIXED and size and (
                form == 0x01 or (form in _PLAIN_INT_FORMS and attr != AT_HIGH_PC)
            ):
                steps.append((_K_INT, size, form, attr))
            elif want and kind == _FIXED and form in _REF_FORMS:
                steps.append((_K_REF, size, form, attr))
            elif want and form == 0x0E:
                steps.append((_K_STRP, size, form, attr))
            else:
                steps.append((kind, size, form, attr if want else None))
        plan = self[code] = (ab.tag, ab.has_children, keep, tuple(st for st in steps if st != 0))
        return plan


class DieReader:
    """Reads selected units of one ``.debug_info`` section."""

    def __init__(self, sections: Mapping[str, bytes] | Any) -> None:
        self.info = sections[".debug_info"]
        self.abbrev = sections[".debug_abbrev"]
        self.str = sections.get(".debug_str", b"")
        self.line_str = sections.get(".debug_line_str", b"")
        self.str_offsets = sections.get(".debug_str_offsets", b"")
        self.addr = sections.get(".debug_addr", b"")
        self._abbrev_cache: dict[int, dict[int, _Abbrev]] = {}
        self._plan_cache: dict[Any, Any] = {}
        self._str_cache: dict[int, str] = {}
        self._tag_tables: dict[int, tuple[dict[int, _Abbrev], Any]] = {}

    def tag_table(self, abbrevs: dict[int, _Abbrev]) -> Any:
        """Abbreviation code -> tag, as a numpy array (per abbreviation table)."""
        import numpy as np

        got = self._tag_tables.get(id(abbrevs))
        if got is None or got[0] is not abbrevs:
            table = np.zeros(max(abbrevs, default=0) + 1, dtype=np.uint32)
            for code, ab in abbrevs.items():
                table[code] = ab.tag
            got = self._tag_tables[id(abbrevs)] = (abbrevs, table)
        return got[1]

    def iter_unit_offsets(self) -> list[int]:
        """Offsets of every unit header (cheap: headers only)."""
        out: list[int] = []
        pos = 0
        info = self.info
        while pos + 11 <= len(info):
            (length,) = struct.unpack_from("<I", info, pos)
            if length >= 0xFFFFFFF0:
                raise DwarfFormatError(f"64-bit DWARF unit at {pos:#x} is not supported")
            out.append(pos)
            pos += 4 + length
        return out

    def string_prefix(self, strp: int, n: int) -> str:
        """The first ``n`` bytes (or fewer: up to its end) of the .debug_str string at
        offset ``strp``, in one read: a scan judges ~10^5 names by how they start."""
        got = self._str_cache.get(strp)
        if got is not None:
            return got
        raw = self.str[strp:strp + n]
        end = raw.find(b"\0")
        return (raw if end < 0 else raw[:end]).decode("utf-8", "replace")  # type: ignore[no-any-return]

    def _cstr_cached(self, off: int) -> str:
        v = self._str_cache[off] = self._cstr(self.str, off)
        return v

    def _cstr(self, sec: Any, off: int) -> str:
        if sec.__class__ is not bytes and hasattr(sec, "cstring"):  # elf.Window: one read
            got = sec.cstring(off)
            if got is None:
                raise DwarfFormatError(f"unterminated string at {off:#x}")
            return got.decode("utf-8", "replace")  # type: ignore[no-any-return]
        end = sec.find(b"\0", off)
        if end < 0:
            raise DwarfFormatError(f"unterminated string at {off:#x}")
        return sec[off:end].decode("utf-8", "replace")  # type: ignore[no-any-return]

    def read_unit(self, offset: int, keep_tags: frozenset[int] | None = None) -> Unit:
        """Read one unit. ``keep_tags`` None keeps every DIE."""
        try:
            return self._read_unit(offset, keep_tags)
        except (IndexError, struct.error, KeyError, UnicodeDecodeError) as e:
            raise DwarfFormatError(f"corrupt DWARF unit at {offset:#x}: {type(e).__name__}: {e}") from e

    def _header(self, offset: int) -> tuple[int, int, int, int, int]:
        info = self.info
        (length,) = struct.unpack_from("<I", info, offset)
        if length >= 0xFFFFFFF0:
            raise DwarfFormatError(f"64-bit DWARF unit at {offset:#x} is not supported")
        end = offset + 4 + length
        if end > len(info):
            raise DwarfFormatError(f"unit at {offset:#x} runs past the end of .debug_info")
        (version,) = struct.unpack_from("<H", info, offset + 4)
        if version >= 5:
            unit_type = info[offset + 6]
            addr_size = info[offset + 7]
            (abbrev_off,) = struct.unpack_from("<I", info, offset + 8)
            pos = offset + 12
            if unit_type in (4, 5):  # skeleton / split_compile: dwo id
                pos += 8
            elif unit_type in (2, 6):  # type / split_type: signature + type offset
                pos += 12
        elif version >= 2:
            (abbrev_off,) = struct.unpack_from("<I", info, offset + 6)
            addr_size = info[offset + 10]
            pos = offset + 11
        else:
            raise DwarfFormatError(f"unit at {offset:#x} has DWARF version {version}")
        return version, addr_size, abbrev_off, pos, end

    def _abbrevs(self, abbrev_off: int) -> dict[int, _Abbrev]:
        table = self._abbrev_cache.get(abbrev_off)
        if table is None:
            table = parse_abbrevs(self.abbrev, abbrev_off)
            self._abbrev_cache[abbrev_off] = table
        return table

    def _plans(
        self, abbrev_off: int, addr_size: int, keep_tags: frozenset[int] | None
    ) -> _Plans:
        """Per abbreviation code: (tag, has_children, keep, steps), each made when first
        asked for (a unit's DIEs are decoded a few percent at most)."""
        key = (abbrev_off, addr_size, keep_tags)
        plans = self._plan_cache.get(key)
        if plans is None:
            plans = self._plan_cache[key] = _Plans(self._abbrevs(abbrev_off), addr_size, keep_tags)
        return plans  # type: ignore[no-any-return]

    def _skips(self, abbrev_off: int, addr_size: int, keep_tags: frozenset[int] | None) -> list[Any]:
        """``skip_table`` of one abbreviation table (kept per table)."""
        key = ("skip", abbrev_off, addr_size, keep_tags)
        table = self._plan_cache.get(key)
        if table is None:
            table = self._plan_cache[key] = skip_table(self._abbrevs(abbrev_off), addr_size, keep_tags)
        return table  # type: ignore[no-any-return]

    def unit_job(self, offset: int) -> tuple[int, int, int, int]:
        """What a walk of the unit in another process needs besides the sections:
        (abbreviation table offset, address size, first DIE's offset, end)."""
        try:
            _version, addr_size, abbrev_off, pos, end = self._header(offset)
        except (IndexError, struct.error) as e:
            raise DwarfFormatError(f"corrupt DWARF unit at {offset:#x}: {type(e).__name__}: {e}") from e
        return abbrev_off, addr_size, pos, end

    def unit_from_walk(self, offset: int, keep_tags: frozenset[int] | None, walked: tuple[Any, ...]) -> Unit:
        """The unit from a walk made elsewhere (``walk``'s four arrays)."""
        try:
            version, addr_size, abbrev_off, pos, end = self._header(offset)
            plans = self._plans(abbrev_off, addr_size, keep_tags)
            top_attrs, _ = self._decode_top(offset, plans, addr_size, pos)
        except (IndexError, struct.error, KeyError, UnicodeDecodeError) as e:
            raise DwarfFormatError(f"corrupt DWARF unit at {offset:#x}: {type(e).__name__}: {e}") from e
        offs, codes, pars, ends = walked
        if not offs or offs[0] != pos:
            raise DwarfFormatError(f"unit at {offset:#x} has no unit DIE")
        dies = Dies(self, offset, addr_size, self._abbrevs(abbrev_off), plans, top_attrs, offs, codes, pars, ends)
        return Unit(offset, version, addr_size, dies, pos, end)

    def unit_summary(self, offset: int) -> tuple[dict[int, Any], frozenset[int]]:
        """The unit DIE's attributes and every DW_FORM the unit's abbreviations use, without
        reading the unit's other DIEs (a whole unit of std costs ~0.3 s)."""
        try:
            version, addr_size, abbrev_off, pos, _ = self._header(offset)
            forms = frozenset(form for ab in self._abbrevs(abbrev_off).values() for _, form, _ in ab.specs)
            plans = self._plans(abbrev_off, addr_size, None)
            attrs, _ = self._decode_top(offset, plans, addr_size, pos)
        except (IndexError, struct.error, KeyError, UnicodeDecodeError) as e:
            raise DwarfFormatError(f"corrupt DWARF unit at {offset:#x}: {type(e).__name__}: {e}") from e
        return attrs, forms

    def _decode_top(
        self, offset: int, plans: _Plans, addr_size: int, pos: int
    ) -> tuple[dict[int, Any], int]:
        pending: list[tuple[dict[int, Any], int, int, int]] = []
        code, p = _uleb(self.info, pos)
        plan = plans[code] if code in plans.abbrevs else None
        if plan is None or plan[0] not in (TAG_COMPILE_UNIT, 0x41, 0x4A):  # compile, type, skeleton unit
            raise DwarfFormatError(f"unit at {offset:#x} has no unit DIE")
        attrs, _ = self._decode(p, plan[3], offset, pos, pending)
        self._resolve_pending(attrs, addr_size, pending)
        return attrs, code

    def _read_unit(self, offset: int, keep_tags: frozenset[int] | None) -> Unit:
        """Walk the unit once, decoding no attribute (``walk``). ``Dies`` decodes a DIE
        when it is first asked for."""
        version, addr_size, abbrev_off, pos, end = self._header(offset)
        plans = self._plans(abbrev_off, addr_size, keep_tags)
        top_attrs, _ = self._decode_top(offset, plans, addr_size, pos)
        offs, codes, pars, ends = walk(self.info, pos, end, self._skips(abbrev_off, addr_size, keep_tags), offset)
        if not offs or offs[0] != pos:
            raise DwarfFormatError(f"unit at {offset:#x} has no unit DIE")
        dies = Dies(self, offset, addr_size, self._abbrevs(abbrev_off), plans, top_attrs, offs, codes, pars, ends)
        return Unit(offset, version, addr_size, dies, pos, end)

    def _decode(
        self, pos: int, steps: tuple[Any, ...], offset: int, die_off: int,
        pending: list[tuple[dict[int, Any], int, int, int]],
    ) -> tuple[dict[int, Any], int]:
        """The kept attributes of one DIE whose abbreviation code has been read (``pos``
        just past it), and the position after its attributes."""
        info = self.info
        uleb = _uleb
        strs = self._str_cache
        attrs: dict[int, Any] = {}
        for step in steps:
            if step.__class__ is int:
                pos += step
                continue
            kind, size, form, attr = step
            if kind == _K_INT:
                attrs[attr] = int.from_bytes(info[pos : pos + size], "little")
                pos += size
            elif kind == _K_REF:
                attrs[attr] = int.from_bytes(info[pos : pos + size], "little") + offset
                pos += size
            elif kind == _K_STRP:
                so = int.from_bytes(info[pos : pos + 4], "little")
                attrs[attr] = strs.get(so) or self._cstr_cached(so)
                pos += 4
            elif kind == _FIXED:
                if attr is not None:
                    self._store(attrs, attr, form, info, pos, size, offset, pending)
                pos += size
            elif kind == _ULEB:
                v, pos = uleb(info, pos)
                if attr is not None:
                    self._store_uleb(attrs, attr, form, v, offset, pending)
            elif kind == _SLEB:
                v, pos = _sleb(info, pos)
                if attr is not None:
                    attrs[attr] = v
            elif kind == _CSTR:
                e = info.index(b"\0", pos)
                if attr is not None:
                    attrs[attr] = info[pos:e].decode("utf-8", "replace")
                pos = e + 1
            elif kind == _IMPLICIT:
                attrs[attr] = size
            elif kind == _INDIRECT:
                raise DwarfFormatError(f"DW_FORM_indirect at {die_off:#x} is not supported")
            elif kind in (_BLOCK_ULEB, _BLOCK1, _BLOCK2, _BLOCK4):
                if kind == _BLOCK_ULEB:
                    n, pos = uleb(info, pos)
                else:
                    w = 1 if kind == _BLOCK1 else 2 if kind == _BLOCK2 else 4
                    n = int.from_bytes(info[pos : pos + w], "little")
                    pos += w
                if attr is not None:
                    attrs[attr] = bytes(info[pos : pos + n])
                pos += n
            else:
                raise DwarfFormatError(f"unknown DW_FORM {form:#x} at {die_off:#x}")
        return attrs, pos
    def _store(
        self, attrs: dict[int, Any], attr: int, form: int, info: bytes, pos: int, size: int,
        unit_off: int, pending: list[tuple[dict[int, Any], int, int, int]],
    ) -> None:
        v: Any = int.from_bytes(info[pos : pos + size], "little") if size else True
        if form in _REF_FORMS:
            v += unit_off
        elif form == 0x0E:
            v = self._cstr(self.str, v)
        elif form == 0x1F:
            v = self._cstr(self.line_str, v)
        elif form in _STRX_FORMS or form in _ADDRX_FORMS:
            pending.append((attrs, attr, form, v))
        elif attr == AT_HIGH_PC and form != 0x01:
            attr = AT_HIGH_PC_OFFSET  # a length from low_pc, not an address
        attrs[attr] = v

    def _store_uleb(
        self, attrs: dict[int, Any], attr: int, form: int, v: int, unit_off: int,
        pending: list[tuple[dict[int, Any], int, int, int]],
    ) -> None:
        if form == 0x15:
            v += unit_off
        elif form == 0x1A or form == 0x1B:
            pending.append((attrs, attr, form, v))
        elif attr == AT_HIGH_PC:
            attr = AT_HIGH_PC_OFFSET
        elif form == 0x23 and attr == AT_RANGES:
            attr = AT_RANGES_INDEX
        elif form == 0x22 and attr == AT_LOCATION:
            attr = AT_LOCATION_INDEX
        attrs[attr] = v

    def _resolve_pending(
        self, top_attrs: dict[int, Any], addr_size: int, pending: list[tuple[dict[int, Any], int, int, int]]
    ) -> None:
        str_base = top_attrs.get(AT_STR_OFFSETS_BASE, 8)
        addr_base = top_attrs.get(AT_ADDR_BASE, 8)
        for attrs, attr, form, idx in pending:
            if form in _STRX_FORMS:
                (soff,) = struct.unpack_from("<I", self.str_offsets, str_base + 4 * idx)
                attrs[attr] = self._cstr(self.str, soff)
            else:
                a = addr_base + addr_size * idx
                attrs[attr] = int.from_bytes(self.addr[a : a + addr_size], "little")


class Dies:
    """The kept DIEs of one unit by section offset, decoded on first access (a read-only
    mapping). ``DieReader._read_unit`` leaves only four arrays: a debug tokio binary's
    units hold millions of DIEs, of which the inventory decodes a few percent."""

    __slots__ = ("_reader", "_unit_off", "_addr_size", "_abbrevs", "_plans", "_top_attrs", "_offs", "_codes",
                 "_pars", "_ends", "_cache", "_peeks", "picked")

    def __init__(self, reader: DieReader, unit_off: int, addr_size: int, abbrevs: dict[int, _Abbrev],
                 plans: _Plans, top_attrs: dict[int, Any], offs: array[int], codes: array[int],
                 pars: array[int], ends: array[int]) -> None:
        self._reader = reader
        self._unit_off = unit_off
        self._addr_size = addr_size
        self._abbrevs = abbrevs
        self._peeks: dict[tuple[int, int], tuple[tuple[int, ...], int, int] | None] = {}
        self._plans = plans
        self._top_attrs = top_attrs
        self._offs = offs
        self._codes = codes
        self._pars = pars
        self._ends = ends
        self._cache: dict[int, Die] = {}
        self.picked: list[int] | None = None  # the sieve's picks, made where the unit was walked

    def __len__(self) -> int:
        return len(self._offs)

    def __iter__(self) -> Iterator[int]:
        return iter(self._offs)

    def __contains__(self, off: object) -> bool:
        return isinstance(off, int) and self._index(off) >= 0

    def __getitem__(self, off: int) -> Die:
        d = self.get(off)
        if d is None:
            raise KeyError(off)
        return d

    def get(self, off: int, default: Any = None) -> Any:
        d = self._cache.get(off)
        if d is not None:
            return d
        i = self._index(off)
        return self._at(i) if i >= 0 else default

    def values(self) -> Iterator[Die]:
        for i in range(len(self._offs)):
            yield self._at(i)

    def tagged(self, tags: frozenset[int]) -> Iterator[tuple[int, int]]:
        """(index, tag) of the DIEs whose tag is in ``tags``, in section order, none decoded."""
        codes = self._codes
        want = {c: ab.tag for c, ab in self._abbrevs.items() if ab.tag in tags}
        for i in range(len(codes)):
            t = want.get(codes[i])
            if t is not None:
                yield i, t

    def forget(self) -> None:
        """Drop the decoded DIEs (they are decoded again when asked for)."""
        self._cache.clear()

    def walk_arrays(self) -> tuple[array[int], array[int], array[int], array[int]]:
        """The walk this unit was made from (``walk``'s four arrays: ``unit_from_walk``)."""
        return self._offs, self._codes, self._pars, self._ends

    def string_at(self, strp: int) -> str:
        """The .debug_str string at offset ``strp`` (not kept: a scan judges ~10^5 names)."""
        return self._reader._str_cache.get(strp) or self._reader._cstr(self._reader.str, strp)

    def at(self, i: int) -> Die:
        return self._at(i)

    def peek(self, i: int, attr: int, raw_strp: bool = False) -> Any:
        """One attribute of the DIE at index ``i`` (None when absent), read alone when the
        attributes before it have fixed sizes (a name, a low_pc, a reference), else from
        the decoded DIE: a unit's scan tells its few interesting DIEs from the rest by
        name without decoding them."""
        off = self._offs[i]
        d = self._cache.get(off)
        if d is not None:
            return d.attrs.get(attr)
        code = self._codes[i]
        loc = self._peeks.get((code, attr), 0)
        if loc == 0:
            loc = self._peeks[(code, attr)] = self._peek_loc(code, attr)
        if loc is None:
            return self._at(i).attrs.get(attr)
        path, size, form = loc
        if size < 0:
            return None  # the abbreviation has no such attribute
        pos = off + (1 if code < 0x80 else len(_uleb_bytes(code)))
        v = read_at(self._reader.info, pos, path, size)
        if form == 0x0E:
            if raw_strp:  # the string's offset, for a caller that judges each string once
                return v
            return self._reader._str_cache.get(v) or self._reader._cstr(self._reader.str, v)
        if form in _REF_FORMS:
            return v + self._unit_off
        return v

    def _peek_loc(self, code: int, attr: int) -> tuple[tuple[int, ...], int, int] | None:
        """(steps that skip the attributes before it, size, form) of ``attr`` in
        abbreviation ``code``; size -1: absent; None: a form ``peek`` does not read
        (the DIE is decoded instead): ``sieve.peek_loc``."""
        return peek_loc(self._abbrevs[code], attr, self._addr_size)

    def sieve(self, sieve: Sieve, end: int) -> list[int]:
        """The indices of the DIEs ``sieve`` (``proxy.analysis.sieve``) picks in this unit,
        which ends at ``end``."""
        return sieve.unit(self._reader.info, 0, self._offs, self._codes, (id(self._abbrevs), self._addr_size),
                          self._abbrevs, self._addr_size, self._unit_off, end)

    def index(self, off: int) -> int:
        """The index of the DIE at section offset ``off``, or -1."""
        return self._index(off)

    def _index(self, off: int) -> int:
        offs = self._offs
        i = bisect_left(offs, off)
        return i if i < len(offs) and offs[i] == off else -1

    def _at(self, i: int) -> Die:
        off = self._offs[i]
        d = self._cache.get(off)
        if d is not None:
            return d
        tag, has_children, _keep, steps = self._plans[self._codes[i]]
        pos = off + 1 if self._codes[i] < 0x80 else _uleb(self._reader.info, off)[1]
        pending: list[tuple[dict[int, Any], int, int, int]] = []
        if i == 0:
            attrs = self._top_attrs
        else:
            try:
                attrs, _ = self._reader._decode(pos, steps, self._unit_off, off, pending)
                self._reader._resolve_pending(self._top_attrs, self._addr_size, pending)
            except (IndexError, struct.error, KeyError, UnicodeDecodeError) as e:
                raise DwarfFormatError(f"corrupt DIE at {off:#x}: {type(e).__name__}: {e}") from e
        p = self._pars[i]
        children: list[int] = []
        if has_children:
            ends = self._ends
            offs = self._offs
            j, e = i + 1, ends[i]
            while j < e:
                children.append(offs[j])
                j = ends[j]
        d = self._cache[off] = Die(off, tag, self._offs[p] if p >= 0 else None, attrs, children)
        return d
