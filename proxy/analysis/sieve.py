"""Which DIEs of a walked unit the inventory's scan must decode: the sieve, on names and
addresses read in place.

Theory of operation: of a debug build's ~10^6 kept DIEs, the scan (``inventory``) decodes
the few that can be a coroutine layout, a resume function, a runtime's task function or
an inlined coroutine: structures named ``{async_*_env#N}`` or like a runtime's task cell,
subprograms with code whose own name or origin's name starts with ``{``, ``poll`` or
``run<`` (and whose symbol's last path component could name such a function), inlined
subroutines whose origin's name does. This module judges that from the bytes of the
walk's arrays alone: each attribute is read where its abbreviation puts it (``peek_loc``),
each .debug_str name from its first bytes, each verdict kept per string and per reference
over all units.

Where it cannot judge here (a name that is not a ``strp``, an attribute after a
variable-size one it cannot skip, an origin in another unit or not kept), the DIE is
picked: the scan's own checks on the decoded DIE decide. So the picks are a superset of
what the scan keeps, and the inventory is the same.

It imports nothing but ``re``, ``bisect`` and ``dwarfwalk``: the unit walker's second
process (``unitwalk``, started ``python -S``) runs it on each unit it walks, so the
first process receives the picks with the arrays and only decodes them.
"""

from __future__ import annotations

import re
from bisect import bisect_left

from . import dwarfwalk as W

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

ASYNC_FN_RE = re.compile(r"^\{(async_fn|async_block|async_closure|async_gen_fn|async_gen_block|coroutine)#\d+\}")
ASYNC_ENV_RE = re.compile(r"^\{(async_fn|async_block|async_closure|async_gen_fn|async_gen_block|coroutine)_env#\d+\}")
# Runtime task cells whose layout reflection needs (where a spawned future lies in its task)
RUNTIME_CELL_PREFIXES = ("Cell<", "Header<", "TaskVTable", "TaskLayout")
# a function's name (or its origin's) that the scan can act on (a coroutine, tokio's
# raw::poll, async-task's run, a GenFuture's or another future's poll)
FN_PREFIXES = ("{", "poll", "run<")
FN_PREFIX = max(len(p) for p in FN_PREFIXES)
# the bytes of a name that decide struct_name_ok: "{async_gen_block_env#" and 26 digits
STRUCT_PREFIX = 48

TAG_STRUCTURE = 0x13
TAG_SUBPROGRAM = 0x2E
TAG_INLINED_SUBROUTINE = 0x1D
SCAN_TAGS = frozenset({TAG_STRUCTURE, TAG_SUBPROGRAM, TAG_INLINED_SUBROUTINE})
AT_NAME = 0x03
AT_LOW_PC = 0x11
AT_ABSTRACT_ORIGIN = 0x31
AT_SPECIFICATION = 0x47
FORM_STRP = 0x0E
REF_FORMS = frozenset({0x11, 0x12, 0x13, 0x14, 0x15})  # unit-relative references
PLAIN_INT_FORMS = frozenset({0x05, 0x06, 0x07, 0x0B, 0x0C, 0x17})  # data1/2/4/8, flag, sec_offset
_HIGH_PC = 0x12
_ORIGIN_HOPS = 8  # as DwarfView.origin


def struct_name_ok(name: str) -> bool:
    """Can a structure of this name be a coroutine layout or a runtime's task cell?"""
    return bool(ASYNC_ENV_RE.match(name)) or name.startswith(RUNTIME_CELL_PREFIXES)


def peek_loc(abbrev: W._Abbrev, attr: int, addr_size: int) -> tuple[tuple[int, ...], int, int] | None:
    """Where ``attr`` lies in a DIE of this abbreviation: (steps that skip the attributes
    before it, size, form); size -1: the abbreviation has no such attribute; None: a form
    not read in place (not fixed-size, or a high_pc given as a length), or an attribute
    after one whose size cannot be skipped a step at a time. A step >= 0 skips that many
    bytes, -1 - kind skips a variable-size form of that kind (uleb, sleb, block1,
    exprloc)."""
    path: list[int] = []
    for a, form, _ in abbrev.specs:
        kind, size = W._FORMS.get(form, (99, 0))
        if kind == W._FIXED and size < 0:
            size = addr_size
        if a == attr:
            plain = form in (0x01, 0x0E, 0x10) or form in REF_FORMS or form in PLAIN_INT_FORMS
            if kind != W._FIXED or not plain or (attr == _HIGH_PC and form != 0x01):
                return None
            return tuple(path), size, form
        if kind == W._IMPLICIT:
            continue
        if kind == W._FIXED:
            if path and path[-1] >= 0:
                path[-1] += size
            else:
                path.append(size)
        elif kind in (W._ULEB, W._SLEB, W._BLOCK1, W._BLOCK_ULEB):
            path.append(-1 - kind)
        else:
            return None
    return (), -1, 0


