"""The session core driven packet by packet, with no socket.

Each test plays the client and the stub by hand, with packets as gdb 13.1
and gdbserver 13.1 send them (seen in --log-packets captures on this
machine), and checks what the core sends each way. The real parts are
exercised end to end in integration/; these pin the DESIGN.md §3 rules.
"""

from __future__ import annotations

import pytest

from proxy.session.actions import Close, SetNoAck, ToClient, ToClientRaw, ToStub, ToStubRaw
from proxy.session.core import Session, SessionConfig
from proxy.probes import Probe
from rsp.framing import frame

PROBE = 0x555555555169
THREAD = b"p3a4d.3a50"


def stop_at(pc: int, *, reason: bytes = b"swbreak:;", thread: bytes = THREAD, sig: bytes = b"05") -> bytes:
    le = pc.to_bytes(8, "little").hex().encode()
    return b"T" + sig + reason + b"06:00e0ffffff7f0000;07:b00eddf7ff7f0000;10:" + le + b";thread:" + thread + b";core:0;"


class Driver:
    """Plays both peers of one session."""

    def __init__(self, probes: list[int] = [PROBE], **cfg: object) -> None:  # noqa: B006
        resolve = (lambda path, entry: [Probe(f"p{a:x}", a) for a in probes]) if probes else None
        self.s = Session(SessionConfig(resolve_probes=resolve, elf_path="/bin/true", **cfg))  # type: ignore[arg-type]

    def client(self, body: bytes) -> list[object]:
        self.s.client_packet(body, frame(body))
        return self.s.take_actions()

    def stub(self, body: bytes) -> list[object]:
        self.s.stub_packet(body, frame(body))
        return self.s.take_actions()

    def start_running(self) -> None:
        """Plant the probes and let the client's first continue through."""
        acts = self.client(b"vCont;c:p3a4d.-1")
        assert acts == [ToStub(f"Z0,{PROBE:x},1".encode())]
        assert self.stub(b"OK")[-1] == ToStubRaw(frame(b"vCont;c:p3a4d.-1"))


def bodies(actions: list[object], kind: type) -> list[bytes]:
    out = []
    for a in actions:
        if isinstance(a, kind):
            out.append(a.body if hasattr(a, "body") else a.raw)  # type: ignore[attr-defined]
    return out


def test_qsupported_edits_both_ways() -> None:
    d = Driver(probes=[])
    acts = d.client(b"qSupported:multiprocess+;xmlRegisters=i386;vContSupported+")
    (up,) = bodies(acts, ToStub)
    assert b"xmlRegisters" not in up  # rule 11
    assert b"swbreak+" in up and b"multiprocess+" in up  # rule 5
    acts = d.stub(b"PacketSize=47ff;QStartNoAckMode+;ConditionalBreakpoints+;BreakpointCommands+;QNonStop+;swbreak+")
    assert bodies(acts, ToStub) == [b"QStartNoAckMode"]
    acts = d.stub(b"OK")
    assert SetNoAck("stub") in acts
    (down,) = bodies(acts, ToClient)
    # breakpoints.py: kept out of the stub where the proxy has a breakpoint of its own
    assert b"BreakpointCommands+" in down and b"ConditionalBreakpoints+" in down
    assert b"QNonStop+" in down  # non-stop mode passes (nonstop.py)
    assert b"PacketSize=47ff" in down and b"qXfer:asyncrsp.graph:read+" in down


def test_registers_full_keeps_xml_registers() -> None:
    d = Driver(probes=[], registers_safe=False)
    (up,) = bodies(d.client(b"qSupported:xmlRegisters=i386"), ToStub)
    assert b"xmlRegisters=i386" in up


def test_hidden_stop_steps_over_and_reissues_without_signal() -> None:
    d = Driver()
    acts = d.client(b"vCont;C1e:p3a4d.3a50;c:p3a4d.-1")
    assert bodies(acts, ToStub) == [f"Z0,{PROBE:x},1".encode()]
    assert bodies(d.stub(b"OK"), ToStubRaw) == [frame(b"vCont;C1e:p3a4d.3a50;c:p3a4d.-1")]
    acts = d.stub(stop_at(PROBE))
    assert bodies(acts, ToStub) == [f"z0,{PROBE:x},1".encode(), b"vCont;s:" + THREAD]
    assert not bodies(acts, ToClientRaw)  # hidden
    assert d.stub(b"OK") == []
    acts = d.stub(stop_at(PROBE + 1, reason=b""))
    # back to back: the breakpoint again, and the client's resume minus its signal (rule 3)
    assert bodies(acts, ToStub) == [f"Z0,{PROBE:x},1".encode(), b"vCont;c:p3a4d.3a50;c:p3a4d.-1"]
    assert d.stub(b"OK") == []
    assert d.s.stats.hidden_stops == 1 and d.s.stats.probe_stats.total == 1


def test_shared_address_is_counted_and_reported() -> None:
    d = Driver()
    z = f"Z0,{PROBE:x},1".encode()
    assert bodies(d.client(z), ToStubRaw) == [frame(z)]  # the union gains it: forwarded
    d.stub(b"OK")
    acts = d.client(b"vCont;c:p3a4d.-1")  # planting adds nothing the stub lacks
    assert bodies(acts, ToStubRaw) == [frame(b"vCont;c:p3a4d.-1")] and not bodies(acts, ToStub)
    acts = d.stub(stop_at(PROBE))
    assert bodies(acts, ToClientRaw) == [frame(stop_at(PROBE))]  # rule 4
    assert d.s.stats.probe_stats.total == 1 and d.s.stats.hidden_stops == 0
    # gdb steps over its own breakpoint: z0 stays local while the proxy owns it,
    # and the step leaves the proxy's breakpoint by the proxy's own step-over.
    assert bodies(d.client(f"z0,{PROBE:x},1".encode()), ToClient) == [b"OK"]
    acts = d.client(b"vCont;s:" + THREAD)
    assert bodies(acts, ToStub) == [f"z0,{PROBE:x},1".encode(), b"vCont;s:" + THREAD]
    d.stub(b"OK")
    acts = d.stub(stop_at(PROBE + 1, reason=b""))
    assert bodies(acts, ToStub) == [f"Z0,{PROBE:x},1".encode()]
    acts = d.stub(b"OK")
    assert bodies(acts, ToClient) == [stop_at(PROBE + 1, reason=b"")]  # the client's step
    assert d.s.stats.probe_stats.total == 1  # not counted twice


