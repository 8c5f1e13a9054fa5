"""The pumps: bytes from each side into the session core, actions back out.

Theory of operation: one nursery per session with two pump tasks. Each pump
reads from its stream, feeds its side's `rsp.Connection` (acks, no-ack,
retransmission), hands packets to the `Session`, then flushes: the session's
actions become bytes queued on either connection, and both connections'
pending bytes are written. The session never awaits, so no lock is needed
around it; writes to each stream are serialised by a per-stream lock.

The poll window: a pump that has handled a packet waits up to WINDOW_MS for
the next one on either side in a blocking poll of its own, outside trio,
and handles it there as that side's pump would. A request's reply (and
gdb's next request) mostly comes within it: each packet then costs no trio
scheduler pass (~half of the proxy's CPU per exchange,
bench/bench_exchange.py). When the window passes empty, the pumps wait in
trio as before. The only other task, the capture loop, says when it is due
and which fd it waits on: the window ends in time for it, at its fd's
events, at a close, at the link's end, and after WINDOW_SPAN outside trio.
"""

from __future__ import annotations

import gc
import math
import os
import select
import time
from collections.abc import Awaitable, Callable
from typing import TextIO

import trio

from proxy.session.actions import (AfterSend, Close, Notice, SetNoAck, SignalProgram, ToClient, ToClientRaw, ToStub,
                                   ToStubRaw, UnkeptToStub)
from proxy.session.core import Session
from proxy.shell.keeper import Keeper
from rsp.connection import Connection, StalePacket
from rsp.errors import ProtocolError
from rsp.framing import frame
from rsp.reader import Ack, BadPacket, Interrupt, Notification, Packet

_CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError)
LEAVE_TIMEOUT = 5.0  # seconds to take probes out after the client left
CAPTURE_TICK = 0.05  # how often the capture is asked whether it needs a hidden stop
CAPTURE_BATCH = 0.002  # after a wakeup, gather more events before reading them
STUB_WATCH = 0.1  # a stub that acknowledges: how often its link is looked after (_stub_watch)
WINDOW_MS = 1  # the poll window: how long a pump waits outside trio for the next packet
WINDOW_SPAN = 0.02  # seconds outside trio at most (< CAPTURE_TICK), before the pumps wait in trio again
# A client quiet this long at a stop: the breakpoints it removed leave the stub (session.client_idle).
# gdb's removes and re-inserts around the steps of a command come within a ms or less.
LINGER_IDLE = 0.002
# Young-generation threshold while a capture folds events (Python's default: 700).
GC_YOUNG = 10_000


def settle_heap() -> None:
    """Once the program's analysis is loaded: keep the garbage collector off it.

    The analysis (inventory, DWARF, line tables: millions of objects) lives as
    long as the proxy, but every full collection walked it again: a continuous
    consumer creates ~3 objects per event that outlive the young generation
    (graph records, the rewind log), and at 50-100k events/s full collections
    came every few hundred ms and took ~25% of the consumer's CPU (debug
    tokio_bench, uprobes: 0.17 s of 0.69 s for 47,202 events; 0.06 s after
    ``gc.freeze()``). Frozen objects are never collected; what the analysis
    drops later is freed by reference counting as before (the analysis builds
    no cycles it later drops). A larger young generation makes the frequent
    collections rarer too."""
    gc.collect()
    gc.freeze()
    young, *older = gc.get_threshold()
    gc.set_threshold(max(young, GC_YOUNG), *older)


def _send_now(stream: trio.abc.Stream, lock: trio.Lock, out: bytes) -> bytes:
    """Write `out` to a socket stream at once, without a trio checkpoint;
    what the socket did not take (or all of it: not a socket, a send of the
    stream's under way) is left for `send_all`.

    Every forwarded packet is a send on each side, and trio's `send_all`
    passes the scheduler twice per send (the lock, the socket's checkpoint):
    with the pumps' receives that was ~6 scheduler passes per request/reply,
    about half of the proxy's ~75 µs of CPU per exchange, paid on every one
    of the thousands of packets a stepping session sends (GDB's testsuite:
    a whole-file time ratio). A nonblocking write that takes everything,
    the usual case for a packet, needs none of them. Order is kept: nothing
    awaits between the lock's check and the write, and a send under way
    holds the lock."""
    sock = getattr(stream, "socket", None)
    if sock is None or lock.locked():
        return out
    try:
        sent = os.write(sock.fileno(), out)
    except BlockingIOError:
        return out
    except OSError:
        return b""  # the link is gone: its pump sees the close and ends the session
    return out[sent:]


