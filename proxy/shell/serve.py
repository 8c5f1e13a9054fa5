"""`asyncrsp serve`: listen, accept one client, connect the stub, run the link."""

from __future__ import annotations

import errno
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

import trio

from proxy.session.core import Session
from proxy.shell.link import Link, PacketLog
from proxy.shell.upstream import UpstreamError, UpstreamSpec, connect


class ServeError(Exception):
    """A one-line reason the proxy cannot serve (busy port, unreachable stub)."""


@dataclass
class ServeOptions:
    host: str
    port: int
    upstream: UpstreamSpec
    log_packets: TextIO | None = None
    stderr: TextIO = field(default_factory=lambda: sys.stderr)


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ServeError(f"--listen '{text}': expected HOST:PORT")
    return host or "127.0.0.1", int(port)


async def serve(opts: ServeOptions, make_session: Callable[[UpstreamSpec], Session]) -> int:
    """Serve one client session; return the exit status."""
    say = lambda text: print(f"asyncrsp: {text}", file=opts.stderr, flush=True)  # noqa: E731
    try:
        listeners = await trio.open_tcp_listeners(opts.port, host=opts.host)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise ServeError(f"port {opts.port} on {opts.host} is busy (--listen another port, or 0 for any)") from None
        raise ServeError(f"cannot listen on {opts.host}:{opts.port}: {err.strerror or err}") from None
    listener = listeners[0]
    sockname = listener.socket.getsockname()
    say(f"listening on {sockname[0]}:{sockname[1]}")
    async with listener:
        client = await listener.accept()
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    session = make_session(opts.upstream)
    say(session.register_notice.removeprefix("asyncrsp: "))
    try:
        upstream = await connect(opts.upstream)
    except UpstreamError as err:
        await client.aclose()
        raise ServeError(str(err)) from None
    try:
        link = Link(session, client, upstream.stream, log=PacketLog(opts.log_packets), notice=say)
        reason = await link.run()
    finally:
        with trio.CancelScope(shield=True):
            await client.aclose()
            await upstream.aclose()
    say(f"session ended: {reason}")
    return 0
