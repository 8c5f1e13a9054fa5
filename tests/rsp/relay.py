"""A small RSP relay for tests and fixture capture, built on `rsp.Connection`.

    python -m tests.rsp.relay LISTEN_PORT STUB_PORT LOGFILE   (LISTEN_PORT 0: any; printed) [--strip-xml-registers]
                              [--serve-features DIR]

It accepts one client, connects to a stub on localhost, and forwards
packets both ways through two `rsp.connection.Connection` objects (so the
relay does its own acks and follows ``QStartNoAckMode``). It writes every
packet body it forwards to LOGFILE as JSON lines ``{"dir": "c2s"|"s2c",
"body": "<latin-1 text>"}``. Options:

* ``--strip-xml-registers`` removes ``xmlRegisters=...`` from the client's
  ``qSupported`` (DESIGN.md §3 rule 11: what the proxy does toward
  gdbserver 13.1);
* ``--serve-features DIR`` answers ``qXfer:features:read:NAME`` from the
  files in DIR instead of asking the stub (to offer a client our own
  target description).

It is a test tool, not the product: one client, blocking sockets, no
time-outs beyond the socket's own.
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
from pathlib import Path

from rsp.connection import Connection  # noqa: E402
from rsp.packets.qsupported import (  # noqa: E402
    build_qsupported_request,
    parse_qsupported_request,
    without,
)
from rsp.packets.qxfer import QXferRead, build_qxfer_reply, parse_qxfer  # noqa: E402
from rsp.reader import Interrupt, Notification, Packet  # noqa: E402


class Relay:
    def __init__(self, client: socket.socket, stub: socket.socket, log, strip_xml: bool,
                 features: dict[str, bytes] | None) -> None:
        self.client, self.stub, self.log = client, stub, log
        self.c = Connection()
        self.s = Connection()
        self.strip_xml = strip_xml
        self.features = features
        self.last_request = b""

    def record(self, direction: str, body: bytes) -> None:
        self.log.write(json.dumps({"dir": direction, "body": body.decode("latin-1")}) + "\n")
        self.log.flush()

    def from_client(self, data: bytes) -> None:
        for event in self.c.receive_data(data):
            if isinstance(event, Interrupt):
                self.record("c2s", b"\x03")
                self.s.send_interrupt()
            elif isinstance(event, Packet):
                self.client_packet(event)

    def client_packet(self, packet: Packet) -> None:
        body = packet.body
        self.last_request = body
        if self.strip_xml and body.startswith(b"qSupported"):
            features = without(parse_qsupported_request(body), "xmlRegisters")
            body = build_qsupported_request(features)
        if self.features is not None and body.startswith(b"qXfer:features:read:"):
            request = parse_qxfer(body)
            assert isinstance(request, QXferRead)
            data = self.features.get(request.annex)
            reply = b"E00" if data is None else build_qxfer_reply(data, request.offset, request.length)
            self.record("c2p", body)
            self.record("p2c", reply)
            self.c.send_packet(reply)
            return
        self.record("c2s", body)
        if body == packet.body:
            self.s.send_raw(packet.raw)
        else:
            self.s.send_packet(body)

    def from_stub(self, data: bytes) -> None:
        for event in self.s.receive_data(data):
            if isinstance(event, (Packet, Notification)):
                self.record("s2c", event.body)
                self.c.send_raw(event.raw)
                if self.last_request == b"QStartNoAckMode" and event.body == b"OK":
                    self.s.set_no_ack()
                    self.c.set_no_ack()

    def flush(self) -> None:
        for conn, sock in ((self.c, self.client), (self.s, self.stub)):
            data = conn.data_to_send()
            if data:
                sock.sendall(data)

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.client, selectors.EVENT_READ, self.from_client)
        sel.register(self.stub, selectors.EVENT_READ, self.from_stub)
        while True:
            for key, _ in sel.select():
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                data = sock.recv(65536)
                if not data:
                    return
                key.data(data)
                self.flush()


def main(argv: list[str]) -> None:
    listen_port, stub_port, logfile = int(argv[0]), int(argv[1]), argv[2]
    strip = "--strip-xml-registers" in argv
    features = None
    if "--serve-features" in argv:
        folder = Path(argv[argv.index("--serve-features") + 1])
        features = {p.name: p.read_bytes() for p in folder.iterdir()}
    listener = socket.create_server(("127.0.0.1", listen_port))
    print("listening", listener.getsockname()[1], flush=True)
    client, _ = listener.accept()
    stub = socket.create_connection(("127.0.0.1", stub_port))
    for sock in (client, stub):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with open(logfile, "w") as log:
        Relay(client, stub, log, strip, features).run()


if __name__ == "__main__":
    main(sys.argv[1:])
