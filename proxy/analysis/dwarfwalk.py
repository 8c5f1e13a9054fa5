"""The DIE walk of one DWARF unit, and what it needs (abbreviations, forms): the part of the
DWARF reader that ``proxy.analysis.unitwalk``'s second process runs. It imports nothing
but ``array`` (that process starts with ``python -S``: each import is resident memory
counted against the analysis); ``dies.py`` builds the rest on it.
"""

from __future__ import annotations

from array import array

TAG_COMPILE_UNIT = 0x11


class DwarfFormatError(Exception):
    """The DWARF bytes cannot be read (corrupt, truncated, or a form we do not know)."""


# Form handling kinds.
_FIXED, _ULEB, _SLEB, _CSTR, _BLOCK_ULEB, _BLOCK1, _BLOCK2, _BLOCK4, _INDIRECT, _IMPLICIT = range(10)

# DW_FORM_* -> (kind, size) ; size is for _FIXED; "A" = address size, "O" = offset size (4)
_FORMS: dict[int, tuple[int, int]] = {
    0x01: (_FIXED, -1),  # addr
    0x03: (_BLOCK2, 0), 0x04: (_BLOCK4, 0),
    0x05: (_FIXED, 2), 0x06: (_FIXED, 4), 0x07: (_FIXED, 8),  # data2/4/8
    0x08: (_CSTR, 0),  # string
    0x09: (_BLOCK_ULEB, 0), 0x0A: (_BLOCK1, 0),  # block, block1
    0x0B: (_FIXED, 1),  # data1
    0x0C: (_FIXED, 1),  # flag
    0x0D: (_SLEB, 0),  # sdata
    0x0E: (_FIXED, 4),  # strp
    0x0F: (_ULEB, 0),  # udata
    0x10: (_FIXED, 4),  # ref_addr (DWARF >= 3, 32-bit)
    0x11: (_FIXED, 1), 0x12: (_FIXED, 2), 0x13: (_FIXED, 4), 0x14: (_FIXED, 8),  # ref1..8
    0x15: (_ULEB, 0),  # ref_udata
    0x16: (_INDIRECT, 0),
    0x17: (_FIXED, 4),  # sec_offset
    0x18: (_BLOCK_ULEB, 0),  # exprloc
    0x19: (_FIXED, 0),  # flag_present
    0x1A: (_ULEB, 0),  # strx
    0x1B: (_ULEB, 0),  # addrx
    0x1C: (_FIXED, 4),  # ref_sup4
    0x1D: (_FIXED, 4),  # strp_sup
    0x1E: (_FIXED, 16),  # data16
    0x1F: (_FIXED, 4),  # line_strp
    0x20: (_FIXED, 8),  # ref_sig8
    0x21: (_IMPLICIT, 0),  # implicit_const
    0x22: (_ULEB, 0), 0x23: (_ULEB, 0),  # loclistx, rnglistx
    0x24: (_FIXED, 8),  # ref_sup8
    0x25: (_FIXED, 1), 0x26: (_FIXED, 2), 0x27: (_FIXED, 3), 0x28: (_FIXED, 4),  # strx1-4
    0x29: (_FIXED, 1), 0x2A: (_FIXED, 2), 0x2B: (_FIXED, 3), 0x2C: (_FIXED, 4),  # addrx1-4
}
def _uleb(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _sleb(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            if b & 0x40:
                result -= 1 << shift
            return result, pos


class _Abbrev:
    """One abbreviation: its tag, whether it has children, and (attr, form, implicit value)
    per attribute."""

    __slots__ = ("tag", "has_children", "specs")

    def __init__(self, tag: int, has_children: bool, specs: tuple[tuple[int, int, int], ...]) -> None:
        self.tag, self.has_children, self.specs = tag, has_children, specs


def parse_abbrevs(data: bytes, offset: int) -> dict[int, _Abbrev]:
    table: dict[int, _Abbrev] = {}
    pos = offset
    while True:
        code, pos = _uleb(data, pos)
        if code == 0:
            return table
        tag, pos = _uleb(data, pos)
        has_children = data[pos] != 0
        pos += 1
        specs: list[tuple[int, int, int]] = []
        while True:
            attr = data[pos]  # one byte almost always (DW_AT_MIPS_linkage_name is two)
            if attr < 0x80:
                pos += 1
            else:
                attr, pos = _uleb(data, pos)
            form = data[pos]
            if form < 0x80:
                pos += 1
            else:
                form, pos = _uleb(data, pos)
            implicit = 0
            if form == 0x21:
                implicit, pos = _sleb(data, pos)
            if attr == 0 and form == 0:
                break
            specs.append((attr, form, implicit))
        table[code] = _Abbrev(tag, has_children, tuple(specs))


def skip_table(abbrevs: dict[int, _Abbrev], addr_size: int,
               keep_tags: frozenset[int] | None) -> list[tuple[int, tuple[object, ...], bool, bool] | None]:
    """Per abbreviation code (a list index): (fixed size or -1, skip steps, has_children,
    keep). The steps skip every attribute: an int >= 0 is a run of fixed-size bytes, a
    negative one is -1 - the kind of a variable-size form."""
    table: list[tuple[int, tuple[object, ...], bool, bool] | None] = [None] * (max(abbrevs, default=0) + 1)
    for code, ab in abbrevs.items():
        keep = keep_tags is None or ab.tag in keep_tags or ab.tag == TAG_COMPILE_UNIT
        steps: list[object] = []
        for _attr, form, _implicit in ab.specs:
            kind, size = _FORMS.get(form, (99, 0))
            if kind == _FIXED:
                size = addr_size if size < 0 else size
                if steps and steps[-1] >= 0:
                    steps[-1] += size
                else:
                    steps.append(size)
            elif kind != _IMPLICIT:
                steps.append(-1 - kind)
        steps = [st for st in steps if st != 0]
        fixed = steps[0] if len(steps) == 1 and steps[0] >= 0 else (0 if not steps else -1)
        table[code] = (fixed, tuple(steps), ab.has_children, keep)
    return table


def walk(info: bytes, pos: int, end: int, skips: list[object], unit_off: int,
         base: int = 0) -> tuple[array[int], array[int], array[int], array[int]]:
    """Walk a unit's DIEs from its unit DIE at ``pos`` to ``end`` once, decoding no
    attribute: each kept DIE leaves its offset, abbreviation code, kept parent (an index)
    and the end of its kept subtree (an index) in four arrays (16 bytes a DIE, against
    ~400 for a decoded one). ``info`` holds the section from ``base`` on (a unit read
    alone: ``proxy.analysis.unitwalk``); the offsets are ``info``'s. ``unit_off``: the
    unit's header, for messages."""
    # arrays while walking: an append costs what a list's does, and a DIE 16 bytes, not ~130
    offs, codes, pars, ends = array("I"), array("I"), array("i"), array("I")
    add_off, add_code, add_par, add_end = offs.append, codes.append, pars.append, ends.append
    # stack: a kept DIE's index (its subtree's end is written when it closes), or
    # -2 - parent for a DIE that is not kept (its children belong to its kept parent)
    stack = [-1]
    n = 0
    nskips = len(skips)
    while pos < end:
        die_off = pos
        code = info[pos]
        if code < 0x80:
            pos += 1
        elif info[pos + 1] < 0x80:  # two bytes: units with more than 127 abbreviations
            code = (code & 0x7F) | (info[pos + 1] << 7)
            pos += 2
        else:
            code, pos = _uleb(info, pos)
        if code == 0:
            if len(stack) > 1:
                e = stack.pop()
                if e >= 0:
                    ends[e] = n
            continue
        sk = skips[code] if code < nskips else None
        if sk is None:
            raise DwarfFormatError(f"unknown abbreviation {code} at {base + die_off:#x}")
        fixed, steps, has_children, keep = sk
        if fixed >= 0:
            pos += fixed
        else:
            for st in steps:
                if st >= 0:
                    pos += st
                    continue
                st = -1 - st
                if st == _ULEB or st == _SLEB:
                    while info[pos] & 0x80:
                        pos += 1
                    pos += 1
                elif st == _CSTR:
                    pos = info.index(b"\0", pos) + 1
                elif st == _BLOCK1:
                    pos += 1 + info[pos]
                elif st == _BLOCK_ULEB:
                    k = info[pos]
                    if k < 0x80:
                        pos += 1 + k
                    else:
                        k, pos = _uleb(info, pos)
                        pos += k
                elif st == _BLOCK2:
                    pos += 2 + int.from_bytes(info[pos : pos + 2], "little")
                elif st == _BLOCK4:
                    pos += 4 + int.from_bytes(info[pos : pos + 4], "little")
                elif st == _INDIRECT:
                    raise DwarfFormatError(f"DW_FORM_indirect at {base + die_off:#x} is not supported")
                else:
                    raise DwarfFormatError(f"unknown DW_FORM at {base + die_off:#x}")
        if keep:
            e = stack[-1]
            add_off(die_off)
            add_code(code)
            add_par(e if e >= 0 else -2 - e)
            if has_children:
                add_end(0)
                stack.append(n)
            else:
                add_end(n + 1)
            n += 1
        elif has_children:
            e = stack[-1]
            stack.append(e if e < 0 else -2 - e)
    if pos != end:
        raise DwarfFormatError(f"unit at {unit_off:#x}: DIEs overrun the unit end")
    for e in stack[1:]:  # a unit cut short of its closing null entries
        if e >= 0:
            ends[e] = n
    return offs, codes, pars, ends
