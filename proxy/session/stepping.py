"""Stepping that follows the task across ``.await`` (docs/stepping.md).

Theory of operation
-------------------
The client steps with its own commands: gdb's ``next`` is a range step
(``vCont;rLO,HI:T``) or single steps, ``finish`` a breakpoint at the return
address and a continue. Neither knows that a coroutine's resume function
returning means "suspended": the step follows the OS thread into the
executor. This part watches those resumes and takes over at that moment.

1. **Origin.** A client step (``s``/``r``) of the stopped thread T whose pc
   is inside a resume function F, or a continue while the client holds a
   breakpoint at the return address of that activation (``finish``), is
   noted: the coroutine's address A (the engine's innermost poll scope of T
   for F), the stack pointer at F's entry (``[sp]`` is the return address),
   the line the step started on. A step from anywhere else is not touched.
2. **Suspended?** When the stop that ends that resume is T back at the
   return address with the stack pointer just above it (F returned), the
   coroutine's ``__state`` is read: ``SuspendN`` means Pending, and the
   client does not hear of this stop. Any other stop goes to the client.
3. **Wait.** A breakpoint of the proxy's at F's entry (or the capture's own
   probe there), the program continued (every thread); a hit whose self
   register (rdi, or rsi when F returns through a slot) is not A is stepped
   over and the program continued.
4. **Arrival** on thread T2. ``next``: T2 is stepped through F's state
   dispatch to the first instruction of the line the step started on (the
   ``.await`` line: the awaitee is polled again there). On T (the same
   thread) that stop goes to the client, and gdb finishes its own ``next``
   from there (the awaitee is Ready: the next line; Pending again: 2.). On
   another thread the proxy finishes the step to the next line itself and
   reports it as a stop of T2 (see ``foreign_stop``). ``finish``: a
   breakpoint at this activation's return address; F returning Ready ends
   there (gdb's own breakpoint there reports ``Run till exit`` and the
   value), Pending goes back to 3.
5. **Everything else** (a signal, a client breakpoint, the client's Ctrl-C,
   the program's exit) ends the wait: the proxy's breakpoint is removed, a
   line of console output says why, and the stop is the client's.

The state is in `AsyncStepping`; the session calls it at three points
(``client_resume``, ``on_stop_reply``, ``report_stop``). Its procedures
talk to the stub through the session's procedure runner.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rsp.packets.memory import memory_bytes
from rsp.packets.monitor import build_console_output
from rsp.packets.resume import Resume, ResumeAction
from rsp.packets.stop import StopReply
from rsp.threads import ThreadId

from proxy.procedure import Exchange, Procedure

from .actions import ToClient
from .breakpoints import BpKey
from .state import Waiter
from .wire import RSP_REGNUM_AMD64, SIGTRAP, feature_on, stop_or_none, without_signals, z_packet

if TYPE_CHECKING:
    from proxy.analysis.model import Inventory, Layout, SourceLoc
    from .core import Session

# gdbserver's x86-64 `g` block: 8-byte registers in gdb's order.
_G_INDEX = {"rax": 0, "rdx": 3, "rsi": 4, "rdi": 5, "rsp": 7, "rip": 16}
MAX_DISPATCH_STEPS = 400  # single steps from F's entry to the resumed .await line
MAX_LINE_STEPS = 2000  # single steps of the proxy's own `next` on another thread


def g_register(regs: bytes, name: str) -> int | None:
    i = _G_INDEX[name] * 16
    data = memory_bytes(regs[i:i + 16].replace(b"xx", b"00"))
    return int.from_bytes(data, "little") if data is not None and len(data) == 8 else None


@dataclass(frozen=True, slots=True)
class Origin:
    """The client's step or finish from inside a coroutine's resume function."""

    kind: str  # "next" (a step or range step) or "finish" (continue to the return address)
    thread: ThreadId
    low: int  # the resume function F, runtime addresses
    high: int
    name: str
    self_ptr: int  # the coroutine A
    self_in: str  # the register holding self at F's entry
    entry_sp: int  # sp at F's entry: [entry_sp] is the return address
    ret_addr: int
    state_addr: int
    state_size: int
    line: SourceLoc | None  # where the step started
    states: dict[int, str]  # __state value -> "Suspend0 at file:line" (for messages)
    start_sp: int = 0  # sp when the step started (a call from the step's line goes below it)
    children: tuple[tuple[int, int], ...] = ()  # resume fns (low, high) of async fns awaited on that line
    inlined: tuple[tuple[int, int], ...] = ()  # the inlined coroutine the step started in (release builds)
    client_frame: tuple[int, int] = (0, 0)  # (return address, entry sp) of the activation the client stepped in


@dataclass(slots=True)
class Wait:
    """A breakpoint the program runs to: F's entry (self == A) or a return site."""

    addr: int
    key: BpKey
    planted: bool  # the proxy planted it for the step (else a probe of the capture's is there)
    thread: ThreadId | None = None  # a return site: only this thread, at this sp
    sp: int | None = None


