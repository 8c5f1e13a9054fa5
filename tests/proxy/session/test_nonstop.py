"""Non-stop mode in the session core, packet by packet (nonstop.py): the
proxy drains the stub's notification queue itself, handles a hidden stop on
its thread alone, and runs the client's own %Stop/vStopped cycle."""

from __future__ import annotations

from proxy.session.actions import ToClient, ToClientRaw, ToStub, ToStubRaw
from proxy.session.nonstop import PLACE_ROUNDS, PLACE_WAIT, Seen, place_stops, siginfo_of
from rsp.framing import frame, frame_notification
from rsp.packets.qsupported import Feature
from rsp.threads import ThreadId

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


def _siginfo(signo: int, code: int) -> bytes:
    return b"l" + signo.to_bytes(4, "little") + bytes(4) + code.to_bytes(4, "little") + bytes(116)


SIGINFO_TRAP = _siginfo(5, 0x80)  # an int3's SIGTRAP (SI_KERNEL)
SIGINFO_STEP = _siginfo(5, 2)  # a single step's (TRAP_TRACE)
SIGINFO = b"qXfer:siginfo:read::0,80"
WORKER = b"p3a4d.3a51"


def _thread_less(d: Driver, stop: bytes, threads: list[bytes], siginfo: list[bytes]) -> list[object]:
    """gdbserver --disable-packet=T in non-stop mode: `stop` names no thread.
    The proxy lists the threads and asks which are stopped with
    qXfer:siginfo:read (a running thread's fails) - never `g`: gdbserver
    would keep a running thread's unavailable registers and write them back
    into it later. Returns what it sends after the answers."""
    d.s.stub_features = [Feature("qXfer:siginfo:read", "+")]
    assert bodies(notify(d, stop), ToStub) == [b"vStopped"]
    return _look(d, threads, siginfo, drained=True)


def _look(d: Driver, threads: list[bytes], siginfo: list[bytes], drained: bool = False) -> list[object]:
    acts = d.stub(b"OK") if drained else []
    if drained:
        assert bodies(acts, ToStub) == [b"qfThreadInfo"]
    assert bodies(d.stub(b"m" + b",".join(threads)), ToStub) == [b"qsThreadInfo"]
    assert bodies(d.stub(b"l"), ToStub) == [p for t in threads for p in (b"Hg" + t, SIGINFO)]
    acts = []
    for answer in siginfo:
        d.stub(b"OK")
        acts = d.stub(answer)
    return acts


def _regs(d: Driver, pcs: list[int]) -> list[object]:
    acts: list[object] = []
    for pc in pcs:
        d.stub(b"OK")
        acts = d.stub(g_block(pc))
    return acts


def test_place_stops_waits_for_the_stops_the_stub_has_not_reported() -> None:
    """Every stop the proxy holds is one stopped thread's; a stopped thread
    without one is a stop gdbserver has not reported yet."""
    main, worker = ThreadId(0x3A4D, 0x3A50), ThreadId(0x3A4D, 0x3A51)
    both = [Seen(main, 5, 0x80), Seen(worker, 5, 0x80)]
    assert place_stops([(5, None)], both) == "wait"
    assert place_stops([(5, None), (5, None)], both) == [0, 1]
    assert place_stops([(5, None)] * 3, both) == "odd"
    # a SIGTRAP stop is a thread's whose siginfo says SIGTRAP; S00 (stopped
    # at the client's request, SIGSTOP) the other's
    assert place_stops([(0, None), (5, None)], [Seen(main, 5, 0x80), Seen(worker, 19, 0)]) == [1, 0]
    assert place_stops([(5, None), (5, None)], [Seen(main, 5, 0x80), Seen(worker, 19, 0)]) == "wait"
    # `T05` without thread:, with its pc: the thread at that pc, once read
    at = [Seen(main, 5, 0x80, 0x1000), Seen(worker, 5, 0x80, 0x2000)]
    assert place_stops([(5, 0x2000), (5, None)], at) == [1, 0]
    assert place_stops([(5, 0x3000), (5, None)], at) == "odd"
    assert place_stops([(5, 0x2000), (5, None)], both) == [0, 1]  # pcs not read yet: counts only


