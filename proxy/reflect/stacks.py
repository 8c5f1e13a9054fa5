"""Task discovery from the threads' stacks (DESIGN.md §4).

At a stop, every thread's stack is unwound with the CFI unwinder
(``proxy.analysis.unwind``) from the registers the session read (``g`` per
thread). For each frame, the DIEs covering its pc (the subprogram and every
inlined subroutine, ``proxy.analysis.lines``) name the frame's parameters and
variables; those whose type is a coroutine state machine, ``GenFuture<ENV>``
(rustc 1.63), or a pointer / ``Pin<&mut _>`` to one, are located with their
DWARF location at that pc (an expression or a location list) and evaluated
with the frame's registers: a coroutine's address. That finds

* the resume functions being polled (their ``self``: in release builds, the
  out-of-line resume function's location list names the callee-saved
  register that holds it at the call of the child, which the CFI restores);
* the futures an executor polls from its own frame, ``block_on``'s pinned
  future in particular, which no task list holds.

Facts (rustc 1.95 and 1.63, corpus): inlined coroutines' ``self`` parameters
have no location at all in release builds (the out-of-line parent's does);
``block_on<F>``'s pinned ``f`` is optimized out in release builds. For such
frames (a subprogram or inlined subroutine with a template type parameter
that is a coroutine, and no located variable of that type) the physical
frame ``[sp, cfa)`` is scanned for a value of that type in a suspended state
whose walk is fully readable; a unique survivor is taken (``found by scan``). A type
that a future found on the same thread already holds is not scanned for (``held_layouts``:
the executor's future was moved into that one).
Several are narrowed to those whose saved locals hold valid values
(``validity``), then to those whose awaitee coroutine is suspended (``awaiting``); if that
leaves several, they are reported as ambiguous and
none taken. A value-typed variable
must be suspended (a moved-from copy keeps ``Unresumed``); a pointer may
point at a coroutine in any valid state (one running its first poll still
says ``Unresumed``).

Pure: memory comes from the reflector's ``BlockReader``; registers from the
caller. Every step is bounded (frames per thread, scan bytes, locations).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from proxy.analysis import dies as D
from proxy.analysis.dwarf import STACK_TAGS, DwarfView
from proxy.analysis.elf import ElfImage
from proxy.analysis.lines import SourceMap, _qualname
from proxy.analysis.model import Inventory, Layout
from proxy.analysis.unwind import DWARF_REGS, Unwinder, UnwoundFrame
from proxy.arch import X86_64, Arch, for_machine

from . import framecache
from .framecache import FrameFacts, Scope
from .memory import BLOCK, BlockReader
from .node import short_type
from .tree import Root
from .validity import Validity
from .walker import Node, Reflector

# gdb's amd64 `g` block order: 16 GPRs, then rip (8 bytes each)
G_ORDER = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
           "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rip")
MAX_FRAMES = 64
PREFETCH = 16 * BLOCK  # stack bytes read up front from each thread's sp (one pass)
MAX_SCAN = 64 << 10  # bytes of one frame scanned for a pinned future
RA_SCAN = 4096  # bytes above sp searched for a return address into the program
# forms that reach outside the unit: ref_addr, indirect, ref_sup4, ref_sig8, ref_sup8
_FOREIGN_FORMS = frozenset({0x10, 0x16, 0x1C, 0x20, 0x24})
_SYSROOT_CRATES = ("std::", "core::", "alloc::", "<std::", "<core::", "<alloc::")


def parse_g(reply: bytes, arch: Arch = X86_64) -> dict[str, int] | None:
    """The integer registers from a ``g`` reply in ``arch``'s order (hex; ``xx`` =
    unavailable): x86-64's 16 GPRs and rip (gdb's amd64 order, ``G_ORDER``), AArch64's
    x0-x30, sp and pc."""
    try:
        data = bytes.fromhex(reply.replace(b"xx", b"00").decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
    if len(data) < max(off for _, _, off in arch.regs) + 8:
        return None
    return {n: int.from_bytes(data[off:off + 8], "little") for n, _, off in arch.regs}


@dataclass(frozen=True, slots=True)
class Found:
    addr: int
    type_name: str
    thread: int
    function: str  # the frame that holds it
    how: str  # "location" | "scan"
    polling: bool = False  # the self of the frame's own resume function: it runs now


class StackFinder:
    def __init__(self, elf: ElfImage, inv: Inventory, bias: int, cache_dir: Path | None = None,
                 use_cache: bool = True) -> None:
        self.inv = inv
        self.bias = bias
        self.machine = elf.machine
        self.warnings: list[str] = []
        self.dwarf = DwarfView.open(elf, self.warnings, STACK_TAGS)  # units are read on a facts() miss
        self.map = SourceMap(elf, self.warnings, self.dwarf) if self.dwarf is not None else None
        self.cache_dir = cache_dir
        self._facts: dict[int, FrameFacts | None] = {}
        # the inventory's build-id is the file's (an inventory of another file: no cache)
        self._use_cache = use_cache and bool(inv.build_id) and elf.build_id == inv.build_id
        if self._use_cache and inv.build_id:
            self._facts = framecache.load(inv.build_id, cache_dir)
        self._facts_dirty = False
        self._sysroot: dict[int, bool] = {}  # unit offset -> a std unit that cannot hold a program coroutine
        self.unwinder = Unwinder(elf, bias)
        self._types: dict[int, tuple[str, str, int] | None] = {}
        self.validity = Validity(inv)
        self.notes: list[str] = []  # ambiguous scans, last discovery
        # per thread, the located coroutines in frame order (innermost first), last discovery
        self.chains: dict[int, list[tuple[int, str] | None]] = {}
        # link-time pc (the call in it) of the resume frame that polls each chain entry, last discovery
        self.chain_pcs: dict[tuple[int, str], int] = {}
        # A thread stopped outside the program enters it where the libraries' own CFI says
        # (regs, read, in_program) -> the registers of the first program frame, or None; set
        # when the libraries are known (a core or a copied process: proxy.corefile.program).
        # The return-address scan below guesses wrong when a libc frame holds a stale one:
        # abort()'s, after a panic hook's eprintln, held a write_fmt return address.
        self.enter: Callable[[dict[str, int], Callable[[int, int], bytes | None],
                              Callable[[int, bool], bool]], dict[str, int] | None] | None = None
        # per thread, the link-time pc of every frame unwound (innermost first; a caller's pc
        # is its call's, one byte back), last discovery: the lines of inlined pollers
        self.frame_pcs: dict[int, list[int]] = {}

    # -- entry ---------------------------------------------------------------------------
    def find(self, r: Reflector, threads: dict[int, dict[str, int]]) -> list[Found]:
        self.notes = []
        arch = for_machine(self.machine)
        if arch is None or not arch.unwinding:
            # the unwinder knows x86-64's and AArch64's CFI columns (another CPU's stack
            # would be read at the wrong registers)
            self.notes.append(arch.unsupported("stack discovery") if arch is not None else
                              f"stack discovery: x86-64 only so far; this program is {self.machine}")
            return []
        R = self.unwinder.regs
        for regs in threads.values():  # one pass brings the usual stack in
            sp = regs.get(R.sp, 0)
            for base in range(sp - sp % BLOCK, sp + PREFETCH, BLOCK):
                r.mem.read(base, 1)
        out: dict[tuple[int, str], Found] = {}  # a child stored at offset 0 shares its parent's address
        self.chains = {}
        self.chain_pcs = {}
        self.frame_pcs = {}
        unwound: dict[int, list[UnwoundFrame] | str] = {}
        for tid, regs in sorted(threads.items()):
            try:
                unwound[tid] = self._unwind(r, regs)
            except Exception as e:  # noqa: BLE001 - corrupt CFI must not end the command
                unwound[tid] = f"thread {tid}: unwinding failed ({type(e).__name__})"
        self._prefetch(unwound)
        try:
            self._find(r, threads, unwound, out)
        finally:
            if self.dwarf is not None:
                self.dwarf.end_prefetch()
                self.dwarf.drop_handed()  # the inventory's walks this discovery did not take
        if self._use_cache:
            self.save_facts()
        return list(out.values())

    def _prefetch(self, unwound: dict[int, list[UnwoundFrame] | str]) -> None:
        """Have the units behind the frames whose facts are unknown walked by a second
        process while this one reads the first ones (``DwarfView.prefetch``)."""
        if self.dwarf is None:
            return
        units: dict[int, None] = {}
        for frames in unwound.values():
            for i, frame in enumerate(frames if isinstance(frames, list) else ()):
                pc = frame.pc - self.bias - (1 if i else 0)
                if pc in self._facts:
                    continue
                uo = self.dwarf.unit_offset_at(pc)
                if uo is not None and uo not in units and not self._sysroot_unit(uo):
                    units[uo] = None
        if len(units) > 1:
            self.dwarf.prefetch(list(units))

    def _find(self, r: Reflector, threads: dict[int, dict[str, int]], unwound: dict[int, list[UnwoundFrame] | str],
              out: dict[tuple[int, str], Found]) -> None:
        for tid, regs in sorted(threads.items()):
            frames = unwound[tid]
            if isinstance(frames, str):
                self.notes.append(frames)
                continue
            # the stack's extent: the outermost sane CFA (a last frame unwound through a
            # garbage rbp chain can say anything)
            sp0 = regs.get(self.unwinder.regs.sp, 0)
            top = max((f.cfa for f in frames if f.cfa and sp0 < f.cfa < sp0 + (8 << 20)), default=sp0)
            located: set[str] = set()
            wanted: dict[str, tuple[str, int, int]] = {}  # layout -> (function, sp, cfa) of the innermost frame
            chain: list[tuple[int, str] | None] = []  # innermost first: who polls whom on this thread
            self.frame_pcs[tid] = [f.pc - self.bias - (1 if i else 0) for i, f in enumerate(frames)]
            for i, frame in enumerate(frames):
                polled = False
                for f in self._frame(r, tid, frame, i, wanted):
                    out.setdefault((f.addr, f.type_name), f)
                    located.add(f.type_name)
                    if f.polling and (f.addr, f.type_name) not in chain:
                        chain.append((f.addr, f.type_name))
                        self.chain_pcs.setdefault((f.addr, f.type_name), frame.pc - self.bias - (1 if i else 0))
                        polled = True
                if not polled and self.inv.resume_fn_at(frame.pc - self.bias - (1 if i else 0)) is not None:
                    chain.append(None)  # a resume frame whose self is unknown or garbage: no link across it
            self.chains[tid] = chain
            held: set[str] | None = None
            for layout, (fname, sp, cfa) in wanted.items():
                if layout in located:
                    continue
                if held is None:
                    held = held_layouts(r, [f for f in out.values() if f.thread == tid])
                if layout in held:
                    continue
                # That frame first, then its callers': a by-value argument may live in its
                # caller's memory. Fact (stuck mt, release, under load, 1 stop in ~10): a
                # caller's frame can hold a stale image of the same future in an older
                # suspended state (run at `sleep` while the live one in block_on's own
                # frame is at `pending`), so a unique hit in the frame itself wins.
                hits = owned_images(r, self.inv.layouts[layout],
                                    lambda lo, hi: self._narrow(r, layout, self._scan(r, lo, hi, layout)), sp, cfa, top)
                if len(hits) > 1:
                    hits = pinned(r, hits, sp0, top)
                if len(hits) > 1:
                    hits = unoverlapped(r, self.inv.layouts[layout], hits)
                if len(hits) == 1:
                    out.setdefault((hits[0], layout), Found(hits[0], layout, tid, fname, "scan"))
                elif hits:
                    self.notes.append(f"thread {tid}: {len(hits)} candidates for {layout} in {fname} "
                                      f"(sp {sp:#x}, cfa {cfa:#x}: {', '.join(hex(h) for h in hits)}); none taken")

    def _unwind(self, r: Reflector, regs: dict[str, int]) -> list[UnwoundFrame]:
        """The thread's frames. A thread stopped outside the program (in libc's ``syscall``
        or futex wrappers, whose CFI the proxy does not have) is entered at the first
        return address into the program's code found on its stack: the rbp chain
        guesses wrong there when rbp is not a frame pointer (rustc 1.63 release)."""
        R = self.unwinder.regs
        pc = regs.get(R.pc, 0)
        if self._in_program(pc, call=False):
            return self.unwinder.unwind(regs, r.mem.read, max_frames=MAX_FRAMES)
        sp = regs.get(R.sp, 0)
        entered = self.enter(regs, r.mem.read, self._in_program) if self.enter is not None else None
        if entered is not None:
            frames = self.unwinder.unwind(entered, r.mem.read, max_frames=MAX_FRAMES)
            return [UnwoundFrame(pc, entered.get(R.sp), sp, "none", tuple(regs.items()))] + frames
        if R.ra_in_register:
            # AArch64: the return address lies in a frame record, not at the caller's sp - 8
            # (this scan's x86-64 rule); the frame-record chain from x29 enters the program
            return self._enter_by_frame_records(r, regs)
        for slot in range(sp, sp + RA_SCAN, 8):
            ra = r.mem.word(slot)
            if ra is None:
                break
            if self._in_program(ra, call=True):
                outer = dict(regs, rip=ra, rsp=slot + 8)
                frames = self.unwinder.unwind(outer, r.mem.read, max_frames=MAX_FRAMES)
                return [UnwoundFrame(pc, slot + 8, sp, "none", tuple(regs.items()))] + frames
        return []

    def _in_program(self, addr: int, call: bool) -> bool:
        """Is addr in the program's code with CFI (and, for a return address, after a call)?"""
        link = addr - self.bias
        if link <= 0 or self.unwinder.fde_for(link - (1 if call else 0)) is None:
            return False
        if not call:
            return True
        if self.unwinder.regs.ra_in_register:  # A64: after a `bl` or a `blr`
            code = self.unwinder.elf.read(link - 4, 4)
            word = int.from_bytes(code, "little") if code is not None and len(code) == 4 else 0
            return word & 0xFC000000 == 0x94000000 or word & 0xFFFFFC1F == 0xD63F0000
        code = self.unwinder.elf.read(link - 7, 7)
        return code is not None and (code[2] == 0xE8 or code[5] == 0xFF or code[4] == 0xFF
                                     or code[1] == 0xFF or code[0] == 0xFF)

    def _enter_by_frame_records(self, r: Reflector, regs: dict[str, int]) -> list[UnwoundFrame]:
        """A thread stopped outside the program on AArch64: the chain of frame records from
        x29 (the caller's x29 at [x29], its pc at [x29 + 8]) up to the first return address
        into the program's code; the program's frames from there by its CFI."""
        R = self.unwinder.regs
        pc, sp, fp = regs.get(R.pc, 0), regs.get(R.sp, 0), regs.get(R.fp, 0)
        for _ in range(64):
            if not sp <= fp < sp + (8 << 20) or fp % 8:
                break
            saved, ra = r.mem.word(fp), r.mem.word(fp + 8)
            if saved is None or ra is None:
                break
            if self._in_program(ra, call=True):
                outer = {R.pc: ra, R.sp: fp + 16, R.fp: saved}
                frames = self.unwinder.unwind(outer, r.mem.read, max_frames=MAX_FRAMES)
                return [UnwoundFrame(pc, fp + 16, sp, "none", tuple(regs.items()))] + frames
            if saved <= fp:
                break
            fp = saved
        return []

    # -- one frame -----------------------------------------------------------------------
    def _frame(self, r: Reflector, tid: int, frame: UnwoundFrame, depth: int,
               wanted: dict[str, tuple[str, int, int]]) -> Iterator[Found]:
        pc = frame.pc - self.bias - (1 if depth else 0)  # a return address: the call itself
        facts = self.facts(pc)
        if facts is None:
            return
        regs = dict(frame.regs)
        resume = self.inv.resume_fn_at(pc)  # the physical frame polls this coroutine
        fbase = None
        if facts.frame_base is not None:
            got = evaluate(facts.frame_base, regs, None, frame.cfa, r.mem, self.bias, self.unwinder.regs.names)
            fbase = got[1] if got is not None else None
        for scope in facts.scopes:
            for mode, layout, extra, expr in scope.variables:
                got = evaluate(expr, regs, fbase, frame.cfa, r.mem, self.bias, self.unwinder.regs.names)
                addr = _address(got, mode, r.mem)
                if addr is None:
                    continue
                addr += extra
                if self._plausible(r, addr, layout, any_state=mode == "pointer"):
                    polling = resume is not None and resume.layout_name == layout and mode == "pointer"
                    yield Found(addr, layout, tid, scope.function, "location", polling)
            for layout in scope.templates:  # an executor's frame (only when it is no resume function)
                wanted.setdefault(layout, (scope.function, frame.sp, frame.cfa or 0))

    # -- what DWARF says about a pc, memoized per build-id (framecache.py) ------------------
    def facts(self, pc: int) -> FrameFacts | None:
        """The frame base and, per scope (the subprogram and each inlined call at the
        link-time pc), the located variables whose type is a coroutine and the template
        coroutine types. A pure function of the binary and the pc: kept in memory and
        on disk by build-id, so a new session (another instance of the program, the same
        program attached again) reads no DWARF for the frames it has seen before."""
        if pc in self._facts:
            return self._facts[pc]
        got = self._facts[pc] = self._read_facts(pc)
        self._facts_dirty = True
        return got

    def save_facts(self) -> None:
        if self._facts_dirty and self.inv.build_id:
            self._facts_dirty = False
            framecache.store(self.inv.build_id, self._facts, self.cache_dir)

    def _read_facts(self, pc: int) -> FrameFacts | None:
        if self.map is None or self.dwarf is None:
            return None
        uo = self.dwarf.unit_offset_at(pc)
        if uo is not None and self._sysroot_unit(uo):
            return None
        chain = self.map._die_chain(pc)
        if not chain:
            return None
        resume = self.inv.resume_fn_at(pc)
        fb_expr = chain[0][1].get(D.AT_FRAME_BASE)
        scopes = []
        for unit, die in chain:
            variables = []
            for var in _variables(self.dwarf, unit, die, pc):
                kind = self._future_type(var)
                if kind is None:
                    continue
                expr = self._location(unit, var, pc)
                if expr is not None:
                    variables.append((*kind, expr))
            templates = tuple(self._template_layouts(die)) if resume is None else ()
            if variables or templates:
                scopes.append(Scope(self.map._fn_name(die), tuple(variables), templates))
        if not scopes:
            return None
        return FrameFacts(fb_expr if isinstance(fb_expr, bytes) else None, tuple(scopes))

    def _sysroot_unit(self, unit_offset: int) -> bool:
        """A unit of the precompiled standard library (``DW_AT_comp_dir`` ``/rustc/<hash>``)
        that refers to no DIE outside itself (no DW_FORM_ref_addr, as LTO's cross-unit
        inlining needs) can only hold types it defines, and std was compiled before the
        program: it holds no coroutine of the program, unless the inventory has layouts
        of std's own crates. Its frames (a parked thread: condvar waits, thread start, the
        main thread's `lang_start`) are then skipped without reading the unit (std's unit is
        the biggest one behind a parked tokio program's frames: ~0.3 s)."""
        got = self._sysroot.get(unit_offset)
        if got is None:
            assert self.dwarf is not None
            try:
                top, forms = self.dwarf.reader.unit_summary(unit_offset)
            except D.DwarfFormatError:
                top, forms = {}, frozenset()
            comp_dir = top.get(D.AT_COMP_DIR)
            got = (isinstance(comp_dir, str) and comp_dir.startswith("/rustc/") and not forms & _FOREIGN_FORMS
                   and not any(n.startswith(_SYSROOT_CRATES) for n in self.inv.layouts))
            self._sysroot[unit_offset] = got
        return got

    def _plausible(self, r: Reflector, addr: int, layout_name: str, any_state: bool) -> bool:
        lay = self.inv.layouts.get(layout_name)
        if lay is None or addr <= 0 or addr >= 1 << 47:
            return False
        v = r.mem.u(addr + lay.state_offset, lay.state_size)
        return v is not None and lay.state(v) is not None and (any_state or v >= 3)

    def _scan(self, r: Reflector, lo: int, hi: int, layout_name: str) -> list[int]:
        lay = self.inv.layouts[layout_name]
        step = max(8, lay.align)
        hi = min(hi, lo + MAX_SCAN)
        hits = []
        for base in range(lo - lo % BLOCK, hi, BLOCK):  # block by block: an unread one is skipped
            data = r.mem.read(base, BLOCK)
            if data is None:
                continue
            first = max(lo, base)
            first += (-first) % step
            for addr in range(first, min(base + BLOCK, hi - lay.size + 1), step):
                i = addr - base + lay.state_offset
                if i + lay.state_size <= BLOCK:
                    v = int.from_bytes(data[i:i + lay.state_size], "little")
                    if v < 3 or lay.state(v) is None:
                        continue
                elif not self._plausible(r, addr, layout_name, any_state=False):
                    continue
                if _clean(r.walk(addr, layout_name)):
                    hits.append(addr)
        return hits

    def _narrow(self, r: Reflector, layout_name: str, hits: list[int]) -> list[int]:
        """Several scan hits: those whose saved locals hold valid values, when that leaves
        any (``validity``: a zero-sized awaitee makes every matching state byte a clean
        walk). One hit stays as it is: a local the coroutine left uninitialised is not
        valid, and the check is a tie-breaker only."""
        if len(hits) < 2:
            return hits
        lay = self.inv.layouts[layout_name]
        valid = []
        for addr in hits:
            state = lay.state(r.mem.u(addr + lay.state_offset, lay.state_size) or 0)
            if state is not None and self.validity.plausible(r.mem.u, addr, layout_name, state):
                valid.append(addr)
        return awaiting(r, lay, valid or hits, self.inv.layouts.get)

    # -- DWARF ---------------------------------------------------------------------------
    def _origin(self, die: D.Die) -> D.Die:
        assert self.dwarf is not None
        return self.dwarf.origin(die, limit=4)

    def _future_type(self, var: D.Die) -> tuple[str, str, int] | None:
        t = var.get(D.AT_TYPE)
        if t is None:
            t = self._origin(var).get(D.AT_TYPE)
        if t is None:
            return None
        if t not in self._types:
            self._types[t] = self._resolve(t, 0)
        return self._types[t]

    def _resolve(self, off: int | None, depth: int) -> tuple[str, str, int] | None:
        """(value | pointer, layout name, offset of the env in the pointee) for a type."""
        assert self.dwarf is not None
        t = self.dwarf.die(off)
        for _ in range(8):
            if t is None or t.tag != D.TAG_TYPEDEF:
                break
            t = self.dwarf.die(t.get(D.AT_TYPE))
        if t is None or depth > 4:
            return None
        if t.tag == D.TAG_POINTER:
            inner = self._resolve(t.get(D.AT_TYPE), depth + 1)
            return ("pointer", inner[1], inner[2]) if inner is not None and inner[0] == "value" else None
        if t.tag != D.TAG_STRUCTURE:
            return None
        name = _qualname(self.dwarf, t)
        if name in self.inv.layouts:
            return ("value", name, 0)
        if name.startswith(("core::future::from_generator::GenFuture<", "core::pin::Pin<")):
            m = self._first_member(t)
            if m is None:
                return None
            inner = self._resolve(m.get(D.AT_TYPE), depth + 1)
            if inner is None:
                return None
            mode, lay, extra = inner
            return (mode, lay, extra + (int(m.get(D.AT_DATA_MEMBER_LOCATION, 0) or 0) if mode == "value" else 0))
        return None

    def _first_member(self, t: D.Die) -> D.Die | None:
        assert self.dwarf is not None
        unit = self.dwarf.unit_of(t)
        for c in t.children if unit is not None else ():
            m = unit.dies[c]  # type: ignore[union-attr]
            if m.tag == D.TAG_MEMBER:
                return m
        return None

    def _template_layouts(self, die: D.Die) -> list[str]:
        """Coroutine types among a function's template type parameters (``block_on<F>``)."""
        assert self.dwarf is not None
        d = self._origin(die)
        unit = self.dwarf.unit_of(d)
        if unit is None:
            return []
        out = []
        for c in d.children:
            p = unit.dies.get(c)
            if p is not None and p.tag == D.TAG_TEMPLATE_TYPE_PARAM:
                kind = self._resolve(p.get(D.AT_TYPE), 0)
                if kind is not None and kind[0] == "value" and kind[2] == 0:
                    out.append(kind[1])
        return out

    def _location(self, unit: D.Unit, var: D.Die, pc: int) -> bytes | None:
        assert self.dwarf is not None
        loc = var.get(D.AT_LOCATION)
        if isinstance(loc, bytes):
            return loc
        if isinstance(loc, int):
            return self.dwarf.location_at(unit, loc, pc)
        return None  # no location (optimized out) or a DW_FORM_loclistx index


