"""The tracepoint collection program and the frame -> engine event conversion.

Theory of operation (pure, no I/O): `build_program` turns the inventory into
one gdbserver tracepoint per probed address - the entry of each resume
function, each of its `ret`s and each unwind exit (`call _Unwind_Resume`
after the landing pad wrote ``__state = 2``). Every tracepoint has exactly
one action, a single ``X`` agent expression (research rule 3: one action
packet; gdbserver ignores the base register of ``M`` actions):

entry::

    reg SELF; const16 state_offset; add; const8 state_size; trace
                                   -> M block: address = self + state_offset, bytes = __state
    reg rsp; const8 8; trace       -> M block: address = sp, bytes = return address
    reg fs_base; setv 2; tracev 2  -> V 2: the thread (frames carry no thread id)
    tracev 1                       -> V 1: CLOCK_MONOTONIC µs (gdbserver's trace_timestamp)

exit (ret / unwind)::

    reg rsp; setv 3; tracev 3      -> V 3: sp (points at the return address)
    reg rax; setv 4; tracev 4      -> V 4 (and rdx as V 5 when needed): the returned
                                       Poll<T>, whose discriminant the analysis
                                       located (a niche inside T included)
    or, for Poll<T> over 16 bytes returned through memory:
    reg rax; const16 off; add; const8 size; trace -> M block: the discriminant
    reg fs_base; setv 2; tracev 2 ; tracev 1

Fast tracepoints (gdbserver's in-process agent, `fast_sites`): the same
expressions at another instruction, with two differences. The entry sp (or
the ret's sp) is ``rsp + adjust`` (``reg rsp; const16 adjust; add``). And
the agent has no ``fs_base``: libinproctrace's ``get_raw_reg`` answers 0 past
the 18 registers its jump pad saves (rax..r15, rip, eflags). The pad keeps
the thread pointer in its ``collecting_t`` (``mov %fs:0x0,%rax``) right below
the saved registers: the pad pushes rsp first (its value S is what ``reg
rsp`` reads), 17 more registers, then reserves 0x18 bytes whose second word
is the thread pointer - at S - 160 (gdbserver ``linux-x86-low.cc``
``amd64_install_fast_tracepoint_jump_pad``). So ``reg rsp; const8 160; sub;
ref64`` is the fs_base, and the frame carries it in V 2 as a trap frame does.

(``setv`` leaves its value on the stack; the agent ignores what is left at
``end``. A hit is evaluated by gdbserver's single thread, so ``setv`` then
``tracev`` of a global state variable cannot interleave with another hit.)

A function without a known layout records one byte at self (the M block's
address is what matters). An exit carries no ``__state``: the self pointer
is gone from the registers at a ``ret``: the Poll result says Ready
(``Returned``) or Pending, and the engine takes the exact ``SuspendN``
from the task's next entry or reads it at the next stop (``pending_reads``).

`FrameConverter` turns drained frames into `PollEnter`/`PollExit` in buffer
order (the buffer is written in hit order), mapping ``fs_base`` to the LWP
with a `ThreadMap`. A frame truncated by a full buffer (fewer blocks than
the actions asked for) is counted and dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from proxy.analysis.model import Inventory, ResumeFn
from proxy.capture.fast_sites import FastSite, entry_site, exit_sites
from proxy.graph.events import PollEnter, PollEvent, PollExit
from rsp.agent import Op, Opcode, assemble, x_expression
from rsp.packets.trace import MAX_TP_NUMBER, TIMESTAMP_TSV, StateVariable, Tracepoint
from rsp.tracebuf import MemoryBlock, TraceFrame

_U64 = (1 << 64) - 1
# x86-64 remote register numbers (gdbserver's amd64-linux description)
REGNUM = {"rax": 0, "rbx": 1, "rcx": 2, "rdx": 3, "rsi": 4, "rdi": 5, "rbp": 6, "rsp": 7}
FS_BASE_REGNUM = 58
TSV_FS_BASE = 2
TSV_SP = 3
TSV_RAX = 4
TSV_RDX = 5
STATE_VARIABLES = (
    StateVariable(TSV_FS_BASE, 0, False, "asyncrsp_fs_base"),
    StateVariable(TSV_SP, 0, False, "asyncrsp_sp"),
    StateVariable(TSV_RAX, 0, False, "asyncrsp_rax"),
    StateVariable(TSV_RDX, 0, False, "asyncrsp_rdx"),
)
OWN_TSV_NUMBERS = frozenset(v.number for v in STATE_VARIABLES)


@dataclass(frozen=True, slots=True)
class SitePoint:
    """One tracepoint of the program: where, what kind, for which resume fn."""

    number: int
    addr: int  # runtime
    kind: str  # "entry", "exit", "unwind"
    site: int  # runtime low_pc of the resume function
    name: str
    tracepoint: Tracepoint


@dataclass(slots=True)
class Program:
    points: list[SitePoint] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # why some sites have no tracepoint
    # fast tracepoints wanted: why a site kept a trap tracepoint ("name: reason")
    fallbacks: list[str] = field(default_factory=list)

    @property
    def fast_points(self) -> int:
        return sum(1 for p in self.points if p.tracepoint.fast is not None)

    def by_number(self) -> dict[int, SitePoint]:
        return {p.number: p for p in self.points}

    def by_addr(self) -> dict[int, SitePoint]:
        return {p.addr: p for p in self.points}

    def packets(self) -> list[bytes]:
        """QTDV for the proxy's state variables, then two QTDP per tracepoint."""
        out = [v.build() for v in STATE_VARIABLES]
        for p in self.points:
            out += p.tracepoint.packets()
        return out


