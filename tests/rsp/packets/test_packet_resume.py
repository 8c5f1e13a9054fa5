from __future__ import annotations

from typing import Any

import pytest
from tests.rsp.rsp_testutil import wire
from hypothesis import given
from hypothesis import strategies as st

from rsp.errors import MalformedPacket
from rsp.packets.resume import Resume, ResumeAction, action_for, parse_resume
from rsp.threads import ALL, ThreadId


def test_captured_vcont(captured: dict[str, Any]) -> None:
    resume = parse_resume(wire(captured["vcont_continue"]))
    assert resume is not None
    assert resume.actions == (ResumeAction("c", thread=ThreadId(0x4211, ALL)),)
    step = parse_resume(wire(captured["vcont_step"]))
    assert step is not None and step.is_step


@pytest.mark.parametrize(
    "body",
    [b"vCont;c", b"vCont;s:p1.2;c", b"vCont;C05:p1.2;c:p1.-1", b"vCont;r1000,2000:p1.2;c",
     b"vCont;t:3", b"vCont;S0b:2;s", b"c", b"s", b"C05", b"S0b;401000", b"c401000", b"bc", b"bs"],
)
def test_round_trip_exact(body: bytes) -> None:
    resume = parse_resume(body)
    assert resume is not None and resume.build() == body


@pytest.mark.parametrize("body", [b"vCont?", b"vCtrlC", b"g", b"", b"qC", b"vContSupported"])
def test_not_a_resume(body: bytes) -> None:
    assert parse_resume(body) is None


@pytest.mark.parametrize("body", [b"vCont;x", b"vCont;C5", b"vCont;r10", b"C", b"cZZ", b"vCont;c:pq"])
def test_malformed(body: bytes) -> None:
    with pytest.raises(MalformedPacket):
        parse_resume(body)


def test_first_matching_action_applies() -> None:
    resume = parse_resume(b"vCont;s:p1.2;C05:p1.-1;c")
    assert resume is not None
    assert action_for(resume, ThreadId(1, 2)) == ResumeAction("s", thread=ThreadId(1, 2))
    assert action_for(resume, ThreadId(1, 3)) == ResumeAction("C", 5, ThreadId(1, ALL))
    assert action_for(resume, ThreadId(2, 9)) == ResumeAction("c")
    only = parse_resume(b"vCont;s:p1.2")
    assert only is not None and only.action_for(ThreadId(1, 3)) is None


def test_legacy_forms_and_signal_removal() -> None:
    resume = parse_resume(b"C05")
    assert resume is not None and resume.legacy == b"C05"
    assert resume.actions[0].without_signal() == ResumeAction("c")
    reverse = parse_resume(b"bc")
    assert reverse is not None and reverse.reverse


threads = st.one_of(
    st.none(),
    st.builds(ThreadId, st.one_of(st.none(), st.integers(1, 2**32)), st.one_of(st.just(ALL), st.integers(1, 2**32))),
)
actions = st.one_of(
    st.builds(ResumeAction, st.sampled_from("cst"), st.none(), threads),
    st.builds(ResumeAction, st.sampled_from("CS"), st.integers(0, 255), threads),
    st.builds(lambda t, a, b: ResumeAction("r", None, t, (a, b)), threads,
              st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
)


@given(st.lists(actions, min_size=1, max_size=5))
def test_vcont_round_trip(acts: list[ResumeAction]) -> None:
    resume = Resume(tuple(acts))
    assert parse_resume(resume.build()) == resume