def read_at(info: Any, pos: int, path: tuple[int, ...], size: int) -> int:
    """The little-endian value ``size`` bytes long that ``path`` (``peek_loc``) leads to
    from ``pos``, the first byte after a DIE's abbreviation code."""
    for st in path:
        if st >= 0:
            pos += st
        elif st == -1 - W._BLOCK1:
            pos += 1 + info[pos]
        elif st == -1 - W._BLOCK_ULEB:
            k, pos = W._uleb(info, pos)
            pos += k
        else:  # a uleb or sleb
            while info[pos] & 0x80:
                pos += 1
            pos += 1
    return int.from_bytes(info[pos:pos + size], "little")


_UNKNOWN = -1  # an attribute not read in place
_ABSENT = -2  # the abbreviation has no such attribute


class Sieve:
    """The sieve's verdicts over all units of one binary. ``prefix(strp, n)``: the first
    ``n`` bytes of the .debug_str string at ``strp``, decoded; ``may_be_named(addr)``:
    could the function at ``addr`` be named so, by its symbols (``inventory``)."""

    def __init__(self, prefix: Callable[[int, int], str], may_be_named: Callable[[int], bool]) -> None:
        self._prefix = prefix
        self._may_be_named = may_be_named
        self._fn_strps: dict[int, bool] = {}
        self._struct_strps: dict[int, bool] = {}
        self._origins: dict[int, bool] = {}  # a reference into the unit sieved -> its origin's verdict
        self._locs: dict[Any, dict[int, Any]] = {}  # per abbreviation table: code -> its reads

    def fn_strp_ok(self, strp: int) -> bool:
        ok = self._fn_strps.get(strp)
        if ok is None:
            ok = self._fn_strps[strp] = self._prefix(strp, FN_PREFIX).startswith(FN_PREFIXES)
        return ok

    def struct_strp_ok(self, strp: int) -> bool:
        ok = self._struct_strps.get(strp)
        if ok is None:
            ok = self._struct_strps[strp] = struct_name_ok(self._prefix(strp, STRUCT_PREFIX))
        return ok

    def _reads(self, key: Any, abbrevs: dict[int, W._Abbrev], addr_size: int) -> dict[int, Any]:
        """Per abbreviation code of a scanned tag (a table, ``key``): ``_code_reads``."""
        got = self._locs.get(key)
        if got is None:
            if len(self._locs) >= 8:  # rustc gives each unit its own table: the last few kept
                del self._locs[next(iter(self._locs))]
            got = self._locs[key] = {code: _code_reads(ab, addr_size) for code, ab in abbrevs.items()
                                     if ab.tag in SCAN_TAGS}
        return got

    def unit(self, info: Any, base: int, offs: Any, codes: Any, key: Any, abbrevs: dict[int, W._Abbrev],
             addr_size: int, unit_off: int, unit_end: int) -> list[int]:
        """The indices (into the walk's arrays) of the DIEs the scan must decode. ``info``
        holds the section from ``base`` on; ``offs`` are ``info``'s offsets; ``key`` names
        the abbreviation table (its offset and the address size)."""
        reads = self._reads(key, abbrevs, addr_size)
        picked: list[int] = []
        # references into this unit only (one from elsewhere is judged True without a
        # chain): forgotten with it, ~60,000 verdicts less in memory for a big build
        self._origins.clear()
        for i, code in enumerate(codes):
            r = reads.get(code)
            if r is None:
                continue
            pos = offs[i] + (1 if code < 0x80 else 2 if code < 0x4000 else 3)
            tag = r[0]
            if tag == TAG_STRUCTURE:
                loc = r[1]
                if loc is _UNKNOWN or (loc is not _ABSENT and self.struct_strp_ok(read_at(info, pos, loc[0], 4))):
                    picked.append(i)
                continue
            if tag == TAG_SUBPROGRAM:
                loc = r[2]
                if loc is _ABSENT:
                    continue  # no code
                if loc is not _UNKNOWN:
                    low = read_at(info, pos, loc[0], loc[1])
                    if not low or not self._may_be_named(low):
                        continue
            if self._fn_ok(info, base, pos, r, offs, unit_off, unit_end, key, abbrevs, addr_size, codes):
                picked.append(i)
        return picked

    def _fn_ok(self, info: Any, base: int, pos: int, r: tuple[Any, ...], offs: Any, unit_off: int,
               unit_end: int, key: Any, abbrevs: dict[int, W._Abbrev], addr_size: int, codes: Any) -> bool:
        """Could this subprogram or inlined subroutine be one the scan acts on, by its own
        name or its origin's (True where not known here)?"""
        name = r[1]
        if name is _UNKNOWN:
            return True
        if name is not _ABSENT and self.fn_strp_ok(read_at(info, pos, name[0], 4)):
            return True
        ref = self._ref(info, pos, r, unit_off)
        if ref is None:
            return False
        if ref < 0:
            return True
        ok = self._origins.get(ref)
        if ok is None:
            ok = self._origins[ref] = self._origin_ok(info, base, ref, offs, unit_off, unit_end, key, abbrevs,
                                                      addr_size, codes)
        return ok

    @staticmethod
    def _ref(info: Any, pos: int, r: tuple[Any, ...], unit_off: int) -> int | None:
        """The DIE's abstract origin, else its specification (a section offset); None:
        neither; -1: not read in place."""
        for loc in (r[3], r[4]):
            if loc is _UNKNOWN:
                return -1
            if loc is not _ABSENT:
                v = read_at(info, pos, loc[0], loc[1])
                return v + unit_off if loc[2] in REF_FORMS else v
        return None

    def _origin_ok(self, info: Any, base: int, ref: int, offs: Any, unit_off: int, unit_end: int, key: Any,
                   abbrevs: dict[int, W._Abbrev], addr_size: int, codes: Any) -> bool:
        """Does the chain of origins from ``ref`` end at a name the scan acts on (True where
        it leaves what this unit's arrays hold)?"""
        reads = self._reads(key, abbrevs, addr_size)
        for _ in range(_ORIGIN_HOPS):
            if not unit_off <= ref < unit_end:
                return True
            i = bisect_left(offs, ref - base)
            if i >= len(offs) or offs[i] != ref - base:
                return True  # not a kept DIE
            code = codes[i]
            r = reads.get(code)
            if r is None:  # another tag: read its name and origins all the same
                r = self._other_reads(key, code, abbrevs, addr_size)
            pos = offs[i] + (1 if code < 0x80 else 2 if code < 0x4000 else 3)
            nxt = self._ref(info, pos, r, unit_off)
            if nxt is None:
                name = r[1]
                if name is _UNKNOWN:
                    return True
                return name is not _ABSENT and self.fn_strp_ok(read_at(info, pos, name[0], 4))
            if nxt < 0:
                return True
            ref = nxt
        return True

    def _other_reads(self, key: Any, code: int, abbrevs: dict[int, W._Abbrev], addr_size: int) -> tuple[Any, ...]:
        got = self._locs.get(("other", key))
        if got is None:
            if len(self._locs) >= 8:
                del self._locs[next(iter(self._locs))]
            got = self._locs[("other", key)] = {}
        r = got.get(code)
        if r is None:
            r = got[code] = _code_reads(abbrevs[code], addr_size)
        return r


