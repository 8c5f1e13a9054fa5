"""Stubs as they are: one packet in flight to a stub that acknowledges
(proxy/session/pacing.py), reads no larger than the stub takes (reads.py).

QEMU 7.2's user-mode gdbstub offers no QStartNoAckMode and, after each reply,
reads one byte and resends the reply unless it is ``+``: a packet sent behind
another before its reply came loses its first byte. The session plays a
QEMU-like stub here (its qSupported reply is the one qemu-x86_64 7.2 sends);
integration/test_qemu_corpus.py runs the real one.
"""

from __future__ import annotations

from proxy.session.actions import Notice, SetNoAck, ToClientRaw, ToStub, ToStubRaw, UnkeptToStub
from proxy.session.pacing import KICK, QUIET_KICK, Pacer
from rsp.framing import frame
from proxy.session.reads import ReadLimit, read_memory
from tests.proxy.session.test_capture_hooks import SITE, Recorder, client, session, stub
from tests.proxy.session.test_core import PROBE, Driver, bodies, stop_at

QEMU_QSUPPORTED = b"PacketSize=1000;qXfer:features:read+;qXfer:auxv:read+;multiprocess+"


def _connected(stub_reply: bytes, probes: list[int]) -> Driver:
    d = Driver(probes=probes)
    d.client(b"qSupported:multiprocess+;swbreak+;xmlRegisters=i386")
    acts = d.stub(stub_reply)
    if b"QStartNoAckMode" in stub_reply:
        acts = d.stub(b"OK")
        assert SetNoAck("stub") in acts
    return d


def _answer(packet: bytes) -> bytes:
    """What a stub answers to each of the proxy's own packets here."""
    if packet.startswith(b"qXfer:"):
        return b"l"
    if packet[:1] == b"m":
        return b"00" * int(packet.split(b",")[1], 16)
    if packet == b"g":
        return b"00" * 560
    return b"OK"


def _play(d: Driver, acts: list[object], until: bytes) -> list[list[bytes]]:
    """Answer every packet the session sends until it sends one starting with ``until``
    (framed or not); the packets of each step, in order."""
    sent: list[list[bytes]] = []
    for _ in range(50):
        out = bodies(acts, ToStub) + [r[1:].split(b"#")[0] if r[:1] == b"$" else r
                                       for r in bodies(acts, ToStubRaw)]
        assert out, sent
        sent.append(out)
        if out[-1].startswith(until):
            return sent
        acts = d.stub(_answer(out[-1]))
    raise AssertionError(sent)


def test_a_stub_without_no_ack_gets_one_packet_at_a_time() -> None:
    probes = [PROBE, PROBE + 0x40, PROBE + 0x80]
    d = _connected(QEMU_QSUPPORTED, probes)
    sent = _play(d, d.client(b"vCont;c:p1.-1"), b"vCont")
    assert all(len(s) == 1 for s in sent), sent
    assert sum(s[0].startswith(b"Z0") for s in sent) == 3, sent
    assert d.s.pacer.held_total >= 2  # the Z0s were planned as one burst


def test_a_hidden_stop_waits_for_each_reply() -> None:
    d = _connected(QEMU_QSUPPORTED, [PROBE])
    _play(d, d.client(b"vCont;c:p1.-1"), b"vCont")
    # The hidden stop: z0, a step, Z0 again and the client's continue, one at a time.
    acts = d.stub(stop_at(PROBE, thread=b"p1.1"))
    sent = _play(d, acts, b"vCont;s")
    sent += _play(d, d.stub(stop_at(PROBE + 2, thread=b"p1.1")), b"vCont;c")
    assert all(len(s) == 1 for s in sent), sent
    assert [s[0][:2] for s in sent][-3:] == [b"vC", b"Z0", b"vC"], sent


def test_a_stub_that_agrees_to_no_ack_gets_bursts() -> None:
    d = _connected(b"PacketSize=3fff;QStartNoAckMode+;multiprocess+", [PROBE, PROBE + 0x40])
    acts = d.client(b"vCont;c:p1.-1")
    assert len(bodies(acts, ToStub)) == 2  # both Z0s at once


