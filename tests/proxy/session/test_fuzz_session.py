"""The session core under a hostile client and a broken stub (hypothesis,
stateful): random and mutated packets from both sides, garbage bodies,
acks-free no-ack switches, interrupts at any moment, replies of the wrong
kind (out of order: a stop reply to an `m`, OK to a `g`), a stub that
answers E01 to everything, console output before stops, hang-ups of either
side at every point: during the plant, a hidden stop at a probe, a drain
the capture asked for (its own interrupt), a monitor command's reads, a
leave.

The core must never raise, every call must return in bounded time, and once
it closes nothing more is fed (the shell stops). A drain-asking capture
(written here: it pins the hooks' side, the real backends run in
integration/) and a probe make hidden stops and drains happen.

Cases: 300 machines x up to 60 steps (about 15,000 steps) per suite run,
the same ones every run (derandomized: tests/conftest.py);
ASYNCRSP_FUZZ_SESSION_EXAMPLES raises it and ASYNCRSP_HYPOTHESIS=random draws
new ones (a longer run's figures: docs/safety.md).
"""

from __future__ import annotations

import os
import time

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from proxy.capture.base import CaptureBase
from proxy.capture.target import Target
from proxy.session.actions import Close, ToClient, ToClientRaw, ToStub, ToStubRaw
from proxy.session.core import Session, SessionConfig
from proxy.procedure import Exchange, Procedure
from proxy.probes import Probe
from rsp.framing import frame

from .test_core import stop_at

PROBE = 0x555555555169
OTHER = 0x555555556000
THREAD = b"p3a4d.3a4d"
STEP_BUDGET = 2.0  # seconds: far above what any call takes; a loop would exceed it

CLIENT_PACKETS = [
    b"qSupported:multiprocess+;swbreak+;hwbreak+;fork-events+;vContSupported+;xmlRegisters=i386",
    b"?", b"g", b"G" + b"00" * 8, b"p10", b"P10=0000000000000000", b"m555555555169,8", b"M555555555169,1:90",
    b"X555555555169,1:\x90", b"Z0,555555555169,1", b"z0,555555555169,1", b"Z0,555555556000,1", b"z0,555555556000,1",
    b"Z1,555555556000,1", b"Z2,7fffffffe000,8", b"Hgp3a4d.3a4d", b"Hg0", b"Hc-1", b"Tp3a4d.3a4d", b"qC",
    b"qfThreadInfo", b"qsThreadInfo", b"qAttached:3a4d", b"qXfer:features:read:target.xml:0,fff",
    b"qXfer:auxv:read::0,1000", b"qXfer:exec-file:read:3a4d:0,fff", b"qXfer:asyncrsp.graph:read::0,fff",
    b"qXfer:osdata:read::0,fff", b"qRcmd," + b"async stats".hex().encode(), b"qRcmd," + b"async tasks".hex().encode(),
    b"qRcmd," + b"async mode off".hex().encode(), b"qRcmd," + b"async mode full".hex().encode(),
    b"qRcmd," + b"help".hex().encode(), b"vCont;c", b"vCont;c:p3a4d.-1", b"vCont;s:p3a4d.3a4d", b"c", b"s",
    b"C02", b"vCont;t", b"vCont;r555555555169,55555555516a:p3a4d.3a4d", b"QStartNoAckMode", b"QNonStop:1",
    b"QNonStop:0", b"vStopped", b"vCtrlC", b"QTinit", b"qTStatus", b"QTStart", b"QTStop", b"D", b"D;3a4d",
    b"D;99", b"k", b"vKill;3a4d", b"vRun;", b"R00", b"!", b"vAttach;3a4d", b"qTBuffer:0,10", b"qSymbol::",
    b"vMustReplyEmpty", b"nosuchpacket", b"",
]