class AsyncStepping:
    """The step follower's state (see the module docstring)."""

    def __init__(self) -> None:
        self.enabled = True
        self.refused: str | None = None  # why it cannot be on (the program's CPU: proxy/arch)
        self.origin: Origin | None = None
        self.wait: Wait | None = None
        self._noted: object = None  # the client resume already looked at
        self._lines: Callable[[int], SourceLoc | None] | None = None
        self._lines_path: str | None = None
        self._awaits: set[SourceLoc] | None = None
        self._last: dict[int, Origin] = {}  # each thread's last origin (its activation may still run)
        self.alone = False  # one thread runs a call to its return for the proxy (Ctrl-C goes through)
        self.taken = 0  # steps taken over (stats)
        self.switched = 0  # ... that ended on another thread

    # -- hooks --------------------------------------------------------------------------
    def wants(self, s: Session, resume: Resume) -> bool:
        """A client resume that may start a step over an .await: note it first."""
        if not self.enabled or resume is self._noted or s.non_stop or resume.reverse:
            return False
        self.origin = None
        st = s.stopped
        if st is None or st.thread is None or st.pc is None or s.target is None:
            return False
        inv = s.target.inventory
        if inv is None or s.engine is None or s.capture is None:
            return False
        fn = inv.resume_fn_at(st.pc - s.target.bias)
        return fn is not None and fn.layout_name is not None and not fn.wrapper

    def task_step(self, s: Session, resume: Resume) -> bool:
        """A step of a task thread (--task-threads): the task is suspended by definition,
        so the step waits for its innermost coroutine's next poll and ends on the next
        line after its .await, on the thread that polls it (a stop of that thread)."""
        view = s.task_threads.view
        if not self.enabled or view is None or not view.enabled or s.target is None:
            return False
        inv = s.target.inventory
        # gdb's `next`/`step` range-step (`r`); a single step (`stepi`, a client without
        # range stepping) of a task thread stays refused: no instruction of it runs alone
        act = next((a for a in resume.actions if a.op == "r" and a.thread is not None and view.knows(a.thread.tid)),
                   None)
        task = view.tasks.get(act.thread.tid) if act is not None and act.thread is not None else None
        if inv is None or task is None or not task.frames or resume.reverse:
            return False
        frame = task.frames[0]
        fn = inv.resume_fn_at(frame.pc - s.target.bias)
        layout = inv.layouts.get(fn.layout_name) if fn is not None and fn.layout_name else None
        if fn is None or layout is None or fn.wrapper:
            return False
        bias = s.target.bias
        states = {x.value: x.name for x in layout.states}
        assert act is not None and act.thread is not None
        origin = Origin("next", act.thread, fn.low_pc + bias, fn.high_pc + bias, fn.path or fn.name,
                        frame.self_addr, fn.self_in, 0, 0, frame.self_addr + layout.state_offset,
                        layout.state_size, self._line(s, frame.pc), states)
        s.task_threads.stale()
        s.start_proc(self._proc_task_wait(s, origin))
        return True

    def _proc_task_wait(self, s: Session, origin: Origin) -> Procedure:
        self.taken += 1
        self.origin = origin
        yield from self._plant(s, origin.low, None, None)
        s.proc = None
        self._run(s, None)

    def proc_note(self, s: Session, resume: Resume, body: bytes, raw: bytes | None) -> Procedure:
        """Sync the capture (the engine's scopes current), note the origin, then resume."""
        sync = s.capture_call("sync")
        if sync is not None:
            yield from sync
        origin = self._origin_for(s, resume)
        if origin is not None:
            (word,) = yield Exchange((b"m%x,8" % origin.entry_sp,))
            data = memory_bytes(word)
            ret = int.from_bytes(data, "little") if data is not None and len(data) == 8 else None
            origin = self._complete(s, origin, ret)
        s.proc = None
        self.origin = origin
        self._noted = resume
        if origin is not None:
            self._last[origin.thread.tid] = origin
        s.lifecycle.resume_after_proc(resume, body, raw)

    def intercepts(self, s: Session, sr: StopReply, pc: int | None) -> bool:
        """A stop at the wait's breakpoint while the step waits: the step's own."""
        w = self.wait
        if w is None or pc != w.addr or sr.kind != "T" or sr.signal != SIGTRAP or sr.thread is None:
            return False
        s.start_proc(self._proc_wait_hit(s, sr, pc))
        return True

    def on_report(self, s: Session, sr: StopReply | None) -> bool:
        """A stop about to reach the client: the end of an origin's step (taken over
        when its coroutine suspended), or the end of a wait (stated)."""
        if self.wait is not None:
            self._end_wait(s, sr)
            return False
        origin, self.origin = self.origin, None
        if origin is None or sr is None or sr.kind != "T" or sr.thread is None or s.proc is not None:
            return False
        if not sr.thread.matches(origin.thread) or sr.signal != SIGTRAP:
            return False
        if origin.children and origin.kind == "next" and self._into_machinery(s, origin, sr):
            s.start_proc(self._proc_hide_call(s, origin, sr))
            return True
        if origin.inlined and origin.kind == "next" and self._out_of_inlined(s, origin, sr):
            s.start_proc(self._proc_inline_out(s, origin, sr))
            return True
        # F returned: its frame is gone. Not always at the return address itself:
        # a stop there may come one instruction later (seen with gdbserver's range
        # stepping over the capture's exit breakpoint at F's `ret`).
        pc, sp = sr.pc(s.pc_regnum), sr.register_value(RSP_REGNUM_AMD64)
        if pc is None or sp is None or origin.low <= pc < origin.high or sp < origin.entry_sp + 8:
            return False
        s.start_proc(self._proc_returned(s, origin, sr))
        return True

    # -- origin -------------------------------------------------------------------------
    def _origin_for(self, s: Session, resume: Resume) -> Origin | None:
        st = s.stopped
        assert st is not None and st.thread is not None and st.pc is not None
        action = resume.action_for(st.thread)
        if action is None:
            return None
        kind = "next" if action.op in ("s", "r") else "finish" if action.op == "c" else None
        if kind is None or (action.op == "s" and self.range_stepping_client(s)):
            # gdb range-steps its `next` and `step` (`r`) when the stub can: its single
            # steps are then `stepi`s (or a step off its own breakpoint), which go where
            # the instruction goes, into the scheduler too (without this, a `stepi` over
            # a resume function's `ret` ended on the .await line of its next poll).
            return None
        inv, bias, engine = s.target.inventory, s.target.bias, s.engine
        fn = inv.resume_fn_at(st.pc - bias)
        layout = inv.layouts.get(fn.layout_name) if fn is not None and fn.layout_name else None
        scope = engine.current_scope(st.thread.tid) if fn is not None else None
        if fn is None or layout is None:
            return None
        if scope is None or scope.site != fn.low_pc + bias:
            # On F's `ret` the capture's exit breakpoint has already ended the poll
            # scope (lldb runs to each branch with a breakpoint, then steps it): the
            # activation noted at the thread's earlier step is still the one, if
            # its frame is still there.
            last = self._last.get(st.thread.tid)
            sp = self._stopped_sp(s)
            if last is None or last.low != fn.low_pc + bias or sp is None or sp > last.entry_sp:
                return None
            return dataclasses.replace(last, kind=kind, line=self._line(s, st.pc), start_sp=sp, children=())
        task = engine.task(scope.task)
        if task is None:
            return None
        states = {x.value: f"{x.name}" + (f" at {x.loc}" if x.loc else "") for x in layout.states}
        line = self._line(s, st.pc)
        return Origin(kind, st.thread, fn.low_pc + bias, fn.high_pc + bias, fn.path or fn.name,
                      task.self_ptr, fn.self_in, scope.sp, 0, task.self_ptr + layout.state_offset,
                      layout.state_size, line, states, self._stopped_sp(s) or 0,
                      self._children(s, layout, line), _inlined_at(inv, fn.low_pc, st.pc - bias, bias))

    def _switched(self, s: Session, origin: Origin, reply: bytes) -> bytes:
        """The step's end on another thread than the client's, as the client can take it:
        gdb (its qSupported names `vContSupported`) a plain stop of that thread; another
        client (lldb) a stop of its own stepping thread that says where the task went on."""
        self.switched += 1
        if feature_on(s.client_features, "vContSupported"):
            return foreign_stop(reply)
        st = stop_or_none(reply)
        where = f"thread with tid {st.thread.tid}" if st is not None and st.thread is not None else "another thread"
        return stepping_thread_stop(origin.thread, f"async step: {origin.name} resumed on the {where} "
                                                   f"(select it to see the next line)")

    @staticmethod
    def range_stepping_client(s: Session) -> bool:
        """gdb (its qSupported names `vContSupported`) with a stub that takes `vCont;r`:
        its line steps come as range steps. lldb steps lines with single steps."""
        return b"r" in s.stub_vcont_ops and feature_on(s.client_features, "vContSupported")

    @staticmethod
    def _stopped_sp(s: Session) -> int | None:
        return s.last_stop.register_value(RSP_REGNUM_AMD64) if s.last_stop is not None else None

    def _children(self, s: Session, layout: Layout, line: SourceLoc | None) -> tuple[tuple[int, int], ...]:
        """The resume functions of the async fns this line awaits (step into them, over the rest)."""
        if line is None:
            return ()
        inv, bias = s.target.inventory, s.target.bias
        names = {x.awaitee.type_name for x in layout.states
                 if x.value >= 3 and x.awaitee is not None and x.loc is not None and _same_line(x.loc, line)}
        return tuple((f.low_pc + bias, f.high_pc + bias) for f in inv.resume_fns if f.layout_name in names)

    @staticmethod
    def _complete(s: Session, origin: Origin, ret: int | None) -> Origin | None:
        """The origin with its return address; a continue without gdb's `finish`
        breakpoint there is no step to follow."""
        if ret is None:
            return None
        if origin.kind == "finish" and not any(k[1] == ret for k in s.bps.client):
            return None  # a continue, not a finish: nothing to follow
        return dataclasses.replace(origin, ret_addr=ret, client_frame=(ret, origin.entry_sp))

    def _into_machinery(self, s: Session, origin: Origin, sr: StopReply) -> bool:
        """The step from an .await line entered what lies between it and the awaited
        async fn's body: a call that is not the child's resume function (the child's
        constructor, `into_future`) or code inlined from another file (`Pin::new_unchecked`)."""
        pc, sp = sr.pc(s.pc_regnum), sr.register_value(RSP_REGNUM_AMD64)
        if pc is None or sp is None or _child_at(origin, pc) is not None:
            return False
        if not origin.low <= pc < origin.high:
            return sp < origin.start_sp
        loc = self._line(s, pc)  # None: a row of line 0 (code of no line: the await's own glue)
        return origin.line is not None and (loc is None or _file_of(loc) != _file_of(origin.line))

    @staticmethod
    def _out_of_inlined(s: Session, origin: Origin, sr: StopReply) -> bool:
        """The step left the inlined coroutine it started in for its parent's code in F:
        on the way to a suspension (the parent's state written, F's return) or past
        the child's completion."""
        pc = sr.pc(s.pc_regnum)
        return (pc is not None and origin.low <= pc < origin.high
                and not any(lo <= pc < hi for lo, hi in origin.inlined))

    # -- procedures ---------------------------------------------------------------------
    def _proc_inline_out(self, s: Session, origin: Origin, sr: StopReply) -> Procedure:
        """Out of an inlined coroutine into its parent (release builds): the thread alone,
        on to F's return (suspended: the wait; gdb's own next ends it on the child's line
        once polled again), back into the child, or another line of the parent."""
        thread = sr.thread
        assert thread is not None
        reply = sr.build()
        first = self._line(s, sr.pc(s.pc_regnum) or 0)
        for _ in range(MAX_LINE_STEPS):
            st = stop_or_none(reply)
            pc = st.pc(s.pc_regnum) if st is not None and st.kind == "T" and st.signal == SIGTRAP else None
            sp = st.register_value(RSP_REGNUM_AMD64) if st is not None and pc is not None else None
            if pc is None or sp is None:
                break
            if not origin.low <= pc < origin.high:
                if sp >= origin.entry_sp + 8:
                    assert st is not None
                    yield from self._proc_returned(s, origin, st)
                    return
                reply = yield from self._over_call(s, thread, sp)
                continue
            if any(lo <= pc < hi for lo, hi in origin.inlined):
                break
            loc = self._line(s, pc)
            if loc is not None and loc != first and (origin.line is None or loc.line != origin.line.line):
                break
            reply = yield from self._single_step(s, thread)
        s.proc = None
        s.report_stop(stop_or_none(reply), None, reply)

    def _proc_hide_call(self, s: Session, origin: Origin, sr: StopReply) -> Procedure:
        """Through the machinery to the child's body or back to the .await line's own
        code (the thread alone): a child's entry is the client's (gdb's `step` stops
        in its body); back on the line inside the client's range, its step goes on."""
        thread = sr.thread
        assert thread is not None and origin.line is not None
        reply = sr.build()
        for _ in range(MAX_LINE_STEPS):
            st = stop_or_none(reply)
            pc = st.pc(s.pc_regnum) if st is not None and st.kind == "T" and st.signal == SIGTRAP else None
            sp = st.register_value(RSP_REGNUM_AMD64) if st is not None and pc is not None else None
            if pc is None or sp is None:
                break
            if _child_at(origin, pc) is not None:
                break  # the child's entry: gdb's `step` runs its prologue and stops on its first line
            if not origin.low <= pc < origin.high:
                if sp >= origin.start_sp:  # F itself returned on the way
                    assert st is not None
                    yield from self._proc_returned(s, origin, st)
                    return
                reply = yield from self._over_call(s, thread, sp)
                continue
            loc = self._line(s, pc)
            if loc is not None and _file_of(loc) == _file_of(origin.line):
                resume = s.resume
                action = resume.action_for(thread) if resume is not None else None
                if (action is not None and action.op == "r" and action.range is not None
                        and action.range[0] <= pc < action.range[1] and not s.interrupt_pending):
                    s.proc = None
                    self.origin = origin  # still the client's step: on with it
                    s.forward(without_signals(resume), None, resume=True)
                    return
                if loc.line != origin.line.line:
                    break
                # another row of the .await line: on through it (gdb would stop there)
            reply = yield from self._single_step(s, thread)
        s.proc = None
        s.report_stop(stop_or_none(reply), None, reply)

    def _proc_returned(self, s: Session, origin: Origin, sr: StopReply) -> Procedure:
        """F returned on the origin's thread: Pending waits for the coroutine's next poll."""
        state = yield from self._read_state(origin)
        if state is None or state < 3:
            s.proc = None
            s.report_stop(sr, None, sr.build())
            return
        self.taken += 1
        self.origin = origin
        yield from self._step_off(s, sr.thread, sr.pc(s.pc_regnum) or 0)
        yield from self._plant(s, origin.low, None, None)
        s.proc = None
        self._run(s, None)

    def _proc_wait_hit(self, s: Session, sr: StopReply, pc: int) -> Procedure:
        w, origin = self.wait, self.origin
        assert w is not None and origin is not None and sr.thread is not None
        (regs,) = yield Exchange((b"g",))
        probe = s.probes.get(pc)
        if w.thread is None:
            mine = g_register(regs, origin.self_in) == origin.self_ptr
        else:
            mine = sr.thread.matches(w.thread) and (w.sp is None or g_register(regs, "rsp") == w.sp)
        if not mine:
            s.proc = None
            if probe is not None and not w.planted:
                if not s.hidden.probe_hit(sr, sr.build(), pc):
                    s.report_stop(sr, None, sr.build())
                return
            s.start_proc(self._proc_pass(s, sr.thread, pc))
            return
        yield from self._record_probe(s, sr, pc)  # the capture's probe at the same address
        yield from self._unplant(s)
        if w.thread is None:
            state = yield from self._read_state(origin)
            if state is not None and state < 3:
                # Not suspended any more: the coroutine was dropped (its task cancelled or
                # its owner gone) and a new one of the same async fn took its memory.
                s.proc = None
                self._give_up(s, sr, f"{origin.name} {origin.self_ptr:#x} was dropped while the step waited; "
                              f"a new coroutine ({origin.states.get(state, state)}) is polled at its address",
                              foreign_stop(sr.build()))
                return
            yield from self._arrived(s, origin, sr, regs)
        else:
            yield from self._returned_again(s, origin, sr)

    def _proc_pass(self, s: Session, thread: ThreadId, pc: int) -> Procedure:
        """Another coroutine at the wait's breakpoint: step it over, run on."""
        yield from self._step_off(s, thread, pc)
        s.proc = None
        self._run(s, None)

    def _arrived(self, s: Session, origin: Origin, sr: StopReply, regs: bytes) -> Procedure:
        """The coroutine is polled again, on sr.thread, at F's entry."""
        thread = sr.thread
        assert thread is not None
        entry_sp = g_register(regs, "rsp")
        if origin.kind == "finish":
            data = None
            if entry_sp is not None:
                (word,) = yield Exchange((b"m%x,8" % entry_sp,))
                data = memory_bytes(word)
            if entry_sp is None or data is None or len(data) != 8:
                s.proc = None
                self._give_up(s, sr, "the return address of its poll could not be read")
                return
            ret = int.from_bytes(data, "little")
            self.origin = dataclasses.replace(origin, entry_sp=entry_sp, ret_addr=ret)
            yield from self._plant(s, ret, thread, entry_sp + 8)
            s.proc = None
            self._run(s, thread)
            return
        reply = yield from self._to_line(s, origin, thread, sr)
        if reply is None:
            return
        if thread.matches(origin.thread):
            # gdb's own `next` goes on from the resumed .await line
            self.origin = None
            s.proc = None
            s.report_stop(stop_or_none(reply), None, reply)
            return
        reply = yield from self._next_line(s, origin, thread, reply)
        st = stop_or_none(reply)
        if st is not None and st.kind == "T" and st.signal == SIGTRAP:
            reply = self._switched(s, origin, reply)
        self.origin = None  # (any other stop - the client's Ctrl-C, a signal - as it came)
        s.proc = None
        s.report_stop(stop_or_none(reply), None, reply)

    def _record_probe(self, s: Session, sr: StopReply, pc: int) -> Procedure:
        """A thread the proxy moves off a capture probe it stopped at: the capture hears of the hit."""
        probe = s.probes.get(pc)
        if probe is None or not s.bps.proxy_owns(pc):
            return
        s.stats.probe_stats.hit(probe, sr.thread)
        reads = s.hidden.capture_reads(probe, sr)
        replies = (yield Exchange(reads)) if reads else []
        s.hidden.capture_hit(probe, sr, list(replies))

    def _returned_again(self, s: Session, origin: Origin, sr: StopReply) -> Procedure:
        """`finish`: the activation returned; Ready ends the step, Pending waits again."""
        state = yield from self._read_state(origin)
        if state is not None and state >= 3:
            yield from self._step_off(s, sr.thread, sr.pc(s.pc_regnum) or 0)
            yield from self._plant(s, origin.low, None, None)
            s.proc = None
            self._run(s, None)
            return
        self.origin = None
        s.proc = None
        body = sr.build()
        # gdb's `finish` breakpoint stops only its thread in its frame: elsewhere gdb
        # would step over the trap and run on, so that end is a plain stop there
        ret, sp = origin.client_frame
        if not (sr.thread is not None and sr.thread.matches(origin.thread) and sr.pc(s.pc_regnum) == ret
                and sr.register_value(RSP_REGNUM_AMD64) == sp + 8):
            body = self._switched(s, origin, body)
        s.report_stop(stop_or_none(body), None, body)

    def _to_line(self, s: Session, origin: Origin, thread: ThreadId, sr: StopReply) -> Procedure:
        """Single-step the thread from F's entry through the state dispatch to the
        first instruction of the line the step started on; its stop reply, or None
        (the step ended otherwise and was reported)."""
        reply = sr.build()
        targets = ({origin.line} if origin.line is not None else set()) | (
            set() if origin.inlined else self._await_lines(s))
        for _ in range(MAX_DISPATCH_STEPS):
            reply = yield from self._single_step(s, thread)
            st = stop_or_none(reply)
            if st is None or st.kind != "T" or st.signal != SIGTRAP:
                s.proc = None
                self._give_up(s, st, "the thread stopped for another reason on the way", reply)
                return None
            pc = st.pc(s.pc_regnum)
            if pc is None or not origin.low <= pc < origin.high:
                break
            # The line the step started on, or (release builds, where the awaiting
            # child is inlined into this function) an .await line of an inlined child:
            # gdb's `next` from there steps over the inlined child as over a call.
            if self._line(s, pc) in targets:
                return reply
        # The dispatch did not reach that line (another build's code shape): the
        # client gets the thread where it is, with the reason.
        s.emit(ToClient(build_console_output(
            "asyncrsp: the coroutine resumed; its .await line was not found, stopped where it runs\n")))
        return reply

    def _next_line(self, s: Session, origin: Origin, thread: ThreadId, reply: bytes) -> Procedure:
        """The proxy's own `next` on a thread the client is not stepping: single steps
        to the first instruction of another line of F, calls stepped over."""
        body_sp = None
        for _ in range(MAX_LINE_STEPS):
            st = stop_or_none(reply)
            if st is None or st.kind != "T" or st.signal != SIGTRAP:
                break
            pc, sp = st.pc(s.pc_regnum), st.register_value(RSP_REGNUM_AMD64)
            if pc is None or sp is None:
                break
            if body_sp is None:
                body_sp = sp
            if origin.low <= pc < origin.high:
                # another line of the async fn's own file (rows of inlined code from
                # other files - into_future, the awaitee's poll - are not a new line)
                loc = self._line(s, pc)
                if (loc is not None and origin.line is not None and loc.file == origin.line.file
                        and loc.line not in (0, origin.line.line)):
                    return reply
            elif sp < body_sp:
                reply = yield from self._over_call(s, thread, sp)
                continue
            else:
                break  # F returned (Pending again or done): the thread is shown there
            reply = yield from self._single_step(s, thread)
        return reply

    def _over_call(self, s: Session, thread: ThreadId, sp: int) -> Procedure:
        """The thread entered a call: run it alone to the return address."""
        (word,) = yield Exchange((b"m%x,8" % sp,))
        data = memory_bytes(word)
        if data is None or len(data) != 8:
            return (yield from self._single_step(s, thread))
        ret = int.from_bytes(data, "little")
        key: BpKey = (0, ret, 1)
        planted = s.bps.proxy_insert(key) if not s.bps.proxy_owns(ret) and not s.bps.client_owns(ret) else False
        if planted:
            yield Exchange((z_packet(True, key),))
        cont = b"vCont;c:" + thread.format(thread.pid is not None)
        while True:
            # the call may take long (or block): the client's Ctrl-C reaches the stub now
            self.alone = True
            (reply,) = yield Exchange((cont,), resume=True)
            self.alone = False
            st = stop_or_none(reply)
            if st is None or st.kind != "T" or st.signal != SIGTRAP or st.pc(s.pc_regnum) != ret:
                break
            if st.register_value(RSP_REGNUM_AMD64) == sp + 8:
                break
            yield from self._step_off(s, thread, ret)  # recursion: an inner frame returned there
        if planted and s.bps.proxy_remove(key) and not (st is not None and st.kind in ("W", "X")):
            yield Exchange((z_packet(False, key),))
        return reply

    def _single_step(self, s: Session, thread: ThreadId) -> Procedure:
        """One instruction of `thread` alone, over a breakpoint at its pc if any."""
        (regs,) = yield Exchange((b"g",))
        pc = g_register(regs, "rip")
        key = _key_at(s, pc) if pc is not None else None
        step = b"vCont;s:" + thread.format(thread.pid is not None)
        if key is None:
            (reply,) = yield Exchange((step,), resume=True)
            return reply
        replies = yield Exchange((z_packet(False, key), step), resume=True)
        yield Exchange((z_packet(True, key),))
        return replies[-1]

    def _step_off(self, s: Session, thread: ThreadId | None, pc: int) -> Procedure:
        """A thread that sits on a breakpoint the stub holds executes it once, not the int3."""
        key = _key_at(s, pc)
        if key is None or thread is None:
            return
        step = b"vCont;s:" + thread.format(thread.pid is not None)
        yield Exchange((z_packet(False, key), step), resume=True)
        yield Exchange((z_packet(True, key),))

    def _plant(self, s: Session, addr: int, thread: ThreadId | None, sp: int | None) -> Procedure:
        kind = 1 if getattr(s.capture, "swallows_breakpoints", False) else 0
        key: BpKey = (kind, addr, 1)
        planted = not s.bps.proxy_owns(addr) and not s.bps.client_owns(addr)
        if planted:
            s.bps.proxy_insert(key)
            (ok,) = yield Exchange((z_packet(True, key),))
            if ok != b"OK":
                s.bps.proxy_remove(key)
                planted = False
        self.wait = Wait(addr, key, planted, thread, sp)

    def _unplant(self, s: Session) -> Procedure:
        w, self.wait = self.wait, None
        if w is not None and w.planted and s.bps.proxy_remove(w.key):
            yield Exchange((z_packet(False, w.key),))

    def _run(self, s: Session, thread: ThreadId | None) -> None:
        """Continue the program (or one thread) while the client's step waits."""
        if s.interrupt_pending or s.closing:
            st = s.last_stop
            self._end_wait(s, st)
            s.report_stop(None, None, s.hidden.interrupt_reply(st) if st is not None else b"S02")
            return
        action = ResumeAction("c", None, thread)
        resume = Resume((action,))
        s.resume = resume
        s.stopped = None
        s.forward(resume.build(), None, resume=True)

    def _read_state(self, origin: Origin) -> Procedure:
        (reply,) = yield Exchange((b"m%x,%x" % (origin.state_addr, origin.state_size),))
        data = memory_bytes(reply)
        return int.from_bytes(data, "little") if data is not None and len(data) == origin.state_size else None

    def _end_wait(self, s: Session, sr: StopReply | None) -> None:
        """A stop of the client's while the step waited: take the breakpoint out, say why."""
        w, origin = self.wait, self.origin
        self.wait = self.origin = None
        if w is None:
            return
        exited = sr is not None and sr.kind in ("W", "X")
        if w.planted and s.bps.proxy_remove(w.key) and not exited:
            s.to_stub(z_packet(False, w.key), Waiter("drop"))
        what = origin.name if origin is not None else "the coroutine"
        addr = f" {origin.self_ptr:#x}" if origin is not None else ""
        why = ("the program exited" if exited else
               "the client's interrupt" if sr is not None and sr.signal in (2, 0x13) else
               "another stop")
        s.emit(ToClient(build_console_output(
            f"asyncrsp: the step ended before {what}{addr} was polled again ({why})\n")))

    def _give_up(self, s: Session, st: StopReply | None, why: str, reply: bytes | None = None) -> None:
        self.wait = self.origin = None
        s.emit(ToClient(build_console_output(f"asyncrsp: the step stopped: {why}\n")))
        if reply is not None:
            s.report_stop(st, None, reply)
        elif st is not None:
            s.report_stop(st, None, st.build())

    def _await_lines(self, s: Session) -> set[SourceLoc]:
        """Every suspend point's .await line of the program's coroutines."""
        if self._awaits is None:
            inv = s.target.inventory if s.target is not None else None
            layouts = inv.layouts.values() if inv is not None else ()
            self._awaits = {x.loc for lay in layouts for x in lay.states if x.value >= 3 and x.loc is not None}
        return self._awaits

    def _line(self, s: Session, pc: int) -> SourceLoc | None:
        path = s.target.path if s.target is not None else None
        if path is None:
            return None
        if self._lines is None or self._lines_path != path:
            from proxy.capture.target import line_lookup

            self._lines, self._lines_path = line_lookup(path), path
        return self._lines(pc - s.target.bias) if self._lines is not None else None

    # -- monitor ------------------------------------------------------------------------
    def command(self, words: list[str]) -> str:
        """``monitor async step [on|off]``."""
        if words and words[0] in ("on", "off"):
            self.enabled = words[0] == "on" and self.refused is None
        state = "on" if self.enabled else f"off ({self.refused})" if self.refused else "off"
        return (f"async step: {state} (steps taken over: {self.taken}, "
                f"ended on another thread: {self.switched})\n")