def _variables(dwarf: DwarfView, unit: D.Unit, die: D.Die, pc: int) -> Iterator[D.Die]:
    """Parameters and variables of a function (or inlined call) in scope at pc."""
    stack = list(die.children)
    while stack:
        c = unit.dies.get(stack.pop())
        if c is None:
            continue
        if c.tag in (D.TAG_FORMAL_PARAMETER, D.TAG_VARIABLE):
            yield c
        elif c.tag == D.TAG_LEXICAL_BLOCK:
            ranges = dwarf.die_ranges(unit, c)
            if not ranges or any(lo <= pc < hi for lo, hi in ranges):
                stack.extend(c.children)


def held_layouts(r: Reflector, found: list[Found]) -> set[str]:
    """The coroutine types inside the futures found on a thread (below their roots). An
    executor frame's future that one of them holds is that one, moved in, not a root to
    scan for: tokio's ``LocalSet::block_on(rt, f)`` is ``rt.block_on(self.run_until(f))``,
    ``f`` moved into ``run_until``'s future, which ``block_on`` holds and the stack's
    locations find. Fact (hyper's single_threaded, debug: its server threads' ``LocalSet::
    block_on`` frames): a scan for ``f`` there took a suspended, clean-walking image in that
    frame's old bytes, drawn as a second task of the server's fn at its first ``.await``
    (`bind`, not yet polled) beside the live one in ``run_until``'s tree."""
    out: set[str] = set()
    for f in found:
        root = r.walk(f.addr, f.type_name)
        out.update(n.type_name for n in root.iter() if n.kind == "coroutine" and n is not root)
    return out


