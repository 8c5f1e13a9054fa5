"""Real clients that drive a gauntlet program into a state (truth.Client): line clients
over TCP (as `nc` is), HTTP/1.1 requests (whole, kept alive, or cut off mid-request)
and WebSocket clients (websocket-client, from PyPI). Each holds its connection open
until the state has been looked at: idle connections are what the truth counts."""

from __future__ import annotations

import contextlib
import socket
import time

from integration.realworld.truth import Client


class Connection:
    """One client's open connection (closed by ``close``)."""

    def __init__(self, sock: object, kind: str) -> None:
        self.sock = sock
        self.kind = kind

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.sock.close()  # type: ignore[attr-defined]


def _read_until(sock: socket.socket, want: bytes, timeout: float) -> bytes:
    sock.settimeout(timeout)
    got = b""
    deadline = time.monotonic() + timeout
    while want not in got and time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        if not chunk:
            break
        got += chunk
    return got


def _line(c: Client, port: int, timeout: float) -> Connection:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    for text in c.send:
        sock.sendall(text.encode() + b"\n")
        time.sleep(0.05)
    if c.expect is not None:
        got = _read_until(sock, c.expect.encode(), timeout)
        if c.expect.encode() not in got:
            raise RuntimeError(f"line client: no {c.expect!r} from the program (got {got[-200:]!r})")
    return Connection(sock, "line")


def _http(c: Client, port: int, timeout: float) -> Connection:
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    body = c.body.encode()
    more = PARTIAL_BODY_LEFT if c.kind == "http-partial-body" else 0
    head = (f"{c.method} {c.path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Length: {len(body) + more}\r\n" + "".join(h + "\r\n" for h in c.headers))
    if c.kind == "http-partial":
        sock.sendall(head.encode())  # the headers never end: a client mid-request
        return Connection(sock, c.kind)
    if more:  # the headers end, the body does not: a handler reading the body waits for the rest
        sock.sendall(head.encode() + b"\r\n" + body)
        return Connection(sock, c.kind)
    sock.sendall(head.encode() + b"\r\n" + body)
    if c.expect is not None:
        got = _read_until(sock, c.expect.encode(), timeout)
        if c.expect.encode() not in got:
            raise RuntimeError(f"http client: no {c.expect!r} in the reply (got {got[-300:]!r})")
    return Connection(sock, c.kind)


def _ws(c: Client, port: int, timeout: float) -> Connection:
    import websocket  # websocket-client (pyproject's test extra)

    ws = websocket.create_connection(f"ws://127.0.0.1:{port}{c.path}", timeout=timeout)
    for text in c.send:
        ws.send(text)
        time.sleep(0.05)
    if c.expect is not None:
        deadline = time.monotonic() + timeout
        seen = []
        while time.monotonic() < deadline:
            msg = ws.recv()
            seen.append(msg)
            if c.expect in str(msg):
                break
        else:
            raise RuntimeError(f"ws client: no {c.expect!r} (got {seen[-3:]!r})")
    return Connection(ws, "ws")


PARTIAL_BODY_LEFT = 1000  # bytes a body cut off mid-request still owes (its Content-Length says so)
_KINDS = {"line": _line, "http": _http, "http-partial": _http, "http-partial-body": _http, "ws": _ws}


def drive(clients: tuple[Client, ...], port: int, timeout: float = 10.0) -> list[Connection]:
    """Open every client in order (each done before the next starts)."""
    out: list[Connection] = []
    try:
        for c in clients:
            out.append(_KINDS[c.kind](c, c.port or port, timeout))
    except BaseException:
        for conn in out:
            conn.close()
        raise
    return out


def close_all(conns: list[Connection]) -> None:
    for conn in conns:
        conn.close()