def foreign_stop(reply: bytes) -> bytes:
    """The stop of a thread the client was not stepping, in the form gdb shows
    as a plain stop at a line: signal 0 (``Thread N "name" stopped.``), never
    SIGTRAP (gdb would call that a random signal)."""
    if reply[:1] == b"T" and len(reply) >= 3:
        # no stop reason either: a `swbreak` would make gdb look for its own breakpoint there
        return b"T00" + reply[3:].replace(b"swbreak:;", b"").replace(b"hwbreak:;", b"")
    return reply


def stepping_thread_stop(thread: ThreadId, why: str) -> bytes:
    """lldb's form of that end: a stop of the thread lldb was stepping, its reason
    (lldb's `reason:exception` with a hex `description`) naming the thread the task
    went on in, no registers (they are that thread's; lldb reads them). lldb ignores
    the stop of a thread its step kept suspended (lldb's `Thread::ShouldStop`: a
    signal-0 or any stop of another thread) and went on stepping its own thread
    alone, parked in the scheduler: the step never ended."""
    return (b"T00thread:" + thread.format(thread.pid is not None) + b";reason:exception;description:"
            + why.encode().hex().encode() + b";")


def _inlined_at(inv: Inventory, low: int, link_pc: int, bias: int) -> tuple[tuple[int, int], ...]:
    """The ranges (runtime) of the coroutine inlined into the resume function at `low`
    whose code holds `link_pc`, or ()."""
    for ic in inv.inlined:
        if ic.parent_low_pc == low and any(lo <= link_pc < hi for lo, hi in ic.ranges):
            return tuple((lo + bias, hi + bias) for lo, hi in ic.ranges)
    return ()


def _child_at(origin: Origin, pc: int) -> tuple[int, int] | None:
    for child in origin.children:
        if child[0] <= pc < child[1]:
            return child
    return None


def _file_of(loc: SourceLoc) -> str:
    return loc.file.replace("\\", "/").rsplit("/", 1)[-1]


def _same_line(a: SourceLoc, b: SourceLoc) -> bool:
    """DWARF names a declaration's file and a line row's file in their own ways
    (a path relative to the unit's directory, or absolute): the line and the
    file's last components must agree."""
    if a.line != b.line:
        return False
    x, y = a.file.replace("\\", "/"), b.file.replace("\\", "/")
    return x == y or x.endswith("/" + y.lstrip("./")) or y.endswith("/" + x.lstrip("./"))


def _key_at(s: Session, pc: int) -> BpKey | None:
    key = s.bps.proxy_key_at(pc)
    if key is not None and key[0] in (0, 1):
        return key
    for k in s.bps.client:
        if k[1] == pc and k[0] in (0, 1):
            return k
    return None


__all__ = ["AsyncStepping", "Origin", "foreign_stop", "g_register"]
