"""The capture hooks of the session core, driven packet by packet.

A recording backend (a `CaptureBase` subclass written here, since this pins
the session core's side of the interface; the real backends run against
real stubs in integration/) checks that every hook is called at its point
of the session's life and that what it returns is obeyed.
"""

from __future__ import annotations

from proxy.capture.base import CaptureBase, Forward, Handover, Reply
from proxy.capture.target import Target
from proxy.host.identity import Identity
from proxy.session.actions import Close, SignalProgram, ToClient, ToClientRaw, ToStub, ToStubRaw
from proxy.session.core import Session, SessionConfig
from proxy.procedure import Exchange, Procedure
from proxy.probes import Probe
from rsp.framing import frame

from rsp.threads import ThreadId

from .test_core import THREAD, bodies, stop_at

SITE = 0x401000


class Recorder(CaptureBase):
    name = "recorder"

    def __init__(self, label: str = "rec", probes: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.label = label
        self.calls: list[str] = []
        self._probes = probes
        self.want_interrupt = False
        self.own_stop_pc: int | None = None
        self.filters_replies = True

    def plan(self, target: Target) -> list[Probe]:
        self.target = target
        self.calls.append("plan")
        return [Probe(f"p{a:x}", a, kind="entry", site=a) for a in self._probes]

    def install(self) -> Procedure:
        self.calls.append("install")
        (ok,) = yield Exchange((self.label.encode() + b"-install",))
        self.calls.append(f"installed:{ok.decode()}")

    def uninstall(self) -> Procedure:
        self.calls.append("uninstall")
        yield Exchange((self.label.encode() + b"-uninstall",))

    def sync(self) -> Procedure:
        self.calls.append("sync")
        yield Exchange((b"qTBuffer:0,10",))

    def stop(self, sr):  # type: ignore[no-untyped-def]
        if self.own_stop_pc is None or sr.pc(16) != self.own_stop_pc:
            return None
        return self._record()

    def _record(self) -> Procedure:
        self.calls.append("own-stop")
        yield Exchange((b"g",))

    def wants_interrupt(self, now: float) -> bool:
        return self.want_interrupt

    def client_request(self, body: bytes):  # type: ignore[no-untyped-def]
        if body == b"qTStatus":
            return Reply(b"T0;tnotrun:0")
        if body == b"Z0,1234,1":
            return Forward(b"Z1,1234,1")
        if body == b"QTinit":
            return Handover("the client starts its own trace experiment")
        return None

    def client_reply(self, request: bytes, reply: bytes) -> bytes:
        if request.startswith(b"m") and reply == b"cc":
            return b"55"
        return reply


def session(rec: Recorder) -> Session:
    made: list[str] = []

    def make(name: str, mode: str, target: object) -> CaptureBase | None:
        made.append(name)
        if mode == "off":
            return None
        return rec if name == "recorder" else Recorder(name)

    cfg = SessionConfig(
        elf_path="/bin/true",
        make_capture=make,
        capture_name="recorder",
        open_target=lambda path, entry, pid, feats: Target(path, pid, True, feats),
    )
    s = Session(cfg)
    s.made = made  # type: ignore[attr-defined]
    return s


def client(s: Session, body: bytes) -> list[object]:
    s.client_packet(body, frame(body))
    return s.take_actions()


def stub(s: Session, body: bytes) -> list[object]:
    s.stub_packet(body, frame(body))
    return s.take_actions()


def running(rec: Recorder) -> Session:
    s = session(rec)
    assert bodies(client(s, b"vCont;c"), ToStub) == [b"rec-install"]
    assert bodies(stub(s, b"OK"), ToStubRaw) == [frame(b"vCont;c")]
    assert rec.calls == ["plan", "install", "installed:OK"]
    return s


def test_install_before_first_resume_uninstall_before_detach() -> None:
    rec = Recorder()
    s = running(rec)
    stub(s, stop_at(0x1000, reason=b""))
    assert bodies(client(s, b"D"), ToStub) == [b"rec-uninstall"]
    assert bodies(stub(s, b"OK"), ToStubRaw) == [frame(b"D")]
    assert rec.calls[-1] == "uninstall"


def test_client_hang_up_uninstalls_even_without_breakpoints() -> None:
    rec = Recorder()
    s = running(rec)
    stub(s, stop_at(0x1000, reason=b""))
    s.client_closed()
    assert bodies(s.take_actions(), ToStub) == [b"rec-uninstall"]
    assert any(isinstance(a, Close) for a in stub(s, b"OK"))


def test_verdicts_reply_forward_handover() -> None:
    rec = Recorder()
    s = running(rec)
    stub(s, stop_at(0x1000, reason=b""))
    assert bodies(client(s, b"qTStatus"), ToClient) == [b"T0;tnotrun:0"]
    assert bodies(client(s, b"Z0,1234,1"), ToStub) == [b"Z1,1234,1"]
    stub(s, b"OK")
    # handover: the backend goes, breakpoints come, then the packet goes up
    acts = client(s, b"QTinit")
    assert bodies(acts, ToStub) == [b"rec-uninstall"]
    acts = stub(s, b"OK")
    assert bodies(acts, ToStub) == [b"breakpoints-install"]
    acts = stub(s, b"OK")
    assert bodies(acts, ToStub) == [b"QTinit"]
    assert s.capture is not rec and s.capture.label == "breakpoints"  # type: ignore[union-attr]


def test_reply_to_a_forwarded_read_is_rewritten() -> None:
    rec = Recorder()
    s = running(rec)
    stub(s, stop_at(0x1000, reason=b""))
    client(s, b"m1234,1")
    acts = stub(s, b"cc")
    assert bodies(acts, ToClientRaw) == [frame(b"55")]


def test_own_stop_is_hidden_and_the_resume_reissued() -> None:
    rec = Recorder()
    rec.own_stop_pc = SITE
    s = running(rec)
    acts = stub(s, stop_at(SITE, reason=b""))
    assert bodies(acts, ToStub) == [b"g"] and not bodies(acts, ToClientRaw)
    acts = stub(s, b"00" * 8)
    assert bodies(acts, ToStubRaw) + bodies(acts, ToStub) == [b"vCont;c"]
    assert "own-stop" in rec.calls


def test_tick_interrupts_drains_and_resumes_hidden() -> None:
    rec = Recorder()
    s = running(rec)
    s.tick(1.0)
    assert s.take_actions() == []  # not wanted
    rec.want_interrupt = True
    s.tick(2.0)
    assert s.take_actions() == [ToStubRaw(b"\x03")]
    s.tick(2.1)
    assert s.take_actions() == []  # one in flight
    acts = stub(s, stop_at(0x1000, sig=b"02", reason=b""))
    assert bodies(acts, ToStub) == [b"qTBuffer:0,10"] and not bodies(acts, ToClientRaw)
    acts = stub(s, b"l")
    assert bodies(acts, ToStub) == [b"vCont;c"]
    assert s.stats.hidden_interrupts == 1 and s.running


def test_a_drain_of_a_program_of_this_host_signals_its_process_alone() -> None:
    """The proxy's own interrupt of a program proven to run here is a SIGINT to that process
    (SignalProgram), not a 0x03: gdbserver answers 0x03 with a SIGINT to the whole process
    group, which killed the program's untraced children (a vfork child, 128 + 2). The stop that
    comes is the same SIGINT stop, hidden as before."""
    rec = Recorder()
    s = running(rec)
    s.identity = Identity(True, 4242, 4242, "test")
    rec.want_interrupt = True
    s.tick(2.0)
    assert s.take_actions() == [SignalProgram(4242, 2)]
    acts = stub(s, stop_at(0x1000, sig=b"02", reason=b""))
    assert bodies(acts, ToStub) == [b"qTBuffer:0,10"] and not bodies(acts, ToClientRaw)


def test_capture_interrupt_crossing_a_real_stop() -> None:
    """The stop that arrives is not ours: report it; the SIGINT that is still
    pending shows up at the next resume and is hidden then."""
    rec = Recorder()
    s = running(rec)
    rec.want_interrupt = True
    s.tick(1.0)
    s.take_actions()
    rec.want_interrupt = False
    acts = stub(s, stop_at(0x2000, reason=b"swbreak:;"))
    assert bodies(acts, ToClientRaw)  # the client's own stop
    assert bodies(client(s, b"vCont;c"), ToStubRaw) == [frame(b"vCont;c")]
    acts = stub(s, stop_at(0x2001, sig=b"02", reason=b""))
    assert not bodies(acts, ToClientRaw) and bodies(acts, ToStub) == [b"qTBuffer:0,10"]


def test_client_interrupt_during_capture_drain_is_reported() -> None:
    rec = Recorder()
    s = running(rec)
    rec.want_interrupt = True
    s.tick(1.0)
    s.take_actions()
    stub(s, stop_at(0x1000, sig=b"02", reason=b""))
    s.client_interrupt()
    acts = stub(s, b"l")
    assert bodies(acts, ToClient) == [b"S02"]


def test_switch_to_mode_off_after_a_monitor_command() -> None:
    rec = Recorder()

    def mon(text: str, sess: Session, read: object) -> str:
        sess.request_switch(mode="off")
        return "mode: full -> off"

    s = running(rec)
    s.config.monitor = mon  # type: ignore[assignment]
    stub(s, stop_at(0x1000, reason=b""))
    acts = client(s, b"qRcmd," + b"async mode off".hex().encode())
    assert bodies(acts, ToStub) == [b"qTBuffer:0,10"]  # sync before the command
    acts = stub(s, b"l")
    assert bodies(acts, ToStub) == [b"rec-uninstall"]
    acts = stub(s, b"OK")
    assert bodies(acts, ToClient)[-1] == b"OK"
    assert s.capture is None and s.mode == "off"


def test_hidden_breakpoints_of_the_capture_are_removed_on_switch() -> None:
    rec = Recorder(probes=(SITE,))
    s = session(rec)
    assert bodies(client(s, b"vCont;c"), ToStub) == [b"Z0,%x,1" % SITE]
    assert bodies(stub(s, b"OK"), ToStub) == [b"rec-install"]
    stub(s, b"OK")
    stub(s, stop_at(0x1000, reason=b""))
    s.start_proc(s.lifecycle.proc_switch(None, "off"))
    assert bodies(s.take_actions(), ToStub) == [b"rec-uninstall"]
    assert bodies(stub(s, b"OK"), ToStub) == [b"z0,%x,1" % SITE]
    stub(s, b"OK")
    assert s.bps.proxy_only() == [] and SITE not in s.probes


class CountingRecorder(Recorder):
    """A backend that counts the session's --probe functions itself (as uprobes do)."""

    def __init__(self, hits: int) -> None:
        super().__init__()
        self.hits = hits

    def count_probes(self, probes: list[Probe]) -> list[int]:
        self.calls.append("count_probes")
        return [p.addr for p in probes]

    def probe_counts(self) -> dict[int, int]:
        return {SITE: self.hits}


def _counting_session(rec: Recorder, **cfg: object) -> Session:
    return Session(SessionConfig(
        elf_path="/bin/true",
        resolve_probes=lambda path, entry: [Probe("probed", SITE)],
        make_capture=lambda name, mode, target: (rec if name == "recorder" else None) if mode != "off" else None,
        capture_name="recorder",
        open_target=lambda path, entry, pid, feats: Target(path, pid, True, feats),
        **cfg,  # type: ignore[arg-type]
    ))


def test_count_probes_taken_by_the_capture() -> None:
    """A probe the backend counts is never a hidden breakpoint at the first plant (no Z0 then
    z0 before the install: a uprobe swallows a Z0 at its address), comes back as one after the
    backend uninstalls, and the backend's hits stay in stats."""
    rec = CountingRecorder(hits=7)
    s = _counting_session(rec)
    assert bodies(client(s, b"vCont;c"), ToStub) == [b"rec-install"]
    stub(s, b"OK")
    assert rec.calls[:3] == ["plan", "count_probes", "install"]
    assert SITE not in s.probes and s.bps.proxy_only() == []
    stub(s, stop_at(0x1000, reason=b""))
    assert "probe hits: 7" in s.queries.stats_lines() and "  probed: 7" in s.queries.stats_lines()
    assert "--probe functions: 1, all counted by recorder (no stop)" in s.queries.stats_lines()
    s.start_proc(s.lifecycle.proc_switch(None, "off"))
    assert bodies(s.take_actions(), ToStub) == [b"rec-uninstall"]
    assert bodies(stub(s, b"OK"), ToStub) == [b"Z0,%x,1" % SITE]  # after the uninstall, never before
    stub(s, b"OK")
    assert SITE in s.probes and s.stats.probe_stats.total == 7
    rec.hits = 100  # gone: its counts were folded once, at the uninstall
    assert "probe hits: 7" in s.queries.stats_lines()


def test_the_keepers_plan_lists_the_captures_own_breakpoints() -> None:
    """proxy/shell/keeper.py takes out what the plan lists: the backend's own
    breakpoints too (tracepoints' fast-tracepoint guards), and the plan is
    written again when they change."""
    rec = Recorder()
    held: list[bytes] = []
    rec.held_breakpoints = lambda: tuple(held)  # type: ignore[method-assign]
    s = running(rec)
    key = s.leave_plan_key()
    held.append(b"z0,7ffff7e4c1a0,1")
    assert s.leave_plan_key() != key
    assert s.leave_plan()["z"] == ["z0,7ffff7e4c1a0,1"]
    stub(s, stop_at(0x1000, reason=b""))
    client(s, b"Z0,7ffff7e4c1a0,1")  # the client's at the same address: one breakpoint, one z
    stub(s, b"OK")
    assert s.leave_plan()["z"] == ["z0,7ffff7e4c1a0,1"]


class FailingCounter(CountingRecorder):
    """Takes the probes, then cannot put its own in (uprobes: the attach failed)."""

    def counting(self) -> bool:
        return False


def test_count_probes_given_back_when_the_capture_cannot_count() -> None:
    """The backend took the --probe functions but its install failed: they are
    hidden breakpoints again before the program runs, and stats says so."""
    rec = FailingCounter(hits=5)
    s = _counting_session(rec)
    assert bodies(client(s, b"vCont;c"), ToStub) == [b"rec-install"]
    assert bodies(stub(s, b"OK"), ToStub) == [b"Z0,%x,1" % SITE]
    assert bodies(stub(s, b"OK"), ToStubRaw) == [frame(b"vCont;c")]
    assert SITE in s.probes and s.bps.proxy_only() == [(0, SITE, 1)]
    stub(s, stop_at(0x1000, reason=b""))
    assert "--probe functions: 1, all hidden breakpoints (a stop per call)" in s.queries.stats_lines()


# -- the early install (uprobes' install_early): from the client's first stop on --------------

THREAD_STOP = stop_at(0x1000, reason=b"")  # the stub names the program's pid
PID = str(ThreadId.parse(THREAD).pid or ThreadId.parse(THREAD).tid)


class EarlyCounter(CountingRecorder):
    """Counts every --probe and starts its install at the client's first stop (as uprobes
    that only count: the link attached in a thread); `install` at the first resume finishes it."""

    installs_early = True

    def __init__(self, hits: int = 3, counts: bool = True, early: bool = True) -> None:
        super().__init__(hits)
        self.counts, self.early = counts, early

    def install_early(self) -> bool:
        self.calls.append("install_early")
        return self.early

    def install(self) -> None:  # type: ignore[override]
        self.calls.append("install")  # joins the thread: no exchange

    def uninstall(self) -> None:  # type: ignore[override]
        self.calls.append("uninstall")  # the links closed: no exchange

    def leaving(self) -> None:
        self.calls.append("leaving")

    def dropped(self) -> None:
        self.calls.append("dropped")

    def counting(self) -> bool:
        self.calls.append("counting")
        return self.counts


def _early_session(rec: Recorder, *, local: bool = True) -> Session:
    from proxy.host.identity import Identity

    def identify(pid, auxv, path):  # type: ignore[no-untyped-def]
        rec.calls.append(f"identify:{pid}")
        return Identity(local, pid if local else None, pid, "test")
        yield  # a procedure with no exchange

    return _counting_session(rec, identify=identify)


def _first_stop(s: Session) -> list[object]:
    assert bodies(client(s, b"?"), ToStubRaw) == [frame(b"?")]
    return stub(s, THREAD_STOP)


def test_count_probes_installed_at_the_first_stop_the_first_resume_only_finishes() -> None:
    """The install starts when the client sees the program's first stop (the
    identity proven first), not at its first resume: the client's start
    (qXfer, qSymbol, reads) overlaps uprobes' attach. Meanwhile the capture
    answers as installed (the m reply over a probe is the capture's to mask);
    the first resume joins it and forwards at once, with no Z0 ever planted."""
    rec = EarlyCounter()
    s = _early_session(rec)
    acts = _first_stop(s)
    assert bodies(acts, ToClientRaw) == [frame(THREAD_STOP)]  # the client has its answer first
    assert rec.calls == ["identify:" + PID, "plan", "count_probes", "install_early"]
    assert s.capture_installed and not s.planted and s.lifecycle.holds_program()
    client(s, b"m%x,1" % SITE)
    assert bodies(stub(s, b"cc"), ToClientRaw) == [frame(b"55")]  # the capture's view of the site
    assert bodies(client(s, b"vCont;c"), ToStubRaw) == [frame(b"vCont;c")]
    assert rec.calls[-2:] == ["install", "counting"]
    assert s.bps.proxy_only() == [] and SITE not in s.probes
    stub(s, stop_at(0x1000, reason=b""))
    assert "--probe functions: 1, all counted by recorder (no stop)" in s.queries.stats_lines()
    assert "probe hits: 3" in s.queries.stats_lines()


def test_early_install_that_cannot_count_gives_the_probes_back_at_the_first_resume() -> None:
    """The attach failed in its thread: the first resume learns it when it joins
    (`counting`), and the probes are hidden breakpoints before the program runs."""
    rec = EarlyCounter(counts=False)
    s = _early_session(rec)
    _first_stop(s)
    assert bodies(client(s, b"vCont;c"), ToStub) == [b"Z0,%x,1" % SITE]
    assert bodies(stub(s, b"OK"), ToStubRaw) == [frame(b"vCont;c")]
    assert s.bps.proxy_only() == [(0, SITE, 1)] and SITE in s.probes


def test_session_ended_before_the_first_resume_takes_the_early_install_out() -> None:
    """A hang-up, a detach or a kill before the first resume: the links go as at
    any leave (uninstall; a kill may close them without waiting), before the
    stub hears of the detach or the kill."""
    rec = EarlyCounter()
    s = _early_session(rec)
    _first_stop(s)
    s.client_closed()
    assert any(isinstance(a, Close) for a in s.take_actions())
    assert rec.calls[-1] == "uninstall" and not s.capture_installed
    for leave in (b"D", b"vKill;%x" % int(PID)):
        rec = EarlyCounter()
        s = _early_session(rec)
        _first_stop(s)
        assert bodies(client(s, leave), ToStubRaw) == [frame(leave)]
        assert rec.calls[-1] == "uninstall" and ("leaving" in rec.calls) == leave.startswith(b"vKill")


def test_no_early_install_for_a_remote_program_or_a_backend_that_declines() -> None:
    """Not proven this host's, or the backend cannot start without the stub: nothing
    is made at the first stop, and the first resume plans it all (the identity and
    the program's file are not asked again)."""
    rec = EarlyCounter()
    s = _early_session(rec, local=False)
    _first_stop(s)
    assert rec.calls == ["identify:" + PID] and s.capture is None and s.target is None
    client(s, b"vCont;c")
    assert rec.calls == ["identify:" + PID, "plan", "count_probes", "install", "counting"]
    rec = EarlyCounter(early=False)
    s = _early_session(rec)
    _first_stop(s)
    assert rec.calls == ["identify:" + PID, "plan", "count_probes", "install_early"] and s.capture is None
    assert not s.capture_installed and not s.lifecycle.holds_program()


def test_a_backend_that_cannot_start_early_is_not_planned_twice() -> None:
    """A Rust program under uprobes has poll sites: its install cannot start at
    the first stop (`may_install_early` is False before any plan). Nothing is
    planned then, and the first resume plans on the target and probes opened at
    the first stop: the program's inventory is loaded once (before, it was loaded,
    planned and dropped at the first stop, then all of it again)."""
    opened: list[int | None] = []
    resolved: list[str | None] = []
    rec = EarlyCounter()
    rec.may_install_early = lambda target: False  # type: ignore[method-assign]

    def identify(pid, auxv, path):  # type: ignore[no-untyped-def]
        rec.calls.append(f"identify:{pid}")
        return Identity(True, pid, pid, "test")
        yield  # a procedure with no exchange

    def open_target(path, entry, pid, feats):  # type: ignore[no-untyped-def]
        opened.append(pid)
        return Target(path, pid, True, feats)

    def resolve(path, entry):  # type: ignore[no-untyped-def]
        resolved.append(path)
        return [Probe("probed", SITE)]

    s = Session(SessionConfig(elf_path="/bin/true", resolve_probes=resolve, capture_name="recorder",
                              make_capture=lambda name, mode, target: rec if mode != "off" else None,
                              open_target=open_target, identify=identify))
    _first_stop(s)
    assert rec.calls == ["identify:" + PID] and s.capture is None and len(opened) == 1
    kept = s.lifecycle.kept[0]
    assert bodies(client(s, b"vCont;c"), ToStubRaw) == [frame(b"vCont;c")]
    assert rec.calls == ["identify:" + PID, "plan", "count_probes", "install", "counting"]
    assert len(opened) == 1 and len(resolved) == 1 and s.target is kept and s.lifecycle.kept is None
    # another process (vRun): nothing of the first is kept for it
    s.lifecycle.kept = (kept, [])
    s.lifecycle.new_process()
    assert s.lifecycle.kept is None


def test_switch_before_the_first_resume_takes_the_early_install_out() -> None:
    """A handover (the client writes code at a site) or `monitor async capture`
    before the first resume: the early install is taken out at once (no hidden
    breakpoint goes in before the first resume), and the first resume plans the
    new backend with the probes."""
    rec = EarlyCounter()
    s = _early_session(rec)
    _first_stop(s)
    s.start_proc(s.lifecycle.proc_switch(None, "off"))
    assert s.take_actions() == [] and rec.calls[-1] == "uninstall"
    assert s.capture is None and not s.capture_installed and not s.lifecycle.early
    assert bodies(client(s, b"vCont;c"), ToStub) == [b"Z0,%x,1" % SITE]


def test_a_new_process_takes_the_early_install_out() -> None:
    """Extended-remote before the first resume: a vRun beside the old process (no
    kill first) takes the early install out of it first, as at a detach; an `R`
    (gdbserver kills every process) has the backend free what it holds without
    waiting (`dropped`). The new process's first stop starts again."""
    for new, gone in ((b"vRun;", "uninstall"), (b"R00", "dropped")):
        rec = EarlyCounter()
        s = _early_session(rec)
        _first_stop(s)
        assert bodies(client(s, new), ToStubRaw) == [frame(new)]
        assert rec.calls[-1] == gone and s.capture is None and not s.lifecycle.early and not s.capture_installed
        rec.calls.clear()
        client(s, b"?")
        stub(s, THREAD_STOP)
        assert rec.calls == ["identify:" + PID, "plan", "count_probes", "install_early"]


def test_ctrl_c_while_the_first_stop_prepares_waits_for_the_continue() -> None:
    """The client's Ctrl-C while the proxy reads the stub for the early install:
    the program is stopped and no resume is out, so it is kept for the next
    continue (as any Ctrl-C while stopped), not taken for a hidden stop's."""
    from rsp.packets.qsupported import Feature

    rec = EarlyCounter()
    s = _early_session(rec)
    s.stub_features = [Feature("qXfer:auxv:read", "+")]
    client(s, b"?")
    assert bodies(stub(s, THREAD_STOP), ToStub) == [b"qXfer:auxv:read::0,1000"]
    s.client_interrupt()
    assert s.take_actions() == [] and s.stats.interrupts_during_hidden == 0
    stub(s, b"l")
    assert rec.calls[-1] == "install_early"
    acts = client(s, b"vCont;c")
    assert [a for a in acts if isinstance(a, ToStubRaw)] == [ToStubRaw(frame(b"vCont;c")), ToStubRaw(b"\x03")]


def test_hang_up_while_the_first_stop_prepares() -> None:
    """The client hangs up while the proxy reads the stub for the early install:
    nothing is installed, and the session ends once the reads are in (or keeps
    the stub for the next client, whose first resume plants as before)."""
    from rsp.packets.qsupported import Feature

    for keep in (False, True):
        rec = EarlyCounter()
        s = _early_session(rec)
        s.stub_features = [Feature("qXfer:auxv:read", "+")]
        client(s, b"?")
        stub(s, THREAD_STOP)
        s.client_closed(keep_stub=keep)
        closes = [a for a in s.take_actions() + stub(s, b"l") if isinstance(a, Close)]
        assert closes and closes[-1].keep_stub == keep
        assert "install_early" not in rec.calls and not s.capture_installed
