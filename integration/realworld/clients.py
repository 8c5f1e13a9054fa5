"""Real clients that drive a gauntlet program into a state (truth.Client): line clients
over TCP (as `nc` is), HTTP/1.1 requests (whole, kept alive, or cut off mid-request),
HTTP/2 requests over cleartext (prior knowledge, RFC 9113 3.3: what hyper's http2 server
and client speak without TLS) and WebSocket clients (websocket-client, from PyPI). Each holds its connection open
until the state has been looked at: idle connections are what the truth counts."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

from integration.realworld.truth import Client


class Connection:
    """One client's open connection (closed by ``close``)."""

    def __init__(self, sock: object, kind: str) -> None:
        self.sock = sock
        self.kind = kind

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.sock.close()  # type: ignore[attr-defined]


def _chunks(sock: socket.socket, timeout: float) -> Iterator[bytes]:
    """What the program sends, chunk by chunk, until it closes or ``timeout`` passes (the
    caller stops taking chunks once it has what it waits for)."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return
        if not chunk:
            return
        yield chunk


def _read_until(sock: socket.socket, want: bytes, timeout: float) -> bytes:
    got = b""
    for chunk in _chunks(sock, timeout):
        got += chunk
        if want in got:
            break
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


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
H2_DATA, H2_HEADERS, H2_SETTINGS, H2_GOAWAY = 0x0, 0x1, 0x4, 0x7
H2_END_STREAM, H2_ACK, H2_END_HEADERS = 0x1, 0x1, 0x4


def h2_frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream.to_bytes(4, "big") + payload


def h2_request_headers(method: str, path: str, authority: str) -> bytes:
    """An HPACK header block (RFC 7541) of literals without indexing, each named by the static
    table's index (2 :method, 6 :scheme http, 4 :path, 1 :authority): no dynamic table."""
    def literal(index: int, value: str) -> bytes:
        raw = value.encode()
        if index > 15 or len(raw) > 126:
            raise ValueError(f"h2 client: {value!r} too long for a one-byte HPACK length")
        return bytes((index, len(raw))) + raw

    return literal(2, method) + literal(6, "http") + literal(4, path) + literal(1, authority)


def h2_frames(buf: bytes) -> tuple[list[tuple[int, int, int, bytes]], bytes]:
    """The whole frames at the front of ``buf`` ((type, flags, stream, payload)) and the rest."""
    out = []
    while len(buf) >= 9:
        n = int.from_bytes(buf[:3], "big")
        if len(buf) < 9 + n:
            break
        out.append((buf[3], buf[4], int.from_bytes(buf[5:9], "big") & 0x7FFF_FFFF, buf[9:9 + n]))
        buf = buf[9 + n:]
    return out, buf


def _h2(c: Client, port: int, timeout: float) -> Connection:
    """One request on stream 1 (headers only, its stream ended), the server's SETTINGS acked,
    the response's DATA read until ``expect``; the connection then stays open, idle. An
    ``h2-partial-body`` request's stream stays open after its headers and one DATA frame of
    ``body``: a handler reading the body waits for the rest."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    partial = c.kind == "h2-partial-body"
    headers = h2_frame(H2_HEADERS, H2_END_HEADERS | (0 if partial else H2_END_STREAM), 1,
                       h2_request_headers(c.method, c.path, f"127.0.0.1:{port}"))
    sock.sendall(H2_PREFACE + h2_frame(H2_SETTINGS, 0, 0) + headers
                 + (h2_frame(H2_DATA, 0, 1, c.body.encode()) if partial else b""))
    if c.expect is None or partial:
        return Connection(sock, c.kind)
    buf, body = b"", b""
    for chunk in _chunks(sock, timeout):
        frames, buf = h2_frames(buf + chunk)
        for kind, flags, stream, payload in frames:
            if kind == H2_SETTINGS and not flags & H2_ACK:
                sock.sendall(h2_frame(H2_SETTINGS, H2_ACK, 0))
            elif kind == H2_DATA and stream == 1:
                body += payload
            elif kind == H2_GOAWAY:
                raise RuntimeError(f"h2 client: the server went away ({payload[:40]!r})")
        if c.expect.encode() in body:
            break
    if c.expect.encode() not in body:
        sock.close()
        raise RuntimeError(f"h2 client: no {c.expect!r} in the response's data (got {body[-300:]!r})")
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
_KINDS = {"line": _line, "http": _http, "http-partial": _http, "http-partial-body": _http, "h2": _h2,
          "h2-partial-body": _h2, "ws": _ws}


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
