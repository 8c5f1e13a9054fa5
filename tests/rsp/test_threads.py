from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rsp.errors import MalformedPacket
from rsp.threads import ALL, ANY, ThreadId


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"p1.2", ThreadId(1, 2)),
        (b"p1.-1", ThreadId(1, ALL)),
        (b"p1", ThreadId(1, ALL)),
        (b"p-1", ThreadId(ALL, ALL)),
        (b"2", ThreadId(None, 2)),
        (b"-1", ThreadId(None, ALL)),
        (b"0", ThreadId(None, ANY)),
        (b"p2da7.2da7", ThreadId(0x2DA7, 0x2DA7)),
        (b"p0.0", ThreadId(0, 0)),
    ],
)
def test_parse(text: bytes, expected: ThreadId) -> None:
    assert ThreadId.parse(text) == expected


@pytest.mark.parametrize("text", [b"", b"p", b"pz.1", b"p1.", b"-2", b"q1"])
def test_parse_errors(text: bytes) -> None:
    with pytest.raises(MalformedPacket):
        ThreadId.parse(text)


def test_format() -> None:
    assert ThreadId(1, 2).format(multiprocess=True) == b"p1.2"
    assert ThreadId(1, 2).format(multiprocess=False) == b"2"
    assert ThreadId(0x10, ALL).format(multiprocess=True) == b"p10.-1"
    assert ThreadId(None, ALL).format(multiprocess=True) == b"-1"


def test_matches() -> None:
    t = ThreadId(5, 7)
    assert ThreadId(5, ALL).matches(t) and ThreadId(None, ALL).matches(t)
    assert ThreadId(ALL, ALL).matches(t) and ThreadId(None, 7).matches(t)
    assert not ThreadId(6, ALL).matches(t) and not ThreadId(5, 8).matches(t)


ids = st.one_of(st.just(ALL), st.integers(min_value=0, max_value=2**40))


@given(st.one_of(st.none(), ids), ids)
def test_round_trip(pid: int | None, tid: int) -> None:
    thread = ThreadId(pid, tid)
    text = thread.format(multiprocess=True)
    parsed = ThreadId.parse(text)
    # "p<pid>" alone means all threads, so formatting always writes the tid
    assert parsed == thread
