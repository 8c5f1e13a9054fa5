from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.rsp.rsp_testutil import wire

from rsp.errors import MalformedPacket
from rsp.framing import frame
from rsp.packets.qxfer import (
    QXferRead,
    QXferWrite,
    build_qxfer_reply,
    parse_qxfer,
    parse_qxfer_reply,
)


def test_read_request() -> None:
    body = b"qXfer:features:read:target.xml:0,1000"
    assert parse_qxfer(body) == QXferRead("features", "target.xml", 0, 0x1000)
    assert parse_qxfer(body).build() == body
    assert parse_qxfer(b"qXfer:threads:read::0,1000") == QXferRead("threads", "", 0, 0x1000)
    assert parse_qxfer(b"qXfer:osdata:read:async-tasks:0,fff").annex == "async-tasks"


def test_write_request_unescapes() -> None:
    body = b"qXfer:siginfo:write::10:a}\x03b"
    req = parse_qxfer(body)
    assert req == QXferWrite("siginfo", "", 0x10, b"a#b") and req.build() == body


@pytest.mark.parametrize("body", [b"qXfer:features:read:target.xml", b"qXfer:x:delete::0,1",
                                  b"qXfer:x:read::0", b"qXfer:x:read::zz,1", b"qXfe"])
def test_malformed(body: bytes) -> None:
    with pytest.raises(MalformedPacket):
        parse_qxfer(body)


def test_reply_escapes_hash() -> None:
    data = b"<item>task #12</item>"
    reply = build_qxfer_reply(data, 0, 0x1000)
    assert reply.startswith(b"l") and b"#" not in reply
    frame(reply)  # frameable
    assert parse_qxfer_reply(reply) == (True, data)


def test_reply_chunks() -> None:
    data = bytes(range(256)) * 3
    got = b""
    offset = 0
    while True:
        last, chunk = parse_qxfer_reply(build_qxfer_reply(data, offset, 100))
        got += chunk
        offset += len(chunk)
        if last:
            break
    assert got == data
    assert build_qxfer_reply(data, len(data), 10) == b"l"
    assert build_qxfer_reply(data, len(data) + 1, 10) == b"E00"


def test_reply_respects_max_body() -> None:
    data = b"#" * 100
    reply = build_qxfer_reply(data, 0, 100, max_body=51)
    assert len(reply) <= 51 and reply.startswith(b"m")


def test_captured_rle_reply(captured: dict[str, Any]) -> None:
    last, data = parse_qxfer_reply(wire(captured["qxfer_target_xml_first_chunk_rle"]))
    assert not last and data.startswith(b'<?xml version="1.0"?>')
    assert b"\n    <flags" in data  # ' * ' expanded to 4 spaces


@given(st.binary(max_size=300), st.integers(0, 300), st.integers(1, 300))
def test_reply_round_trip(data: bytes, offset: int, length: int) -> None:
    reply = build_qxfer_reply(data, offset, length)
    if offset > len(data):
        assert reply == b"E00"
        return
    last, chunk = parse_qxfer_reply(reply)
    assert chunk == data[offset : offset + length]
    assert last == (offset + length >= len(data))
