"""The core stub answers RSP from an image; fed one byte at a time like every protocol test."""

from __future__ import annotations

import pytest

from proxy.corefile.elfcore import parse_core
from proxy.corefile.image import core_image
from proxy.corefile.stub import CoreStub
from rsp.connection import Connection
from rsp.framing import escape_binary, hex_encode
from rsp.reader import Packet
from rsp.regs import AMD64_LINUX_NOXML
from tests.proxy.corefile.test_elfcore import PROG, TEXT, spec


def make_stub() -> CoreStub:
    data = spec().build()
    return CoreStub(core_image(parse_core(data), data, lambda p: TEXT if p == PROG else None))


def ask(stub: CoreStub, body: bytes, *, bytewise: bool = True) -> bytes:
    client = Connection()
    client.send_packet(body)
    out = client.data_to_send()
    for i in range(len(out)) if bytewise else [None]:
        stub.receive_data(out[i:i + 1] if i is not None else out)
    got = [ev for ev in client.receive_data(stub.data_to_send()) if isinstance(ev, Packet)]
    assert len(got) == 1, got
    return got[0].body


@pytest.mark.parametrize("body, want", [
    (b"?", b"T0bthread:64;"),  # the first thread, with its signal (SIGSEGV)
    (b"qfThreadInfo", b"m64,65"),
    (b"qsThreadInfo", b"l"),
    (b"Hg65", b"OK"),
    (b"Hg99", b"E01"),
    (b"T65", b"OK"),
    (b"m400010,4", hex_encode(TEXT[16:20])),
    (b"m401ffe,4", hex_encode(TEXT[0x1ffe:0x2002])),
    (b"m900000,4", b"E14"),
    (b"x0,0", b"OK"),  # lldb's probe
    (b"x400010,4", TEXT[16:20]),  # no '#', '$', '}' or '*' in these bytes: no escaping
    (b"qXfer:exec-file:read::0,fff", b"l" + PROG.encode()),
    (b"vCont;c", b"E.asyncrsp: a core file is read-only: it cannot run, step, or be written"),
    (b"c", b"E.asyncrsp: a core file is read-only: it cannot run, step, or be written"),
    (b"M400000,1:00", b"E.asyncrsp: a core file is read-only: it cannot run, step, or be written"),
    (b"Z0,401000,1", b"E.asyncrsp: a core file is read-only: no breakpoints"),
    (b"qTStatus", b""),
])
def test_answers(body: bytes, want: bytes) -> None:
    assert ask(make_stub(), body) == want


def test_registers_of_the_selected_thread() -> None:
    stub = make_stub()
    g = AMD64_LINUX_NOXML.decode(ask(stub, b"g"))
    assert g["rip"] == 0x401010 and g["rax"] == 0x1122334455667788
    assert ask(stub, b"Hg65") == b"OK"
    assert AMD64_LINUX_NOXML.decode(ask(stub, b"g"))["rip"] == 0x401020
    assert ask(stub, b"p10") == (0x401020).to_bytes(8, "little").hex().encode()  # rip is register 16


def test_auxv_and_target_description() -> None:
    stub = make_stub()
    assert ask(stub, b"qXfer:auxv:read::0,1000") == b"l" + escape_binary(stub.image.auxv)
    xml = ask(stub, b"qXfer:features:read:target.xml:0,fff")
    assert xml.startswith(b"l<?xml") and b"64bit-core.xml" in xml
    assert b'name="rip"' in ask(stub, b"qXfer:features:read:64bit-core.xml:0,3fff")


def test_no_ack_mode_and_supported() -> None:
    stub = make_stub()
    assert b"qXfer:auxv:read+" in ask(stub, b"qSupported:multiprocess+;swbreak+")
    assert ask(stub, b"QStartNoAckMode") == b"OK"
    assert stub.conn.no_ack
