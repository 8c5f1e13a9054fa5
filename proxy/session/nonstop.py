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
answer, displaced stepping, is not offered to its clients); so the probed
instruction is emulated wherever it can be (a `--probe` function's first
instruction too: proxy/symbols.py keeps its bytes).

A stub that names no thread in its stops (gdbserver --disable-packet=T):
`_ns_place` finds each stop's thread by counting stops against stopped
threads (`place_stops`), waiting for the stops gdbserver has not reported
yet; the threads whose stops went to the client are its own until it
resumes them (`_ns_held`).
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import TYPE_CHECKING

from rsp.errors import MalformedPacket
from rsp.framing import frame_notification, rle_expand, unescape_binary
from rsp.packets.memory import memory_bytes
from rsp.packets.resume import Resume, ResumeAction
from rsp.packets.stop import StopReply
from rsp.threads import ThreadId

from proxy.probes import Probe
from proxy.procedure import Exchange, Procedure

from . import emulate
from .actions import ToClientRaw
from .breakpoints import BpKey
from .wire import (
    SIGTRAP,
    feature_on,
    is_trap_reason,
    pc_from_g,
    stop_or_none,
    stopped_pc_from_g,
    z_packet,
)

if TYPE_CHECKING:
    from .state import SessionBase


def _key(thread: ThreadId | None) -> tuple[int | None, int] | None:
    return None if thread is None else (thread.pid, thread.tid)


TRAP_TRACE = 2  # si_code of a single step's SIGTRAP (an int3's is SI_KERNEL, 0x80)
# How long a stop without a thread waits for the stub to report the other
# stopped threads' stops (_ns_place): at least PLACE_ROUNDS looks and
# PLACE_WAIT seconds, at most PLACE_MAX_ROUNDS looks. gdbserver reports a
# pending stop at one of its next event-loop turns (its loop takes the
# client's socket and its event pipe in turn; each look is three or more
# exchanges), so a look or two should do; the bound is for a stop that never
# comes (the proxy's picture of the threads wrong).
PLACE_ROUNDS = 8
PLACE_WAIT = 0.25
PLACE_MAX_ROUNDS = 200


@dataclasses.dataclass(frozen=True, slots=True)
class Seen:
    """A stopped thread that the client does not hold stopped."""

    thread: ThreadId
    signo: int  # its siginfo's si_signo (the host's number; SIGTRAP is 5 either way)
    code: int  # si_code: TRAP_TRACE after a single step
    pc: int | None = None  # read once the stop is placed (never a running thread's `g`)


def siginfo_of(reply: bytes) -> tuple[int, int] | None:
    """(si_signo, si_code) from a `qXfer:siginfo:read` reply; None for a
    thread that runs (gdbserver answers E01: ptrace cannot read it)."""
    if reply[:1] not in (b"l", b"m"):
        return None
    try:
        data = unescape_binary(reply[1:])
    except MalformedPacket:
        return None
    if len(data) < 12:
        return None
    return int.from_bytes(data[0:4], "little", signed=True), int.from_bytes(data[8:12], "little", signed=True)