# The thread pointer in a fast tracepoint's jump pad: S - 160 (module docstring).
FAST_THREAD_AREA = 160


def _fs_base_and_time(fast: bool = False) -> list[Op | Opcode]:
    if fast:
        fsb: list[Op | Opcode] = [Op(Opcode.reg, REGNUM["rsp"]), Op(Opcode.const8, FAST_THREAD_AREA), Opcode.sub,
                                  Opcode.ref64]
    else:
        fsb = [Op(Opcode.reg, FS_BASE_REGNUM)]
    return [*fsb, Op(Opcode.setv, TSV_FS_BASE), Op(Opcode.tracev, TSV_FS_BASE), Op(Opcode.tracev, TIMESTAMP_TSV)]


def _sp(adjust: int) -> list[Op | Opcode]:
    ops: list[Op | Opcode] = [Op(Opcode.reg, REGNUM["rsp"])]
    if adjust:
        ops += [Op(Opcode.const16, adjust), Opcode.add]
    return ops


def entry_expression(self_reg: str, state_offset: int, state_size: int, sp_adjust: int = 0,
                     fast: bool = False) -> bytes:
    ops: list[Op | Opcode] = [Op(Opcode.reg, REGNUM[self_reg])]
    if state_offset:
        ops += [Op(Opcode.const16, state_offset), Opcode.add]
    ops += [Op(Opcode.const8, state_size), Opcode.trace, *_sp(sp_adjust), Op(Opcode.const8, 8), Opcode.trace]
    ops += _fs_base_and_time(fast)
    ops.append(Opcode.end)
    return assemble(ops)


def exit_expression(poll_pending: tuple[int, int, int] | None = None, in_memory: bool = False,
                    sp_adjust: int = 0, fast: bool = False) -> bytes:
    """`poll_pending` (offset, size, value) says where Poll<T> keeps its
    discriminant: in rax:rdx, or (`in_memory`, T over 16 bytes) in the
    return slot whose address the function returns in rax."""
    ops: list[Op | Opcode] = [*_sp(sp_adjust), Op(Opcode.setv, TSV_SP), Op(Opcode.tracev, TSV_SP)]
    if poll_pending is not None:
        off, size, _ = poll_pending
        if in_memory:
            ops.append(Op(Opcode.reg, REGNUM["rax"]))
            if off:
                ops += [Op(Opcode.const16, off), Opcode.add]
            ops += [Op(Opcode.const8, size), Opcode.trace]
        else:
            ops += [Op(Opcode.reg, REGNUM["rax"]), Op(Opcode.setv, TSV_RAX), Op(Opcode.tracev, TSV_RAX)]
            if off + size > 8:
                ops += [Op(Opcode.reg, REGNUM["rdx"]), Op(Opcode.setv, TSV_RDX), Op(Opcode.tracev, TSV_RDX)]
    ops += _fs_base_and_time(fast)
    ops.append(Opcode.end)
    return assemble(ops)