def test_client_breakpoint_union() -> None:
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x1000, reason=b""))  # some reported stop
    # the client inserts at the probe: the stub already has it -> answered locally
    assert bodies(d.client(f"Z0,{PROBE:x},1".encode()), ToClient) == [b"OK"]
    # elsewhere: forwarded
    assert bodies(d.client(b"Z0,1234,1"), ToStubRaw) == [frame(b"Z0,1234,1")]


def test_interrupt_during_hidden_stop_reports_sigint() -> None:
    d = Driver()
    d.start_running()
    d.stub(stop_at(PROBE))
    d.s.client_interrupt()  # rule 8
    assert d.s.take_actions() == []  # not forwarded: the stub is stopped
    d.stub(b"OK")
    acts = d.stub(stop_at(PROBE + 1, reason=b""))
    assert bodies(acts, ToStub) == [f"Z0,{PROBE:x},1".encode()]
    acts = d.stub(b"OK")
    (reported,) = bodies(acts, ToClient)
    assert reported.startswith(b"T02") and THREAD in reported


def test_interrupt_while_the_probes_are_planted_reaches_the_stub_with_the_resume() -> None:
    """A Ctrl-C that comes while the first resume plants the probes: once the
    client's resume went out, the stub gets it (it was dropped: the client
    waited for a stop that never came)."""
    d = Driver()
    assert bodies(d.client(b"vCont;c:p3a4d.-1"), ToStub) == [f"Z0,{PROBE:x},1".encode()]
    d.s.client_interrupt()
    assert d.s.take_actions() == []  # the stub is busy with the plant
    acts = d.stub(b"OK")
    assert acts[-2:] == [ToStubRaw(frame(b"vCont;c:p3a4d.-1")), ToStubRaw(b"\x03")]
    (reported,) = bodies(d.stub(stop_at(0x1000, reason=b"", sig=b"02")), ToClientRaw)
    assert reported.startswith(b"$T02")


def test_a_client_gone_during_the_plant_is_not_resumed_for() -> None:
    """The client hangs up while the first resume plants the probes: its
    resume is not sent (the program would run with the proxy's breakpoints
    and nobody to take them out); the probes come out and the session ends."""
    d = Driver()
    assert bodies(d.client(b"vCont;c:p3a4d.-1"), ToStub) == [f"Z0,{PROBE:x},1".encode()]
    d.s.client_closed()
    acts = d.stub(b"OK")
    assert bodies(acts, ToStub) == [f"z0,{PROBE:x},1".encode()]
    assert Close("client disconnected") in d.stub(b"OK")


def test_the_keepers_plan_lists_a_breakpoint_before_the_stub_gets_it() -> None:
    """proxy/shell/keeper.py acts on this plan if the proxy dies: a Z0 on its
    way to the stub is in it already; the client's breakpoints too (their
    connection goes with the proxy); nothing once the client detached."""
    d = Driver()
    assert d.s.leave_plan() == {}  # nothing planted before the first resume
    d.client(b"vCont;c:p3a4d.-1")
    plan = d.s.leave_plan()
    assert plan["z"] == [f"z0,{PROBE:x},1"] and plan["trace"] is False and plan["detach"] == "D"
    d.stub(b"OK")
    d.stub(stop_at(0x1000, reason=b""))
    key = d.s.leave_plan_key()
    d.client(b"Z0,1234,1")
    assert d.s.leave_plan_key() != key
    assert d.s.leave_plan()["z"] == ["z0,1234,1", f"z0,{PROBE:x},1"]
    d.stub(b"OK")
    d.client(b"D")
    assert d.s.leave_plan() == {}


def test_a_refused_thread_selection_is_not_taken_for_the_clients() -> None:
    """gdbserver answers E01 to `Hg` for a thread it does not know and keeps
    its selection: the proxy keeps the client's too (fuzz seed 201: a Z0
    taken for a fork child's, its z0 answered locally, an int3 left)."""
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x1000, reason=b""))
    assert bodies(d.client(b"Hgp8a3a4d.3a50"), ToStubRaw) == [frame(b"Hgp8a3a4d.3a50")]
    assert bodies(d.stub(b"E01"), ToClientRaw) == [frame(b"E01")]
    assert d.s.client_g_thread == THREAD  # the stop's thread, gdbserver's selection since the stop
    assert bodies(d.client(b"Z0,1234,1"), ToStubRaw) == [frame(b"Z0,1234,1")]
    d.stub(b"OK")
    assert bodies(d.client(b"Hg0"), ToStubRaw) == [frame(b"Hg0")]
    d.stub(b"OK")
    assert d.s.client_g_thread == b"0"
    assert bodies(d.client(b"z0,1234,1"), ToStubRaw) == [frame(b"z0,1234,1")]


def test_a_client_remove_the_table_does_not_know_goes_to_the_stub() -> None:
    """Only a remove the proxy still needs the stub's breakpoint for is
    answered locally; one this table never saw reaches the stub."""
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x1000, reason=b""))
    assert bodies(d.client(b"z0,1234,1"), ToStubRaw) == [frame(b"z0,1234,1")]
    d.stub(b"OK")
    assert bodies(d.client(f"z0,{PROBE:x},1".encode()), ToClient) == [b"OK"]  # the probe stays