def owned_images(r: Reflector, lay: Layout, scan: Callable[[int, int], list[int]], sp: int, cfa: int,
                 top: int) -> list[int]:
    """``frame_first`` over the images that survive the overlap rule in each range: a pattern
    inside the live image's awaitee must not make the frame's one image two. Fact (tokio's
    echo-tcp, release, under load): block_on's frame held main's block (at its accept) and,
    0x40 above, a `bind` pattern inside its awaitee; two in the frame sent the search to the
    callers', where another image lay (0x18 below the CFA) that the overlap rule could not
    set aside: two stayed, none taken, main missing from every view."""
    return frame_first(lambda lo, hi: unoverlapped(r, lay, scan(lo, hi)), sp, cfa, top)


def frame_first(scan: Callable[[int, int], list[int]], sp: int, cfa: int, top: int) -> list[int]:
    """The scan hits for a future a frame owns: those in the frame ``[sp, cfa)`` when
    exactly one is there, else those in the frame and its callers ``[sp, top)``."""
    if sp < cfa <= top:
        hits = scan(sp, cfa)
        if len(hits) == 1:
            return hits
    return scan(sp, top)


def pinned(r: Reflector, hits: list[int], lo: int, hi: int) -> list[int]:
    """Of several images of one future on a thread's stack, the one a word of that stack
    points at: the executor polls it through a ``Pin<&mut F>`` it keeps, and nothing points
    at a stale image (a copy left in a frame's slot by an earlier move or poll). Fact
    (tokio's graceful-shutdown, release, block_on of `#[tokio::main]`'s block): 5 suspended,
    plausible images in block_on's frame and its callers'; one of them pointed at. All hits
    when none or several are."""
    want = set(hits)
    seen: set[int] = set()
    hi = min(hi, lo + MAX_SCAN)
    for base in range(lo - lo % BLOCK, hi, BLOCK):
        data = r.mem.read(base, BLOCK)
        if data is None:
            continue
        for i in range(0, BLOCK - 7, 8):
            v = int.from_bytes(data[i:i + 8], "little")
            if v in want and lo <= base + i < hi:
                seen.add(v)
    return [h for h in hits if h in seen] if len(seen) == 1 else hits