def _code_reads(ab: W._Abbrev, addr_size: int) -> tuple[Any, ...]:
    """(tag, name, low_pc, abstract origin, specification) of an abbreviation, each
    ``peek_loc``'s (path, size, form), or _ABSENT, or _UNKNOWN (a name not in .debug_str
    too: the decoded DIE tells)."""
    reads: list[Any] = [ab.tag]
    for attr in (AT_NAME, AT_LOW_PC, AT_ABSTRACT_ORIGIN, AT_SPECIFICATION):
        loc = peek_loc(ab, attr, addr_size)
        reads.append(_UNKNOWN if loc is None else _ABSENT if loc[1] < 0 else loc)
    if reads[1] not in (_UNKNOWN, _ABSENT) and reads[1][2] != FORM_STRP:
        reads[1] = _UNKNOWN
    return tuple(reads)


def named_by_symbols(maybe: Any, every: Any) -> Callable[[int], bool]:
    """``Sieve``'s ``may_be_named`` from two sorted address arrays: the functions' with a
    symbol that may name them so, and every function's. An address without any symbol:
    the DWARF is asked."""
    def ok(addr: int) -> bool:
        i = bisect_left(maybe, addr)
        if i < len(maybe) and maybe[i] == addr:
            return True
        j = bisect_left(every, addr)
        return not (j < len(every) and every[j] == addr)

    return ok


class FileStrings:
    """``Sieve``'s ``prefix`` over a string section read from a file with ``pread``,
    through the 64 most recently read 8 KB blocks (512 KB: the walker's memory counts
    against the analysis; on the axum debug build 9,100 reads against 4,900 with 256
    blocks, in the same time)."""

    def __init__(self, fd: int, offset: int, size: int) -> None:
        self._fd, self._offset, self._size = fd, offset, size
        self._blocks: dict[int, bytes] = {}

    def prefix(self, strp: int, n: int) -> str:
        import os

        if not 0 <= strp < self._size:
            return ""
        k = strp >> 13
        blk = self._blocks.pop(k, None)
        if blk is None:
            blk = os.pread(self._fd, min(8192, self._size - (k << 13)), self._offset + (k << 13))
            if len(self._blocks) >= 64:
                del self._blocks[next(iter(self._blocks))]
        self._blocks[k] = blk
        at = strp & 8191
        raw = blk[at:at + n]
        if len(raw) < n and b"\0" not in raw:  # across blocks
            raw = os.pread(self._fd, min(n, self._size - strp), self._offset + strp)
        end = raw.find(b"\0")
        return (raw if end < 0 else raw[:end]).decode("utf-8", "replace")
