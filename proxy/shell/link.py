"""The pumps: bytes from each side into the session core, actions back out.

Theory of operation: one nursery per session with two pump tasks. Each pump
reads from its stream, feeds its side's `rsp.Connection` (acks, no-ack,
retransmission), hands packets to the `Session`, then flushes: the session's
actions become bytes queued on either connection, and both connections'
pending bytes are written. The session never awaits, so no lock is needed
around it; writes to each stream are serialised by a per-stream lock.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Awaitable, Callable
from typing import TextIO

import trio

from proxy.session.actions import Close, Notice, SetNoAck, ToClient, ToClientRaw, ToStub, ToStubRaw
from proxy.session.core import Session
from proxy.shell.keeper import Keeper
from rsp.connection import Connection, StalePacket
from rsp.errors import ProtocolError
from rsp.reader import BadPacket, Interrupt, Notification, Packet

_CLOSED = (trio.BrokenResourceError, trio.ClosedResourceError)
LEAVE_TIMEOUT = 5.0  # seconds to take probes out after the client left
CAPTURE_TICK = 0.05  # how often the capture is asked whether it needs a hidden stop
CAPTURE_BATCH = 0.002  # after a wakeup, gather more events before reading them
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


async def _send(stream: trio.abc.Stream, lock: trio.Lock, out: bytes) -> None:
    if not lock.locked():
        # Held from the direct write to the end of its rest: taking the lock after a partial
        # write is a checkpoint, where another sender could put its bytes in between.
        lock.acquire_nowait()
        try:
            out = _send_now(stream, _FREE, out)
            if out:
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


class _Free:
    """A lock that is never taken: `_send` holds the real one itself."""

    def locked(self) -> bool:
        return False


_FREE: trio.Lock = _Free()  # type: ignore[assignment]


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
        self.cconn, self.sconn = Connection(), sconn or Connection(drop_before_ack=True)
        self.keep_stub = keep_stub
        self.keeper = keeper
        self._plan_key: tuple[object, ...] | None = None
        self.stub_kept = False
        self.client_lock, self.stub_lock = trio.Lock(), trio.Lock()
        self.log = log or PacketLog(None)
        self.notice = notice or (lambda text: None)
        self.closed = trio.Event()
        self.close_reason = ""
        self.client_gone = False

    async def run(self) -> str:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, "client", self.client, self.cconn)
            nursery.start_soon(self._pump, "stub", self.stub, self.sconn)
            nursery.start_soon(self._capture_loop)
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
        while True:
            try:
                data = await stream.receive_some(65536)
            except _CLOSED + (OSError,):
                data = b""
            if not data:
                await self._side_closed(side)
                return
            self.log.write("c>" if side == "client" else "s>", data)
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
                return
            await self._flush()

    def _dispatch(self, side: str, ev: object) -> None:
        """Hand one link event to the session."""
        if isinstance(ev, BadPacket):
            self.notice(f"bad packet from the {side}, asked again: {ev.error}")
        elif isinstance(ev, StalePacket):
            # gdb's rule for a packet received instead of an ack (rsp/connection.py)
            self.log.write("s!", b"stale, acknowledged and ignored: " + ev.raw)
        elif side == "client":
            if isinstance(ev, Packet):
                self.session.client_packet(ev.body, ev.raw)
            elif isinstance(ev, Interrupt):
                self.session.client_interrupt()
        elif isinstance(ev, Packet):
            self.session.stub_packet(ev.body, ev.raw)
        elif isinstance(ev, Notification):
            self.session.stub_notification(ev.body, ev.raw)

    async def _capture_loop(self) -> None:
        """Drive the capture while the program runs: fold a continuous
        consumer's new events into the engine (waking on its fd, if it has
        one), and let the session decide on hidden drains (`tick`)."""
        behind = False
        settled = False
        while True:
            cap = self.session.capture
            if cap is not None and not settled:
                settle_heap()  # the target (its analysis) exists once a capture does
                settled = True
            fd = cap.wakeup_fd() if cap is not None else None
            if behind:
                # poll() said it has events left over (it folds for a bounded time):
                # go on at once, after letting the client's and the stub's packets in
                await trio.sleep(0)
            else:
                with trio.move_on_after(CAPTURE_TICK):
                    if fd is not None:
                        await trio.lowlevel.wait_readable(fd)
                        await trio.sleep(CAPTURE_BATCH)  # let a batch build up: no wakeup per event
                    else:
                        await trio.sleep(CAPTURE_TICK)
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
        self._tell_keeper()
        for action in self.session.take_actions():
            if isinstance(action, ToStub):
                self.sconn.send_packet(action.body)
            elif isinstance(action, ToStubRaw):
                if action.raw == b"\x03":
                    self.sconn.send_interrupt()
                else:
                    self.sconn.send_raw(action.raw)
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
        await self._send_pending()

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
        out = self.sconn.data_to_send()
        if out:
            self.log.write("s<", out)
            await _send(self.stub, self.stub_lock, out)
        out = self.cconn.data_to_send()
        if out and not self.client_gone:
            self.log.write("c<", out)
            await _send(self.client, self.client_lock, out)

    def _close(self, reason: str) -> None:
        if not self.closed.is_set():
            self.close_reason = reason
            self.closed.set()
