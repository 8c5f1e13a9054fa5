"""The stop's knowledge (proxy/session/known.py) without sockets: what it answers, what it
leaves to the stub, and what makes it forget. The stop replies are gdbserver 13.1's (seen in
--log-packets captures); the same answers against a real gdbserver are compared in
integration/test_known_answers.py."""

from __future__ import annotations

from proxy.session.actions import ToClient, ToClientRaw, ToStub, ToStubRaw
from proxy.session.core import Session, SessionConfig
from proxy.session.known import StopKnowledge
from rsp.framing import frame
from rsp.packets.stop import parse_stop_reply

THREAD = b"p4a8f.4a8f"
STOP = (b"T0506:0000000000000000;07:a0e7ffffff7f0000;10:7157fef7ff7f0000;thread:" + THREAD + b";core:1;")
RSP, RIP = b"a0e7ffffff7f0000", b"7157fef7ff7f0000"


class Memory:
    """A process's memory as /proc/PID/mem would give it: None where the reader declines."""

    def __init__(self, data: dict[int, bytes]) -> None:
        self.data = data
        self.closed = 0

    def read(self, addr: int, size: int) -> bytes | None:
        for base, blob in self.data.items():
            if base <= addr and addr + size <= base + len(blob):
                return blob[addr - base:addr - base + size]
        return None

    def close(self) -> None:
        self.closed += 1


def known(mem: Memory | None = None) -> StopKnowledge:
    k = StopKnowledge(enabled=True, open_memory=(lambda pid: mem) if mem is not None else None)
    k.memory_pid, k.memory_link_pid = 99, 0x4A8F
    k.p_supported = True
    k.stopped(parse_stop_reply(STOP), selects=True)
    return k


def test_expedited_registers_of_the_stop_thread() -> None:
    k = known()
    assert k.answer(b"p7") == RSP and k.answer(b"p10") == RIP
    assert k.answer(b"p0") is None  # not expedited
    assert k.answer(b"p7;thread:4a8f;") is None  # lldb's suffix: not this form
    assert k.stats.registers == 2


def test_registers_only_while_the_stub_has_the_stop_thread_selected() -> None:
    k = known()
    k.sent(b"Hgp4a8f.4a90")
    assert k.answer(b"p7") is None and k.answer(b"Hgp4a8f.4a90") is None  # until its OK
    k.selected_ok(b"p4a8f.4a90")
    assert k.answer(b"p7") is None  # another thread's registers
    assert k.answer(b"Hgp4a8f.4a90") == b"OK"
    k.sent(b"Hg" + THREAD)
    k.selected_ok(THREAD)
    assert k.answer(b"p7") == RSP


def test_a_repeated_selection_of_the_selected_thread() -> None:
    k = known()
    assert k.answer(b"Hg" + THREAD) == b"OK"
    assert k.answer(b"Hgp4a8f.4a90") is None and k.answer(b"Hc" + THREAD) is None


def test_a_stub_without_p_answers_every_one_empty() -> None:
    k = StopKnowledge(enabled=True)
    k.stopped(parse_stop_reply(STOP), selects=True)
    assert k.answer(b"p7") is None  # not known whether the stub answers `p`
    k.forwarding(b"p7")
    k.replied(b"")  # gdbserver 13.1 on x86-64: no `p` at all
    assert k.answer(b"p7") == b"" and k.answer(b"p10") == b""
    k2 = StopKnowledge(enabled=True)
    k2.stopped(parse_stop_reply(STOP), selects=True)
    k2.forwarding(b"p7")
    k2.replied(RSP)
    assert k2.p_supported and k2.answer(b"p10") == RIP


def test_a_stop_from_question_mark_does_not_claim_the_selection() -> None:
    k = StopKnowledge(enabled=True)
    k.stopped(parse_stop_reply(STOP), selects=False)
    assert k.answer(b"p7") is None and k.answer(b"Hg" + THREAD) is None


def test_thread_list_repeated_within_a_stop() -> None:
    k = known()
    ask = b"qXfer:threads:read::0,1000"
    assert k.answer(ask) is None
    k.forwarding(ask)
    k.replied(b"l<threads/>")
    assert k.answer(ask) == b"l<threads/>"
    assert k.answer(b"qXfer:threads:read::0,fff") is None  # another request
    k.sent(b"vCont;s:" + THREAD)
    assert k.answer(ask) is None


def test_a_reply_is_kept_only_for_the_request_it_answers() -> None:
    k = known()
    k.forwarding(b"qXfer:threads:read::0,1000")
    k.forwarding(b"m1000,8")  # the reply that comes is this one's
    k.replied(b"0011223344556677")
    assert k.threads == {}


def test_memory_from_the_reader_and_what_it_declines() -> None:
    mem = Memory({0x1000: bytes(range(16))})
    k = known(mem)
    assert k.answer(b"m1004,4") == b"04050607"
    assert k.answer(b"m100c,8") is None  # runs past what the reader gives
    assert k.answer(b"m1000,0") is None and k.answer(b"m1000") is None and k.answer(b"m10g0,4") is None
    assert k.stats.memory == 1 and k.stats.memory_left == 1