def test_the_interrupt_byte_is_never_held() -> None:
    p = Pacer()
    p.stub_acks(True)
    assert p.offer(ToStub(b"m1000,8")) == [ToStub(b"m1000,8")]
    assert p.offer(ToStub(b"m2000,8")) == []
    assert p.offer(ToStubRaw(b"\x03")) == [ToStubRaw(b"\x03")]
    assert p.answered() == [ToStub(b"m2000,8")]


def test_packets_without_a_reply_do_not_hold_the_next() -> None:
    p = Pacer()
    p.stub_acks(True)
    assert p.offer(ToStub(b"R00")) == [ToStub(b"R00")]
    assert p.offer(ToStub(b"qC")) == [ToStub(b"qC")]  # R gets no reply: nothing to wait for
    assert p.offer(ToStub(b"g")) == []
    assert p.stub_acks(False) == [ToStub(b"g")]  # no-ack after all: everything goes


def _parked_and_running() -> Driver:
    """QEMU 7.2 user mode: a second thread's T05 comes while the first one's hidden stop is
    handled (seen: right behind the `g` reply); the proxy answers the first and resumes."""
    d = _connected(QEMU_QSUPPORTED, [PROBE])
    _play(d, d.client(b"vCont;c:p1.-1"), b"vCont")
    acts = d.stub(stop_at(PROBE, thread=b"p1.1"))
    first = (bodies(acts, ToStub) + [b""])[0]
    acts = d.stub(stop_at(PROBE, thread=b"p1.2"))  # the other thread, where a reply was due
    assert bodies(acts, ToStub) == [] and d.s.pacer.strays == 1
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == []  # the hidden stop is being handled: no kick yet
    _play(d, d.stub(_answer(first)), b"vCont;s")
    _play(d, d.stub(stop_at(PROBE + 2, thread=b"p1.1")), b"vCont;c")
    return d


def test_a_thread_parked_in_the_stubs_loop_is_released_by_a_continue() -> None:
    """The parked thread waits for a packet that resumes (QEMU's gdb_handlesig loop: a `+`
    is garbage to it once it has set running_state back to 0, pacing.py): `$c#63`, sent on
    its own, never more than one at a time, and again only once the stub's ack showed that
    a parked thread took it."""
    d = _parked_and_running()
    d.s.kick_parked(acked=False)
    assert d.s.take_actions() == []  # the resume's ack has not come: it may still be read
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == [UnkeptToStub(KICK)] and KICK == frame(b"c")
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == []  # not taken yet: its bytes wait in the socket
    d.s.stub_ack()  # a parked thread's loop took it (its `+`, for nothing of ours)
    assert d.s.pacer.released == 1
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == [UnkeptToStub(KICK)]  # another may be parked
    for _ in range(3):  # none was: nothing more, or the kicks' bytes would pile up
        d.s.kick_parked(acked=True)
        assert d.s.take_actions() == []
    assert d.s.pacer.kicks == 2


def test_a_report_sent_again_for_a_kicks_bytes_is_one_stop() -> None:
    """No thread was parked: the next thread that traps reads the kick's five bytes as the
    ack of its report and sends it again for each. The client gets one stop; the copies
    are neither strays nor unsolicited packets for the client."""
    d = _parked_and_running()
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == [UnkeptToStub(KICK)]
    stop = b"T05thread:p1.2;"
    assert bodies(d.stub(stop), ToStub) == [b"g"]  # no registers in QEMU's reports: pc from `g`
    for _ in KICK:
        assert d.stub(stop) == []
    d.s.stub_stale(stop)  # one more, where the link had a packet out: no stray
    assert d.s.pacer.copies == len(KICK) + 1 and d.s.pacer.strays == 1
    assert d.stub(_answer(b"g")) == [ToClientRaw(frame(stop))]  # one stop for the client
    assert d.client(b"?") == [ToStubRaw(frame(b"?"))]
    assert d.stub(stop) == [ToClientRaw(frame(stop))]  # the same stop as `?`'s answer: a reply
    # after a resume the thread may report the same stop again, as a new one; no kick: the
    # reporting thread read all of it, none was parked
    _play(d, d.client(b"vCont;c:p1.-1"), b"vCont")
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == []
    assert bodies(d.stub(stop), ToStub) == [b"g"]


