"""Addresses to source and back: ``pc_to_frames`` (with inlined frames, like gdb's ``bt``)
and ``line_to_pcs``.

Theory of operation: ``SourceMap(elf)`` keeps a ``DwarfView``. For a pc it
finds the unit through ``.debug_aranges``, decodes that unit's line program
once (pyelftools) into a sorted row table, and reads the unit's DIEs with the
fast reader to find the subprogram and the chain of
``DW_TAG_inlined_subroutine`` that cover the pc. The innermost frame's line
comes from the line table; each outer frame's line is the ``call_file`` /
``call_line`` of the inlined call below it. Without DWARF, the symbol table
gives the function name and no line.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_right
from dataclasses import dataclass
from typing import Any

from . import dies as D
from .demangle import demangle
from .dwarf import DwarfView, _v4_line_files, line_program_files
from .elf import ElfImage
from .model import Frame, SourceLoc


@dataclass(frozen=True, slots=True)
class _Rows:
    """A unit's line table, sorted by address, in arrays: ~25 bytes a row, where a list
    of tuples took ~125 (a first ``monitor async tree`` on the axum debug build keeps ~20
    units' tables: 60,000 rows)."""

    addrs: array[int]
    file_idx: array[int]
    lines: array[int]
    ends: bytes  # end_sequence
    files: list[str]
    version: int

    @staticmethod
    def of(rows: list[tuple[int, int, int, bool]], files: list[str], version: int) -> _Rows:
        """From (address, file index, line, end_sequence) rows in program order."""
        rows.sort(key=lambda r: (r[0], not r[3]))
        return _Rows(array("Q", [r[0] for r in rows]), array("Q", [r[1] for r in rows]),
                     array("q", [r[2] for r in rows]), bytes(r[3] for r in rows), files, version)

    def row(self, i: int) -> tuple[int, int, int, bool]:
        return self.addrs[i], self.file_idx[i], self.lines[i], bool(self.ends[i])

    def rows(self) -> list[tuple[int, int, int, bool]]:
        return [self.row(i) for i in range(len(self.addrs))]


class SourceMap:
    def __init__(self, elf: ElfImage, warnings: list[str] | None = None, dwarf: DwarfView | None = None) -> None:
        self.elf = elf
        self.warnings = warnings if warnings is not None else []
        self.dwarf = dwarf if dwarf is not None else DwarfView.open(elf, self.warnings)
        self._rows: dict[int, _Rows | None] = {}
        self._subs: dict[int, tuple[list[int], list[tuple[int, int, int, D.Die]], list[int]]] = {}

    # -- line tables -----------------------------------------------------------------
    def _line_rows(self, unit_off: int) -> _Rows | None:
        if unit_off in self._rows:
            return self._rows[unit_off]
        try:
            out = self._v4_rows(unit_off)
        except (IndexError, struct.error, ValueError, D.DwarfFormatError):
            out = None  # pyelftools reads it again, and says why
        if out is None:
            out = self._pyelf_rows(unit_off)
        self._rows[unit_off] = out
        return out

    def _pyelf_rows(self, unit_off: int) -> _Rows | None:
        """``_line_rows`` through pyelftools' line program reader (DWARF 5, or what
        ``_v4_rows`` does not read)."""
        out: _Rows | None = None
        assert self.dwarf is not None
        try:
            pyelf = self.dwarf.pyelf()
            cu = pyelf.get_CU_at(unit_off)
            lp = pyelf.line_program_for_CU(cu)
            if lp is not None:
                comp_dir = _s(cu.get_top_DIE().attributes.get("DW_AT_comp_dir"))
                files = line_program_files(lp, comp_dir)
                rows = []
                for e in lp.get_entries():
                    st = e.state
                    if st is not None:
                        rows.append((st.address, st.file, st.line, bool(st.end_sequence)))
                out = _Rows.of(rows, files, lp.header["version"])
        except Exception as e:  # pyelftools raises many kinds on corrupt input  # noqa: BLE001
            self.warnings.append(f"line table of unit {unit_off:#x} unreadable: {type(e).__name__}: {e}")
        return out

    def _v4_rows(self, unit_off: int) -> _Rows | None:
        """``_line_rows`` of a DWARF 2-4 line program, decoded here (pyelftools makes
        objects per opcode: 16x slower on the axum debug build, whose first ``monitor
        async tree`` reads ~20 units' programs); None: another version, or an opcode
        this decoder does not know (pyelftools then)."""
        assert self.dwarf is not None
        attrs, _ = self.dwarf.reader.unit_summary(unit_off)
        stmt = attrs.get(D.AT_STMT_LIST)
        data = self.dwarf.sections.get(".debug_line", b"")
        if stmt is None or not data:
            return None
        files = _v4_line_files(data, stmt, attrs.get(D.AT_COMP_DIR) or "")
        if files is None:
            return None
        rows = _v4_line_rows(data, stmt, int(self.dwarf.reader._header(unit_off)[1]))
        if rows is None:
            return None
        return _Rows.of(rows, files, struct.unpack_from("<H", data, stmt + 4)[0])

    def _file(self, rows: _Rows, index: int) -> str | None:
        i = index if rows.version >= 5 else index - 1
        return rows.files[i] if 0 <= i < len(rows.files) else None

    def pc_to_line(self, pc: int) -> SourceLoc | None:
        if self.dwarf is None:
            return None
        uo = self.dwarf.unit_offset_at(pc)
        rows = self._line_rows(uo) if uo is not None else None
        if rows is None:
            return None
        i = bisect_right(rows.addrs, pc) - 1
        if i < 0 or rows.ends[i]:
            return None
        fi, line = rows.file_idx[i], rows.lines[i]
        f = self._file(rows, fi)
        return SourceLoc(f, line) if f and line else None

    def line_to_pcs(self, file: str, line: int, near: int | None = None) -> list[int]:
        """Every is_stmt-or-not row address for file:line (file may be a suffix of the path).
        ``near``: only in the unit holding that pc (decoding every unit's line program of a
        release tokio binary takes ~10 s; one unit, milliseconds)."""
        if self.dwarf is None:
            return []
        out: set[int] = set()
        units = self.dwarf.unit_offsets
        if near is not None:
            uo_near = self.dwarf.unit_offset_at(near)
            units = [uo_near] if uo_near is not None else []
        for uo in units:
            rows = self._line_rows(uo)
            if rows is None:
                continue
            wanted = {i for i, f in enumerate(rows.files) if f == file or f.endswith("/" + file.lstrip("/"))}
            if not wanted:
                continue
            base = 0 if rows.version >= 5 else 1
            for addr, fi, ln, end in zip(rows.addrs, rows.file_idx, rows.lines, rows.ends):
                if not end and ln == line and fi - base in wanted and addr:
                    out.add(addr)
        return sorted(out)

    # -- frames ------------------------------------------------------------------------
    def pc_to_frames(self, pc: int) -> list[Frame]:
        """Source frames at pc, innermost first; inlined frames marked ``inlined``."""
        chain = self._die_chain(pc)
        if not chain:
            sym = self.elf.symbol_at(pc)
            if sym is None:
                return []
            return [Frame(sym.demangled, self.pc_to_line(pc))]
        assert self.dwarf is not None
        frames: list[Frame] = []
        loc = self.pc_to_line(pc)
        for unit, die in reversed(chain):  # innermost first
            name = self._fn_name(die)
            frames.append(Frame(name, loc, inlined=die.tag == D.TAG_INLINED_SUBROUTINE))
            if die.tag == D.TAG_INLINED_SUBROUTINE:
                f = self.dwarf.file_name(unit, die.get(D.AT_CALL_FILE))
                cl = die.get(D.AT_CALL_LINE)
                loc = SourceLoc(f, int(cl)) if f and cl else None
        return frames

    def _fn_name(self, die: D.Die) -> str:
        assert self.dwarf is not None
        d = self.dwarf.origin(die)
        link = d.get(D.AT_LINKAGE_NAME) or d.get(D.AT_MIPS_LINKAGE_NAME)
        if link:
            dem = demangle(link)
            if dem:
                return dem
        return _qualname(self.dwarf, d)

    def _die_chain(self, pc: int) -> list[tuple[D.Unit, D.Die]]:
        if self.dwarf is None:
            return []
        uo = self.dwarf.unit_offset_at(pc)
        unit = self.dwarf.unit(uo) if uo is not None else None
        if unit is None:
            return []
        top = self._subprogram_at(unit, pc)
        if top is None:
            return []
        chain: list[tuple[D.Unit, D.Die]] = [(unit, top)]
        children = top.children
        while True:
            hit = None
            for c in children:
                d = unit.dies[c]
                if d.tag in (D.TAG_SUBPROGRAM, D.TAG_INLINED_SUBROUTINE, D.TAG_LEXICAL_BLOCK):
                    # a lexical block is kept only by views that ask (proxy.reflect.stacks)
                    if any(lo <= pc < hi for lo, hi in self.dwarf.die_ranges(unit, d)):
                        hit = d
                        break
                elif d.tag in (D.TAG_NAMESPACE, D.TAG_STRUCTURE, D.TAG_UNION, D.TAG_ENUMERATION):
                    if self._contains_pc(unit, d, pc):
                        hit = d
                        break
            if hit is None:
                return chain
            if hit.tag in (D.TAG_SUBPROGRAM, D.TAG_INLINED_SUBROUTINE):
                chain.append((unit, hit))
            children = hit.children

    def _subprogram_at(self, unit: D.Unit, pc: int) -> D.Die | None:
        """The outermost subprogram with code at pc: through a per-unit table of every
        subprogram under the unit's namespaces and types, sorted by address, built once.
        (A linear walk of std's unit costs ~10 ms per frame; stack discovery asks for
        dozens of frames per stop.)"""
        idx = self._subs.get(unit.offset)
        if idx is None:
            idx = self._subs[unit.offset] = self._index_subprograms(unit)
        starts, entries, reach = idx
        i = bisect_right(starts, pc) - 1
        best = None
        # ranges may nest or overlap: look back over every entry that can still reach pc
        while i >= 0 and reach[i] > pc:
            lo, hi, order, die = entries[i]
            if lo <= pc < hi and (best is None or order < best[0]):
                best = (order, die)
            i -= 1
        if best is None:
            return None
        die = best[1]
        return die if isinstance(die, D.Die) else unit.dies.at(die)  # type: ignore[union-attr]

    def _index_subprograms(self, unit: D.Unit) -> tuple[list[int], list[tuple[int, int, int, D.Die | int]], list[int]]:
        entries: list[tuple[int, int, int, D.Die | int]]
        if isinstance(unit.dies, D.Dies):
            entries = self._subprograms_with_code(unit)  # type: ignore[assignment]
        else:
            entries = self._subprograms_walked(unit)  # type: ignore[assignment]
        entries.sort(key=lambda e: (e[0], e[2]))
        reach, far = [], 0  # reach[i]: the highest end among entries[:i+1]
        for lo, hi, _, _ in entries:
            far = max(far, hi)
            reach.append(far)
        return [e[0] for e in entries], entries, reach

    def _subprograms_with_code(self, unit: D.Unit) -> list[tuple[int, int, int, int]]:
        """``_subprograms_walked`` from the unit's arrays, with each DIE's index in them
        (``Dies.at``) for the DIE: the subprograms whose every ancestor is a namespace or
        a type, numbered in document order, of those only the ones whose abbreviation can
        give code (a low_pc, not 0, or ranges). No DIE is decoded where the abbreviation
        puts low_pc and high_pc at fixed places: they are read for every such subprogram
        at once (a first ``monitor async tree`` on the axum debug build decoded ~10^4
        subprograms of ~25 units for this, a third of its stack discovery)."""
        import numpy as np

        assert self.dwarf is not None
        dies = unit.dies
        assert isinstance(dies, D.Dies)
        codes = np.frombuffer(dies._codes, dtype=np.uint32)
        pars = np.frombuffer(dies._pars, dtype=np.int32)
        tags = dies._reader.tag_table(dies._abbrevs)[codes]
        holder = np.isin(tags, _HOLDERS)
        holder[0] = True  # the unit DIE
        # reached: every kept ancestor below the unit DIE holds (parents come first: one
        # level of nesting per round)
        par = np.maximum(pars, 0)
        reached = holder[par]
        reached[0] = False
        while True:
            nxt = reached & ((pars <= 0) | reached[par])
            if np.array_equal(nxt, reached):
                break
            reached = nxt
        subs = np.nonzero(reached & (tags == D.TAG_SUBPROGRAM))[0]
        if not subs.size:
            return []
        order = np.arange(subs.size)  # a subprogram's rank in document order
        # per abbreviation: 0 no code, 1 a low_pc alone (0: dropped by the linker), 2 ranges
        how = np.zeros(int(codes.max()) + 1, dtype=np.uint8)
        for code, ab in dies._abbrevs.items():
            if code < how.size:
                attrs = {a for a, _f, _i in ab.specs}
                how[code] = 2 if D.AT_RANGES in attrs else 1 if D.AT_LOW_PC in attrs else 0
        sub_codes = codes[subs]
        kind = how[sub_codes]
        keep = kind > 0
        subs, order, kind, sub_codes = subs[keep], order[keep], kind[keep], sub_codes[keep]
        # low and high read in place, by abbreviation (-1: decode the DIE)
        low = np.full(subs.size, -1, dtype=np.int64)
        high = np.zeros(subs.size, dtype=np.int64)
        info = dies._reader.info
        if isinstance(info, bytes) and subs.size:
            data = np.frombuffer(info, dtype=np.uint8)
            offs = np.frombuffer(dies._offs, dtype=np.uint32)[subs].astype(np.int64)
            for code in np.unique(sub_codes[kind == 1]).tolist():
                place = _pc_places(dies._abbrevs[code], dies._addr_size)
                if place is None:
                    continue
                sel = np.nonzero(sub_codes == code)[0]
                start = offs[sel] + len(D._uleb_bytes(code))
                lo = _read_le(data, start + place[0], place[1])
                hi = _read_le(data, start + place[2], place[3])
                low[sel] = lo
                high[sel] = hi + lo if place[4] else hi
        entries: list[tuple[int, int, int, int]] = []
        for i, rank, lo, hi in zip(subs.tolist(), order.tolist(), low.tolist(), high.tolist()):
            if lo > 0:
                entries.append((lo, hi, rank, i))
            elif lo < 0:
                if how[dies._codes[i]] == 1 and dies.peek(i, D.AT_LOW_PC) == 0:
                    continue
                for a, b in self.dwarf.die_ranges(unit, dies.at(i)):
                    entries.append((a, b, rank, i))
        return entries

    def _subprograms_walked(self, unit: D.Unit) -> list[tuple[int, int, int, D.Die]]:
        """(low, high, document order, DIE) of every subprogram with code under the
        unit's namespaces and types (not inside another subprogram): a walk of the tree."""
        assert self.dwarf is not None
        entries: list[tuple[int, int, int, D.Die]] = []
        order = 0
        stack = list(reversed(unit.top_die.children))  # document order: the first match wins
        while stack:
            d = unit.dies[stack.pop()]
            if d.tag == D.TAG_SUBPROGRAM:
                for lo, hi in self.dwarf.die_ranges(unit, d):
                    entries.append((lo, hi, order, d))
                order += 1
            elif d.tag in (D.TAG_NAMESPACE, D.TAG_STRUCTURE, D.TAG_UNION, D.TAG_ENUMERATION):
                stack.extend(reversed(d.children))
        return entries

    def _contains_pc(self, unit: D.Unit, d: D.Die, pc: int) -> bool:
        """Does a namespace/type hold a subprogram covering pc (searched shallowly)."""
        assert self.dwarf is not None
        stack = list(d.children)
        while stack:
            c = unit.dies[stack.pop()]
            if c.tag == D.TAG_SUBPROGRAM:
                if any(lo <= pc < hi for lo, hi in self.dwarf.die_ranges(unit, c)):
                    return True
            elif c.tag in (D.TAG_NAMESPACE, D.TAG_STRUCTURE, D.TAG_UNION, D.TAG_ENUMERATION):
                stack.extend(c.children)
        return False


def _v4_line_rows(data: bytes, off: int, addr_size: int) -> list[tuple[int, int, int, bool]] | None:
    """The rows (address, file index, line, end_sequence) of the DWARF 2-4 line program at
    ``off``, as pyelftools' ``get_entries`` states give them; None for another version or
    an opcode not known here. DW_LNE_define_file adds no file (``line_program_files``
    lists the header's)."""
    length, version, header_length = struct.unpack_from("<IHI", data, off)
    if length >= 0xFFFFFFF0 or not 2 <= version <= 4:
        return None
    end = off + 4 + length
    pos = off + 10
    min_inst = data[pos]
    max_ops = 1
    if version >= 4:
        max_ops = data[pos + 1] or 1
        pos += 1
    line_base = data[pos + 2] - 256 if data[pos + 2] >= 128 else data[pos + 2]
    line_range = data[pos + 3]
    opcode_base = data[pos + 4]
    if max_ops != 1 or not line_range:
        return None  # VLIW op_index: pyelftools
    pos = off + 10 + header_length
    rows: list[tuple[int, int, int, bool]] = []
    address, file, line = 0, 1, 1
    uleb, sleb = D._uleb, D._sleb
    const_add = ((255 - opcode_base) // line_range) * min_inst
    while pos < end:
        op = data[pos]
        pos += 1
        if op >= opcode_base:
            adj = op - opcode_base
            address += (adj // line_range) * min_inst
            line += line_base + adj % line_range
            rows.append((address, file, line, False))
        elif op == 0:
            n, pos = uleb(data, pos)
            sub = data[pos]
            if sub == 1:  # end_sequence
                rows.append((address, file, line, True))
                address, file, line = 0, 1, 1
            elif sub == 2:  # set_address
                address = int.from_bytes(data[pos + 1:pos + 1 + addr_size], "little")
            pos += n
        elif op == 1:  # copy
            rows.append((address, file, line, False))
        elif op == 2:  # advance_pc
            v, pos = uleb(data, pos)
            address += v * min_inst
        elif op == 3:  # advance_line
            v, pos = sleb(data, pos)
            line += v
        elif op == 4:  # set_file
            file, pos = uleb(data, pos)
        elif op in (5, 12):  # set_column, set_isa
            _, pos = uleb(data, pos)
        elif op in (6, 7, 10, 11):  # negate_stmt, basic_block, prologue_end, epilogue_begin
            pass
        elif op == 8:  # const_add_pc
            address += const_add
        elif op == 9:  # fixed_advance_pc
            address += int.from_bytes(data[pos:pos + 2], "little")
            pos += 2
        else:
            return None
    return rows


def _qualname(dwarf: DwarfView, die: D.Die) -> str:
    parts = [die.get(D.AT_NAME) or "?"]
    unit = dwarf.unit_of(die)
    p = die.parent
    while unit is not None and p is not None:
        pd = unit.dies[p]
        if pd.tag in (D.TAG_NAMESPACE, D.TAG_STRUCTURE, D.TAG_UNION, D.TAG_ENUMERATION):
            parts.append(pd.get(D.AT_NAME) or "?")
        p = pd.parent
    return "::".join(reversed(parts))


def _s(v: Any) -> str:
    if v is None:
        return ""
    val = v.value if hasattr(v, "value") else v
    return val.decode("utf-8", "replace") if isinstance(val, bytes) else str(val)


_HOLDERS = (D.TAG_NAMESPACE, D.TAG_STRUCTURE, D.TAG_UNION, D.TAG_ENUMERATION)
_HIGH_PC_LENGTH_FORMS = frozenset({0x05, 0x06, 0x07, 0x0B})  # data2/4/8, data1: high_pc is a length


def _pc_places(ab: D._Abbrev, addr_size: int) -> tuple[int, int, int, int, bool] | None:
    """Where a subprogram of this abbreviation holds DW_AT_low_pc and DW_AT_high_pc:
    (low's offset past the code, its size, high's offset, its size, high is a length),
    or None when either is not at a fixed place (an attribute of variable size before
    it, another form) or absent."""
    pos = 0
    low = high = None
    for attr, form, _ in ab.specs:
        kind, size = D._FORMS.get(form, (-1, 0))
        if kind == D._IMPLICIT:
            if attr in (D.AT_LOW_PC, D.AT_HIGH_PC):
                return None
            continue
        if kind != D._FIXED:
            break
        size = addr_size if size < 0 else size
        if attr == D.AT_LOW_PC and form == 0x01:
            low = (pos, size)
        elif attr == D.AT_HIGH_PC and (form == 0x01 or form in _HIGH_PC_LENGTH_FORMS):
            high = (pos, size, form != 0x01)
        pos += size
    if low is None or high is None:
        return None
    return low[0], low[1], high[0], high[1], high[2]


def _read_le(data: Any, at: Any, size: int) -> Any:
    """The little-endian unsigned values ``size`` bytes long at the positions ``at`` of the
    byte array ``data`` (numpy), as int64 (addresses of x86-64 user space fit)."""
    import numpy as np

    out = np.zeros(at.size, dtype=np.int64)
    for k in range(size):
        out |= data[at + k].astype(np.int64) << (8 * k)
    return out
_MAPS: dict[str, SourceMap] = {}


def pc_to_frames(elf: ElfImage, pc: int) -> list[Frame]:
    """Module-level convenience: frames for a link-time pc (one SourceMap per file)."""
    return _map(elf).pc_to_frames(pc)


def line_to_pcs(elf: ElfImage, file: str, line: int) -> list[int]:
    return _map(elf).line_to_pcs(file, line)


def _map(elf: ElfImage) -> SourceMap:
    m = _MAPS.get(elf.path)
    if m is None or m.elf is not elf:
        m = _MAPS[elf.path] = SourceMap(elf)
    return m