def test_interrupt_while_stopped_reaches_the_stub_after_the_next_continue() -> None:
    """gdb's Ctrl-C between a stop and its next resume (it handled a
    shared-library event by itself): the next resume must stop at once
    (reconnect-ctrl-c.exp). Forwarded while stopped, gdbserver would queue a
    real SIGINT in the kernel, which a detach delivers (the program died):
    the 0x03 goes after the next continue instead, and a detach drops it."""
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x7FFFF7FCC060))  # not a probe: the client's stop
    d.s.take_actions()
    d.s.client_interrupt()
    assert d.s.take_actions() == []
    acts = d.client(b"vCont;c:p3a4d.-1")
    assert acts == [ToStubRaw(frame(b"vCont;c:p3a4d.-1")), ToStubRaw(b"\x03")]
    (reported,) = bodies(d.stub(stop_at(0x1000, reason=b"", sig=b"02")), ToClientRaw)
    assert reported.startswith(b"$T02")
    d.s.client_interrupt()  # stopped again; then a detach: nothing reaches the stub but the D
    assert d.s.take_actions() == []
    acts = d.client(b"D;3a4d")
    assert b"\x03" not in bodies(acts, ToStubRaw)


def test_a_sigint_that_crossed_a_stop_is_consumed_before_the_detach() -> None:
    """The client's 0x03 went while the program ran, and another stop (a
    client breakpoint) came instead of its SIGINT: gdbserver left a real
    SIGINT waiting in the kernel, which the detach would deliver. The proxy
    runs the program until it stops with it, passing no signal, then detaches."""
    from proxy.host.identity import Identity

    pending = [True]
    d = Driver(probes=[], sigint_pending=lambda pid: pending[0])
    d.s.identity = Identity(True, 0x3a4d, 0x3a4d, "test")
    d.client(b"vCont;c:p3a4d.-1")
    d.s.client_interrupt()
    assert d.s.take_actions() == [ToStubRaw(b"\x03")]
    d.stub(stop_at(0x1234))  # a client breakpoint won: not the SIGINT
    acts = d.client(b"D;3a4d")
    assert bodies(acts, ToStub) == [b"QProgramSignals:"]
    assert bodies(d.stub(b"OK"), ToStub) == [b"vCont;c"]
    pending[0] = False
    assert bodies(d.stub(stop_at(0x1000, reason=b"", sig=b"02")), ToStubRaw) == [frame(b"D;3a4d")]


def _crossed_with_a_probe(pending: list[bool]) -> Driver:
    """A probe planted, the client's 0x03 sent, and a client breakpoint's stop
    came instead of its SIGINT (which now waits in the kernel while `pending`)."""
    from proxy.host.identity import Identity

    d = Driver(sigint_pending=lambda pid: pending[0])
    d.s.identity = Identity(True, 0x3a4d, 0x3a4d, "test")
    d.start_running()
    d.s.client_interrupt()
    assert d.s.take_actions() == [ToStubRaw(b"\x03")]
    d.stub(stop_at(0x1234))
    return d


def test_a_crossed_sigint_consumed_with_the_probes_coming_out() -> None:
    """As above with a probe planted: its z0 goes with the resume that consumes
    the SIGINT, and the stop is the last of the replies (the session fuzzer
    found the core expecting one reply there: 'too many values to unpack')."""
    pending = [True]
    d = _crossed_with_a_probe(pending)
    assert bodies(d.client(b"D;3a4d"), ToStub) == [b"QProgramSignals:"]
    assert bodies(d.stub(b"OK"), ToStub) == [f"z0,{PROBE:x},1".encode(), b"vCont;c"]
    assert d.stub(b"OK") == []
    pending[0] = False
    assert bodies(d.stub(stop_at(0x1000, reason=b"", sig=b"02")), ToStubRaw) == [frame(b"D;3a4d")]


def test_a_crossed_sigint_consumed_when_the_client_hangs_up() -> None:
    """The same crossing, then the client is killed while the program is
    stopped: the proxy leaves without a detach packet of the client's, and
    gdbserver detaches when the link closes - delivering the waiting SIGINT
    (fault campaign, breakpoint capture, the client killed: 2 of 12 attached
    programs died of SIGINT). The proxy runs the program until the SIGINT
    stops it, passing no signal, before it goes."""
    pending = [True]
    d = _crossed_with_a_probe(pending)
    d.s.client_closed()
    assert bodies(d.s.take_actions(), ToStub) == [b"QProgramSignals:"]
    assert bodies(d.stub(b"OK"), ToStub) == [b"QProgramSignals:", f"z0,{PROBE:x},1".encode(), b"vCont;c"]
    d.stub(b"OK")
    assert d.stub(b"OK") == []
    pending[0] = False
    assert any(isinstance(a, Close) for a in d.stub(stop_at(0x1000, reason=b"", sig=b"02")))


def test_a_crossed_sigint_of_a_remote_program_read_through_the_stub() -> None:
    """The same crossing, the program of another host (a container, `--remote`):
    its /proc is the stub's, read with vFile. The client killed, the SIGINT
    waiting (ShdPnd bit 1): consumed before the proxy goes (`fault-campaign
    --victims client --backends breakpoints --proxy-arg=--remote`: 4 of 20
    programs died of SIGINT when it was not)."""
    from proxy.host.identity import Identity

    d = Driver(sigint_pending=_remote_asked)
    d.s.identity = Identity(False, None, 0x3a4d, "test: remote")
    d.start_running()
    d.s.client_interrupt()
    assert d.s.take_actions() == [ToStubRaw(b"\x03")]
    d.stub(stop_at(0x1234))  # a client breakpoint won: not the SIGINT
    d.s.client_closed()
    path = b"/proc/%d/status" % 0x3a4d
    assert bodies(d.s.take_actions(), ToStub) == [b"vFile:open:" + path.hex().encode() + b",0,0"]
    assert bodies(d.stub(b"F7"), ToStub) == [b"vFile:pread:7,1000,0", b"vFile:close:7"]
    status = b"Name:\tbench\nSigPnd:\t0000000000000000\nShdPnd:\t0000000000000002\n"
    assert d.stub(b"F%x;" % len(status) + status) == []
    assert bodies(d.stub(b"F0"), ToStub) == [b"QProgramSignals:"]
    assert bodies(d.stub(b"OK"), ToStub) == [b"QProgramSignals:", f"z0,{PROBE:x},1".encode(), b"vCont;c"]
    d.stub(b"OK")
    assert d.stub(b"OK") == []
    assert any(isinstance(a, Close) for a in d.stub(stop_at(0x1000, reason=b"", sig=b"02")))


