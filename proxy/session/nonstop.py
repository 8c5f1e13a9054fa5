"""Non-stop mode (``QNonStop:1``): stops come as ``%Stop`` notifications,
each acknowledged with ``vStopped``; resumes are answered ``OK``; threads
stop and run one by one.

The proxy owns the notification cycle with the stub: at a ``%Stop`` it
drains the stub's queue itself (``vStopped`` until ``OK``) and sorts each
stop. A hidden one (a thread at a proxy breakpoint) stops only that thread:
the proxy selects it (``Hg``), does the capture's reads, and resumes it
alone - by emulating the probed instruction (one ``vCont;c:thread``), or by
stepping it over the breakpoint (``vCont;s:thread``; its step's stop puts
the breakpoint back and resumes it) - while the other threads keep running.
Then the client's selection comes back (rule 6). The stops the client sees
go to its own queue, in the same cycle: ``%Stop`` for the first, each
``vStopped`` of the client answered with the next, ``OK`` at the end.

A client's ``?`` in non-stop mode starts such a cycle too (gdbserver answers
the first stopped thread and queues the others for ``vStopped``).

While a thread steps over a proxy breakpoint the breakpoint is out, and
another thread passing there meanwhile is not counted (gdbserver's own
answer, displaced stepping, is not offered to its clients).
"""

from __future__ import annotations

import dataclasses

from rsp.errors import MalformedPacket
from rsp.framing import frame_notification, rle_expand
from rsp.packets.memory import memory_bytes
from rsp.packets.resume import Resume, ResumeAction
from rsp.packets.stop import StopReply, parse_stop_reply
from rsp.threads import ThreadId

from . import emulate
from .actions import ToClient, ToClientRaw
from .breakpoints import BpKey
from .probes import Probe
from .procedure import Exchange, Procedure
from .state import SessionBase
from .wire import (
    RSP_REGNUM_AMD64,
    SIGTRAP,
    feature_on,
    is_trap_reason,
    pc_from_g,
    stopped_pc_from_g,
    z_packet,
)


def _key(thread: ThreadId | None) -> tuple[int | None, int] | None:
    return None if thread is None else (thread.pid, thread.tid)