def test_siginfo_of_reads_signo_and_code() -> None:
    assert siginfo_of(b"E01") is None
    assert siginfo_of(SIGINFO_STEP) == (5, 2)
    escaped = b"l" + (5).to_bytes(4, "little") + bytes(4) + b"}" + bytes((0x23 ^ 0x20,)) + bytes(3) + bytes(116)
    assert siginfo_of(escaped) == (5, 0x23)


def test_stop_without_a_thread_is_the_stopped_thread_at_a_probe() -> None:
    """stop-reply-no-thread-multi.exp with --probe: the worker hits a hidden
    probe while main runs. The stop is the worker's (the only stopped thread):
    its pc read, hidden, the client sees nothing."""
    d = _non_stop_running()
    acts = _thread_less(d, b"S05", [THREAD, WORKER], [b"E01", SIGINFO_TRAP])
    assert bodies(acts, ToStub) == [b"Hg" + WORKER, b"g"]  # only now: its stop is here, it stays stopped
    d.stub(b"OK")
    assert bodies(d.stub(g_block(PROBE)), ToStub) == [b"Hg" + WORKER]
    acts = d.stub(b"OK")
    assert bodies(acts, ToStub) == [f"z0,{PROBE:x},1".encode(), b"vCont;s:" + WORKER]  # that thread alone
    assert d.stub(b"OK") == [] and d.stub(b"OK") == []
    assert d.s.stats.hidden_stops == 1
    assert d.client(b"vStopped") == [ToClient(b"OK")]  # nothing queued for the client


def test_two_threads_at_hidden_probes_at_once_are_both_handled() -> None:
    """Both threads trapped at the probe; gdbserver reported one (`S05`) and
    has the other's pending (it ignores a resume of a thread whose stop it
    has not reported). The proxy looks again until the second stop comes
    (its own %Stop, while the proxy looks), then handles each thread: both
    hits counted, each thread resumed alone, the client sees nothing."""
    d = _non_stop_running()
    acts = _thread_less(d, b"S05", [THREAD, WORKER], [SIGINFO_TRAP, SIGINFO_TRAP])
    assert bodies(acts, ToStub) == [b"qfThreadInfo"]  # one stop, two stopped threads: look again
    assert notify(d, b"S05") == []  # the second, while the proxy looks
    acts = _look(d, [THREAD, WORKER], [SIGINFO_TRAP, SIGINFO_TRAP])
    assert bodies(acts, ToStub) == [b"vStopped"]  # taken in
    assert bodies(d.stub(b"OK"), ToStub) == [b"qfThreadInfo"]
    acts = _look(d, [THREAD, WORKER], [SIGINFO_TRAP, SIGINFO_TRAP])
    assert bodies(acts, ToStub) == [b"Hg" + THREAD, b"g", b"Hg" + WORKER, b"g"]
    acts = _regs(d, [PROBE, PROBE])
    stepped = []
    for _ in range(2):
        assert bodies(acts, ToStub) in ([b"Hg" + THREAD], [b"Hg" + WORKER])
        acts = d.stub(b"OK")
        assert bodies(acts, ToStub)[0] == f"z0,{PROBE:x},1".encode()
        stepped.append(bodies(acts, ToStub)[1])
        d.stub(b"OK")
        acts = d.stub(b"OK")
    assert sorted(stepped) == [b"vCont;s:" + THREAD, b"vCont;s:" + WORKER]
    assert not [a for a in acts if isinstance(a, (ToClient, ToClientRaw))]
    assert d.s.stats.hidden_stops == 2 and d.s.stats.probe_stats.total == 2
    assert d.s.stats.ns_waited == 2
    assert d.client(b"vStopped") == [ToClient(b"OK")]


