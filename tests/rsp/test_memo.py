from __future__ import annotations

import pytest

from rsp.errors import MalformedPacket
from rsp.memo import kept
from rsp.packets.breakpoints import parse_breakpoint
from rsp.packets.resume import parse_resume
from rsp.threads import ThreadId


def test_a_kept_parse_answers_repeats_from_its_cache_and_raises_again_for_a_bad_body() -> None:
    calls: list[bytes] = []

    @kept
    def parse(body: bytes) -> int:
        calls.append(body)
        if not body.isdigit():
            raise MalformedPacket(body, "digits")
        return int(body)

    assert parse(b"12") == parse(b"12") == 12
    assert calls == [b"12"]  # the repeat was the cache's
    for _ in range(2):
        with pytest.raises(MalformedPacket):
            parse(b"x")
    assert calls == [b"12", b"x", b"x"]  # a failure is parsed (and raised) every time
    assert parse(bytearray(b"7")) == 7 and calls[-1] == bytearray(b"7")  # unhashable: parsed, not kept


def test_the_kept_parsers_give_what_a_fresh_parse_gives() -> None:
    # a resume is a new object each time: the session tells two equal resumes apart by it
    assert parse_resume(b"vCont;r1,2:p1.2;c:p1.-1") is not parse_resume(b"vCont;r1,2:p1.2;c:p1.-1")
    assert parse_breakpoint(b"Z0,401000,1") == parse_breakpoint.__wrapped__(b"Z0,401000,1")  # type: ignore[attr-defined]
    assert ThreadId.parse(b"p3a4d.3a4e") == ThreadId(0x3A4D, 0x3A4E)
    assert ThreadId.parse(b"-1") == ThreadId(None, -1)
    with pytest.raises(MalformedPacket):
        ThreadId.parse(b"pzz.1")