def place_stops(stops: list[tuple[int | None, int | None]], seen: list[Seen]) -> list[int] | str:
    """Which of the stopped threads each stop without a thread is about.

    `stops`: (signal, pc or None) of the stops the stub reported and the
    proxy holds; `seen`: the stopped threads the client does not hold. The
    stub reports each thread's stop once, and a stopped thread stays stopped
    until someone resumes it; so every held stop is one seen thread's, and a
    seen thread without a held stop is one whose stop the stub has not
    reported yet (gdbserver has it pending, or has not even waited for it):
    "wait" for it while there are fewer stops than threads. With as many
    stops as threads, each thread has exactly one: a SIGTRAP stop goes to a
    thread whose siginfo says SIGTRAP, any other to one that does not; a stop
    that names its pc (`T05` without `thread:`) to the thread at that pc, once
    the pcs are read. The rest are alike (`S05`, `S05`): any order is the same.
    Returns the index into `seen` for each stop, "wait", or "odd" (more stops
    than threads: something the proxy did not see resumed the client's)."""
    if len(stops) > len(seen):
        return "odd"
    if len(stops) < len(seen):
        return "wait"
    out = [-1] * len(stops)
    for trap in (True, False):
        mine = [i for i, (sig, _) in enumerate(stops) if (sig == SIGTRAP) == trap]
        free = [j for j, t in enumerate(seen) if (t.signo == SIGTRAP) == trap]
        if len(mine) != len(free):
            return "wait"  # a thread between two stops (gdbserver stopping it for a step-over)
        rest = []
        for i in mine:
            pc = stops[i][1]
            at = [j for j in free if pc is not None and seen[j].pc == pc]
            if pc is not None and not at and all(seen[j].pc is not None for j in free):
                return "odd"
            if at:
                out[i] = at[0]
                free.remove(at[0])
            else:
                rest.append(i)
        for i in rest:
            out[i] = free.pop(0)
    return out


def _is_wildcard(action: ResumeAction) -> bool:
    """A resume (not stop) action for every thread, or every thread of a process."""
    return action.op != "t" and (action.thread is None or action.thread.tid == -1)


def spell_out(resume: Resume, threads: list[ThreadId], spared: list[ThreadId],
              packet_size: int | None = None) -> list[bytes]:
    """`resume` with each wildcard action replaced by one action per thread of `threads` it
    covers, leaving out the `spared` threads and any thread an earlier action names (vCont
    applies to each thread its leftmost matching action). Split into vCont packets of at
    most `packet_size` bytes (framing included); [] when no action is left."""
    def spared_one(t: ThreadId) -> bool:
        return any(q.tid == t.tid and (q.pid is None or t.pid is None or q.pid == t.pid) for q in spared)

    multiprocess = any(t.pid is not None for t in threads)
    actions: list[bytes] = []
    named: list[ThreadId] = []
    for action in resume.actions:
        if not _is_wildcard(action):
            actions.append(action.build(multiprocess))
            if action.thread is not None:
                named.append(action.thread)
            continue
        for t in threads:
            if action.applies_to(t) and not spared_one(t) and not any(n.matches(t) for n in named):
                actions.append(dataclasses.replace(action, thread=t).build(multiprocess))
                named.append(t)
    limit = (packet_size or 16384) - 4 - len(b"vCont")
    packets: list[bytes] = []
    current = b""
    for item in actions:
        if current and len(current) + 1 + len(item) > limit:
            packets.append(b"vCont" + current)
            current = b""
        current += b";" + item
    if current:
        packets.append(b"vCont" + current)
    return packets


