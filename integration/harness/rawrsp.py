"""A tiny RSP peer written by hand, for fault injection.

Deliberately independent of ``rsp/`` (the code under test): framing is
re-implemented here in a few lines so a bug in the library cannot hide
itself. :class:`RawPeer` wraps a connected socket (client side towards the
proxy, or the stub side of a fake upstream).
"""

from __future__ import annotations

import socket
import time


def checksum(payload: bytes) -> int:
    return sum(payload) & 0xFF


def frame(payload: bytes, corrupt: bool = False) -> bytes:
    """``$payload#cs``; with ``corrupt`` the checksum is off by one."""
    cs = (checksum(payload) + (1 if corrupt else 0)) & 0xFF
    return b"$" + payload + b"#" + b"%02x" % cs


def expand_rle(payload: bytes) -> bytes:
    out = bytearray()
    i = 0
    while i < len(payload):
        if payload[i:i + 1] == b"*" and out:
            out += out[-1:] * (payload[i + 1] - 29)
            i += 2
        else:
            out += payload[i:i + 1]
            i += 1
    return bytes(out)


class RawPeer:
    """One end of an RSP link, acks handled by the caller."""

    def __init__(self, sock: socket.socket, timeout: float = 10.0) -> None:
        self.sock = sock
        self.sock.settimeout(timeout)
        self.buf = b""
        self.noack = False  # after QStartNoAckMode: no acks either way

    @classmethod
    def connect(cls, address: str, timeout: float = 10.0) -> RawPeer:
        host, port = address.rsplit(":", 1)
        return cls(socket.create_connection((host, int(port)), timeout=timeout), timeout)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_packet(self, payload: bytes, corrupt: bool = False) -> None:
        self.sock.sendall(frame(payload, corrupt))

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError("peer closed the connection")
        self.buf += chunk

    def read_byte(self) -> bytes:
        while not self.buf:
            self._fill()
        b, self.buf = self.buf[:1], self.buf[1:]
        return b

    def read_ack(self) -> bytes:
        """The next ``+`` or ``-`` (other bytes before it are an error)."""
        b = self.read_byte()
        if b not in (b"+", b"-"):
            raise AssertionError(f"expected an ack, got {b!r} (+ {self.buf[:40]!r})")
        return b

    def read_packet(self) -> tuple[bytes, bool]:
        """Next ``$...#cs`` packet (acks before it are skipped): (payload, checksum ok)."""
        while True:
            while b"$" not in self.buf:
                self._fill()
            start = self.buf.index(b"$")
            self.buf = self.buf[start:]
            while b"#" not in self.buf or len(self.buf) < self.buf.index(b"#") + 3:
                self._fill()
            end = self.buf.index(b"#")
            payload, cs = self.buf[1:end], self.buf[end + 1:end + 3]
            self.buf = self.buf[end + 3:]
            try:
                ok = int(cs, 16) == checksum(payload)
            except ValueError:
                ok = False
            return payload, ok

    def request(self, payload: bytes) -> bytes:
        """Send a packet, expect ``+`` (unless `noack`), read the reply, ack it; RLE expanded."""
        self.send_packet(payload)
        if not self.noack:
            ack = self.read_ack()
            if ack != b"+":
                raise AssertionError(f"{payload!r} was NAKed")
        return self.reply(payload)

    def reply(self, payload: bytes = b"") -> bytes:
        """The next packet, acked (unless `noack`); RLE expanded. `payload`: the
        request it answers, for the error."""
        reply, ok = self.read_packet()
        if not self.noack:
            self.send(b"+" if ok else b"-")
        if not ok:
            raise AssertionError(f"bad checksum on the reply to {payload!r}")
        return expand_rle(reply)

    def run_a_little(self, seconds: float = 0.3) -> bytes:
        """`vCont;c`, then a Ctrl-C after `seconds`: the stop reply (acked)."""
        self.send_packet(b"vCont;c")
        assert self.read_ack() == b"+"
        time.sleep(seconds)
        self.send(b"\x03")
        reply, _ = self.read_packet()
        self.send(b"+")
        return reply

    def closed(self, timeout: float = 5.0) -> bool:
        """True when the peer closes within ``timeout`` (data is discarded)."""
        deadline = time.monotonic() + timeout
        self.sock.settimeout(0.2)
        while time.monotonic() < deadline:
            try:
                if not self.sock.recv(65536):
                    return True
            except TimeoutError:
                continue
            except OSError:
                return True
        return False

    def close(self) -> None:
        self.sock.close()