def test_a_strays_report_sent_again_is_no_stop_and_its_thread_is_released() -> None:
    """Seen (1 run in 40): a thread's report came stale, before the ack of the proxy's resume,
    then again as a packet, and five times more for the kick's bytes; the proxy acked each and
    the thread went to its loop (running_state 0). Its report is still a stray's (no stop for
    the client), and another kick goes: the first was eaten, not taken."""
    d = _parked_and_running()
    stray = b"T05thread:p1.3;"
    d.s.stub_stale(stray)  # before the resume's ack
    assert d.s.pacer.strays == 2
    assert d.stub(stray) == []  # again, where the proxy waits for a stop: not the stop
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == [UnkeptToStub(KICK)]
    for _ in KICK:  # its wait for an ack read the kick: no stop, no stray more
        assert d.stub(stray) == []
    assert d.s.pacer.strays == 2
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == [UnkeptToStub(KICK)]  # now in its loop: this one it takes
    d.s.stub_ack()
    assert bodies(d.stub(stray), ToStub) == [b"g"]  # released, it trapped again: the stop


def test_a_kick_split_between_two_threads_is_sent_again() -> None:
    """A thread that traps while a kick waits in the socket reads part of it as its ack, a
    parked thread the rest (garbage to it): fewer copies than the kick's bytes. The parked
    one still waits: after the next resume, another kick."""
    d = _parked_and_running()
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == [UnkeptToStub(KICK)]
    stop = b"T05thread:p1.2;"
    assert bodies(d.stub(stop), ToStub) == [b"g"]
    assert d.stub(stop) == []  # one copy only
    assert d.stub(_answer(b"g")) == [ToClientRaw(frame(stop))]
    _play(d, d.client(b"vCont;c:p1.-1"), b"vCont")
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == [UnkeptToStub(KICK)]


def test_another_threads_report_while_the_client_is_stopped_is_a_stray() -> None:
    """QEMU's user mode stops only the thread that trapped: another one may report while the
    client looks at the stop, nothing asked. It is no packet for the client."""
    d = _parked_and_running()
    assert bodies(d.stub(b"T05thread:p1.2;"), ToStub) == [b"g"]
    assert d.stub(_answer(b"g")) == [ToClientRaw(frame(b"T05thread:p1.2;"))]
    assert d.stub(b"T05thread:p1.3;") == []
    assert d.s.pacer.strays == 2


def test_a_reply_sent_again_while_the_program_runs_is_no_stop() -> None:
    """A thread whose reply's ack another thread read sends it again for the bytes of the
    next resume (seen: `$OK` right before a hidden step's T05, taken for the step's reply):
    no resume is answered `OK`; dropped, and the real stop still ends the wait."""
    d = _parked_and_running()
    assert d.stub(b"OK") == []
    assert d.stub(b"00" * 8) == []
    assert bodies(d.stub(b"T05thread:p1.1;"), ToStub) == [b"g"]  # the stop, read on
    assert d.stub(_answer(b"g")) == [ToClientRaw(frame(b"T05thread:p1.1;"))]
    assert d.s.pacer.copies == 2


# -- reads cut to what the stub takes (proxy/session/reads.py)

def _run(limit: ReadLimit, ranges: list[tuple[int, int]], stub_max: int,
         unmapped: range = range(0)) -> tuple[list[bytes | None], list[bytes]]:
    """Run read_memory against a stub that refuses reads over ``stub_max`` bytes (E22, as
    QEMU 7.2 does over 2,048) and reads in ``unmapped`` (E14); memory byte = address & 0xff."""
    gen = read_memory(limit, ranges)
    asked: list[bytes] = []
    try:
        ex = next(gen)
        while True:
            replies = []
            for body in ex.bodies:
                asked.append(body)
                addr, size = (int(x, 16) for x in body[1:].split(b","))
                if size > stub_max:
                    replies.append(b"E22")
                elif addr in unmapped or addr + size - 1 in unmapped:
                    replies.append(b"E14")
                else:
                    replies.append(bytes((a & 0xff) for a in range(addr, addr + size)).hex().encode())
            ex = gen.send(replies)
    except StopIteration as done:
        return done.value, asked


def test_reads_are_cut_from_packet_size() -> None:
    limit = ReadLimit(0x1000)  # QEMU's PacketSize: (4096 - 4) / 2 -> 1024-byte pieces
    assert limit.size == 1024
    got, asked = _run(limit, [(0x10000, 4096)], stub_max=2048)
    assert len(asked) == 4 and got[0] == bytes(a & 0xff for a in range(0x10000, 0x11000))
    assert ReadLimit(0x3FFF).size == 4096 and ReadLimit(None).size == 4096