# Reads the program's code at link-time addresses: (address, size) -> bytes or None.
CodeReader = Callable[[int, int], "bytes | None"]


def _fast_entry(code: CodeReader | None, low: int, high: int, self_reg: str | None,
                label: str, prog: Program) -> FastSite | None:
    if code is None:
        return None
    text = code(low, high - low) if high > low else None
    site = entry_site(text, low, self_reg) if text else "no code bytes"
    if isinstance(site, str):
        prog.fallbacks.append(f"{label}: {site}")
        return None
    return site


def _fast_exits(code: CodeReader | None, low: int, high: int, rets: tuple[int, ...],
                label: str, prog: Program) -> dict[int, FastSite]:
    if code is None or not rets:
        return {}
    text = code(low, high - low) if high > low else None
    sites = exit_sites(text, low, rets) if text else {r: "no code bytes" for r in rets}
    out = {}
    for r, s in sites.items():
        if isinstance(s, str):
            prog.fallbacks.append(f"{label} (ret {r:#x}): {s}")
        else:
            out[r] = s
    return out


def state_window(inventory: Inventory, fn: ResumeFn) -> tuple[int, int]:
    """(offset from self, size) of the bytes an entry collects: the layout's
    ``__state``, or self's first byte when there is no layout or the offset
    does not fit the agent expression's 16-bit constant."""
    layout = inventory.layouts.get(fn.layout_name) if fn.layout_name else None
    if layout is None or layout.state_offset >= 1 << 16:
        return 0, 1
    return layout.state_offset, layout.state_size


def build_program(
    inventory: Inventory,
    bias: int,
    wanted: Callable[[ResumeFn], bool] = lambda fn: True,
    *,
    entry_only: bool = False,
    fast_code: CodeReader | None = None,
) -> Program:
    """`fast_code` (the program's code, link-time addresses) asks for fast
    tracepoints where `fast_sites` finds a site; the others stay traps."""
    prog = Program()
    number = 1  # never 0: its frames look like the end of the buffer
    for fn in inventory.resume_fns:
        if not fn.low_pc or not wanted(fn):
            continue
        off, size = state_window(inventory, fn)
        site = fn.low_pc + bias
        in_mem = fn.self_in == "rsi"
        exit_x = x_expression(exit_expression(fn.poll_pending, in_mem))
        fe = _fast_entry(fast_code, fn.low_pc, fn.high_pc, fn.self_in, fn.name, prog)
        if fe is not None:
            entry = (fe.addr + bias, "entry", x_expression(entry_expression(fn.self_in, off, size, fe.adjust, True)),
                     fe.length)
        else:
            entry = (site, "entry", x_expression(entry_expression(fn.self_in, off, size)), None)
        wants: list[tuple[int, str, bytes, int | None]] = [entry]
        if not entry_only:
            fx = _fast_exits(fast_code, fn.low_pc, fn.high_pc, fn.rets, fn.name, prog)
            for r in fn.rets:
                s = fx.get(r)
                if s is None:
                    wants.append((r + bias, "exit", exit_x, None))
                else:
                    wants.append((s.addr + bias, "exit",
                                  x_expression(exit_expression(fn.poll_pending, in_mem, s.adjust, True)), s.length))
            if fast_code is not None and fn.other_exits:
                prog.fallbacks.append(f"{fn.name}: unwind exits are calls to _Unwind_Resume (not relocated)")
            wants += [(x + bias, "unwind", exit_x, None) for x in fn.other_exits]
        if number + len(wants) - 1 > MAX_TP_NUMBER:
            prog.skipped.append(f"{fn.name}: more than {MAX_TP_NUMBER} tracepoints")
            continue
        for addr, kind, action, fast in wants:
            label = fn.name if kind == "entry" else f"{fn.name} ({'ret' if kind == 'exit' else kind})"
            prog.points.append(SitePoint(number, addr, kind, site, label,
                                         Tracepoint(number, addr, (action,), fast=fast)))
            number += 1
    return prog