class DrainingCapture(CaptureBase):
    """Asks for a drain (a hidden interrupt) whenever `want` is set; its install,
    sync and uninstall each exchange a packet with the stub."""

    name = "drainer"

    def __init__(self) -> None:
        super().__init__()
        self.want = False
        self.filters_replies = True

    def plan(self, target: Target) -> list[Probe]:
        self.target = target
        return [Probe("site", OTHER, kind="entry", site=OTHER)]

    def install(self) -> Procedure:
        yield Exchange((b"QTinit",))

    def uninstall(self) -> Procedure:
        yield Exchange((b"QTStop",))

    def sync(self) -> Procedure:
        (rep,) = yield Exchange((b"qTBuffer:0,10",))
        if rep[:1] == b"E":
            return

    def wants_interrupt(self, now: float) -> bool:
        return self.want

    def client_reply(self, request: bytes, reply: bytes) -> bytes:
        return reply


def _monitor(text: str, session: object, read) -> str:  # type: ignore[no-untyped-def]
    data = read(PROBE, 16)
    return f"{text}: {'unread' if data is None else data.hex()}\n"


def _stub_reply(request: bytes, mode: str, draw) -> bytes:  # type: ignore[no-untyped-def]
    """What the stub says to `request` in `mode` (good, error, garbage, wrong kind)."""
    if mode == "error":
        return b"E01"
    if mode == "garbage":
        return draw(st.binary(max_size=40))
    if mode == "wrong":
        return draw(st.sampled_from([b"OK", stop_at(PROBE), b"", b"W00", b"l", b"00" * 8, b"E.text", b"O6869"]))
    head = request[:1]
    if request.startswith(b"qSupported"):
        return b"PacketSize=47ff;QStartNoAckMode+;swbreak+;qXfer:auxv:read+;qXfer:exec-file:read+;multiprocess+;" \
               b"QStartupWithShell+;fork-events+;QNonStop+"
    if request.startswith(b"qXfer:auxv"):
        return b"l" + bytes.fromhex("0900000000000000" + "6011555555550000" + "00" * 16).replace(b"}", b"}]")
    if request.startswith(b"qXfer:exec-file"):
        return b"l/bin/true"
    if head == b"m":
        return b"cc" * 8
    if head == b"g":
        return b"00" * 16 * 16 + PROBE.to_bytes(8, "little").hex().encode()
    if request.startswith((b"vCont", b"c", b"s", b"C", b"S")) and not request.startswith(b"vCont?"):
        return draw(st.sampled_from([stop_at(PROBE), stop_at(PROBE), stop_at(OTHER), stop_at(PROBE, sig=b"02",
                                                                                          reason=b""),
                                     b"W00", b"X09", b"T05fork:p3a4e.3a4e;thread:p3a4d.3a4d;",
                                     b"T05exec:2f62696e2f74727565;thread:p3a4d.3a4d;", b"S05"]))
    if head == b"?":
        return stop_at(0x7FFFF7FE3290, reason=b"")
    return draw(st.sampled_from([b"OK", b"", b"E01"]))