def _crossed_without_probes(local: bool, sigint_pending) -> Driver:  # type: ignore[no-untyped-def]
    """No probe; the client's 0x03 crossed a client breakpoint's stop."""
    from proxy.host.identity import Identity

    d = Driver(probes=[], sigint_pending=sigint_pending)
    d.s.identity = Identity(True, 0x3a4d, 0x3a4d, "test") if local else Identity(False, None, 0x3a4d, "remote")
    d.client(b"vCont;c:p3a4d.-1")
    d.s.client_interrupt()
    d.s.take_actions()
    d.stub(stop_at(0x1234))
    return d


def _remote_asked(pid: int) -> bool:
    pytest.fail("this host's /proc asked for a remote program")


def test_a_crossed_sigint_consumed_at_a_hang_up_with_nothing_of_the_proxys_in() -> None:
    """No probe, no capture: a hang-up after a crossing still consumes the
    SIGINT (a `D` did already; a hang-up left it to gdbserver's detach)."""
    pending = [True]
    d = _crossed_without_probes(True, lambda pid: pending[0])
    d.s.client_closed()
    assert bodies(d.s.take_actions(), ToStub) == [b"QProgramSignals:"]
    assert bodies(d.stub(b"OK"), ToStub) == [b"QProgramSignals:", b"vCont;c"]
    d.stub(b"OK")
    pending[0] = False
    assert any(isinstance(a, Close) for a in d.stub(stop_at(0x1000, reason=b"", sig=b"02")))


def test_no_sigint_waiting_in_a_remote_program_no_extra_resume() -> None:
    d = _crossed_without_probes(False, _remote_asked)
    assert bodies(d.client(b"D;3a4d"), ToStub)[0].startswith(b"vFile:open:")
    d.stub(b"F7")
    d.stub(b"F20;SigPnd:\t0000000000000000\nShdPnd:\t0\n")
    assert bodies(d.stub(b"F0"), ToStubRaw) == [frame(b"D;3a4d")]


def test_a_stub_without_vfile_leaves_as_before() -> None:
    d = _crossed_without_probes(False, _remote_asked)
    d.client(b"D;3a4d")
    assert bodies(d.stub(b""), ToStubRaw) == [frame(b"D;3a4d")]


def test_no_crossing_no_extra_resume_at_the_detach() -> None:
    from proxy.host.identity import Identity

    d = Driver(probes=[], sigint_pending=lambda pid: True)  # a SIGINT someone else sent: the program's own
    d.s.identity = Identity(True, 0x3a4d, 0x3a4d, "test")
    d.client(b"vCont;c:p3a4d.-1")
    d.stub(stop_at(0x1234))
    assert bodies(d.client(b"D;3a4d"), ToStubRaw) == [frame(b"D;3a4d")]


def test_interrupt_while_stopped_is_not_sent_after_a_step_but_after_the_continue() -> None:
    """gdb's Ctrl-C while it handles a shared-library event by itself: it
    steps over its breakpoint (z0, vCont;s, Z0) and continues. The step ends
    by itself; the Ctrl-C goes with the continue (reconnect-ctrl-c.exp under
    load: dropped at the step, the program ran on and the client waited)."""
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x7FFFF7FCC060))
    d.s.take_actions()
    d.s.client_interrupt()
    acts = d.client(b"vCont;s:" + THREAD)
    assert acts == [ToStubRaw(frame(b"vCont;s:" + THREAD))]
    d.stub(stop_at(0x7FFFF7FCC064, reason=b""))
    acts = d.client(b"vCont;c:p3a4d.-1")
    assert acts == [ToStubRaw(frame(b"vCont;c:p3a4d.-1")), ToStubRaw(b"\x03")]
    (reported,) = bodies(d.stub(stop_at(0x1000, reason=b"", sig=b"02")), ToClientRaw)
    assert reported.startswith(b"$T02")


def g_block(pc: int) -> bytes:
    return b"00" * 128 + pc.to_bytes(8, "little").hex().encode() + b"00" * 64


def test_stop_without_a_thread_finds_the_thread_at_the_probe() -> None:
    """gdbserver --disable-packet=T: `S05`, no thread, no registers, and the
    stub's selected thread stays the client's: the proxy asks the selected
    thread first, then looks for the one at a probe, puts the client's
    selection back, and steps that thread alone (no emulation: its writes
    would go to the selected thread)."""
    d = Driver()
    d.start_running()
    other = b"p3a4d.3a51"
    assert bodies(d.stub(b"S05"), ToStub) == [b"qC", b"g"]
    d.stub(b"QC" + THREAD)
    assert bodies(d.stub(g_block(0x1000)), ToStub) == [b"qfThreadInfo"]
    assert bodies(d.stub(b"m" + THREAD + b"," + other), ToStub) == [b"qsThreadInfo"]
    assert bodies(d.stub(b"l"), ToStub) == [b"Hg" + other, b"g"]
    d.stub(b"OK")
    assert bodies(d.stub(g_block(PROBE)), ToStub) == [b"Hg" + THREAD]
    acts = d.stub(b"OK")
    assert bodies(acts, ToStub) == [f"z0,{PROBE:x},1".encode(), b"vCont;s:" + other]
    assert not bodies(acts, ToClient)