def count_expression(fast: bool = False) -> bytes:
    """A counted probe (``--trace-probe``): the thread and the time only."""
    return assemble([*_fs_base_and_time(fast), Opcode.end])


def add_count_points(prog: Program, funcs: list[tuple[str, int, tuple[int, ...]]], *, bias: int = 0,
                     fast_code: CodeReader | None = None, sizes: dict[int, int] | None = None) -> None:
    """Tracepoints on the entry ("count-entry") and every ret ("count-exit")
    of plain functions: (name, runtime address, runtime ret addresses).
    With `fast_code` (and each function's size in `sizes`), fast where a site is found."""
    trap = x_expression(count_expression())
    fast_x = x_expression(count_expression(True))
    number = max((p.number for p in prog.points), default=0) + 1
    taken = {p.addr for p in prog.points}
    for name, addr, rets in funcs:
        low = addr - bias
        high = low + (sizes or {}).get(addr, 0)
        fe = _fast_entry(fast_code, low, high, None, name, prog)
        fx = _fast_exits(fast_code, low, high, tuple(r - bias for r in rets), name, prog)
        points: list[tuple[int, str, int | None]] = [
            (fe.addr + bias, "count-entry", fe.length) if fe else (addr, "count-entry", None)]
        for r in rets:
            s = fx.get(r - bias)
            points.append((s.addr + bias, "count-exit", s.length) if s else (r, "count-exit", None))
        for a, kind, fast in points:
            if a in taken or number > MAX_TP_NUMBER:
                continue
            taken.add(a)
            label = name if kind == "count-entry" else f"{name} (ret)"
            action = fast_x if fast is not None else trap
            prog.points.append(SitePoint(number, a, kind, addr, label, Tracepoint(number, a, (action,), fast=fast)))
            number += 1


# ------------------------------------------------------------------ threads
class ThreadMap:
    """fs_base -> LWP. Learnt from the stopped threads' registers (`learn`)
    or from the thread control blocks (`tid_offset`: glibc keeps the
    thread's tid in ``struct pthread`` at fs_base + offset)."""

    def __init__(self) -> None:
        self.lwp: dict[int, int] = {}
        self.tid_offset: int | None = None
        self._synthetic: dict[int, int] = {}
        self._pinned: dict[int, int] = {}  # fs_base -> the thread id its events were given
        self.relabelled = 0  # fs_bases later read as another LWP than the one pinned

    def learn(self, fs_base: int, lwp: int) -> None:
        if fs_base and lwp > 0:
            pinned = self._pinned.get(fs_base)
            if pinned is not None and pinned != lwp:
                self.relabelled += 1
            self.lwp[fs_base] = lwp

    def thread(self, fs_base: int) -> int:
        """The LWP, or a stable negative number for a thread never mapped
        (it exited before the proxy could read its control block). Pinned at
        first use: a thread's events must keep one identity for the engine
        (its scopes are per thread), even if a later read names another LWP."""
        pinned = self._pinned.get(fs_base)
        if pinned is not None:
            return pinned
        lwp = self.lwp.get(fs_base)
        if lwp is None:
            lwp = self._synthetic[fs_base] = -(len(self._synthetic) + 1)
        self._pinned[fs_base] = lwp
        return lwp

    @property
    def unmapped(self) -> int:
        return sum(1 for f in self._synthetic if self._pinned.get(f) == self._synthetic[f])

    def find_tid_offset(self, tcbs: dict[int, bytes], lwps: set[int]) -> int | None:
        """The offset in the TCB that holds the tid: the one where every
        control block read holds a distinct live LWP (0 or -1 for a thread
        that exited: both read here, -1 from tokio's workers after the
        runtime shut down) and at least one holds a live LWP. glibc 2.36
        x86-64: 0x2d0."""
        if not tcbs or not lwps:
            return None
        size = min(len(b) for b in tcbs.values())
        candidates = []
        for off in range(0, size - 3, 4):
            vals = [int.from_bytes(b[off:off + 4], "little", signed=True) for b in tcbs.values()]
            live = [v for v in vals if v in lwps]
            if live and all(v in lwps or v in (0, -1) for v in vals) and len(set(live)) == len(live):
                candidates.append(off)
        if not candidates:
            return None
        if 0x2D0 in candidates:
            return 0x2D0
        return candidates[0] if len(candidates) == 1 else None