def test_a_refused_big_read_is_halved_and_the_limit_kept() -> None:
    limit = ReadLimit(0x4000)  # claims 4096-byte reads; takes 2048 (QEMU's real limit)
    got, asked = _run(limit, [(0x20000, 4096), (0x30008, 8)], stub_max=2048)
    assert got[0] == bytes(a & 0xff for a in range(0x20000, 0x21000))
    assert got[1] == bytes(range(8, 16))
    assert limit.size == 2048 and limit.learned and "4096-byte" in limit.learned
    _, asked = _run(limit, [(0x40000, 4096)], stub_max=2048)
    assert asked == [b"m40000,800", b"m40800,800"]  # no refused read any more


def test_unreadable_memory_is_not_taken_for_a_limit() -> None:
    limit = ReadLimit(0x1000)
    got, _ = _run(limit, [(0x50000, 1024)], stub_max=2048)  # proves 1024-byte reads
    got, asked = _run(limit, [(0x60000, 1024), (0x70000, 2048)], stub_max=2048,
                      unmapped=range(0x60000, 0x61000))
    assert got[0] is None and got[1] is not None and len(got[1]) == 2048
    assert limit.size == 1024 and limit.learned is None
    assert asked == [b"m60000,400", b"m70000,400", b"m70400,400"]  # no halving of the unmapped one


# -- a trap at a hidden breakpoint reported after the breakpoint was taken out

def _g_at(pc: int) -> bytes:
    """QEMU's `g` for x86-64 with rip (register 16) at ``pc``, the rest zero."""
    return b"00" * 128 + pc.to_bytes(8, "little").hex().encode() + b"00" * (560 - 136)


def _to_stub(acts: list[object]) -> list[bytes]:
    return bodies(acts, ToStub) + [r[1:].split(b"#")[0] for r in bodies(acts, ToStubRaw)]


def test_a_trap_reported_after_its_hidden_breakpoint_went_is_hidden() -> None:
    """QEMU 7.2 user mode: a thread that trapped at a hidden breakpoint may report after the
    proxy took that breakpoint out (seen: 1 run in about 100 of the corpus' tokio_app mt
    when the capture went off at the second thread's report; gdb was shown a SIGTRAP at the
    probe). Here the capture is switched off while the client looks at a stop, and a thread
    reports its trap there after the client's resume. QEMU's pc is the breakpoint's address
    itself (no int3 executed): the trap is the proxy's, resumed as the client asked, hidden.
    A trap elsewhere is the client's; so is one there once the client saw a stop."""
    rec = Recorder(probes=(SITE,))
    s = session(rec)
    client(s, b"qSupported:multiprocess+;swbreak+;xmlRegisters=i386")
    acts = stub(s, QEMU_QSUPPORTED)
    acts = client(s, b"vCont;c:p1.-1")
    for _ in range(10):  # the auxv read, the Z0, the capture's install, one at a time
        (sent,) = _to_stub(acts)
        if sent.startswith(b"vCont"):
            break
        acts = stub(s, b"OK")
    assert s.bps.proxy_owns(SITE)
    assert _to_stub(stub(s, b"T05thread:p1.1;")) == [b"g"]  # QEMU's reports carry no registers
    assert bodies(stub(s, _g_at(SITE + 0x10)), ToClientRaw) == [frame(b"T05thread:p1.1;")]
    s.start_proc(s.lifecycle.proc_switch(None, "off"))  # as `monitor async mode off` does
    assert _to_stub(s.take_actions()) == [b"rec-uninstall"]
    assert _to_stub(stub(s, b"OK")) == [b"z0,%x,1" % SITE]
    stub(s, b"OK")
    assert not s.probes and not s.bps.proxy_owns(SITE)
    assert _to_stub(client(s, b"vCont;c:p1.-1")) == [b"vCont;c:p1.-1"]
    # the late one: its pc read, at the address where the proxy's breakpoint was
    assert _to_stub(stub(s, b"T05thread:p1.3;")) == [b"g"]
    acts = stub(s, _g_at(SITE))
    assert _to_stub(acts) == [b"vCont;c:p1.-1"] and not bodies(acts, ToClientRaw)
    assert s.stats.late_traps == 1 and any(isinstance(a, Notice) and f"{SITE:#x}" in a.text for a in acts)
    # a SIGTRAP elsewhere is the client's to see
    assert _to_stub(stub(s, b"T05thread:p1.3;")) == [b"g"]
    assert bodies(stub(s, _g_at(SITE + 0x10)), ToClientRaw) == [frame(b"T05thread:p1.3;")]
    # once the client saw a stop, a trap there is no late one of the proxy's any more
    assert _to_stub(client(s, b"vCont;c:p1.-1")) == [b"vCont;c:p1.-1"]
    assert not s.bps.gone
    assert stub(s, b"T05thread:p1.4;") == [ToClientRaw(frame(b"T05thread:p1.4;"))]
    assert s.stats.late_traps == 1


