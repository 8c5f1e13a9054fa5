"""The client's listening socket, opened before anything heavy is imported:
`asyncrsp serve` says "listening on" within the interpreter's own start-up,
and a client that connects meanwhile waits in the kernel's backlog while the
session's modules load (GDB's own testsuite starts a proxy per gdbserver and
waits for the line each time). No trio here: serve.py adopts the socket."""

from __future__ import annotations

import errno
import socket


class ServeError(Exception):
    """A one-line reason the proxy cannot serve (busy port, unreachable stub)."""


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ServeError(f"--listen '{text}': expected HOST:PORT")
    return host or "127.0.0.1", int(port)


def inherited_socket(text: str) -> socket.socket | None:
    """`--listen fd:N`: a listening TCP socket this process inherited as
    descriptor N (a supervisor's socket activation, or a wrapper that binds
    the port itself and starts the stub at once, without waiting for the
    proxy's start-up); None for HOST:PORT."""
    if not text.startswith("fd:"):
        return None
    if not text[3:].isdigit():
        raise ServeError(f"--listen '{text}': expected fd:N with N a descriptor number")
    fd = int(text[3:])
    try:
        sock = socket.socket(fileno=fd)
    except OSError as err:
        raise ServeError(f"--listen fd:{fd}: not an open socket ({err.strerror or err})") from None
    try:
        listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        stream = sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
    except OSError:
        listening, stream = 0, False
    if not (listening and stream):
        sock.detach()  # not ours to close
        raise ServeError(f"--listen fd:{fd}: not a listening TCP socket")
    sock.set_inheritable(False)
    return sock


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on the first address `host` resolves to (as
    trio.open_tcp_listeners: SO_REUSEADDR, v6 sockets v6 only)."""
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, addr = infos[0]
        sock = socket.socket(family, kind, proto)
    except OSError as err:
        raise ServeError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(addr)
        sock.listen(min(socket.SOMAXCONN, 0xFFFF))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise ServeError(f"port {port} on {host} is busy (--listen another port, or 0 for any)") from None
        raise ServeError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    return sock