class NonStop(SessionBase):
    # -- the client's side
    def _ns_client_nonstop(self, body: bytes, raw: bytes | None) -> None:
        self._ns_request = body[len(b"QNonStop:"):] == b"1"
        self._forward(body, raw)

    def _ns_reply_seen(self, body: bytes) -> None:
        """A reply to the client's request went by (QNonStop's OK)."""
        if self._ns_request is not None:
            if body == b"OK":
                self.non_stop = self._ns_request
                self._ns_queue.clear()
                self._ns_notified = False
            self._ns_request = None

    def _ns_client_vstopped(self) -> None:
        if self._ns_queue:
            self._ns_queue.popleft()
        if self._ns_queue:
            self._reply(self._ns_queue[0])
        else:
            self._ns_notified = False
            self._reply(b"OK")

    def _ns_client_status(self) -> None:
        """`?`: gdbserver answers one stopped thread and queues the others."""
        self._start_proc(self._proc_ns_status())

    def _proc_ns_status(self) -> Procedure:
        (first,) = yield Exchange((b"?",))
        stops = [first] if first != b"OK" else []
        if stops:
            stops += yield from self._ns_drain()
        self._proc = None
        self._ns_queue.clear()
        self._ns_queue.extend(stops)
        self._ns_notified = bool(stops)
        self._reply(stops[0] if stops else b"OK")

    def _ns_client_resume(self, resume: Resume, body: bytes, raw: bytes | None) -> None:
        for action in resume.actions:
            k = _key(action.thread)
            if k is None or action.thread is None or action.thread.tid in (-1, 0):
                self._ns_default = action
                if action.op != "t":
                    self._ns_actions.clear()
            else:
                self._ns_actions[k] = action
        if not self._planted and (self.config.resolve_probes is not None or self.capture is not None
                                  or self.config.make_capture is not None):
            self._start_proc(self._proc_ns_plant_then(body, raw))
            return
        self._forward(body, raw)

    def _proc_ns_plant_then(self, body: bytes, raw: bytes | None) -> Procedure:
        yield from self._plant()
        self._proc = None
        self._forward(body, raw)

    def _ns_action_for(self, thread: ThreadId | None) -> ResumeAction | None:
        k = _key(thread)
        if k is not None and k in self._ns_actions:
            return self._ns_actions[k]
        return self._ns_default

    # -- the stub's side
    def stub_notification(self, body: bytes, raw: bytes) -> None:
        if not self.non_stop or not body.startswith(b"Stop:"):
            self._emit(ToClientRaw(raw))
            return
        body = body[len(b"Stop:"):]
        if b"*" in body:  # run-length encoded like any reply
            body = rle_expand(body)
        self._ns_waiting = True
        self._ns_notified_stop = body
        self._ns_kick()

    def _ns_kick(self) -> None:
        if self._ns_waiting and self._proc is None and not self._closing:
            self._ns_waiting = False
            self._start_proc(self._proc_ns_cycle())

    def _ns_drain(self) -> Procedure:
        """vStopped until OK: the stub's queued stops (the first one, notified
        or answered, is acknowledged by the first vStopped)."""
        out: list[bytes] = []
        while True:
            (reply,) = yield Exchange((b"vStopped",))
            if reply == b"OK" or not reply[:1].isalpha() or reply[:1] == b"E":
                return out
            out.append(reply)

    def _proc_ns_cycle(self) -> Procedure:
        # The notification's own stop is the head of the stub's queue: the
        # first vStopped acknowledges it and answers the next. Ask `?`-less:
        # the notified stop came with the notification, kept by the link.
        stops = [self._ns_notified_stop] if self._ns_notified_stop is not None else []
        self._ns_notified_stop = None
        stops += yield from self._ns_drain()
        for body in stops:
            yield from self._ns_sort(body)
        self._proc = None

    def _ns_sort(self, body: bytes) -> Procedure:
        """One stop of the stub's: hidden (handled here) or the client's."""
        try:
            sr: StopReply | None = parse_stop_reply(body)
        except MalformedPacket:
            sr = None
        if sr is not None and sr.kind in ("W", "X"):
            self._program_exited = True
            self.bps.forget_all()
            self._capture_installed = False
        if (sr is not None and sr.thread is None and sr.kind in ("T", "S")
                and (self._ns_stepping or (self.probes and sr.signal == SIGTRAP))):
            # A stub that names no thread (gdbserver --disable-packet=T or
            # Tthread): the thread is looked for (_ns_find_thread).
            found = yield from self._ns_find_thread(sr)
            if found is not None:
                sr = dataclasses.replace(sr, thread=found)
        k = _key(sr.thread) if sr is not None else None
        if sr is not None and k is not None and k in self._ns_stepping:
            yield from self._ns_step_done(sr, body, k)
            return
        if sr is not None and sr.kind in ("T", "S") and sr.signal == SIGTRAP and self.probes:
            pc = sr.pc(self.pc_regnum) if sr.kind == "T" else None
            if pc is None and sr.thread is not None:
                replies = yield Exchange((self._ns_select(sr.thread), b"g") + self._ns_restore())
                pc = pc_from_g(replies[1])
            if pc is not None and (is_trap_reason(sr) or sr.reason is None):
                probe = self.probes.get(pc)
                if probe is not None and sr.thread is not None:
                    self.stats.probe_stats.hit(probe, sr.thread)
                    if not self.bps.client_owns(pc):
                        yield from self._ns_hidden(sr, pc, probe)
                        return
                    self.stats.shared_stops += 1
                    reads = self._capture_reads(probe, sr)
                    if reads:
                        replies = yield Exchange((self._ns_select(sr.thread),) + reads + self._ns_restore())
                        self._capture_hit(probe, sr, replies[1:1 + len(reads)])
        self._ns_to_client(body)

    def _ns_threads(self) -> Procedure:
        """The program's threads (qfThreadInfo/qsThreadInfo)."""
        ids: list[bytes] = []
        (listing,) = yield Exchange((b"qfThreadInfo",))
        while listing[:1] == b"m" and len(ids) < 4096:
            ids += [t for t in listing[1:].split(b",") if t]
            (listing,) = yield Exchange((b"qsThreadInfo",))
        threads: list[ThreadId] = []
        for t in ids:
            try:
                threads.append(ThreadId.parse(t))
            except MalformedPacket:
                continue
        return threads

    def _ns_find_thread(self, sr: StopReply) -> Procedure:
        """The thread a stop without one is about: the program's only thread;
        among several, the one stopped thread the stop can be about - one the
        proxy is stepping, or one at a proxy breakpoint (at the stop's pc,
        when the stop names one) that the client did not ask to step.
        Otherwise None: the client sees the stop as the stub sent it.
        (GDB's stop-reply-no-thread-multi.exp with --probe: the worker hit a
        hidden probe while main ran; the client, given the stop as sent, took
        main for the stopped thread - "PC register is not available".)

        Which threads are stopped is asked with `qXfer:siginfo:read` (a
        running thread's fails), never with `g`: gdbserver keeps registers it
        read for a running thread (unavailable, or half read) as valid, and
        writes them back into the thread at its next internal resume - main,
        in clone3, trapped or crashed (SIGSEGV) there. Only a stopped
        thread's `g` is read.

        Several candidates (threads hitting hidden probes at the same moment)
        cannot be told apart: gdbserver's stop for one may still be queued,
        and it does not resume a thread whose stop it has not reported. Then
        the client sees the stop as sent (a limit, in docs/gdb-testsuite.md)."""
        threads = yield from self._ns_threads()
        if len(threads) == 1:
            return threads[0]
        if not threads or not feature_on(self.stub_features, "qXfer:siginfo:read"):
            return None
        asks: tuple[bytes, ...] = ()
        for thread in threads:
            asks += (self._ns_select(thread), b"qXfer:siginfo:read::0,80")
        replies = yield Exchange(asks)
        stopped = [t for i, t in enumerate(threads)
                   if replies[2 * i] == b"OK" and replies[2 * i + 1][:1] in (b"l", b"m")]
        if not stopped:
            if self._ns_restore():
                yield Exchange(self._ns_restore())
            return None
        asks = ()
        for thread in stopped:
            asks += (self._ns_select(thread), b"g")
        replies = yield Exchange(asks + self._ns_restore())
        known_pc = sr.pc(self.pc_regnum) if sr.kind == "T" else None
        found: list[ThreadId] = []
        for i, thread in enumerate(stopped):
            pc = stopped_pc_from_g(replies[2 * i + 1]) if replies[2 * i] == b"OK" else None
            if pc is None:
                continue
            if _key(thread) in self._ns_stepping:
                found.append(thread)
                continue
            action = self._ns_action_for(thread)
            if (self.bps.proxy_key_at(pc) is not None and known_pc in (None, pc)
                    and not (action is not None and action.op in ("s", "S", "r"))):
                found.append(thread)
        return found[0] if len(found) == 1 else None

    def _ns_to_client(self, body: bytes) -> None:
        self._ns_queue.append(body)
        if not self._ns_notified:
            self._ns_notified = True
            self._emit(ToClientRaw(frame_notification(b"Stop:" + body)))

    def _ns_select(self, thread: ThreadId) -> bytes:
        return b"Hg" + thread.format(thread.pid is not None)

    def _ns_restore(self) -> tuple[bytes, ...]:
        """The client's selection back (rule 6)."""
        g = self.client_g_thread
        return (b"Hg" + g,) if g else ()

    def _ns_hidden(self, sr: StopReply, pc: int, probe: Probe) -> Procedure:
        """A thread at a proxy breakpoint: read, then resume it alone."""
        t0 = self.config.clock()
        self.stats.hidden_stops += 1
        thread = sr.thread
        assert thread is not None
        key = self.bps.proxy_key_at(pc)
        assert key is not None
        tid = thread.format(thread.pid is not None)
        action = self._ns_action_for(thread)
        reads = self._capture_reads(probe, sr)
        em = None
        if (self._emulate and probe.code and action is not None and action.op in ("c", "C")):
            em = emulate.decode(probe.code)
        extra: tuple[bytes, ...] = ()
        sp = sr.register_value(RSP_REGNUM_AMD64)
        if em is not None:
            extra = () if b"g" in reads else (b"g",)
            if em.needs_stack_word and sp is not None:
                extra += (b"m%x,8" % sp,)
        replies = (yield Exchange((self._ns_select(thread),) + reads + extra))[1:]
        self._capture_hit(probe, sr, replies[: len(reads)])
        if em is not None:
            regs = replies[reads.index(b"g")] if b"g" in reads else replies[len(reads)]
            word = memory_bytes(replies[-1]) if em.needs_stack_word and sp is not None else None
            effect = emulate.apply(em, regs, word)
            if effect is not None:
                self.stats.emulated += 1
                yield Exchange(tuple(effect.packets) + (b"vCont;c:" + tid,) + self._ns_restore())
                self.stats.hidden_time += self.config.clock() - t0
                return
        self._ns_stepping[_key(thread)] = (key, action)  # type: ignore[index]
        yield Exchange((z_packet(False, key), b"vCont;s:" + tid) + self._ns_restore())
        self.stats.hidden_time += self.config.clock() - t0

    def _ns_step_done(self, sr: StopReply, body: bytes, k: tuple[int | None, int]) -> Procedure:
        """The step over a proxy breakpoint ended: the breakpoint back; then
        the thread goes on as the client asked, or the client sees the stop."""
        key, action = self._ns_stepping.pop(k)
        if sr.kind in ("W", "X"):
            self._ns_to_client(body)
            return
        yield Exchange((z_packet(True, key),))
        assert sr.thread is not None
        tid = sr.thread.format(sr.thread.pid is not None)
        if sr.kind in ("T", "S") and sr.signal == SIGTRAP and action is not None:
            if action.op in ("c", "C"):
                yield Exchange((b"vCont;c:" + tid,))
                return
            if action.op == "r" and action.range is not None:
                pc = sr.pc(self.pc_regnum)
                lo, hi = action.range
                if pc is not None and lo <= pc < hi:
                    yield Exchange((b"vCont;r%x,%x:%s" % (lo, hi, tid),))
                    return
        self._ns_to_client(body)