def test_step_of_the_hit_thread_is_the_clients_step() -> None:
    d = Driver()
    d.client(b"vCont;s:" + THREAD)
    d.stub(b"OK")
    d.stub(stop_at(PROBE))
    d.stub(b"OK")
    d.stub(stop_at(PROBE + 1, reason=b""))
    acts = d.stub(b"OK")
    assert bodies(acts, ToClient) == [stop_at(PROBE + 1, reason=b"")]


def test_range_step_reissued_only_inside_range() -> None:
    d = Driver()
    d.client(b"vCont;r555555555000,555555555200:" + THREAD + b";c:p3a4d.-1")
    d.stub(b"OK")
    d.stub(stop_at(PROBE))
    d.stub(b"OK")
    acts = d.stub(stop_at(PROBE + 1, reason=b""))
    assert bodies(acts, ToStub)[-1].startswith(b"vCont;r")  # still in range: re-issued


def test_detach_removes_probes_first() -> None:
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x1000, reason=b""))
    acts = d.client(b"D;3a4d")
    assert bodies(acts, ToStub) == [f"z0,{PROBE:x},1".encode()]  # rule 9
    acts = d.stub(b"OK")
    assert bodies(acts, ToStubRaw) == [frame(b"D;3a4d")]
    assert bodies(d.stub(b"OK"), ToClientRaw) == [frame(b"OK")]


def test_client_hangs_up_while_running() -> None:
    d = Driver()
    d.start_running()
    d.s.client_closed()
    assert d.s.take_actions() == [ToStubRaw(b"\x03")]
    acts = d.stub(stop_at(0x1000, sig=b"02", reason=b""))
    # the proxy's own SIGINT must not reach an attached program after detach
    assert bodies(acts, ToStub) == [b"QProgramSignals:", f"z0,{PROBE:x},1".encode()]
    d.stub(b"OK")
    acts = d.stub(b"OK")
    assert any(isinstance(a, Close) for a in acts)


def test_exit_forgets_breakpoints() -> None:
    d = Driver()
    d.start_running()
    acts = d.stub(b"W03;process:3a4d")
    assert bodies(acts, ToClientRaw) == [frame(b"W03;process:3a4d")]
    assert d.s.bps.proxy_only() == []


def test_auxv_reply_is_run_length_decoded() -> None:
    """gdbserver RLE-encodes binary qXfer replies too (seen with auxv here):
    the load bias must come from the expanded bytes."""
    seen: list[int | None] = []

    def resolve(path: str | None, entry: int | None) -> list[Probe]:
        seen.append(entry)
        return []

    s = Session(SessionConfig(resolve_probes=resolve, elf_path="/bin/true"))
    s.stub_features = [__import__("rsp.packets.qsupported", fromlist=["Feature"]).Feature("qXfer:auxv:read", "+")]
    s.client_packet(b"vCont;c", frame(b"vCont;c"))
    assert bodies(s.take_actions(), ToStub) == [b"qXfer:auxv:read::0,1000"]
    entry = (0x555555555040).to_bytes(8, "little")  # 40 50 55 55 55 55 00 00
    # AT_ENTRY=9 then AT_NULL: zero runs encoded as "\x00*" + chr(29 + repeats)
    # (a count of 6 would be '#', which RLE never uses: split that run)
    wire = b"l" + b"\x09\x00\x00*" + bytes([29 + 5]) + b"\x40\x50\x55*" + bytes([29 + 3]) + b"\x00*" + bytes([29 + 17])
    s.stub_packet(wire, b"")
    assert seen == [0x555555555040]


@pytest.mark.parametrize("text,expect_local", [(b"async stats", True), (b"help", False)])
def test_monitor_async_local_others_forwarded(text: bytes, expect_local: bool) -> None:
    d = Driver(probes=[], monitor=lambda t, s, read: "probe hits: 0\n")
    acts = d.client(b"qRcmd," + text.hex().encode())
    if expect_local:
        out = bodies(acts, ToClient)
        assert out[-1] == b"OK" and out[0].startswith(b"O")
        assert bytes.fromhex(out[0][1:].decode()) == b"probe hits: 0\n"
    else:
        assert bodies(acts, ToStubRaw)


def test_work_after_the_answer_comes_after_its_replies() -> None:
    """What a monitor command leaves for after its answer (session.after_answer: a cold
    analysis's cache write, proxy.app) comes as AfterSend after the command's last reply,
    at the end of its procedure only: not while the command waits for a memory read."""
    from proxy.session.actions import AfterSend

    done: list[str] = []

    def monitor(text: str, session: Session, read) -> str:  # type: ignore[no-untyped-def]
        session.after_answer.append(lambda: done.append("cache written"))
        assert read(0x1000, 4) == b"\x01\x02\x03\x04"  # asked of the stub while the command waits
        return "answer\n"

    d = Driver(probes=[], monitor=monitor)
    acts = d.client(b"qRcmd," + b"async tree".hex().encode())
    assert bodies(acts, ToStub) == [b"m1000,4"] and not any(isinstance(a, AfterSend) for a in acts)
    acts = d.stub(b"01020304")
    assert bodies(acts, ToClient)[-1] == b"OK"
    later = [a for a in acts if isinstance(a, AfterSend)]
    assert len(later) == 1 and acts.index(later[0]) > max(i for i, a in enumerate(acts) if isinstance(a, ToClient))
    assert done == []  # the shell runs it (proxy.shell.link), once the replies are sent
    later[0].work()
    assert done == ["cache written"] and d.s.after_answer == []


