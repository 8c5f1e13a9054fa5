from __future__ import annotations

import pytest
from tests.rsp.rsp_testutil import wire
from hypothesis import given
from hypothesis import strategies as st

from rsp.errors import LocalProtocolError, MalformedPacket
from rsp.framing import (
    checksum,
    escape_binary,
    frame,
    frame_notification,
    hex_decode,
    hex_encode,
    rle_expand,
    unescape_binary,
)


def test_checksum_and_frame() -> None:
    assert checksum(b"OK") == 0x9A
    assert frame(b"OK") == b"$OK#9a"
    assert frame(b"") == b"$#00"
    assert frame_notification(b"Stop:T05") == b"%Stop:T05#" + b"%02x" % checksum(b"Stop:T05")


@pytest.mark.parametrize("body", [b"a#b", b"$", b"m*"])
def test_frame_refuses_raw_specials(body: bytes) -> None:
    with pytest.raises(LocalProtocolError):
        frame(body)


def test_escape_examples() -> None:
    assert escape_binary(b"#12") == b"}\x0312"
    assert escape_binary(b"a$b}c*d") == b"a}\x04b}]c}\x0ad"
    assert escape_binary(b"plain") == b"plain"
    assert unescape_binary(b"}\x0312") == b"#12"
    assert unescape_binary(b"}}") == b"]"  # any byte may be escaped


def test_unescape_rejects_dangling_escape() -> None:
    with pytest.raises(MalformedPacket):
        unescape_binary(b"abc}")
    assert unescape_binary(b"ab}]") == b"ab}"


@given(st.binary())
def test_escape_round_trip(data: bytes) -> None:
    escaped = escape_binary(data)
    assert b"#" not in escaped and b"$" not in escaped and b"*" not in escaped
    assert unescape_binary(escaped) == data
    frame(escaped)  # always frameable


def test_escaped_hash_never_follows_escape_as_raw_hash() -> None:
    # '}#' cannot appear: an escaped '#' is '}' 0x03, so the first raw '#'
    # in a body always ends it.
    assert b"}#" not in escape_binary(bytes(range(256)) * 2)


def test_rle_examples() -> None:
    assert rle_expand(b"0* ") == b"0000"
    assert rle_expand(b"ab*\"c") == b"abbbbbbc"
    assert rle_expand(b"no runs") == b"no runs"
    # '*' as a count byte: 42 - 29 = 13 more copies (seen in gdbserver m replies)
    assert rle_expand(b"f**") == b"f" * 14


def test_rle_repeats_last_expanded_byte() -> None:
    # gdb's reader repeats the last byte of its output buffer.
    assert rle_expand(b"0* * ") == b"0" * 7


@pytest.mark.parametrize("body", [b"*a", b"a*", b"a*\x01"])
def test_rle_malformed(body: bytes) -> None:
    with pytest.raises(MalformedPacket):
        rle_expand(body)


def _rle_encode(data: bytes) -> bytes:
    """A reference encoder in gdbserver's style (runs of 4+, counts that
    avoid '#', '$' and '}' is fine)."""
    out = bytearray()
    i = 0
    while i < len(data):
        j = i
        while j < len(data) and data[j] == data[i] and j - i < 97:
            j += 1
        run = j - i
        n = run - 1
        if run >= 4 and chr(n + 29) not in "#$+-":
            out += data[i : i + 1] + b"*" + bytes((n + 29,))
        else:
            out += data[i:j]
        i = j
    return bytes(out)


@given(st.lists(st.sampled_from(list(b"0fx")), max_size=400).map(bytes))
def test_rle_round_trip(data: bytes) -> None:
    assert rle_expand(_rle_encode(data)) == data


@given(st.lists(st.sampled_from(list(b"0f*} #$\x1c\x1d~")), max_size=60).map(bytes))
def test_rle_fast_path_agrees_with_the_exact_reader(body: bytes) -> None:
    """Any body, well formed or not: the split-based expansion gives what the
    run-by-run reader gives, or the same error."""
    from rsp.framing import _rle_expand_exact

    try:
        want: bytes | str = _rle_expand_exact(body)
    except MalformedPacket:
        want = "malformed"
    try:
        got: bytes | str = rle_expand(body)
    except MalformedPacket:
        got = "malformed"
    assert got == want


def test_captured_g_reply_expands_to_560_bytes(captured: dict[str, object]) -> None:
    body = wire(str(captured["g_reply_noxml_rle"]))
    assert b"*" in body
    assert len(hex_decode(rle_expand(body))) == 560


@given(st.binary())
def test_hex_round_trip(data: bytes) -> None:
    assert hex_decode(hex_encode(data)) == data


@pytest.mark.parametrize("text", [b"abc", b"zz", b"0 1"])
def test_hex_decode_errors(text: bytes) -> None:
    with pytest.raises(MalformedPacket):
        hex_decode(text)
