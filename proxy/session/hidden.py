"""Hidden stops (DESIGN.md §3 rules 2-4 and 8): a trap at a proxy breakpoint
is counted, handed to the capture, and the thread resumed as the client
asked - by emulating the probed instruction (emulate.py, one resume) or by
stepping over it; a probe at a client breakpoint is processed, then reported."""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import TYPE_CHECKING

from rsp.errors import MalformedPacket
from rsp.framing import frame
from rsp.packets.memory import memory_bytes
from rsp.packets.resume import Resume
from rsp.packets.stop import StopReply, parse_stop_reply
from rsp.threads import ThreadId

from proxy.probes import Probe
from proxy.procedure import Exchange, Procedure

from . import emulate
from .actions import Notice, ToStub
from .breakpoints import BpKey
from .state import Waiter
from .wire import (
    SIGINT,
    SIGSTOP,
    SIGTRAP,
    expedite_from_g,
    feature_on,
    has_signal_for,
    is_trap_reason,
    pc_from_g,
    step_packet,
    stop_or_none,
    tid_of,
    without_signals,
    z_packet,
)

if TYPE_CHECKING:
    from .state import SessionBase


class HiddenStops:
    """Hidden stops, a part the session holds (`session.hidden`): a stop at a proxy
    breakpoint classified, counted, handed to the capture and resumed as the client asked
    (the module's docstring). It keeps no state of its own: it acts on the session's (`s`)
    stop, breakpoint table, capture and procedure runner."""

    def __init__(self, session: SessionBase) -> None:
        self.s = session

    def thread_on_proxy_bp(self, resume: Resume) -> tuple[ThreadId, BpKey] | None:
        """The last-stopped thread sits on a proxy breakpoint it would re-execute."""
        st = self.s.stopped
        if st is None or st.thread is None or st.pc is None:
            return None
        key = self.s.bps.proxy_key_at(st.pc)
        if key is None or key[0] != 0:
            return None
        action = resume.action_for(st.thread)
        if action is None:
            return None
        return st.thread, key

    def interrupt_reply(self, step: StopReply) -> bytes:
        """The stop the client's interrupt would have given (rule 8): gdbserver
        stops with SIGINT, lldb-server with SIGSTOP; no stop reason."""
        sig = SIGSTOP if feature_on(self.s.stub_features, "QThreadSuffixSupported") else SIGINT
        if step.thread is None:
            return b"S%02x" % sig
        return b"T%02xthread:%s;" % (sig, step.thread.format(step.thread.pid is not None))

    def client_steps(self, thread: ThreadId | None) -> bool:
        if self.s.resume is None:
            return False
        if thread is None:  # a stop without a thread (S05): any step of the client's
            return self.s.resume.is_step
        action = self.s.resume.action_for(thread)
        return action is not None and action.op in ("s", "S", "r")

    def probe_hit(self, sr: StopReply, raw: bytes, pc: int) -> bool:
        """A trap at `pc`: if it is a probe, count it and handle it (hidden or shared)."""
        probe = self.s.probes.get(pc)
        if probe is None or (self.s.bps.proxy_key_at(pc) is None and not self.s.bps.client_owns(pc)):
            # A trap at a probe's address while no breakpoint of ours is there (the
            # stub refused the Z0, or its reply came for another request: found by
            # tests/proxy/session/test_fuzz_session.py): not ours to hide - unless it
            # is a late report of one that was there (late_trap).
            return self.late_trap(sr, pc)
        self.s.stats.probe_stats.hit(probe, sr.thread)
        self.s.stop_pc_override = pc
        if not self.s.bps.client_owns(pc) and not self.s.closing:
            self.s.start_proc(self._proc_hidden_stop(sr, pc, probe))
        else:
            self.s.stats.shared_stops += 1
            self.s.start_proc(self._proc_shared_stop(sr, raw, probe))
        return True

    def late_trap(self, sr: StopReply, pc: int) -> bool:
        """A SIGTRAP at an address where the proxy had a breakpoint since the client last saw
        a stop, taken out since, where the client has none: the proxy's trap, reported late
        (hidden and resumed as the client asked: True).

        Only for a stub that lets every trapping thread report on its own (QEMU 7.2 user
        mode, pacing.py): a thread that trapped at a hidden breakpoint while another one's
        stop was handled reports it once it gets the socket, after the proxy took that
        breakpoint out (seen when the capture went off at a second thread's report, which
        it no longer does: about 1 run in 100 of the corpus' tokio_app mt under load; the
        client was shown a SIGTRAP at the probe; a capture or mode switch takes breakpoints
        out too). QEMU traps before the
        instruction at the breakpoint's address (accel/tcg/cpu-exec.c,
        check_for_breakpoints_slow: EXCP_DEBUG on ``pc == bp->pc``; linux-user/i386/
        cpu_loop.c: SIGTRAP at ``env->eip``; the `g` of every hidden stop in the packet logs
        says the Z0's address, not one past it): nothing to step over or put back, the
        thread's pc stays as it is and the instruction runs when the thread resumes. A stub
        that stops every thread at a report (gdbserver) drops such a trap itself."""
        s = self.s
        if s.pacer.no_ack or sr.signal != SIGTRAP or not s.bps.late_trap(pc) or s.resume is None:
            return False
        if not is_trap_reason(sr) and (sr.reason is not None or self.client_steps(sr.thread)):
            return False
        s.stats.late_traps += 1
        if s.stats.late_traps == 1:
            s.emit(Notice(f"a thread's trap at {pc:#x}, where a hidden breakpoint was, came after it was "
                           "taken out (QEMU user mode): hidden, the program resumed (counted in stats)"))
        self._go_on(sr)
        return True

    def _go_on(self, sr: StopReply) -> None:
        """Resume as the client asked after a hidden stop with nothing to step over; the
        interrupt's stop instead if the client asked for one meanwhile (rule 8)."""
        resume = self.s.resume
        if resume is None or self.s.interrupt_pending or self.s.closing:
            self._proc_done_report(self.interrupt_reply(sr))
        else:
            self.s.forward(without_signals(resume), None, resume=True)

    def proc_read_pc_then_classify(self, sr: StopReply, raw: bytes) -> Procedure:
        scanned = False
        if sr.thread is None:
            # `S05` (gdbserver --disable-packet=T): no thread, and gdbserver's
            # selected thread stays the client's, not the one that stopped
            # (stop-reply-no-thread-multi.exp: the worker hit a probe). The
            # selected thread first; if it is not at a probe, the one that is.
            qc, regs = yield Exchange((b"qC", b"g"))
            cur = qc[2:] if qc.startswith(b"QC") else None
            pc = pc_from_g(regs, self.s.arch)
            found = cur if pc is not None and pc in self.s.probes else None
            if found is None and cur is not None:
                ids: list[bytes] = []
                (listing,) = yield Exchange((b"qfThreadInfo",))
                while listing[:1] == b"m" and len(ids) < 4096:
                    ids += listing[1:].split(b",")
                    (listing,) = yield Exchange((b"qsThreadInfo",))
                for t in ids:
                    if t == cur:
                        continue
                    (_, other) = yield Exchange((b"Hg" + t, b"g"))
                    opc = pc_from_g(other, self.s.arch)
                    if opc is not None and opc in self.s.probes:
                        found, regs, scanned = t, other, True
                        break
                if ids:
                    yield Exchange((b"Hg" + cur,))  # the client's selection back (rule 6)
            if found is not None:
                try:
                    sr = dataclasses.replace(sr, thread=ThreadId.parse(found))
                except MalformedPacket:
                    pass
        else:
            regs = yield from self._registers_of(sr.thread)
        self.s.proc = None
        pc = pc_from_g(regs, self.s.arch)
        sr = expedite_from_g(sr, regs, self.s.arch)
        # A thread found by the scan is not the stub's selected one: no
        # emulation (its writes would go to the selected thread).
        self.s.no_emulation = scanned
        hit = pc is not None and self.probe_hit(sr, raw, pc)
        self.s.no_emulation = False
        if not hit:
            self.s.report_stop(sr, raw, pc=pc)

    def _registers_of(self, thread: ThreadId) -> Generator[Exchange, list[bytes], bytes]:
        """The `g` block of the thread that stopped. A stub that lets every trapping thread
        report on its own (QEMU 7.2 user mode, pacing.py) makes a reporting thread its
        selected one (gdbstub.c, gdb_set_stop_cpu: ``g_cpu = cpu``) and builds every reply
        in one buffer (``str_buf``: handle_read_all_regs' memtohex, gdb_handlesig's
        ``T05thread:``): a report that comes while `g` is answered leaves the block another
        thread's, or a mix of both (seen, 1 run in about 150 of the corpus' tokio_app mt:
        ``T05thread:p01.529a;`` and the rest of the block, one valid packet; the pc unread,
        the client was shown a SIGTRAP at a probe). Then it is read again, the thread
        selected first (`Hg`: the client takes the stopped thread for the selected one)."""
        strays = self.s.pacer.strays
        (regs,) = yield Exchange((b"g",))
        for _ in range(3):
            if self.s.pacer.no_ack or self.s.pacer.strays == strays:
                break
            strays = self.s.pacer.strays
            (_, regs) = yield Exchange((b"Hg" + thread.format(thread.pid is not None), b"g"))
        return regs

    def _proc_hidden_stop(self, sr: StopReply, pc: int, probe: Probe) -> Procedure:
        """Rules 2-4 and 8: step the thread over the proxy's breakpoint, resume."""
        t0 = self.s.config.clock()
        self.s.stats.hidden_stops += 1
        key = self.s.bps.proxy_key_at(pc)
        if key is None:  # the capture's breakpoint is gone: nothing to step over
            self.s.proc = None
            self.s.stats.hidden_time += self.s.config.clock() - t0
            self._go_on(sr)
            return
        thread = sr.thread
        step = step_packet(thread)
        reads = self.capture_reads(probe, sr)
        em = self._emulation_for(probe, thread)
        if em is not None:
            # One resume instead of two: read what the instruction needs with
            # the capture's reads, then write its effect and resume (emulate.py).
            extra: tuple[bytes, ...] = () if b"g" in reads else (b"g",)
            sp = sr.register_value(self.s.sp_regnum)
            if em.needs_stack_word and sp is not None:
                extra += (b"m%x,8" % sp,)
            replies = yield Exchange(reads + extra)
            self.capture_hit(probe, sr, replies[: len(reads)])
            regs = replies[reads.index(b"g")] if b"g" in reads else replies[len(reads)]
            word = memory_bytes(replies[-1]) if em.needs_stack_word and sp is not None else None
            effect = emulate.apply(em, regs, word)
            resume = self.s.resume
            if (effect is not None and resume is not None and not self.s.interrupt_pending
                    and not self.s.closing):
                self.s.stats.emulated += 1
                self.s.stats.hidden_time += self.s.config.clock() - t0
                self.s.proc = None
                for body in effect.packets:
                    self.s.to_stub(body, Waiter("write"))
                self.s.waiters.append(Waiter("client-resume", True))
                self.s.emit(ToStub(without_signals(resume)))
                return
            reads = ()  # captured already: fall back to the step-over
        if not self.s.pacer.no_ack and reads:
            # A stub that takes one packet at a time: the reads first, so that a stop report
            # of another thread meanwhile is known before the step (pacing.py)
            self.capture_hit(probe, sr, (yield Exchange(reads)))
            reads = ()
        replies = yield Exchange(reads + (z_packet(False, key), step), resume=True)
        if em is None and reads:
            self.capture_hit(probe, sr, replies[: len(reads)])
        step_reply = replies[-1]
        resume = self.s.resume
        assert resume is not None
        step_sr = stop_or_none(step_reply)
        if (not self.s.pacer.no_ack and step_sr is not None and step_sr.thread is not None
                and thread is not None and step_sr.thread.tid != thread.tid):
            # Another thread's report came for the step (QEMU 7.2 user mode: the step went to
            # the thread whose read took it): the stepped thread steps when it is released and
            # reports then (core: an orphan step, resumed hidden); this one is parked at its
            # stop and goes on, or traps again, at the resume.
            self.s.pacer.stray()
            self.s.orphan_steps.add(thread.tid)
            yield Exchange((z_packet(True, key),))
            self.s.proc = None
            self.s.stats.hidden_time += self.s.config.clock() - t0
            self.s.forward(without_signals(resume), None, resume=True)
            return
        if step_sr is None or step_sr.kind in ("W", "X") or step_sr.signal != SIGTRAP:
            # Something else happened during the step (rule 4): put the
            # breakpoint back if the process lives, and report it.
            if step_sr is not None and step_sr.kind not in ("W", "X"):
                yield Exchange((z_packet(True, key),))
            self.s.stats.hidden_time += self.s.config.clock() - t0
            self._on_stop_reply_after_proc(step_reply)
            return
        new_pc = step_sr.pc(self.s.pc_regnum)
        report: bytes | None = None
        action = resume.action_for(thread) if thread is not None else None
        if self.s.interrupt_pending or self.s.interrupt_forwarded or self.s.closing:
            report = self.interrupt_reply(step_sr)
        elif action is not None and action.op in ("s", "S"):
            report = step_reply  # the proxy's step is the client's step (rule 3)
        elif action is not None and action.op == "r" and action.range is not None:
            lo, hi = action.range
            if new_pc is None or not lo <= new_pc < hi:
                report = step_reply
        if report is not None:
            yield Exchange((z_packet(True, key),))
            self.s.stats.hidden_time += self.s.config.clock() - t0
            self._proc_done_report(report)
            return
        # Put the breakpoint back and re-issue the client's resume, back to back.
        self.s.stats.hidden_time += self.s.config.clock() - t0
        self.s.proc = None
        self.s.to_stub(z_packet(True, key), Waiter("drop"))
        self.s.waiters.append(Waiter("client-resume", True))
        self.s.emit(ToStub(without_signals(resume)))

    def _proc_shared_stop(self, sr: StopReply, raw: bytes, probe: Probe) -> Procedure:
        """Rule 4: a probe at a client breakpoint is processed, then reported."""
        reads = self.capture_reads(probe, sr)
        replies: list[bytes] = (yield Exchange(reads)) if reads else []
        self.capture_hit(probe, sr, replies)
        self.s.proc = None
        self.s.report_stop(sr, raw, pc=self.s.stop_pc_override)
        if self.s.stopped is not None:
            self.s.stopped.counted = True

    def _emulation_for(self, probe: Probe, thread: ThreadId | None) -> emulate.Emulation | None:
        """Emulate the probed instruction when it is safe: a known instruction,
        gdbserver's `g` layout without xmlRegisters (rule 11), and a thread
        that simply continues (a step is the client's own: rule 3)."""
        if (not self.s.emulate or not probe.code or thread is None or self.s.resume is None
                or self.s.no_emulation):
            return None
        if self.s.interrupt_pending or self.s.interrupt_forwarded or self.s.closing:
            return None
        action = self.s.resume.action_for(thread)
        if action is None or action.op not in ("c", "C"):
            return None
        return emulate.decode(probe.code)

    def capture_reads(self, probe: Probe, sr: StopReply | None) -> tuple[bytes, ...]:
        cap = self.s.capture
        if cap is None or probe.kind == "count" or sr is None:
            return ()
        try:
            return tuple(cap.reads(probe, tid_of(sr.thread), sr))
        except Exception as err:  # a capture bug must never take the session down
            self.s.capture_failed(err)
            return ()

    def capture_hit(self, probe: Probe, sr: StopReply | None, replies: list[bytes]) -> None:
        cap = self.s.capture
        if cap is not None and probe.kind != "count" and sr is not None:
            try:
                cap.hit(probe, tid_of(sr.thread), sr, replies)
            except Exception as err:  # noqa: BLE001 - counted and reported once
                self.s.capture_failed(err)

    def _on_stop_reply_after_proc(self, body: bytes) -> None:
        self.s.proc = None
        self.s.on_stop_reply(body, frame(body))

    def _proc_done_report(self, body: bytes) -> None:
        self.s.proc = None
        self.s.report_stop(stop_or_none(body), None, body)

    def proc_step_off_then_resume(
        self, resume: Resume, body: bytes, raw: bytes | None, thread: ThreadId, key: BpKey
    ) -> Procedure:
        """Step a thread off a proxy breakpoint before the client's resume (rule 2).

        The thread was reported stopped at the probe without executing it
        (e.g. a step that entered the function): that is a hit too, unless
        it was a breakpoint stop already counted.
        """
        self.s.resume = resume
        st = self.s.stopped
        reads: tuple[bytes, ...] = ()
        probe = self.s.probes.get(key[1])
        fresh = st is not None and not st.counted and probe is not None
        if fresh and probe is not None:
            self.s.stats.probe_stats.hit(probe, thread)
            reads = self.capture_reads(probe, self.s.last_stop)
        replies = yield Exchange(reads + (z_packet(False, key), step_packet(thread)), resume=True)
        if fresh and probe is not None:
            self.capture_hit(probe, self.s.last_stop, replies[: len(reads)])
        step_reply = replies[-1]
        yield Exchange((z_packet(True, key),))
        self.s.proc = None
        action = resume.action_for(thread)
        if action is not None and action.op in ("s", "S"):
            self._proc_done_report(step_reply)
            return
        try:
            sr = parse_stop_reply(step_reply)
        except MalformedPacket:
            sr = None
        if sr is None or sr.kind in ("W", "X") or sr.signal != SIGTRAP:
            self.s.on_stop_reply(step_reply, frame(step_reply))
            return
        self.s.stopped = None
        self.s.forward(without_signals(resume) if has_signal_for(resume, thread) else body,
                      None, resume=True)