def test_hang_up_racing_a_probe_stop_collects_the_queued_sigint() -> None:
    """Our 0x03 can cross a stop reply already on its way; gdbserver, then
    stopped, queues a real SIGINT that would kill an attached program after
    the detach (seen in integration/test_faults.py about 1 run in 5)."""
    d = Driver()
    d.start_running()
    d.s.client_closed()
    assert d.s.take_actions() == [ToStubRaw(b"\x03")]
    acts = d.stub(stop_at(PROBE))  # the probe's stop, not the interrupt's
    assert bodies(acts, ToStub) == [b"QProgramSignals:", f"z0,{PROBE:x},1".encode(), b"vCont;c"]
    d.stub(b"OK")
    d.stub(b"OK")
    acts = d.stub(stop_at(0x1000, sig=b"02", reason=b""))
    assert any(isinstance(a, Close) for a in acts)


def test_hang_up_during_a_hidden_stop_sends_no_interrupt() -> None:
    d = Driver()
    d.start_running()
    d.stub(stop_at(PROBE))  # hidden stop in progress
    d.s.client_closed()
    assert d.s.take_actions() == []  # no 0x03 toward a stopped gdbserver
    d.stub(b"OK")
    acts = d.stub(stop_at(PROBE + 1, reason=b""))
    assert bodies(acts, ToStub) == [f"Z0,{PROBE:x},1".encode()]  # back in, then leave
    acts = d.stub(b"OK")
    assert bodies(acts, ToStub) == [f"z0,{PROBE:x},1".encode()]
    assert any(isinstance(a, Close) for a in d.stub(b"OK"))


def test_fork_child_loses_the_proxy_breakpoints_and_is_not_the_program() -> None:
    """gdbserver reports a fork (`fork:` reason) with the child stopped; the
    child holds copies of the proxy's int3s. The proxy removes them in the
    child (Hg child; z0), puts the stub's selection back, reports the fork.
    gdb's own z0s in the child and its `D;child` leave the program's table
    and probes alone."""
    d = Driver()
    d.client(b"?")
    d.stub(stop_at(0x1000, reason=b""))  # the program's pid comes from its first stop
    d.start_running()
    child = b"p3a99.3a99"
    acts = d.stub(stop_at(0x1000, reason=b"fork:" + child + b";"))
    assert bodies(acts, ToStub) == [b"Hg" + child, f"z0,{PROBE:x},1".encode()]
    acts = d.stub(b"OK") + d.stub(b"OK")
    assert bodies(acts, ToStub) == [b"Hg" + THREAD]
    acts = d.stub(b"OK")
    assert bodies(acts, ToClientRaw)  # the fork is reported
    d.client(b"Hg" + child)
    d.stub(b"OK")
    assert bodies(d.client(b"z0,2000,1"), ToStubRaw) == [frame(b"z0,2000,1")]  # forwarded as is
    d.stub(b"OK")
    d.client(b"Hg" + THREAD)
    d.stub(b"OK")
    assert bodies(d.client(b"D;3a99"), ToStubRaw) == [frame(b"D;3a99")]  # not a leave
    d.stub(b"OK")
    assert d.s.bps.proxy_only() == [(0, PROBE, 1)] and PROBE in d.s.probes
    assert d.s.stats.forks_cleaned == 1

def _monitor_wanting_threads(seen: list[object]):  # type: ignore[no-untyped-def]
    def monitor(text: str, s: Session, read) -> str:  # type: ignore[no-untyped-def]
        got = s.queries.monitor_threads() if s.queries.monitor_threads is not None else "no accessor"
        seen.append(got)
        return "ok\n"
    return monitor


@pytest.mark.parametrize("hg_after_stop", [False, True])
def test_monitor_reads_every_thread_then_restores_the_clients_thread(hg_after_stop: bool) -> None:
    """Rule 6: `Hg` + `g` per thread for stack discovery, then the stub's selected thread
    as the client believes it: its own Hg if sent after the last stop, else the stop's."""
    seen: list[object] = []
    d = Driver(probes=[], monitor=_monitor_wanting_threads(seen))
    d.client(b"Hgp3a4d.3a51")  # the client looked at thread 3a51 before resuming
    d.stub(b"OK")
    d.client(b"vCont;c:p3a4d.-1")
    d.stub(stop_at(0x1000, sig=b"02", reason=b""))  # the stop moves the stub to 3a50
    want = b"p3a4d.3a50"
    if hg_after_stop:
        d.client(b"Hgp3a4d.3a52")
        d.stub(b"OK")
        want = b"p3a4d.3a52"
    acts = d.client(b"qRcmd," + b"async tree".hex().encode())
    assert bodies(acts, ToStub) == [b"qfThreadInfo"]
    assert bodies(d.stub(b"mp3a4d.3a50,p3a4d.3a51"), ToStub) == [b"qsThreadInfo"]
    acts = d.stub(b"l")
    assert bodies(acts, ToStub) == [b"Hgp3a4d.3a50", b"g", b"Hgp3a4d.3a51", b"g", b"Hg" + want]
    for reply in (b"OK", b"00" * 8, b"OK", b"11" * 8):
        assert d.stub(reply) == []
    acts = d.stub(b"OK")
    out = bodies(acts, ToClient)
    assert out[-1] == b"OK" and bytes.fromhex(out[0][1:].decode()) == b"ok\n"
    assert seen == [{0x3a50: b"00" * 8, 0x3a51: b"11" * 8}]  # read when asked: the command ran once


@pytest.mark.parametrize("client_mp", [False, True])
def test_stub_classifying_qsupported_names_multiprocess_only_for_a_client_that_does(client_mp: bool) -> None:
    """gdbserver turns multiprocess on at the qSupported that names it and off
    only at a new connection: a client without it (gdb's
    multiprocess-feature-packet off) then got `W0;process:PID` and gdb ended
    in an internal error (stop-reply-no-thread.exp, to_disable=threads)."""
    d = Driver(probes=[], classify_stub=lambda reply: (True, "asyncrsp: registers: safe"))
    acts = d.client(b"qSupported:" + (b"multiprocess+;" if client_mp else b"") + b"swbreak+;xmlRegisters=i386")
    (probe,) = bodies(acts, ToStub)
    assert probe.startswith(b"qSupported") and (b"multiprocess+" in probe) == client_mp