class SessionUnderFire(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.capture = DrainingCapture()
        self.s = Session(SessionConfig(
            resolve_probes=lambda path, entry: [Probe("probed", PROBE)],
            elf_path="/bin/true",
            monitor=_monitor,
            make_capture=lambda name, mode, target: self.capture if mode != "off" else None,
            capture_name="drainer",
            open_target=lambda path, entry, pid, feats: Target(path, pid, False, feats),
        ))
        self.pending: list[bytes] = []  # requests the stub has not answered, oldest first
        self.closed = False
        self.now = 0.0
        self.steps = 0

    def _call(self, fn, *args) -> None:  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        fn(*args)
        acts = self.s.take_actions()
        assert time.perf_counter() - t0 < STEP_BUDGET, f"{fn.__name__} took too long"
        for a in acts:
            if isinstance(a, ToStub):
                self.pending.append(a.body)
            elif isinstance(a, ToStubRaw):
                if a.raw != b"\x03":
                    self.pending.append(a.raw[1:-3])
            elif isinstance(a, Close):
                self.closed = True
            elif isinstance(a, (ToClient, ToClientRaw)):
                pass
        self.steps += 1

    # ------------------------------------------------------------- the client
    @precondition(lambda self: not self.closed)
    @rule(body=st.sampled_from(CLIENT_PACKETS))
    def client_sends(self, body: bytes) -> None:
        self._call(self.s.client_packet, body, frame(body) if b"*" not in body and b"#" not in body else None)

    @precondition(lambda self: not self.closed)
    @rule(body=st.sampled_from(CLIENT_PACKETS), data=st.data())
    def client_sends_a_mutant(self, body: bytes, data) -> None:  # type: ignore[no-untyped-def]
        b = bytearray(body)
        for _ in range(data.draw(st.integers(1, 3))):
            i = data.draw(st.integers(0, len(b)))
            op = data.draw(st.integers(0, 3))
            if op == 0 and b:
                b[min(i, len(b) - 1)] = data.draw(st.integers(0, 255))
            elif op == 1:
                b[i:i] = data.draw(st.binary(min_size=1, max_size=4))
            elif op == 2:
                del b[i:]
            else:
                b += data.draw(st.binary(max_size=8))
        raw = b"$" + bytes(b) + b"#" + data.draw(st.sampled_from([b"00", b"zz", b"%02x" % (sum(b) & 0xFF)]))
        self._call(self.s.client_packet, bytes(b), raw)

    @precondition(lambda self: not self.closed)
    @rule(body=st.binary(max_size=64))
    def client_sends_garbage(self, body: bytes) -> None:
        self._call(self.s.client_packet, body, b"$" + body + b"#00")

    @precondition(lambda self: not self.closed)
    @rule()
    def client_interrupts(self) -> None:
        self._call(self.s.client_interrupt)

    @precondition(lambda self: not self.closed)
    @rule()
    def client_hangs_up(self) -> None:
        self._call(self.s.client_closed)

    # ------------------------------------------------------------- the stub
    @precondition(lambda self: not self.closed and bool(self.pending))
    @rule(mode=st.sampled_from(["good", "good", "good", "error", "garbage", "wrong"]), data=st.data())
    def stub_answers(self, mode: str, data) -> None:  # type: ignore[no-untyped-def]
        req = self.pending.pop(0)
        reply = _stub_reply(req, mode, data.draw)
        if data.draw(st.booleans()) and req.startswith((b"vCont;c", b"c")):
            self._call(self.s.stub_packet, b"O6869", frame(b"O6869"))  # console output first
        raw = frame(reply) if b"#" not in reply and b"$" not in reply and b"*" not in reply else b"$" + reply + b"#00"
        self._call(self.s.stub_packet, reply, raw)

    @precondition(lambda self: not self.closed)
    @rule(body=st.binary(max_size=40))
    def stub_says_something_unasked(self, body: bytes) -> None:
        self._call(self.s.stub_packet, body, b"$" + body + b"#00")

    @precondition(lambda self: not self.closed)
    @rule()
    def stub_hangs_up(self) -> None:
        self._call(self.s.stub_closed)

    # ------------------------------------------------------------- the capture and the clock
    @precondition(lambda self: not self.closed)
    @rule(want=st.booleans())
    def time_passes(self, want: bool) -> None:
        self.capture.want = want
        self.now += 0.05
        self._call(self.s.tick, self.now)

    @precondition(lambda self: self.closed)
    @rule()
    def closed_sessions_get_nothing_more(self) -> None:
        """The shell stops feeding a closed session; its stats still answer."""
        assert self.s.queries.stats_lines()

    @invariant()
    def stats_always_answer(self) -> None:
        lines = self.s.queries.stats_lines()
        assert all(isinstance(line, str) for line in lines)


EXAMPLES = int(os.environ.get("ASYNCRSP_FUZZ_SESSION_EXAMPLES", "300"))
SessionUnderFire.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=60, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestSessionUnderFire = SessionUnderFire.TestCase