def test_registers_read_while_another_thread_reported_are_read_again() -> None:
    """QEMU 7.2 user mode makes a thread that reports its selected one and builds every reply
    in one buffer: the `g` asked for the stopped thread came as ``T05thread:`` of the other
    one followed by the rest of the block (seen). The thread is selected and its registers
    read again; its trap at the probe is hidden as any other."""
    d = _connected(QEMU_QSUPPORTED, [PROBE])
    _play(d, d.client(b"vCont;c:p1.-1"), b"vCont")
    assert bodies(d.stub(b"T05thread:p1.1;"), ToStub) == [b"g"]
    assert d.stub(b"T05thread:p1.2;") == [] and d.s.pacer.strays == 1
    mixed = b"T05thread:p1.2;" + _g_at(PROBE)[len(b"T05thread:p1.2;"):]
    assert bodies(d.stub(mixed), ToStub) == [b"Hgp1.1"]
    assert bodies(d.stub(b"OK"), ToStub) == [b"g"]
    acts = d.stub(_g_at(PROBE))
    assert bodies(acts, ToStub) == [f"z0,{PROBE:x},1".encode()] and not bodies(acts, ToClientRaw)
    assert d.s.stats.hidden_stops == 1


def test_a_report_garbled_by_another_threads_reply_gets_a_release() -> None:
    """QEMU 7.2 builds every thread's packets in one buffer: a reply written over another
    thread's report left ``$OK#9aread:p01.7ff2;#da`` (seen), bytes outside any packet and no
    report. That thread waits for its ack and the program hung; the bytes (the link's
    watch: stub_garbled) count as a parked thread: the kick goes, the thread reads it as no
    ack and sends its report again, which is the stop."""
    d = _connected(QEMU_QSUPPORTED, [PROBE])
    _play(d, d.client(b"vCont;c:p1.-1"), b"vCont")
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == []  # nothing known to be parked
    d.s.stub_garbled()
    d.s.kick_parked(acked=True)
    assert d.s.take_actions() == [UnkeptToStub(KICK)] and d.s.pacer.garbles == 1
    report = b"T05thread:p1.7ff2;"
    assert bodies(d.stub(report), ToStub) == [b"g"]
    for _ in KICK[1:]:
        assert d.stub(report) == []  # one copy for each byte of the kick
    assert d.s.pacer.copies == len(KICK) - 1


def test_a_stub_quiet_while_the_program_runs_gets_one_kick() -> None:
    """A mix of two threads' packets may leave nothing to see (a reply sent twice in one,
    then a step no thread reported: seen, the program hung): after QUIET_KICK of the stub's
    silence one kick goes, and no other until one is seen taken or eaten."""
    d = _connected(QEMU_QSUPPORTED, [PROBE])
    _play(d, d.client(b"vCont;c:p1.-1"), b"vCont")
    d.s.kick_parked(acked=True, quiet=QUIET_KICK / 2)
    assert d.s.take_actions() == []
    d.s.kick_parked(acked=True, quiet=QUIET_KICK)
    assert d.s.take_actions() == [UnkeptToStub(KICK)]
    d.s.kick_parked(acked=True, quiet=10 * QUIET_KICK)
    assert d.s.take_actions() == []  # its bytes wait in the socket: no more
    report = b"T05thread:p1.2;"  # the next thread that traps reads them as its ack
    assert bodies(d.stub(report), ToStub) == [b"g"]
    for _ in KICK[1:]:
        assert d.stub(report) == []
    assert d.stub(_answer(b"g")) == [ToClientRaw(frame(report))]