def test_a_step_onto_a_probe_is_the_clients_and_its_thread_held() -> None:
    """A thread whose siginfo says it single-stepped (TRAP_TRACE) onto the
    probe's address did not hit it: its stop goes to the client as sent, and
    the thread stays the client's until resumed - a later stop is placed
    without it."""
    d = _non_stop_running()
    acts = _thread_less(d, b"S05", [THREAD, WORKER], [b"E01", SIGINFO_STEP])
    assert bodies(acts, ToStub) == [b"Hg" + WORKER, b"g"]
    acts = _regs(d, [PROBE])
    assert acts == [ToClientRaw(frame_notification(b"Stop:S05"))]
    assert d.s.stats.hidden_stops == 0
    assert d.client(b"vStopped") == [ToClient(b"OK")]
    # main hits the probe; the worker is still stopped for the client
    assert bodies(notify(d, b"S05"), ToStub) == [b"vStopped"]
    acts = _look(d, [THREAD, WORKER], [SIGINFO_TRAP, SIGINFO_STEP], drained=True)
    assert bodies(acts, ToStub) == [b"Hg" + THREAD, b"g"]
    assert bodies(_regs(d, [PROBE]), ToStub) == [b"Hg" + THREAD]
    assert bodies(d.stub(b"OK"), ToStub) == [f"z0,{PROBE:x},1".encode(), b"vCont;s:" + THREAD]
    d.stub(b"OK")
    d.stub(b"OK")
    assert d.s.stats.ns_waited == 0 and d.s.stats.hidden_stops == 1
    # the client resumes the worker: it is no longer held
    d.client(b"vCont;c:" + WORKER)
    assert WORKER not in [b"p%x.%x" % k for k in d.s.ns.held]  # type: ignore[str-format]


def test_counts_that_never_meet_give_the_stop_as_sent() -> None:
    """A stopped thread whose stop never comes (a model the proxy got wrong):
    after PLACE_ROUNDS looks and PLACE_WAIT seconds the stop goes to the one
    candidate if there is exactly one, else to the client as the stub sent it."""
    now = [0.0]
    d = Driver(clock=lambda: now[0])
    d.client(b"QNonStop:1")
    d.stub(b"OK")
    d.client(b"vCont;c:p3a4d.-1")
    d.stub(b"OK")
    d.stub(b"OK")
    acts = _thread_less(d, b"S05", [THREAD, WORKER], [SIGINFO_TRAP, SIGINFO_TRAP])
    for _ in range(PLACE_ROUNDS - 1):
        now[0] += PLACE_WAIT
        assert bodies(acts, ToStub) == [b"qfThreadInfo"]
        acts = _look(d, [THREAD, WORKER], [SIGINFO_TRAP, SIGINFO_TRAP])
    assert bodies(acts, ToStub) == [b"Hg" + THREAD, b"g", b"Hg" + WORKER, b"g"]
    acts = _regs(d, [PROBE, PROBE])  # two at the probe: cannot tell
    assert acts == [ToClientRaw(frame_notification(b"Stop:S05"))]
    assert d.s.stats.ns_unplaced == 1 and d.s.stats.hidden_stops == 0


def test_the_threads_a_status_reply_names_without_a_thread_are_the_clients() -> None:
    """`?` in non-stop mode: gdbserver answers a stop for every thread whose
    stop it reported and nobody resumed. With as many stopped threads as
    stops, those threads are the client's: a later stop without a thread is
    placed without them, at once."""
    d = _non_stop_running()
    d.s.stub_features = [Feature("qXfer:siginfo:read", "+")]
    assert bodies(d.client(b"?"), ToStub) == [b"?"]
    assert bodies(d.stub(b"S05"), ToStub) == [b"vStopped"]
    assert bodies(d.stub(b"S00"), ToStub) == [b"vStopped"]
    acts = _look(d, [THREAD, WORKER], [SIGINFO_TRAP, _siginfo(19, 0)], drained=True)
    assert acts == [ToClient(b"S05")]
    assert d.client(b"vStopped") == [ToClient(b"S00")]
    assert d.client(b"vStopped") == [ToClient(b"OK")]
    d.client(b"vCont;c:" + WORKER)  # the worker runs again, main stays the client's
    d.stub(b"OK")
    acts = _thread_less(d, b"S05", [THREAD, WORKER], [SIGINFO_TRAP, SIGINFO_TRAP])
    assert bodies(acts, ToStub) == [b"Hg" + WORKER, b"g"]  # main apart: no waiting
    assert bodies(_regs(d, [PROBE]), ToStub) == [b"Hg" + WORKER]