def unoverlapped(r: Reflector, lay: Layout, hits: list[int]) -> list[int]:
    """Of several images of one future, drop each whose state byte lies inside the bytes
    another image's current state uses (its awaitee, its saved locals): two live objects
    never share bytes, and a coroutine cannot hold one of its own type, so that "image" is a
    pattern in the other one's awaitee. Fact (tokio's echo-tcp, release, block_on of
    `#[tokio::main]`'s block, the future addressed from rsp, nothing pointing at it): the
    live block at its accept `.await` (state 4, a 184-byte awaitee at +32) and, 0x40 above
    it, a plausible state 3 (`bind`'s `.await`) whose state byte is inside that awaitee. All
    hits when that drops none or all of them."""
    spans = {}
    for h in hits:
        st = lay.state(r.mem.u(h + lay.state_offset, lay.state_size) or 0)
        parts = ([st.awaitee] if st is not None and st.awaitee is not None else []) + list(st.locals if st else ())
        spans[h] = [(h + m.offset, h + m.offset + m.size) for m in parts if m.size > 0]
    inside = {h for h in hits for g in hits if g != h
              and any(lo <= h + lay.state_offset < hi for lo, hi in spans[g])}
    kept = [h for h in hits if h not in inside]
    return kept if kept else hits


def awaiting(r: Reflector, lay: Layout, hits: list[int], layout_of: Callable[[str], Layout | None]) -> list[int]:
    """Of several images, those whose awaitee, when it is a coroutine, is suspended: a
    coroutine suspends at an `.await` only after its awaitee's poll returned Pending (the
    awaitee then suspended itself), so an awaitee not yet polled or finished is a stale copy's
    (or one running now, inside a poll the stack shows). Fact (h2's examples/server.rs,
    release, attached under load, 1 stop in ~10): block_on's frame held `#[tokio::main]`'s
    block at its accept (accept suspended) and a stale one at `bind` (bind Returned); the
    callers' frame a third "image" at accept whose accept read Unresumed (garbage walking
    clean: the walk stops at a coroutine not yet polled): three, none taken, main missing.
    All hits when that keeps none or one of them is all there is."""
    if len(hits) < 2:
        return hits
    kept = []
    for h in hits:
        st = lay.state(r.mem.u(h + lay.state_offset, lay.state_size) or 0)
        child = layout_of(st.awaitee.type_name) if st is not None and st.awaitee is not None else None
        v = r.mem.u(h + st.awaitee.offset + child.state_offset, child.state_size) \
            if st is not None and st.awaitee is not None and child is not None else None
        if child is None or (v is not None and v >= 3):
            kept.append(h)
    return kept or hits