class NonStopMode:
    """Non-stop mode's part of a session (the module's docstring): its state, the client's
    notification cycle and the stub's. The session holds it (`session.ns`) and routes to it
    the client's `QNonStop`, `?`, `vStopped` and resumes in non-stop mode, the replies it
    sees go by, and the stub's `%Stop` notifications; it asks the session (`s`) for the
    links, the procedure runner, the breakpoint table and the capture's reads."""

    def __init__(self, session: SessionBase) -> None:
        self.s = session
        self.on = False  # the stub is in non-stop mode (its OK to QNonStop:1 seen)
        self.request: bool | None = None  # QNonStop:N sent, its OK not seen yet
        self.queue: deque[bytes] = deque()  # stops for the client; [0] notified, not acknowledged
        self.notified = False  # the client is in a notification cycle
        self.waiting = False  # the stub notified while the proxy was busy
        self.notified_stop: bytes | None = None  # that notification's stop
        self.actions: dict[tuple[int | None, int], ResumeAction] = {}  # the client's, per thread
        self.default: ResumeAction | None = None  # ... and for the others
        # threads stepping over a proxy breakpoint: (the breakpoint, the client's action for the thread)
        self.over: dict[tuple[int | None, int], tuple[BpKey, ResumeAction | None]] = {}
        self.held: set[tuple[int | None, int]] = set()  # stopped for the client, not resumed since

    def client_gone(self) -> None:
        """The client left (a kept stub waits for the next): no cycle of its is open."""
        self.queue.clear()
        self.notified = False

    # -- the client's side
    def client_nonstop(self, body: bytes, raw: bytes | None) -> None:
        self.request = body[len(b"QNonStop:"):] == b"1"
        self.s.forward(body, raw)

    def reply_seen(self, body: bytes) -> None:
        """A reply to the client's request went by (QNonStop's OK)."""
        if self.request is not None:
            if body == b"OK":
                self.on = self.request
                self.queue.clear()
                self.held.clear()
                self.notified = False
            self.request = None

    def client_vstopped(self) -> None:
        if self.queue:
            self.queue.popleft()
        if self.queue:
            self.s.reply(self.queue[0])
        else:
            self.notified = False
            self.s.reply(b"OK")

    def client_status(self) -> None:
        """`?`: gdbserver answers one stopped thread and queues the others."""
        self.s.start_proc(self._proc_status())

    def _proc_status(self) -> Procedure:
        (first,) = yield Exchange((b"?",))
        stops = [first] if first != b"OK" else []
        if stops:
            stops += yield from self._drain()
        yield from self._status_held(stops)
        self.s.proc = None
        self.queue.clear()
        self.queue.extend(stops)
        self.notified = bool(stops)
        self.s.reply(stops[0] if stops else b"OK")

    def _status_held(self, stops: list[bytes]) -> Procedure:
        """`?` answers a stop for every thread whose stop gdbserver reported
        and nobody resumed since: those are the client's now (_ns_held). A
        stub that names no thread: when there are as many stopped threads
        as stops, they are those threads; otherwise the ones not yet known
        stay unknown (a later stop without a thread may then wait out the
        bound, _ns_place)."""
        self.held.clear()
        parsed = [sr for sr in map(stop_or_none, stops) if sr is not None]
        for sr in parsed:
            if sr.thread is not None:
                self.held.add(_key(sr.thread))  # type: ignore[arg-type]
        unnamed = [sr for sr in parsed if self.placeable(sr)]
        if not unnamed:
            return
        threads = yield from self._threads()
        if len(threads) == 1:
            self.held.add(_key(threads[0]))  # type: ignore[arg-type]
            return
        if not threads or not feature_on(self.s.stub_features, "qXfer:siginfo:read"):
            return
        seen = yield from self._seen(threads)
        if self._restore():
            yield Exchange(self._restore())
        if len(seen) == len(unnamed):
            self.held.update(_key(t.thread) for t in seen)  # type: ignore[misc]

    def client_resume(self, resume: Resume, body: bytes, raw: bytes | None) -> None:
        spared = self.queued_threads() if resume.legacy is None and any(map(_is_wildcard, resume.actions)) else []
        for action in resume.actions:
            k = _key(action.thread)
            if k is None or action.thread is None or action.thread.tid in (-1, 0):
                self.default = action
                if action.op != "t":
                    self.actions.clear()
                    self.held.clear()
            else:
                self.actions[k] = action
                if action.op != "t":
                    self.held.discard(k)
        self.held.update(_key(t) for t in spared)  # type: ignore[misc]
        plant = not self.s.planted and (self.s.config.resolve_probes is not None or self.s.capture is not None
                                         or self.s.config.make_capture is not None)
        if spared:
            self.s.start_proc(self._proc_resume_sparing(resume, spared, plant))
        elif plant:
            self.s.start_proc(self._proc_plant_then(body, raw))
        else:
            self.s.forward(body, raw)

    def _proc_plant_then(self, body: bytes, raw: bytes | None) -> Procedure:
        yield from self.s.lifecycle.plant()
        self.s.proc = None
        self.s.forward(body, raw)

    def queued_threads(self) -> list[ThreadId]:
        """The threads a wildcard resume must leave stopped, as gdbserver does: those with a
        stop the client has not pulled yet (`vStopped`), and the children of a queued fork or
        vfork, which the client has not seen born (gdbserver's `in_queued_stop_replies`).

        gdbserver keeps such a stop in its own queue until the client acknowledges it, and a
        wildcard `vCont;c` passes over its thread. The proxy drains the stub's queue at once
        (to find its own stops), so to the stub those stops are acknowledged: forwarded as it
        came, the wildcard resumed a thread whose stop the client was about to read, and a
        fork child before the client detached it (GDB's forking-threads-plus-breakpoint.exp:
        the child ran and exited, `D;pid` got E01, "Can't detach process"; a thread at a
        breakpoint hit it again and its stop reached the client twice)."""
        out: list[ThreadId] = []
        for body in self.queue:
            sr = stop_or_none(body)
            if sr is None:
                continue
            if sr.thread is not None:
                out.append(sr.thread)
            if sr.reason in ("fork", "vfork", "clone") and sr.reason_value:
                try:
                    out.append(ThreadId.parse(sr.reason_value))
                except MalformedPacket:
                    pass
        return out

    def _proc_resume_sparing(self, resume: Resume, spared: list[ThreadId], plant: bool) -> Procedure:
        """The client's resume with each wildcard action spelt out for the program's threads,
        the `spared` ones left out (queued_threads); in several packets when one would be
        longer than the stub takes (non-stop: each is answered OK at once)."""
        if plant:
            yield from self.s.lifecycle.plant()
        threads = yield from self._threads()
        if not threads:  # no list to spell the wildcard out with: the resume as it came
            self.s.proc = None
            self.s.forward(resume.build(), None)
            return
        packets = spell_out(resume, threads, spared, self.s.packet_size)
        if len(packets) > 1:
            replies = yield Exchange(tuple(packets[:-1]))
            bad = next((r for r in replies if r != b"OK"), None)
            if bad is not None:
                self.s.proc = None
                self.s.reply(bad)
                return
        self.s.proc = None
        if packets:
            self.s.forward(packets[-1], None)
        else:
            self.s.reply(b"OK")  # every thread it named is spared: gdbserver resumes none and says OK

    def _action_for(self, thread: ThreadId | None) -> ResumeAction | None:
        k = _key(thread)
        if k is not None and k in self.actions:
            return self.actions[k]
        return self.default

    # -- the stub's side
    def notification(self, body: bytes, raw: bytes) -> None:
        if not self.on or not body.startswith(b"Stop:"):
            self.s.emit(ToClientRaw(raw))
            return
        body = body[len(b"Stop:"):]
        if b"*" in body:  # run-length encoded like any reply
            body = rle_expand(body)
        self.waiting = True
        self.notified_stop = body
        self.kick()

    def kick(self) -> None:
        if self.waiting and self.s.proc is None and not self.s.closing:
            self.waiting = False
            self.s.start_proc(self._proc_cycle())

    def _drain(self) -> Procedure:
        """vStopped until OK: the stub's queued stops (the first one, notified
        or answered, is acknowledged by the first vStopped)."""
        out: list[bytes] = []
        while True:
            (reply,) = yield Exchange((b"vStopped",))
            if reply == b"OK" or not reply[:1].isalpha() or reply[:1] == b"E":
                return out
            out.append(reply)

    def _reported(self) -> Procedure:
        """The stops the stub reported since the last look: the notified one
        (kept by stub_notification) and its queue behind it."""
        stops = [self.notified_stop] if self.notified_stop is not None else []
        self.notified_stop = None
        stops += yield from self._drain()
        return stops

    def _proc_cycle(self) -> Procedure:
        # The notification's own stop is the head of the stub's queue: the
        # first vStopped acknowledges it and answers the next. Ask `?`-less:
        # the notified stop came with the notification, kept by the link.
        stops = yield from self._reported()
        placed = yield from self._place(stops)
        for body, sr, hit, pc in placed:
            yield from self._sort(body, sr, hit, pc)
        self.s.proc = None

    def placeable(self, sr: StopReply | None) -> bool:
        """A stop without a thread that the proxy must place: one of its own
        (a hidden probe hit, a step over one) may be among them."""
        return (sr is not None and sr.thread is None and sr.kind in ("T", "S")
                and bool(self.over or self.s.probes))

    def _place(self, stops: list[bytes]) -> Procedure:
        """Each stop parsed, with its thread where the stub named none
        (gdbserver --disable-packet=T or Tthread): (body, stop, whether it
        can be a probe hit, its pc if read).

        The program's only thread, if it has one. Among several: which
        threads are stopped is asked with `qXfer:siginfo:read` (a running
        thread's fails), never with `g`: gdbserver keeps registers it read
        for a running thread (unavailable, or half read) as valid, and
        writes them back into the thread at its next internal resume - main,
        in clone3, trapped or crashed (SIGSEGV) there. Then `place_stops`:
        every stop the proxy holds is one stopped thread's, so with as many
        stops as stopped threads (the client's held ones apart) each thread
        has its stop; with fewer, gdbserver has not reported the others yet
        - two threads at hidden probes at the same moment, the second's stop
        pending in gdbserver, which ignores a resume of a thread whose stop
        it has not reported. Then look again, taking in what the stub
        reports meanwhile, until the counts meet. Only then are the stopped
        threads' pcs read (they stay stopped: their stops are here).
        (GDB's stop-reply-no-thread-multi.exp with --probe: given the bare
        stop, gdb took it for main's - "PC register is not available" - and
        the worker at the other hidden probe waited forever.)

        If the counts do not meet (PLACE_ROUNDS looks and PLACE_WAIT
        seconds, or more stops than threads), a stop goes to the one stopped
        thread it can be about, if there is one; otherwise to the client as
        the stub sent it, as straight."""
        parsed: list[StopReply | None] = [stop_or_none(body) for body in stops]
        hits = [True] * len(stops)
        pcs: list[int | None] = [None] * len(stops)
        t0, rounds, selected = self.s.config.clock(), 0, False
        while any(self.placeable(sr) for sr in parsed):
            rounds += 1
            todo = [i for i, sr in enumerate(parsed) if self.placeable(sr)]
            threads = yield from self._threads()
            if len(threads) == 1:
                for i in todo:
                    parsed[i] = dataclasses.replace(parsed[i], thread=threads[0])  # type: ignore[arg-type]
                break
            if not threads or not feature_on(self.s.stub_features, "qXfer:siginfo:read"):
                break
            seen = yield from self._seen(threads)
            selected = True
            asked = [(parsed[i].signal, self._stop_pc(parsed[i])) for i in todo]  # type: ignore[union-attr]
            verdict = place_stops(asked, seen)
            if isinstance(verdict, list):
                replies = yield Exchange(tuple(p for t in seen for p in (self._select(t.thread), b"g"))
                                         + self._restore())
                seen = [dataclasses.replace(t, pc=stopped_pc_from_g(replies[2 * j + 1], self.s.arch))
                        for j, t in enumerate(seen)]
                verdict = place_stops(asked, seen)
                selected = False
            if isinstance(verdict, list):
                if rounds > 1:
                    self.s.stats.ns_waited += len(todo)
                for i, j in zip(todo, verdict):
                    t = seen[j]
                    parsed[i] = dataclasses.replace(parsed[i], thread=t.thread)  # type: ignore[arg-type]
                    hits[i] = t.signo == SIGTRAP and t.code != TRAP_TRACE
                    pcs[i] = t.pc
                break
            if self.s.closing or verdict == "odd" or rounds >= PLACE_MAX_ROUNDS or (
                    rounds >= PLACE_ROUNDS and self.s.config.clock() - t0 >= PLACE_WAIT):
                yield from self._guess(parsed, todo, seen)
                selected = False
                break
            if self.waiting:  # the stub reported more meanwhile
                self.waiting = False
                more = yield from self._reported()
                for body in more:
                    stops.append(body)
                    parsed.append(stop_or_none(body))
                    hits.append(True)
                    pcs.append(None)
        if selected and self._restore():
            yield Exchange(self._restore())
        return list(zip(stops, parsed, hits, pcs))

    def _stop_pc(self, sr: StopReply) -> int | None:
        return sr.pc(self.s.pc_regnum) if sr.kind == "T" else None

    def _seen(self, threads: list[ThreadId]) -> Procedure:
        """The stopped threads the client does not hold, by their siginfo."""
        asks: tuple[bytes, ...] = ()
        for thread in threads:
            asks += (self._select(thread), b"qXfer:siginfo:read::0,80")
        replies = yield Exchange(asks)  # the client's selection back with the next reads (_ns_place)
        seen: list[Seen] = []
        for i, thread in enumerate(threads):
            info = siginfo_of(replies[2 * i + 1]) if replies[2 * i] == b"OK" else None
            if info is not None and _key(thread) not in self.held:
                seen.append(Seen(thread, info[0], info[1]))
        return seen

    def _guess(self, parsed: list[StopReply | None], todo: list[int], seen: list[Seen]) -> Procedure:
        """The counts did not meet: each stop to the one stopped thread it can
        be about - one the proxy is stepping, or one at a proxy breakpoint
        (at the stop's pc, when the stop names one) that the client did not
        ask to step - if there is exactly one; else the client's, as sent."""
        replies = yield Exchange(tuple(p for t in seen for p in (self._select(t.thread), b"g"))
                                 + self._restore())
        found: list[tuple[ThreadId, int]] = []
        for j, t in enumerate(seen):
            pc = stopped_pc_from_g(replies[2 * j + 1], self.s.arch) if replies[2 * j] == b"OK" else None
            if pc is None:
                continue
            action = self._action_for(t.thread)
            if _key(t.thread) in self.over or (
                    self.s.bps.proxy_key_at(pc) is not None
                    and not (action is not None and action.op in ("s", "S", "r"))):
                found.append((t.thread, pc))
        for i in todo:
            sr = parsed[i]
            assert sr is not None
            known = self._stop_pc(sr)
            fits = [f for f in found if known in (None, f[1]) or _key(f[0]) in self.over]
            if len(fits) == 1:
                parsed[i] = dataclasses.replace(sr, thread=fits[0][0])
                found.remove(fits[0])
            else:
                self.s.stats.ns_unplaced += 1

    def _sort(self, body: bytes, sr: StopReply | None, hit: bool = True, pc: int | None = None) -> Procedure:
        """One stop of the stub's: hidden (handled here) or the client's.
        `hit`: False when the thread's siginfo says it only stepped onto the
        address (a client's step ending at a probe is not a hit)."""
        if sr is not None and sr.kind in ("W", "X"):
            self.s.program_exited = True
            self.s.bps.forget_all()
            self.s.capture_installed = False
            self.held.clear()
        if sr is not None:
            self.s.lifecycle.exec_forgets_breakpoints(sr)
        k = _key(sr.thread) if sr is not None else None
        if sr is not None and k is not None and k in self.over:
            yield from self._step_done(sr, body, k)
            return
        if hit and sr is not None and sr.kind in ("T", "S") and sr.signal == SIGTRAP and self.s.probes:
            if pc is None:
                pc = self._stop_pc(sr)
            if pc is None and sr.thread is not None:
                replies = yield Exchange((self._select(sr.thread), b"g") + self._restore())
                pc = pc_from_g(replies[1], self.s.arch)
            if pc is not None and (is_trap_reason(sr) or sr.reason is None):
                probe = self.s.probes.get(pc)
                if probe is not None and sr.thread is not None:
                    self.s.stats.probe_stats.hit(probe, sr.thread)
                    if not self.s.bps.client_owns(pc):
                        yield from self._hidden(sr, pc, probe)
                        return
                    self.s.stats.shared_stops += 1
                    reads = self.s.hidden.capture_reads(probe, sr)
                    if reads:
                        replies = yield Exchange((self._select(sr.thread),) + reads + self._restore())
                        self.s.hidden.capture_hit(probe, sr, replies[1:1 + len(reads)])
        self._to_client(body, sr.thread if sr is not None else None)

    def _threads(self) -> Procedure:
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

    def _to_client(self, body: bytes, thread: ThreadId | None = None) -> None:
        """A stop for the client; its thread (when known) stays stopped for
        the client until the client resumes it (_ns_held)."""
        if thread is not None:
            self.held.add(_key(thread))  # type: ignore[arg-type]
        self.queue.append(body)
        if not self.notified:
            self.notified = True
            self.s.emit(ToClientRaw(frame_notification(b"Stop:" + body)))

    def _select(self, thread: ThreadId) -> bytes:
        return b"Hg" + thread.format(thread.pid is not None)

    def _restore(self) -> tuple[bytes, ...]:
        """The client's selection back (rule 6)."""
        g = self.s.client_g_thread
        return (b"Hg" + g,) if g else ()

    def _hidden(self, sr: StopReply, pc: int, probe: Probe) -> Procedure:
        """A thread at a proxy breakpoint: read, then resume it alone."""
        t0 = self.s.config.clock()
        self.s.stats.hidden_stops += 1
        thread = sr.thread
        assert thread is not None
        key = self.s.bps.proxy_key_at(pc)
        assert key is not None
        tid = thread.format(thread.pid is not None)
        action = self._action_for(thread)
        reads = self.s.hidden.capture_reads(probe, sr)
        em = None
        if (self.s.emulate and probe.code and action is not None and action.op in ("c", "C")):
            em = emulate.decode(probe.code)
        extra: tuple[bytes, ...] = ()
        sp = sr.register_value(self.s.sp_regnum)
        if em is not None:
            extra = () if b"g" in reads else (b"g",)
            if em.needs_stack_word and sp is not None:
                extra += (b"m%x,8" % sp,)
        replies = (yield Exchange((self._select(thread),) + reads + extra))[1:]
        self.s.hidden.capture_hit(probe, sr, replies[: len(reads)])
        if em is not None:
            regs = replies[reads.index(b"g")] if b"g" in reads else replies[len(reads)]
            word = memory_bytes(replies[-1]) if em.needs_stack_word and sp is not None else None
            effect = emulate.apply(em, regs, word)
            if effect is not None:
                self.s.stats.emulated += 1
                yield Exchange(tuple(effect.packets) + (b"vCont;c:" + tid,) + self._restore())
                self.s.stats.hidden_time += self.s.config.clock() - t0
                return
        self.over[_key(thread)] = (key, action)  # type: ignore[index]
        yield Exchange((z_packet(False, key), b"vCont;s:" + tid) + self._restore())
        self.s.stats.hidden_time += self.s.config.clock() - t0

    def _step_done(self, sr: StopReply, body: bytes, k: tuple[int | None, int]) -> Procedure:
        """The step over a proxy breakpoint ended: the breakpoint back; then
        the thread goes on as the client asked, or the client sees the stop."""
        key, action = self.over.pop(k)
        if sr.kind in ("W", "X"):
            self._to_client(body)
            return
        yield Exchange((z_packet(True, key),))
        assert sr.thread is not None
        tid = sr.thread.format(sr.thread.pid is not None)
        if sr.kind in ("T", "S") and sr.signal == SIGTRAP and action is not None:
            if action.op in ("c", "C"):
                yield Exchange((b"vCont;c:" + tid,))
                return
            if action.op == "r" and action.range is not None:
                pc = sr.pc(self.s.pc_regnum)
                lo, hi = action.range
                if pc is not None and lo <= pc < hi:
                    yield Exchange((b"vCont;r%x,%x:%s" % (lo, hi, tid),))
                    return
        self._to_client(body, sr.thread)