def _socket_fd(stream: trio.abc.Stream) -> int | None:
    """The descriptor of a socket stream (None: another kind of stream)."""
    sock = getattr(stream, "socket", None)
    return sock.fileno() if sock is not None else None


def _read_now(fd: int) -> bytes | None:
    """What the socket holds, read without trio: None when it holds nothing
    after all, b"" when the peer closed (or the link broke)."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None
    except OSError:
        return b""


async def _receive(stream: trio.abc.Stream, fd: int | None) -> bytes:
    """The next bytes of a pump's stream (b"": closed).

    trio's `receive_some` first tries the read behind a checkpoint, and
    between a request and its reply there is never anything yet: a
    BlockingIOError raised (and caught by an asynccontextmanager) per
    packet, then the wait, then the read again. A socket's pump waits
    first and reads once (~a quarter of the proxy's CPU per exchange,
    bench/bench_exchange.py). The wait is a checkpoint every time, as
    trio's own was."""
    if fd is None:
        try:
            return await stream.receive_some(65536)
        except _CLOSED + (OSError,):
            return b""
    while True:
        try:
            await trio.lowlevel.wait_readable(fd)
        except _CLOSED + (OSError,):
            return b""
        data = _read_now(fd)
        if data is not None:
            return data


async def _send(stream: trio.abc.Stream, lock: trio.Lock, out: bytes) -> None:
    if not lock.locked():
        out = _send_now(stream, lock, out)
        if not out:
            return
        # The rest: the lock is taken before anything awaits (acquire_nowait is no
        # checkpoint), so no other sender's bytes come in between.
        lock.acquire_nowait()
        try:
            await _send_all(stream, out)
        finally:
            lock.release()
        return
    async with lock:
        await _send_all(stream, out)


async def _send_all(stream: trio.abc.Stream, out: bytes) -> None:
    try:
        await stream.send_all(out)
    except _CLOSED + (OSError,):
        pass  # the side's pump sees the close and ends the session


class PacketLog:
    def __init__(self, fh: TextIO | None) -> None:
        self.fh = fh
        self.t0 = time.monotonic()

    def write(self, direction: str, data: bytes) -> None:
        if self.fh is not None:
            self.fh.write(f"{time.monotonic() - self.t0:10.6f} {direction} {data!r}\n")