# --------------------------------------------------------------- conversion
@dataclass(slots=True)
class ConvertStats:
    frames: int = 0
    events: int = 0
    truncated: int = 0  # frames with fewer blocks than their actions (full buffer)
    unknown: int = 0  # frames of a tracepoint number not ours


class FrameConverter:
    def __init__(self, program: Program, threads: ThreadMap, state_offsets: dict[int, int],
                 poll_pending: dict[int, tuple[int, int, int]] | None = None) -> None:
        self._pending = poll_pending or {}  # site -> Poll<T>'s (offset, size, Pending value)
        self._points = program.by_number()
        self._threads = threads
        self.program = program
        self.counts: dict[str, int] = {}  # counted probes: hits per tracepoint label
        self._state_offset = state_offsets  # site -> __state offset, for sites with a layout
        self.stats = ConvertStats()

    def use(self, program: Program) -> None:
        """Frames drained from now on were written by `program`'s tracepoints."""
        self.program = program
        self._points = program.by_number()

    def fs_bases(self, frames: Iterable[TraceFrame]) -> set[int]:
        return {v for f in frames if (v := f.variables().get(TSV_FS_BASE))}

    def convert(self, frames: Iterable[TraceFrame], next_seq: Callable[[], int]) -> list[PollEvent]:
        out: list[PollEvent] = []
        for f in frames:
            self.stats.frames += 1
            point = self._points.get(f.tracepoint)
            if point is None:
                self.stats.unknown += 1
                continue
            if point.kind.startswith("count-"):
                self.counts[point.name] = self.counts.get(point.name, 0) + 1
                continue
            ev = self._event(point, f, next_seq)
            if ev is None:
                self.stats.truncated += 1
                continue
            out.append(ev)
        self.stats.events += len(out)
        return out

    def _event(self, p: SitePoint, f: TraceFrame, next_seq: Callable[[], int]) -> PollEvent | None:
        v = f.variables()
        fsb = v.get(TSV_FS_BASE)
        ts = v.get(TIMESTAMP_TSV)
        if fsb is None or ts is None:
            return None
        thread = self._threads.thread(fsb)
        time_ns = ts * 1000
        if p.kind == "entry":
            mem = f.memory()
            if len(mem) < 2:
                return None
            state_blk, sp_blk = mem[0], mem[1]
            off = self._state_offset.get(p.site)
            self_ptr = state_blk.addr - (off or 0)
            state = _state(state_blk) if off is not None else None
            ret = int.from_bytes(sp_blk.data, "little") if len(sp_blk.data) == 8 else None
            return PollEnter(next_seq(), thread, p.site, self_ptr, sp_blk.addr, ret, state, time_ns)
        sp = v.get(TSV_SP)
        if sp is None:
            return None
        result = None if p.kind == "unwind" else self._poll_result(p.site, f, v)
        return PollExit(next_seq(), thread, p.site, sp & 0xFFFFFFFFFFFFFFFF, None, None, result,
                        panicked=p.kind == "unwind", time_ns=time_ns)

    def _poll_result(self, site: int, f: TraceFrame, v: dict[int, int]) -> int | None:
        """0 Ready / 1 Pending from the collected Poll<T> discriminant."""
        pp = self._pending.get(site)
        if pp is None:
            return None
        off, size, pending = pp
        mem = f.memory()
        if mem:
            raw = mem[0].data
        elif TSV_RAX in v:
            raw = (v[TSV_RAX] & _U64).to_bytes(8, "little") + (v.get(TSV_RDX, 0) & _U64).to_bytes(8, "little")
            raw = raw[off:off + size]
        else:
            return None
        if len(raw) != size:
            return None
        return 1 if int.from_bytes(raw, "little") == pending else 0


def _state(blk: MemoryBlock) -> int | None:
    return int.from_bytes(blk.data, "little") if blk.data else None
