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


# the shapes of an abbreviation's attributes (skip_table): fixed size; fixed bytes, one
# uleb or sleb, fixed bytes; fixed bytes, one block with a uleb length (an exprloc), fixed
# bytes; anything else (the steps one at a time)
_FIXED_SHAPE, _ULEB_SHAPE, _BLOCK_SHAPE, _STEPS_SHAPE = range(4)


def skip_table(abbrevs: dict[int, _Abbrev], addr_size: int,
               keep_tags: frozenset[int] | None) -> list[tuple[int, int, int, tuple[int, ...], bool, bool] | None]:
    """Per abbreviation code (a list index, at least 128 long): (shape, a, b, steps,
    has_children, keep), None for an unknown code. The steps skip every attribute: an
    int >= 0 is a run of fixed-size bytes, a negative one is -1 - the kind of a
    variable-size form. The shape lets ``walk`` skip the common abbreviations without
    going through the steps (half the DIEs of a debug build have one variable-size
    attribute, a member's offset or a variable's location): ``_FIXED_SHAPE`` a bytes;
    ``_ULEB_SHAPE`` and ``_BLOCK_SHAPE`` a bytes, the variable-size form, b bytes."""
    table: list[tuple[int, int, int, tuple[int, ...], bool, bool] | None] = (
        [None] * max(max(abbrevs, default=0) + 1, 0x80))
    for code, ab in abbrevs.items():
        keep = keep_tags is None or ab.tag in keep_tags or ab.tag == TAG_COMPILE_UNIT
        steps: list[int] = []
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
        var = [i for i, st in enumerate(steps) if st < 0]
        shape, a, b = _STEPS_SHAPE, 0, 0
        if not var:
            shape, a = _FIXED_SHAPE, sum(steps)
        elif len(var) == 1 and -1 - steps[var[0]] in (_ULEB, _SLEB, _BLOCK_ULEB):
            i = var[0]
            shape = _BLOCK_SHAPE if -1 - steps[i] == _BLOCK_ULEB else _ULEB_SHAPE
            a, b = sum(steps[:i]), sum(steps[i + 1:])
        table[code] = (shape, a, b, tuple(steps), ab.has_children, keep)
    return table


def walk(info: bytes, pos: int, end: int, skips: list[object], unit_off: int,
         base: int = 0) -> tuple[array[int], array[int], array[int], array[int]]:
    """Walk a unit's DIEs from its unit DIE at ``pos`` to ``end`` once, decoding no
    attribute: each kept DIE leaves its offset, abbreviation code, kept parent (an index)
    and the end of its kept subtree (an index) in four arrays (16 bytes a DIE, against
    ~400 for a decoded one). ``info`` holds the section from ``base`` on (a unit read
    alone: ``proxy.analysis.unitwalk``); the offsets are ``info``'s. ``unit_off``: the
    unit's header, for messages. ``skips``: ``skip_table``'s."""
    # arrays while walking: an append costs what a list's does, and a DIE 16 bytes, not ~130
    offs, codes, pars, ends = array("I"), array("I"), array("i"), array("I")
    add_off, add_code, add_par, add_end = offs.append, codes.append, pars.append, ends.append
    # stack: a kept DIE's index (its subtree's end is written when it closes), or
    # -2 - parent for a DIE that is not kept (its children belong to its kept parent);
    # top: its last entry
    stack = [-1]
    push, pop = stack.append, stack.pop
    top = -1
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
                e = pop()
                if e >= 0:
                    ends[e] = n
                top = stack[-1]
            continue
        sk = skips[code] if code < nskips else None
        if sk is None:
            raise DwarfFormatError(f"unknown abbreviation {code} at {base + die_off:#x}")
        shape, a, b, steps, has_children, keep = sk  # type: ignore[misc]
        if shape == _FIXED_SHAPE:
            pos += a
        elif shape == _ULEB_SHAPE:
            pos += a
            while info[pos] & 0x80:
                pos += 1
            pos += 1 + b
        elif shape == _BLOCK_SHAPE:
            pos += a
            k = info[pos]
            if k < 0x80:
                pos += 1 + k + b
            else:
                k, pos = _uleb(info, pos)
                pos += k + b
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
            add_off(die_off)
            add_code(code)
            add_par(top if top >= 0 else -2 - top)
            if has_children:
                add_end(0)
                push(n)
                top = n
            else:
                add_end(n + 1)
            n += 1
        elif has_children:
            top = top if top < 0 else -2 - top
            push(top)
    if pos != end:
        raise DwarfFormatError(f"unit at {unit_off:#x}: DIEs overrun the unit end")
    for e in stack[1:]:  # a unit cut short of its closing null entries
        if e >= 0:
            ends[e] = n
    return offs, codes, pars, ends