def _clean(node: Node) -> bool:
    return not any(n.kind == "unreadable" for n in node.iter())


def _address(got: tuple[str, int] | None, mode: str, mem: BlockReader) -> int | None:
    """The coroutine's address from an evaluated location."""
    if got is None:
        return None
    kind, v = got
    if mode == "value":
        return v if kind == "addr" else None
    return mem.word(v) if kind == "addr" else v


def evaluate(expr: bytes, regs: dict[str, int], fbase: int | None, cfa: int | None,
             mem: BlockReader, bias: int, names: tuple[str, ...] = DWARF_REGS) -> tuple[str, int] | None:
    """A DWARF location expression: ("addr", a) the variable lies at a; ("value", v) it is v.
    Only what rustc emits for frame variables is known; anything else is None."""
    stack: list[int] = []
    pos = 0
    M = (1 << 64) - 1

    def reg(n: int) -> int | None:
        return regs.get(names[n]) if 0 <= n < len(names) else None

    try:
        while pos < len(expr):
            op = expr[pos]
            pos += 1
            if 0x50 <= op <= 0x6F or op == 0x90:  # DW_OP_reg*, regx: the value is in a register
                n = op - 0x50 if op != 0x90 else D._uleb(expr, pos)[0]
                v = reg(n)
                return ("value", v) if v is not None else None
            if 0x70 <= op <= 0x8F:  # DW_OP_breg*
                off, pos = D._sleb(expr, pos)
                v = reg(op - 0x70)
                if v is None:
                    return None
                stack.append((v + off) & M)
            elif op == 0x92:  # bregx
                n, pos = D._uleb(expr, pos)
                off, pos = D._sleb(expr, pos)
                v = reg(n)
                if v is None:
                    return None
                stack.append((v + off) & M)
            elif op == 0x91:  # fbreg
                off, pos = D._sleb(expr, pos)
                if fbase is None:
                    return None
                stack.append((fbase + off) & M)
            elif op == 0x9C:  # call_frame_cfa
                if cfa is None:
                    return None
                stack.append(cfa)
            elif op == 0x03:  # addr (link time)
                (a,) = struct.unpack_from("<Q", expr, pos)
                pos += 8
                stack.append(a + bias)
            elif 0x30 <= op <= 0x4F:  # lit*
                stack.append(op - 0x30)
            elif op in (0x08, 0x0A, 0x0C, 0x0E):  # const1u..const8u
                w = {0x08: 1, 0x0A: 2, 0x0C: 4, 0x0E: 8}[op]
                stack.append(int.from_bytes(expr[pos:pos + w], "little"))
                pos += w
            elif op in (0x09, 0x0B, 0x0D, 0x0F):  # const1s..const8s
                w = {0x09: 1, 0x0B: 2, 0x0D: 4, 0x0F: 8}[op]
                stack.append(int.from_bytes(expr[pos:pos + w], "little", signed=True) & M)
                pos += w
            elif op == 0x10:  # constu
                v, pos = D._uleb(expr, pos)
                stack.append(v)
            elif op == 0x11:  # consts
                v, pos = D._sleb(expr, pos)
                stack.append(v & M)
            elif op == 0x23:  # plus_uconst
                v, pos = D._uleb(expr, pos)
                stack.append((stack.pop() + v) & M)
            elif op == 0x22:  # plus
                b, a = stack.pop(), stack.pop()
                stack.append((a + b) & M)
            elif op == 0x1C:  # minus
                b, a = stack.pop(), stack.pop()
                stack.append((a - b) & M)
            elif op == 0x12:  # dup
                stack.append(stack[-1])
            elif op == 0x06:  # deref
                w = mem.word(stack.pop())
                if w is None:
                    return None
                stack.append(w)
            elif op == 0x9F:  # stack_value
                return ("value", stack[-1]) if stack else None
            elif op == 0x93:  # piece: the first piece is where the value starts
                break
            else:  # entry_value, implicit pointers, TLS, ...: not located
                return None
    except (IndexError, struct.error):
        return None
    return ("addr", stack[-1]) if stack else None


def frame_name(function: str) -> str:
    """A frame's function for a header, generic arguments dropped:
    ``tokio::runtime::park::CachedParkThread::block_on``; a qualified path keeps its
    ``<Type as Trait>`` (rustc 1.63 names every async fn's frame
    ``<core::future::from_generator::GenFuture<T> as core::future::future::Future>::poll``,
    which a cut at the first ``<`` left empty)."""
    if not function.startswith("<"):
        return short_type(function)
    depth = 0
    for i, ch in enumerate(function):
        if ch == "<":
            depth += 1
        elif ch == ">" and function[i - 1:i] != "-":
            depth -= 1
            if depth == 0:
                return f"<{short_type(function[1:i])}>{short_type(function[i + 1:])}"
    return function


def stack_roots(found: list[Found]) -> list[Root]:
    out = []
    for f in found:
        where = frame_name(f.function)
        how = "" if f.how == "location" else ", found by scan"
        out.append(Root(f.addr, f.type_name, "", "stack", f.thread,
                        header=f"on the stack of thread {f.thread}, in {where}{how}"))
    return out
