"""Non-stop mode in the session core, packet by packet (nonstop.py): the
proxy drains the stub's notification queue itself, handles a hidden stop on
its thread alone, and runs the client's own %Stop/vStopped cycle."""

from __future__ import annotations

from proxy.session.actions import ToClient, ToClientRaw, ToStub, ToStubRaw
from rsp.framing import frame, frame_notification
from rsp.packets.qsupported import Feature

from .test_core import PROBE, THREAD, Driver, bodies, g_block, stop_at


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


SIGINFO_TRAP = b"l" + (5).to_bytes(4, "little") + bytes(4) + (0x80).to_bytes(4, "little") + bytes(116)


def _thread_less_stop(main_running: bool, worker_g: bytes) -> tuple[Driver, list[object]]:
    """gdbserver --disable-packet=T in non-stop mode, two threads: `S05` names
    neither. The proxy lists the threads, asks which are stopped with
    qXfer:siginfo:read (a running thread's fails) - never `g`: gdbserver would
    keep a running thread's unavailable registers and write them back into it
    later - then reads the stopped ones' registers."""
    d = _non_stop_running()
    d.s.stub_features = [Feature("qXfer:siginfo:read", "+")]
    worker = b"p3a4d.3a51"
    assert bodies(notify(d, b"S05"), ToStub) == [b"vStopped"]
    assert bodies(d.stub(b"OK"), ToStub) == [b"qfThreadInfo"]
    assert bodies(d.stub(b"m" + THREAD + b"," + worker), ToStub) == [b"qsThreadInfo"]
    siginfo = b"qXfer:siginfo:read::0,80"
    assert bodies(d.stub(b"l"), ToStub) == [b"Hg" + THREAD, siginfo, b"Hg" + worker, siginfo]
    d.stub(b"OK")
    d.stub(b"E01" if main_running else SIGINFO_TRAP)
    d.stub(b"OK")
    acts = d.stub(SIGINFO_TRAP)
    stopped = [worker] if main_running else [THREAD, worker]
    asks = [p for t in stopped for p in (b"Hg" + t, b"g")]
    assert bodies(acts, ToStub) == asks
    if not main_running:
        d.stub(b"OK")
        d.stub(g_block(0x1000))
    d.stub(b"OK")
    return d, d.stub(worker_g)


def test_stop_without_a_thread_is_the_stopped_thread_at_a_probe() -> None:
    """stop-reply-no-thread-multi.exp with --probe: the worker hits a hidden
    probe while main runs. The stop is the worker's (the only stopped thread,
    at a proxy breakpoint): hidden, the client sees nothing."""
    d, acts = _thread_less_stop(True, g_block(PROBE))
    worker = b"p3a4d.3a51"
    assert bodies(acts, ToStub) == [b"Hg" + worker, b"g"]  # its pc, as for any S05
    d.stub(b"OK")
    assert bodies(d.stub(g_block(PROBE)), ToStub) == [b"Hg" + worker]
    acts = d.stub(b"OK")
    assert bodies(acts, ToStub) == [f"z0,{PROBE:x},1".encode(), b"vCont;s:" + worker]  # that thread alone
    assert d.stub(b"OK") == [] and d.stub(b"OK") == []
    assert d.s.stats.hidden_stops == 1
    assert d.client(b"vStopped") == [ToClient(b"OK")]  # nothing queued for the client


def test_stop_without_a_thread_elsewhere_goes_to_the_client_as_sent() -> None:
    """No stopped thread at a proxy breakpoint (the client's own stop, or a
    thread that is stopped for the client somewhere else): not the proxy's."""
    d, acts = _thread_less_stop(False, g_block(0x2000))
    assert acts == [ToClientRaw(frame_notification(b"Stop:S05"))]
    assert d.s.stats.hidden_stops == 0