def test_memory_only_of_the_program_selected() -> None:
    k = known(Memory({0x1000: b"\x01" * 8}))
    k.sent(b"Hgp4b00.4b00")
    k.selected_ok(b"p4b00.4b00")  # a fork child
    assert k.answer(b"m1000,8") is None
    k2 = known(Memory({0x1000: b"\x01" * 8}))
    k2.memory_pid = None  # not proven local
    assert k2.answer(b"m1000,8") is None


def test_what_keeps_and_what_forgets_the_stop() -> None:
    keeps = [b"m1000,8", b"g", b"p7", b"Z0,1000,1", b"z0,1000,1", b"Tp4a8f.4a8f", b"qXfer:threads:read::0,1000",
             b"qfThreadInfo", b"qsThreadInfo", b"qC"]
    forgets = [b"vCont;c", b"c", b"s", b"M1000,1:00", b"X1000,1:\x00", b"G00", b"P7=00", b"vFile:pwrite:3,0,00",
               b"qRcmd,61", b"D", b"k", b"QTDP:1:1000:E:0:0", b"\x03", b"vRun;", b"qSymbol::"]
    for body in keeps:
        k = known(Memory({0x1000: b"\x01" * 8}))
        k.sent(body)
        assert k.answer(b"p7") == RSP, body
    for body in forgets:
        mem = Memory({0x1000: b"\x01" * 8})
        k = known(mem)
        assert k.answer(b"m1000,8") == b"01" * 8
        k.sent(body)
        assert k.answer(b"p7") is None and k.answer(b"m1000,8") is None, body
        assert mem.closed == 0, body  # the process's memory stays open for the next stop


def test_the_memory_is_opened_once_a_process_and_again_after_an_exec() -> None:
    opened: list[int] = []
    mem = Memory({0x1000: b"\x01" * 8})
    k = StopKnowledge(enabled=True, open_memory=lambda pid: opened.append(pid) or mem)
    k.memory_pid, k.memory_link_pid = 99, 0x4A8F
    for _ in range(3):
        k.stopped(parse_stop_reply(STOP), selects=True)
        assert k.answer(b"m1000,8") == b"01" * 8
        k.sent(b"vCont;c")
    assert opened == [99]
    k.stopped(parse_stop_reply(STOP.replace(b"T05", b"T05exec:2f62696e2f7472756500;", 1)), selects=True)
    assert mem.closed == 1
    assert k.answer(b"m1000,8") == b"01" * 8 and opened == [99, 99]


def test_a_tracepoint_ends_memory_answers_for_the_session() -> None:
    k = known(Memory({0x1000: b"\x01" * 8}))
    k.sent(b"QTDP:1:1000:E:0:0")
    k.stopped(parse_stop_reply(STOP), selects=True)
    assert k.answer(b"p7") == RSP and k.answer(b"m1000,8") is None


def test_exit_and_threadless_stops_know_nothing() -> None:
    k = known()
    k.stopped(parse_stop_reply(b"W00;process:4a8f"), selects=True)
    assert k.answer(b"p7") is None
    k.stopped(parse_stop_reply(b"S05"), selects=True)
    assert k.answer(b"Hg" + THREAD) is None


# -- in the session --------------------------------------------------------------------------

GDBSERVER_FEATURES = b"PacketSize=3fff;QStartNoAckMode+;QStartupWithShell+;multiprocess+;swbreak+"


def session(features: bytes = GDBSERVER_FEATURES) -> Session:
    """A session past the client's qSupported (and no-ack, when the stub offers it)."""
    s = Session(SessionConfig(classify_stub=None))
    for side, body in (("client", b"qSupported:multiprocess+;swbreak+"), ("stub", features), ("stub", b"OK")):
        if body != b"OK" or b"QStartNoAckMode+" in features:
            say(s, side, body)
    return s


def say(s: Session, side: str, body: bytes) -> list[object]:
    """One packet from `side` ("client" or "stub"); what the session sends for it."""
    (s.client_packet if side == "client" else s.stub_packet)(body, frame(body))
    return s.take_actions()


def test_the_session_answers_after_a_reported_stop_and_forgets_at_the_next_resume() -> None:
    s = session()
    assert say(s, "client", b"vCont;s:" + THREAD) == [ToStubRaw(frame(b"vCont;s:" + THREAD))]
    say(s, "stub", STOP)
    assert say(s, "client", b"p7") == [ToStubRaw(frame(b"p7"))]  # does the stub answer `p`? asked once
    assert say(s, "stub", RSP) == [ToClientRaw(frame(RSP))]
    assert say(s, "client", b"p7") == [ToClient(RSP)]
    assert say(s, "client", b"Hg" + THREAD) == [ToClient(b"OK")]
    assert say(s, "client", b"p0") == [ToStubRaw(frame(b"p0"))]
    say(s, "stub", b"00" * 8)
    assert say(s, "client", b"P7=0000000000000000") == [ToStubRaw(frame(b"P7=0000000000000000"))]
    say(s, "stub", b"OK")
    assert say(s, "client", b"p7") == [ToStubRaw(frame(b"p7"))]  # written: the stub is asked


