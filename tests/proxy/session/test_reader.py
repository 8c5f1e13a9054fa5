"""A question that reads the stopped program runs once, its reads answered as it asks
(proxy/session/reader.py); the session's side is in test_core.py and test_local_reads.py."""

from __future__ import annotations

import threading

import pytest

from proxy.session.reader import Asker


def test_each_ask_is_answered_in_order_and_the_question_runs_once() -> None:
    runs: list[int] = []

    def question(ask):  # type: ignore[no-untyped-def]
        runs.append(1)
        return [ask(("m", 1)), ask(("m", 2))]

    a = Asker(question)
    assert a.next() == ("ask", ("m", 1))
    a.answer(b"one")
    assert a.next() == ("ask", ("m", 2))
    a.answer(None)  # unreadable: the question gets None and goes on
    assert a.next() == ("done", [b"one", None]) and runs == [1]


def test_what_the_question_raises_is_handed_over() -> None:
    def question(ask):  # type: ignore[no-untyped-def]
        ask("x")
        raise ValueError("bad layout")

    a = Asker(question)
    assert a.next()[0] == "ask"
    a.answer(1)
    kind, err = a.next()
    assert kind == "raised" and isinstance(err, ValueError) and str(err) == "bad layout"


def test_abandoned_while_waiting_it_unwinds_and_its_thread_ends() -> None:
    """The session closed while the question waited for the stub: its cleanup runs, it
    answers nothing, and no thread is left behind."""
    cleaned: list[str] = []

    def question(ask):  # type: ignore[no-untyped-def]
        try:
            ask("m")
        finally:
            cleaned.append("finally")
        pytest.fail("not reached")  # pragma: no cover

    before = threading.active_count()
    a = Asker(question)
    assert a.next()[0] == "ask"
    a.abandon()
    assert cleaned == ["finally"] and threading.active_count() == before


def test_a_session_closing_mid_command_leaves_no_thread() -> None:
    """A monitor command waiting for a memory read when the client hangs up, then the stub."""
    from proxy.session.actions import ToStub

    from .test_core import Driver, bodies

    def monitor(text, s, read):  # type: ignore[no-untyped-def]
        read(0x1000, 4)
        return "never\n"

    before = threading.active_count()
    d = Driver(probes=[], monitor=monitor)
    acts = d.client(b"qRcmd," + b"async tree".hex().encode())
    assert bodies(acts, ToStub) == [b"m1000,4"] and threading.active_count() == before + 1
    d.s.client_closed()
    assert threading.active_count() == before + 1  # the stub may still answer
    d.s.stub_closed()
    assert threading.active_count() == before
