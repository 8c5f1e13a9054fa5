"""Non-stop mode in the session core, packet by packet (nonstop.py): the
proxy drains the stub's notification queue itself, handles a hidden stop on
its thread alone, and runs the client's own %Stop/vStopped cycle."""

from __future__ import annotations

from proxy.session.actions import ToClient, ToClientRaw, ToStub, ToStubRaw
from rsp.framing import frame, frame_notification

from .test_core import PROBE, THREAD, Driver, bodies, stop_at


def _non_stop_running() -> Driver:
    d = Driver()
    d.client(b"QNonStop:1")
    assert d.stub(b"OK") == [ToClientRaw(frame(b"OK"))]
    assert d.s.non_stop
    assert d.client(b"vCont;c:p3a4d.-1") == [ToStub(f"Z0,{PROBE:x},1".encode())]
    assert d.stub(b"OK")[-1] == ToStubRaw(frame(b"vCont;c:p3a4d.-1"))
    assert d.stub(b"OK") == [ToClientRaw(frame(b"OK"))]
    return d


def notify(d: Driver, stop: bytes) -> list[object]:
    d.s.stub_notification(b"Stop:" + stop, frame_notification(b"Stop:" + stop))
    return d.s.take_actions()


def test_hidden_stop_resumes_only_its_thread_and_the_client_sees_nothing() -> None:
    d = _non_stop_running()
    assert bodies(notify(d, stop_at(PROBE)), ToStub) == [b"vStopped"]
    assert bodies(d.stub(b"OK"), ToStub) == [b"Hg" + THREAD]
    assert bodies(d.stub(b"OK"), ToStub) == [f"z0,{PROBE:x},1".encode(), b"vCont;s:" + THREAD]
    d.stub(b"OK")
    assert d.stub(b"OK") == []
    # the step's stop: the breakpoint back, that thread alone resumed
    assert bodies(notify(d, stop_at(PROBE + 1, reason=b"")), ToStub) == [b"vStopped"]
    assert bodies(d.stub(b"OK"), ToStub) == [f"Z0,{PROBE:x},1".encode()]
    assert bodies(d.stub(b"OK"), ToStub) == [b"vCont;c:" + THREAD]
    acts = d.stub(b"OK")
    assert not [a for a in acts if isinstance(a, (ToClient, ToClientRaw))]
    assert d.s.stats.hidden_stops == 1


def test_the_clients_stops_come_in_its_own_cycle() -> None:
    d = _non_stop_running()
    other = b"p3a4d.3a51"
    first, second = stop_at(0x1000), stop_at(0x2000, thread=other)
    notify(d, first)
    acts = d.stub(second)  # vStopped's answer: one more queued stop
    assert bodies(acts, ToStub) == [b"vStopped"]
    acts = d.stub(b"OK")
    assert acts == [ToClientRaw(frame_notification(b"Stop:" + first))]
    assert d.client(b"vStopped") == [ToClient(second)]
    assert d.client(b"vStopped") == [ToClient(b"OK")]