def test_not_for_a_stub_that_is_not_gdbserver() -> None:
    s = session(b"PacketSize=1000;qXfer:features:read+")  # QEMU's gdbstub says no QStartupWithShell
    say(s, "client", b"vCont;s:" + THREAD)
    say(s, "stub", STOP)
    say(s, "client", b"p7")
    say(s, "stub", RSP)
    assert say(s, "client", b"p7") == [ToStubRaw(frame(b"p7"))]


# -- lingering removes (breakpoints.py) -----------------------------------------------------

BP = b"0,7ffff7fcc060,1"


def stopped_with_a_breakpoint() -> Session:
    s = session()
    assert say(s, "client", b"Z" + BP) == [ToStubRaw(frame(b"Z" + BP))]
    say(s, "stub", b"OK")
    say(s, "client", b"vCont;s:" + THREAD)
    say(s, "stub", STOP)
    return s


def test_gdbs_remove_and_insert_around_a_step_stay_in_the_proxy() -> None:
    s = stopped_with_a_breakpoint()
    assert say(s, "client", b"z" + BP) == [ToClient(b"OK")]
    assert list(s.bps.lingering) == [(0, 0x7FFFF7FCC060, 1)] and not s.bps.client
    s.planted = True  # as after the first resume's plant: the keeper's plan is made
    assert s.leave_plan()["z"] == ["z" + BP.decode()]  # still in the stub: in the plan
    assert say(s, "client", b"m7fffffffe7a0,8") == [ToStubRaw(frame(b"m7fffffffe7a0,8"))]  # a read: stays
    say(s, "stub", b"00" * 8)
    assert say(s, "client", b"Z" + BP) == [ToClient(b"OK")]
    assert say(s, "client", b"vCont;s:" + THREAD) == [ToStubRaw(frame(b"vCont;s:" + THREAD))]


def test_a_lingering_breakpoint_leaves_the_stub_before_anything_else() -> None:
    s = stopped_with_a_breakpoint()
    say(s, "client", b"z" + BP)
    assert say(s, "client", b"vCont;c") == [ToStub(b"z" + BP)]  # out first
    assert say(s, "stub", b"OK") == [ToStubRaw(frame(b"vCont;c"))]  # then the resume
    assert s.bps.lingering == {} and s.bps.client == {}


def test_a_lingering_breakpoint_leaves_before_a_selection() -> None:
    s = stopped_with_a_breakpoint()
    say(s, "client", b"z" + BP)
    assert say(s, "client", b"Hg" + THREAD) == [ToClient(b"OK")]  # the selected thread again: stays
    assert s.bps.lingering
    assert say(s, "client", b"Hgp4b00.4b00") == [ToStub(b"z" + BP)]  # in the process it is in
    assert say(s, "stub", b"OK") == [ToStubRaw(frame(b"Hgp4b00.4b00"))]


def test_a_lingering_breakpoint_leaves_before_the_proxys_own_traffic_and_a_hang_up() -> None:
    s = stopped_with_a_breakpoint()
    say(s, "client", b"z" + BP)
    s.client_closed(keep_stub=True)
    assert s.take_actions() == [ToStub(b"z" + BP)]
    s.stub_packet(b"OK", frame(b"OK"))
    assert any(type(a).__name__ == "Close" for a in s.take_actions())


def test_a_remove_lingers_only_at_a_stop_of_gdbserver_in_all_stop() -> None:
    s = session(b"PacketSize=1000;qXfer:features:read+")  # not gdbserver
    say(s, "client", b"Z" + BP)
    say(s, "stub", b"OK")
    say(s, "client", b"vCont;s:" + THREAD)
    say(s, "stub", STOP)
    assert say(s, "client", b"z" + BP) == [ToStubRaw(frame(b"z" + BP))]
    s2 = session()
    say(s2, "client", b"Z" + BP)
    say(s2, "stub", b"OK")  # no stop seen yet
    assert say(s2, "client", b"z" + BP) == [ToStubRaw(frame(b"z" + BP))]


def test_another_packet_at_a_lingering_address_takes_it_out_first() -> None:
    for other in (b"z" + BP, b"Z1,7ffff7fcc060,1", b"Z0,7ffff7fcc060,2"):
        s = stopped_with_a_breakpoint()
        say(s, "client", b"z" + BP)
        assert say(s, "client", other) == [ToStub(b"z" + BP)], other
        # then as straight: a second remove of it too goes to the stub, as gdbserver would get it
        assert say(s, "stub", b"OK") == [ToStubRaw(frame(other))]