def test_an_exec_in_non_stop_mode_forgets_the_clients_breakpoints_as_gdbserver_does() -> None:
    """gdbserver forgets a process's breakpoints at its exec, and gdb inserts its own
    again without removing them: kept in the table, the proxy answered that `Z0` OK
    itself and the new image ran without the breakpoint (gdb.threads/thread-execl.exp in
    non-stop mode looped on exec forever)."""
    d = _non_stop_running()
    bp = b"Z0,5555555551a9,1"
    d.client(bp)
    assert bodies(d.stub(b"OK"), ToClientRaw) == [frame(b"OK")]
    exec_stop = b"T05exec:2f746d702f78;06:0000000000000000;07:0000000000000000;10:0000000000000000;thread:" + THREAD + b";"
    assert bodies(notify(d, exec_stop), ToStub) == [b"vStopped"]
    acts = d.stub(b"OK")
    assert acts == [ToClientRaw(frame_notification(b"Stop:" + exec_stop))]
    assert d.client(b"vStopped") == [ToClient(b"OK")]
    acts = d.client(bp)
    assert bodies(acts, ToStub) == [bp] or bodies(acts, ToStubRaw) == [frame(bp)]  # to the stub: a new image


def test_a_wildcard_resume_leaves_stopped_what_the_client_has_not_pulled() -> None:
    """gdbserver passes over, in a wildcard resume, a thread whose stop sits in its queue
    and the child of a queued fork. The proxy has drained the stub's queue, so it spells
    the wildcard out without them; once the client pulled the stops, as it came."""
    d = _non_stop_running()
    fork = b"T05fork:p3a60.3a60;06:0100000000000000;10:0010000000000000;thread:p3a4d.3a51;core:1;"
    notify(d, fork)
    assert d.stub(b"OK") == [ToClientRaw(frame_notification(b"Stop:" + fork))]
    # the client resumes everything but one thread before pulling the fork's stop
    assert bodies(d.client(b"vCont;C14:p3a4d.3a50;c"), ToStub) == [b"qfThreadInfo"]
    assert bodies(d.stub(b"mp3a4d.3a50,p3a4d.3a51,p3a4d.3a52,p3a60.3a60"), ToStub) == [b"qsThreadInfo"]
    assert bodies(d.stub(b"l"), ToStub) == [b"vCont;C14:p3a4d.3a50;c:p3a4d.3a52"]
    assert d.stub(b"OK") == [ToClientRaw(frame(b"OK"))]
    assert d.client(b"vStopped") == [ToClient(b"OK")]
    # pulled: the next wildcard is the stub's to apply
    assert d.client(b"vCont;c") == [ToStubRaw(frame(b"vCont;c"))]


def test_a_wildcard_resume_of_spared_threads_only_is_answered_ok() -> None:
    d = _non_stop_running()
    notify(d, stop_at(0x1000))
    d.stub(b"OK")
    assert bodies(d.client(b"vCont;c:p3a4d.-1"), ToStub) == [b"qfThreadInfo"]
    d.stub(b"m" + THREAD)
    assert d.stub(b"l") == [ToClient(b"OK")]


def test_spell_out_splits_at_the_stubs_packet_size() -> None:
    from proxy.session.nonstop import spell_out
    from rsp.packets.resume import parse_resume

    resume = parse_resume(b"vCont;s:p1.2;c")
    assert resume is not None
    threads = [ThreadId(1, t) for t in range(2, 40)] + [ThreadId(9, 9)]
    packets = spell_out(resume, threads, [ThreadId(1, 7), ThreadId(9, 9)], packet_size=64)
    assert all(len(p) + 4 <= 64 for p in packets), packets
    items = [i for p in packets for i in p.split(b";")[1:]]
    assert items[0] == b"s:p1.2"
    assert items[1:] == [b"c:p1.%x" % t for t in range(3, 40) if t != 7]
    assert spell_out(parse_resume(b"vCont;c:p1.-1"), threads, []) == [  # type: ignore[arg-type]
        b"vCont;" + b";".join(b"c:p1.%x" % t for t in range(2, 40))]


def test_a_wildcard_resume_goes_as_it_came_when_the_stub_lists_no_thread() -> None:
    d = _non_stop_running()
    notify(d, stop_at(0x1000))
    d.stub(b"OK")
    assert bodies(d.client(b"vCont;c"), ToStub) == [b"qfThreadInfo"]
    assert bodies(d.stub(b"E01"), ToStub) == [b"vCont;c"]
