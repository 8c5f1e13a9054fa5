"""`asyncrsp serve`: listen, accept one client, connect the stub, run the link."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

import trio

from proxy.session.core import Session
from proxy.shell.listen import ServeError, listen_socket
from proxy.shell.keeper import Keeper
from proxy.shell.link import Link, PacketLog
from proxy.shell.upstream import UpstreamError, UpstreamSpec, connect


@dataclass
class ServeOptions:
    host: str
    port: int
    upstream: UpstreamSpec
    log_packets: TextIO | None = None
    # End when the first client leaves (as gdbserver --once). Otherwise a
    # client that hangs up without detaching or killing leaves the stub link,
    # the program and the capture for the next client on the same port, when
    # the stub itself would take another client (_stub_takes_another).
    once: bool = False
    stderr: TextIO = field(default_factory=lambda: sys.stderr)
    # The listening socket when the command line opened it already (listen.py;
    # it said "listening on" then).
    sock: socket.socket | None = None


async def _stub_takes_another(spec: UpstreamSpec) -> bool:
    """Would the stub accept another client after this one? gdbserver
    without --once keeps its listening socket open while it serves a client
    (with --once it closes it at the first accept): a connection attempt
    tells. The attempt waits in gdbserver's backlog, and is taken (and seen
    closed at once) only after the proxy's own link ends."""
    if spec.kind != "tcp":
        return False  # a stub on a pipe or a socket file serves its one link
    try:
        with trio.move_on_after(1):
            probe = await trio.open_tcp_stream(spec.host, spec.port)
            await probe.aclose()
            return True
    except OSError:
        pass
    return False


async def _next_client(listener: trio.SocketListener, stub: trio.abc.Stream
                       ) -> tuple[trio.SocketStream, bytes] | None:
    """Wait for the next client of a kept stub, watching the stub meanwhile:
    a stub that goes away ends the proxy (None); what it sends is kept."""
    got: list[trio.SocketStream] = []
    pending = bytearray()
    gone = False

    async def accept(scope: trio.CancelScope) -> None:
        got.append(await listener.accept())
        scope.cancel()

    async def watch(scope: trio.CancelScope) -> None:
        nonlocal gone
        while True:
            try:
                data = await stub.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                gone = True
                scope.cancel()
                return
            pending.extend(data)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept, nursery.cancel_scope)
        nursery.start_soon(watch, nursery.cancel_scope)
    if gone and not got:
        return None
    return got[0], bytes(pending)


async def serve(opts: ServeOptions, make_session: Callable[[UpstreamSpec], Session]) -> int:
    """Serve client sessions on one stub; return the exit status."""
    say = lambda text: print(f"asyncrsp: {text}", file=opts.stderr, flush=True)  # noqa: E731
    sock = opts.sock
    if sock is None:
        sock = listen_socket(opts.host, opts.port)
        sockname = sock.getsockname()
        say(f"listening on {sockname[0]}:{sockname[1]}")
    sockname = sock.getsockname()
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    async with listener:
        client = await listener.accept()
        if opts.once:
            await listener.aclose()  # as gdbserver --once: nobody else connects
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        session = make_session(opts.upstream)
        if session.config.classify_stub is None or not session.config.registers_safe:
            # Otherwise the stub's own qSupported decides, and the session says
            # so then (core.py _proc_qsupported): one line, not the guess and the answer.
            say(session.register_notice.removeprefix("asyncrsp: "))
        try:
            upstream = await connect(opts.upstream)
        except UpstreamError as err:
            await client.aclose()
            raise ServeError(str(err)) from None
        session.stub_socket = getattr(upstream.stream, "socket", None)  # its peer: an emulator's process?
        keeper = Keeper.for_stub(session.stub_socket)
        log = PacketLog(opts.log_packets)
        keep = None if opts.once else (lambda: _stub_takes_another(opts.upstream))
        sconn = None
        reason = ""
        try:
            while True:
                link = Link(session, client, upstream.stream, log=log, notice=say, sconn=sconn, keep_stub=keep,
                            keeper=keeper)
                sconn = link.sconn
                try:
                    reason = await link.run()
                finally:
                    with trio.CancelScope(shield=True):
                        await client.aclose()
                if not link.stub_kept:
                    break
                say(f"client left; the stub, the program and the capture wait for the next client "
                    f"on {sockname[0]}:{sockname[1]}")
                got = await _next_client(listener, upstream.stream)
                if got is None:
                    reason = "the stub closed the connection while no client was connected"
                    break
                client, pending = got
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                session.client_reconnected()
                if pending:
                    sconn.feed(pending)  # the link's stub pump handles it first
        finally:
            if keeper is not None:
                # Left (or nothing of ours there): the keeper goes quietly. Not
                # left (the stub's answers did not come in time): it leaves.
                if session.leave_plan() and reason != "stub disconnected":
                    keeper.abandon()
                else:
                    keeper.bye()
            with trio.CancelScope(shield=True):
                await upstream.aclose()
    say(f"session ended: {reason}")
    return 0