class Link:
    def __init__(
        self,
        session: Session,
        client: trio.abc.Stream,
        stub: trio.abc.Stream,
        *,
        log: PacketLog | None = None,
        notice: "callable[[str], None] | None" = None,  # type: ignore[valid-type]
        sconn: Connection | None = None,
        keep_stub: Callable[[], Awaitable[bool]] | None = None,
        keeper: Keeper | None = None,
    ) -> None:
        self.session = session
        self.client, self.stub = client, stub
        # The stub's side outlives a client when the stub is kept for the next one.
        self.cconn, self.sconn = Connection(), sconn or Connection(drop_before_ack=True, bare_acks=True)
        self.keep_stub = keep_stub
        self.keeper = keeper
        self._plan_key: tuple[object, ...] | None = None
        self.stub_kept = False
        self.client_lock, self.stub_lock = trio.Lock(), trio.Lock()
        self.log = log or PacketLog(None)
        self.notice = notice or (lambda text: None)
        self.closed = trio.Event()
        self._capture_ready = trio.Event()  # set by a flush that sees a new capture (_capture_loop)
        self._capture_seen: object = None
        # The capture loop, for the poll window: when it must run next (monotonic;
        # inf: asleep until a new capture), and the capture's fd it waits on.
        self._capture_due = 0.0
        self._capture_fd: int | None = None
        self._window_capture_fd: int | None = None
        self.close_reason = ""
        self.client_gone = False
        self._stub_heard = 0.0  # monotonic time of the stub's last bytes
        self._client_heard = 0.0  # ... and the client's
        self._lingering = trio.Event()  # set once the stub holds breakpoints the client removed (_linger_watch)
        self._stub_junk = 0  # the stub's bytes outside any packet, as last seen by the watch
        self._window: select.poll | None = None
        self._sides: dict[int, tuple[str, Connection]] = {}
        fds = (_socket_fd(client), _socket_fd(stub))
        if fds[0] is not None and fds[1] is not None:
            self._window = select.poll()
            for fd, side in zip(fds, (("client", self.cconn), ("stub", self.sconn))):
                self._window.register(fd, select.POLLIN)
                self._sides[fd] = side

    async def run(self) -> str:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, "client", self.client, self.cconn)
            nursery.start_soon(self._pump, "stub", self.stub, self.sconn)
            nursery.start_soon(self._capture_loop)
            nursery.start_soon(self._stub_watch)
            nursery.start_soon(self._linger_watch)
            await self.closed.wait()
            nursery.cancel_scope.cancel()
        return self.close_reason

    # -- pumps
    async def _pump(self, side: str, stream: trio.abc.Stream, conn: Connection) -> None:
        """Read one side until it closes; feed its packets to the session."""
        # What a kept stub sent while no client was connected (serve.py) first.
        while (ev := conn.next_event()) is not None:
            self._dispatch(side, ev)
            await self._flush()
        fd = _socket_fd(stream)
        while True:
            data = await _receive(stream, fd)
            if not data:
                await self._side_closed(side)
                return
            if not await self._take(side, conn, data):
                return
            await self._poll_window()

    async def _take(self, side: str, conn: Connection, data: bytes) -> bool:
        """Bytes from one side: each of their packets to the session, each
        followed by what it sends in answer. False: the link broke."""
        self.log.write("c>" if side == "client" else "s>", data)
        if side == "stub":
            self._stub_heard = time.monotonic()
        else:
            self._client_heard = time.monotonic()
        lane = self._lane(side, conn, data)
        if lane is not None:
            stream, lock, out, tag = lane
            self.log.write(tag, out)
            await _send(stream, lock, out)
            return True
        try:
            conn.feed(data)
            # One event at a time, each followed by what the session sends in
            # answer: a stub's stale packet is recognised the way gdb does
            # (rsp/connection.py, drop_before_ack).
            while (ev := conn.next_event()) is not None:
                self._dispatch(side, ev)
                await self._flush()
        except ProtocolError as err:
            self.notice(f"{side} link broken: {err}")
            self._close(str(err))
            return False
        await self._flush()
        if side == "client" and self.session.lingering and not self._lingering.is_set():
            self._lingering.set()
        return True

    def _lane(self, side: str, conn: Connection, data: bytes) -> tuple[trio.abc.Stream, trio.Lock, bytes, str] | None:
        """The fast lane (proxy/session/core.py): `data`, one whole packet of a read or of
        its reply, passed on as it came (or the answer known at this stop), with no event,
        action or flush: (stream, its lock, the bytes, the log's tag). None: the usual path.
        Only while nothing else is queued on either side, so the order of bytes is kept."""
        if (self.cconn.has_data_to_send() or self.sconn.has_data_to_send() or self.client_gone
                or self.client_lock.locked() or self.stub_lock.locked()):
            return None
        body = conn.lone_packet(data)
        if body is None:
            return None
        if side == "client":
            got = self.session.lane_client(body, data)
            if got is None:
                return None
            if got is True:
                return self.stub, self.stub_lock, data, "s<"
            return self.client, self.client_lock, frame(got), "c<"  # type: ignore[arg-type]
        if not self.session.lane_stub(body):
            return None
        return self.client, self.client_lock, data, "c<"

    async def _poll_window(self) -> None:
        """Wait for the next packets outside trio while they come within
        WINDOW_MS of each other (the module docstring). A close is left to
        its side's pump (it reads the end again, waiting in trio)."""
        window = self._window
        if window is None:
            return
        until = time.monotonic() + WINDOW_SPAN
        while self._window_open():
            cfd = self._capture_fd
            if cfd != self._window_capture_fd:  # the capture's events end the window
                if self._window_capture_fd is not None:
                    window.unregister(self._window_capture_fd)
                if cfd is not None:
                    window.register(cfd, select.POLLIN)
                self._window_capture_fd = cfd
            ready = window.poll(min(WINDOW_MS, (self._capture_due - time.monotonic()) * 1000))
            if not ready:
                return
            for fd, _event in ready:
                if fd == cfd or not self._window_open():
                    return
                data = _read_now(fd)
                if data is None:
                    continue
                if not data:
                    return
                side, conn = self._sides[fd]
                if not await self._take(side, conn, data):
                    return
            if time.monotonic() > until:
                return

    def _window_open(self) -> bool:
        return (time.monotonic() < self._capture_due and not self._capture_ready.is_set()
                and not self.closed.is_set() and not self.client_gone)

    def _dispatch(self, side: str, ev: object) -> None:
        """Hand one link event to the session."""
        if isinstance(ev, BadPacket):
            self.notice(f"bad packet from the {side}, asked again: {ev.error}")
        elif isinstance(ev, StalePacket):
            # gdb's rule for a packet received instead of an ack (rsp/connection.py)
            self.log.write("s!", b"stale, acknowledged and ignored: " + ev.raw)
            self.session.stub_stale(ev.body)
        elif isinstance(ev, Ack):  # the stub's, for nothing of ours (rsp/connection.py, bare_acks)
            self.session.stub_ack()
        elif side == "client":
            if isinstance(ev, Packet):
                self.session.client_packet(ev.body, ev.raw)
            elif isinstance(ev, Interrupt):
                self.session.client_interrupt()
        elif isinstance(ev, Packet):
            self.session.stub_packet(ev.body, ev.raw)
        elif isinstance(ev, Notification):
            self.session.stub_notification(ev.body, ev.raw)

    async def _stub_watch(self) -> None:
        """Look after a stub that acknowledges packets (never agreed to no-ack mode; the watch
        ends when it does): resend our packet a parked thread of QEMU's user-mode stub ate
        (rsp/connection.py lost_to_stale) once the stub is quiet, and release its parked
        threads while the program runs (proxy/session/pacing.py), one release at a time."""
        while not self.closed.is_set():
            await trio.sleep(STUB_WATCH)
            if self.sconn.no_ack:
                return
            if self.sconn.lost_to_stale() and time.monotonic() - self._stub_heard >= STUB_WATCH:
                self.log.write("s!", b"our packet was taken for acks (stale reports): sent again")
                self.sconn.retransmit()
            junk = self.sconn.reader.junk_bytes
            if junk > self._stub_junk:
                self._stub_junk = junk
                self.log.write("s!", b"bytes outside any packet: a packet of the stub's was garbled")
                self.session.stub_garbled()
            self.session.kick_parked(acked=not self.sconn.awaits_ack(), quiet=time.monotonic() - self._stub_heard)
            await self._flush()

    async def _linger_watch(self) -> None:
        """Once the stub holds breakpoints the client removed: when the client has been quiet
        for LINGER_IDLE, they leave the stub (session.client_idle). Asleep otherwise: no timer
        while nothing lingers."""
        while True:
            await self._lingering.wait()
            while (left := self._client_heard + LINGER_IDLE - time.monotonic()) > 0:
                await trio.sleep(left)
            self._lingering = trio.Event()
            if self.session.client_idle():
                await self._flush()

    async def _capture_loop(self) -> None:
        """Drive the capture while the program runs: fold a continuous
        consumer's new events into the engine (waking on its fd, if it has
        one), and let the session decide on hidden drains (`tick`)."""
        behind = False
        settled = False
        while True:
            cap = self.session.capture
            if self._capture_ready.is_set():
                self._capture_ready = trio.Event()  # seen
            if cap is not None and not settled:
                settle_heap()  # the target (its analysis) exists once a capture does
                settled = True
            if cap is None or not cap.ticks():
                # Nothing to poll or tick (no capture, or breakpoint capture:
                # its work is done at hidden stops): asleep until a flush sees
                # another capture. A timeout every CAPTURE_TICK cost each session
                # of the GDB testsuite a deadline and a cancel scope 20 times a
                # second.
                self._capture_due = math.inf
                await self._capture_ready.wait()
                continue
            fd = cap.wakeup_fd()
            if behind:
                # poll() said it has events left over (it folds for a bounded time):
                # go on at once, after letting the client's and the stub's packets in
                self._capture_due = 0.0
                await trio.sleep(0)
            else:
                # When the loop is due again, and the fd it waits on, for the
                # pumps' poll window (which then returns to trio in time).
                self._capture_due = time.monotonic() + CAPTURE_TICK
                with trio.move_on_after(CAPTURE_TICK):
                    if fd is not None:
                        self._capture_fd = fd
                        try:
                            await trio.lowlevel.wait_readable(fd)
                        finally:
                            self._capture_fd = None
                        self._capture_due = min(self._capture_due, time.monotonic() + CAPTURE_BATCH)
                        await trio.sleep(CAPTURE_BATCH)  # let a batch build up: no wakeup per event
                    else:
                        await trio.sleep(CAPTURE_TICK)
            self._capture_due = 0.0  # running
            cap = self.session.capture
            behind = False
            if cap is not None:
                try:
                    behind = bool(cap.poll())
                except Exception as err:  # noqa: BLE001 - a capture bug must not end the session
                    self.session.stats.capture_errors += 1
                    self.notice(f"capture poll failed: {err!r}")
            self.session.tick(time.monotonic())
            await self._flush()

    async def _side_closed(self, side: str) -> None:
        if side == "stub":
            self.session.stub_closed()
            await self._flush()
            self._close("stub disconnected")
            return
        # The client left: the session takes the probes out first (rule 9),
        # unless the stub keeps the program for the next client.
        self.client_gone = True
        keep = self.keep_stub is not None and await self.keep_stub()
        self.session.client_closed(keep_stub=keep)
        await self._flush()
        with trio.move_on_after(LEAVE_TIMEOUT):
            await self.closed.wait()
        self._close("client disconnected (probes could not be confirmed removed in time)")

    # -- output
    async def _flush(self) -> None:
        actions = self.session.take_actions()
        if not actions:
            # Nothing the session said: only the links' own bytes (acks, a
            # retransmission). The keeper's plan changes only with what goes
            # to the stub, so it is asked with the actions (once per packet,
            # not at every flush).
            await self._send_pending()
            return
        self._tell_keeper()
        later: list[AfterSend] = []
        if self.session.capture is not self._capture_seen:
            self._capture_seen = self.session.capture
            self._capture_ready.set()  # the capture loop looks at it
        for action in actions:
            if isinstance(action, ToStub):
                self.sconn.send_packet(action.body)
            elif isinstance(action, ToStubRaw):
                if action.raw == b"\x03":
                    self.sconn.send_interrupt()
                else:
                    self.sconn.send_raw(action.raw)
            elif isinstance(action, UnkeptToStub):
                self.sconn.send_unkept(action.raw)
            elif isinstance(action, SignalProgram):
                try:
                    os.kill(action.pid, action.signal)
                except OSError:
                    self.sconn.send_interrupt()  # gone or not ours to signal: the stub's way
            elif isinstance(action, ToClient):
                self.cconn.send_packet(action.body)
            elif isinstance(action, ToClientRaw):
                self.cconn.send_raw(action.raw)
            elif isinstance(action, SetNoAck):
                await self._send_pending()
                (self.cconn if action.side == "client" else self.sconn).set_no_ack()
            elif isinstance(action, Notice):
                self.notice(action.text)
            elif isinstance(action, Close):
                await self._send_pending()
                self.stub_kept = action.keep_stub
                self._close(action.reason)
            elif isinstance(action, AfterSend):
                later.append(action)
        await self._send_pending()
        for action in later:  # the answer is out
            try:
                action.work()
            except Exception as err:  # noqa: BLE001 - never the link's end
                self.notice(f"work after an answer failed: {err!r}")

    def _tell_keeper(self) -> None:
        """The keeper's plan (keeper.py) before the stub gets what changed it:
        a breakpoint the stub holds is always in the plan."""
        if self.keeper is None:
            return
        key = self.session.leave_plan_key() + (self.sconn.no_ack,)
        if key != self._plan_key:
            self._plan_key = key
            plan = self.session.leave_plan()
            if plan:
                plan["noack"] = self.sconn.no_ack
            self.keeper.update(plan)

    async def _send_pending(self) -> None:
        if self.sconn.has_data_to_send():
            out = self.sconn.data_to_send()
            self.log.write("s<", out)
            await _send(self.stub, self.stub_lock, out)
        if self.cconn.has_data_to_send():
            out = self.cconn.data_to_send()
            if self.client_gone:
                return
            self.log.write("c<", out)
            await _send(self.client, self.client_lock, out)

    def _close(self, reason: str) -> None:
        if not self.closed.is_set():
            self.close_reason = reason
            self.closed.set()