def test_extended_restart_gets_no_reply_and_plants_again() -> None:
    """`R` (gdb's `run` with run-packet off): gdbserver restarts the program
    and answers nothing; the proxy waited for a reply and every later packet
    queued behind it (ext-restart.exp timeouts). The new process gets the
    probes planted at its first resume."""
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x1000))  # the client's stop
    assert bodies(d.client(b"R00"), ToStubRaw) == [frame(b"R00")]
    assert bodies(d.client(b"?"), ToStubRaw) == [frame(b"?")]  # not queued
    d.stub(stop_at(0x2000))
    assert d.client(b"vCont;c:p3a4d.-1") == [ToStub(f"Z0,{PROBE:x},1".encode())]


def test_hang_up_keeps_the_stub_only_in_all_stop_while_the_program_lives() -> None:
    """A stub that takes another client (gdbserver without --once): a client
    that just hangs up leaves program, probes and capture for the next one;
    in non-stop mode (threads would run on unheard) the proxy leaves as with
    --once: its probes go out first."""
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x1000))
    d.s.take_actions()
    d.s.client_closed(keep_stub=True)
    assert d.s.take_actions() == [Close("client disconnected", keep_stub=True)]
    d.s.client_reconnected()
    assert d.client(b"vCont;c:p3a4d.-1") == [ToStubRaw(frame(b"vCont;c:p3a4d.-1"))]  # planted already
    n = Driver()
    n.client(b"QNonStop:1")
    n.stub(b"OK")
    n.client(b"vCont;c:p3a4d.-1")
    n.stub(b"OK")
    n.stub(b"OK")
    n.s.take_actions()
    n.s.client_closed(keep_stub=True)
    acts = n.s.take_actions()
    assert bodies(acts, ToStub) == [f"z0,{PROBE:x},1".encode()]
    assert not any(isinstance(a, Close) and a.keep_stub for a in acts)


@pytest.mark.parametrize("request_", [b"vRun;", b"vAttach;3a60"])
def test_another_process_without_a_kill_takes_the_probes_out_of_the_old_one(request_: bytes) -> None:
    """Extended-remote: the client runs or attaches another process while the
    one the proxy follows still lives (gdbserver's vRun and vAttach start the
    new one beside it; gdb with a second inferior). The proxy's breakpoints
    come out of the old process first - left in, one was a SIGTRAP nobody
    expected - then the request goes on; the new process gets its own at its
    first resume."""
    d = Driver()
    d.start_running()
    assert bodies(d.stub(stop_at(0x1000)), ToClientRaw) == [frame(stop_at(0x1000))]
    acts = d.client(request_)
    assert bodies(acts, ToStub) == [f"z0,{PROBE:x},1".encode()]
    assert not bodies(acts, ToStubRaw)
    assert bodies(d.stub(b"OK"), ToStubRaw) == [frame(request_)]
    assert d.s.processes == 2 and not d.s.bps.proxy


def test_another_process_after_a_kill_goes_at_once() -> None:
    """After a kill (gdb's `run` again) nothing of the proxy's is left: the
    vRun goes to the stub as it is."""
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x1000))
    assert bodies(d.client(b"vKill;3a4d"), ToStub) == [f"z0,{PROBE:x},1".encode()]
    assert bodies(d.stub(b"OK"), ToStubRaw) == [frame(b"vKill;3a4d")]
    d.stub(b"OK")
    assert bodies(d.client(b"vRun;"), ToStubRaw) == [frame(b"vRun;")]


def test_the_stubs_symbol_look_up_takes_only_its_answers_until_it_ends() -> None:
    """A client's `qSymbol::` answered `qSymbol:NAME`: the stub now waits for that
    symbol's answer and takes any other packet for a malformed one (gdbserver:
    "Malformed response to qSymbol, ignoring: g"; a `vCont;c` there ran the
    program to its end). The proxy answers E01 to everything but the answer and
    `m` reads until the stub's look-up is over, then lets everything through again."""
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x1000, reason=b""))
    assert bodies(d.client(b"qSymbol::"), ToStubRaw) == [frame(b"qSymbol::")]
    d.stub(b"qSymbol:6d61696e")
    for hostile in (b"g", b"vCont;c", b"qC"):
        acts = d.client(hostile)
        assert bodies(acts, ToClient) == [b"E01"] and not bodies(acts, ToStubRaw), hostile
    assert bodies(d.client(b"m1000,8"), ToStubRaw) == [frame(b"m1000,8")]
    d.stub(b"0000000000000000")
    assert bodies(d.client(b"qSymbol::6d61696e"), ToStubRaw) == [frame(b"qSymbol::6d61696e")]
    d.stub(b"qSymbol:6f74686572")  # the next question
    assert bodies(d.client(b"g"), ToClient) == [b"E01"]
    d.client(b"qSymbol:1234:6f74686572")
    d.stub(b"OK")  # done
    assert bodies(d.client(b"g"), ToStubRaw) == [frame(b"g")]


def test_a_client_gone_inside_the_symbol_look_up_gets_it_ended_before_the_leave() -> None:
    """The client hangs up while the stub waits for a symbol: every packet of the
    proxy's leave would be a malformed answer, so each question is answered
    "unknown" first."""
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x1000, reason=b""))
    d.client(b"qSymbol::")
    d.stub(b"qSymbol:6d61696e")
    d.s.client_closed()
    assert bodies(d.s.take_actions(), ToStub) == [b"qSymbol::6d61696e"]
    assert bodies(d.stub(b"qSymbol:6f74686572"), ToStub) == [b"qSymbol::6f74686572"]
    assert bodies(d.stub(b"OK"), ToStub) == [f"z0,{PROBE:x},1".encode()]


def _stopped_in_program(pid: int) -> Driver:
    d = Driver(probes=[])
    d.client(b"qSupported:multiprocess+;fork-events+")
    d.stub(b"PacketSize=47ff;multiprocess+;fork-events+")
    d.s.main_pid = pid  # the program's pid, as the plant finds it (lifecycle.find_program)
    d.client(b"?")
    d.stub(stop_at(PROBE))
    return d


def test_a_resume_of_a_fork_child_asks_the_stub_for_its_leader_and_is_forwarded() -> None:
    """gdb following a fork child (`follow-fork-mode child`, `detach-on-fork
    off`) resumes it by its own process's wildcard, `vCont;c:pCHILD.-1`. `T`
    takes no wildcard at gdbserver, so the child's leader thread is asked for:
    there, the resume goes on (it was answered E01 when any other process
    counted as one the stub did not have)."""
    d = _stopped_in_program(0x3a4d)
    assert bodies(d.client(b"vCont;c:p3a60.-1"), ToStub) == [b"Tp3a60.3a60"]
    assert bodies(d.stub(b"OK"), ToStubRaw) == [frame(b"vCont;c:p3a60.-1")]


def test_a_resume_of_a_process_the_stub_does_not_have_is_refused() -> None:
    d = _stopped_in_program(0x3a4d)
    assert bodies(d.client(b"vCont;c:p1.-1"), ToStub) == [b"Tp1.1"]
    assert bodies(d.stub(b"E01"), ToClient) == [b"E01"]
    assert d.s.stats.shielded == 1


def test_a_stop_makes_its_thread_the_clients_selection_in_all_stop() -> None:
    """gdbserver makes the reported thread its general thread at a stop, and
    gdb sends no Hg before its next `Z0`/`z0` there (remote.c keeps the
    stopped thread as selected). With a fork child selected before the stop
    (`detach-on-fork off`: gdb inserts into both processes), the parent's
    `Z0` counted as the child's: forwarded past the table, the stub's one
    breakpoint there went out with the child's `z0`, and the parent's `z0`
    got E01 ("Cannot remove breakpoints because program is no longer
    writable")."""
    d = _stopped_in_program(0x3a4d)
    assert bodies(d.client(b"Z0,1000,1"), ToStubRaw) == [frame(b"Z0,1000,1")]
    d.stub(b"OK")
    d.client(b"Hgp3a60.3a60")
    d.stub(b"OK")
    assert d.s.client_g_thread == b"p3a60.3a60"
    assert bodies(d.client(b"vCont;c:p3a4d.-1"), ToStubRaw) == [frame(b"vCont;c:p3a4d.-1")]
    d.stub(stop_at(PROBE))
    assert d.s.client_g_thread == THREAD
    acts = d.client(b"Z0,1000,1")  # the program's, already in the union
    assert bodies(acts, ToClient) == [b"OK"] and not bodies(acts, ToStubRaw)


def test_an_exec_of_the_program_empties_the_breakpoint_table() -> None:
    """gdbserver forgets a process's breakpoints when it calls exec, and gdb
    inserts its own again without removing them: the same `Z0` must reach
    the stub (answered OK from the table, the new image had no int3 there)."""
    d = _stopped_in_program(0x3a4d)
    assert bodies(d.client(b"Z0,1000,1"), ToStubRaw) == [frame(b"Z0,1000,1")]
    d.stub(b"OK")
    assert bodies(d.client(b"vCont;c:p3a4d.-1"), ToStubRaw) == [frame(b"vCont;c:p3a4d.-1")]
    d.stub(b"T05exec:2f62696e2f74727565;thread:p3a4d.3a4d;")
    assert bodies(d.client(b"Z0,1000,1"), ToStubRaw) == [frame(b"Z0,1000,1")]


def test_an_exec_of_another_process_keeps_the_programs_breakpoints() -> None:
    d = _stopped_in_program(0x3a4d)
    d.client(b"Z0,1000,1")
    d.stub(b"OK")
    d.client(b"vCont;c:p3a4d.-1")
    d.stub(b"T05exec:2f62696e2f74727565;thread:p3a60.3a60;")  # a fork child gdb keeps
    d.client(b"Hgp3a4d.3a4d")
    d.stub(b"OK")
    acts = d.client(b"Z0,1000,1")
    assert bodies(acts, ToClient) == [b"OK"] and not bodies(acts, ToStubRaw)


def test_the_current_thread_is_the_stops_not_the_last_hg() -> None:
    """gdb fetches other threads' registers with Hg after a stop (a late attach: the last Hg
    named another thread than the one gdb shows): `monitor async bt` with no argument
    describes the stop's thread (tokio's tinydb attached late)."""
    d = Driver()
    d.start_running()
    d.stub(stop_at(0x1000, reason=b""))
    d.client(b"Hgp3a4d.3a51")
    d.stub(b"OK")
    assert d.s.client_g_thread == b"p3a4d.3a51"
    assert d.s.current_thread() == 0x3A50


def test_the_parts_use_only_the_sessions_public_names() -> None:
    """The session's parts (non-stop, lifecycle, hidden stops, stepping, queries, task
    threads) and the application that composes it hold the session (`self.s`, `s`,
    `session`): what they may use of it is its public names; its underscored ones are its
    own. Read from the sources (a part that reaches into the session fails here)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[3] / "proxy"
    reach = re.compile(r"(?<![\w.])(?:self\.s|self\.session|session|s)\._[a-z]\w*")
    found = []
    for path in sorted({root / "app.py", *root.glob("*/*.py")}):
        if path.name in ("core.py", "state.py") and path.parent.name == "session":
            continue  # the session's own modules
        for no, line in enumerate(path.read_text().splitlines(), 1):
            found += [f"{path.relative_to(root)}:{no}: {m}" for m in reach.findall(line)]
    assert not found, "\n".join(found)
