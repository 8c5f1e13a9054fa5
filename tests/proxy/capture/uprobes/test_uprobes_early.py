"""uprobes' early install (`install_early`): the link attached in a thread from the
client's first stop on, joined before anything reads or closes it.

The BPF side is replaced by a fake whose attach waits for the test (the kernel's
own attach and its grace periods run in integration/test_probes.py and
integration/test_uprobes.py); what is pinned here is the ordering: the capture
answers as attached while the thread runs, the first resume waits for it
(`counting`), a failure or a bug in the thread reaches the session's thread, and
no close ever overtakes the attach."""

from __future__ import annotations

import signal
import threading
from types import SimpleNamespace

import pytest

from proxy.capture.base import Forward
from proxy.capture.uprobes import bpf as B
from proxy.capture.uprobes.capture import UprobeCapture
from proxy.capture.uprobes.decode import SiteInfo
from proxy.capture.uprobes.sites import Site, SitePlan

SITE = 0x401136


def _site(addr: int, kind: int = B.KIND_COUNT) -> Site:
    return Site("probed", addr, addr - 0x400000, b"\x55", B.SiteSpec(kind), SiteInfo(kind, addr, addr))


class FakeProgram:
    """What `_take_links` and `_close_links` use of a loaded B.Program."""

    count_only = True

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.links = [7]

    def ring(self) -> SimpleNamespace:
        return SimpleNamespace(close=lambda: self.log.append("ring closed"))

    def detach_all(self) -> None:
        if self.links:
            self.log.append("links closed")
        self.links = []

    def detach_later(self, link: int) -> None:
        self.log.append("links closed")  # a kill: in a thread nobody waits for
        self.links.remove(link)

    def counters(self) -> dict[str, int]:
        return {}

    def site_hits(self, cookies: list[int]) -> dict[int, int]:
        return {c: 4 for c in cookies}

    def set_credits(self, n: int) -> None:
        pass

    def close(self) -> None:
        self.log.append("program closed")


def _capture(attach, sites: list[Site] | None = None) -> UprobeCapture:  # type: ignore[no-untyped-def]
    cap = UprobeCapture()
    sites = sites if sites is not None else [_site(SITE)]
    cap.plan_ = SitePlan(sites, [])
    cap._sites_by_addr = cap.plan_.by_addr()
    cap._mask = sorted((s.addr, s.original) for s in sites)
    cap._path = cap._given_path = "/bin/true"
    cap._pid = 1234
    cap._attach_bpf = attach  # type: ignore[method-assign]
    return cap


def test_attach_runs_in_a_thread_and_the_first_resume_waits_for_it() -> None:
    log: list[str] = []
    go = threading.Event()
    masks: list[set[int]] = []

    def attach(sites: list[Site]) -> FakeProgram:
        masks.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, [])))
        go.wait(5)
        log.append("attached")
        return FakeProgram(log)

    cap = _capture(attach)
    assert cap.install_early()
    # meanwhile the capture answers as attached: the client's Z0 at a site becomes a Z1
    assert cap.attached and cap._prog is None
    v = cap.client_request(b"Z0,%x,1" % SITE)
    assert isinstance(v, Forward) and v.body == b"Z1,%x,1" % SITE
    threading.Timer(0.05, go.set).start()
    assert cap.install() is None  # the first resume: waits, no exchange
    assert log == ["attached"] and cap.counting() and cap._prog is not None
    assert cap.attach_wait_s is not None and cap.attach_wait_s >= 0.02
    assert signal.SIGINT in masks[0] and signal.SIGTERM in masks[0]  # the session's signals, not the thread's
    assert any("ms later and waited" in line for line in cap.stats_lines())


def test_a_close_before_the_first_resume_waits_for_the_attach() -> None:
    """A hang-up, detach or kill before the first resume: the links close after
    the attach returned them, never before (a link the thread returned after a
    close would keep its int3s in the program)."""
    log: list[str] = []
    go = threading.Event()

    def attach(sites: list[Site]) -> FakeProgram:
        go.wait(5)
        log.append("attached")
        return FakeProgram(log)

    cap = _capture(attach)
    assert cap.install_early()
    threading.Timer(0.05, go.set).start()
    cap.leaving()
    assert cap.uninstall() is None
    assert log[0] == "attached" and "links closed" in log and cap._prog is None and not cap.attached


def test_a_failed_attach_gives_the_probes_back_and_a_bug_reaches_the_session() -> None:
    cap = _capture(lambda sites: None)  # BpfError inside: note set, nothing attached
    assert cap.install_early()
    assert not cap.counting() and not cap.attached

    def broken(sites: list[Site]) -> FakeProgram:
        raise RuntimeError("bug in the attach")

    cap = _capture(broken)
    assert cap.install_early()
    with pytest.raises(RuntimeError):
        cap.counting()  # the session's _capture_call counts it; the probes become breakpoints
    assert not cap.attached and cap._prog is None


def test_install_early_declines_poll_sites_and_client_breakpoints_at_sites() -> None:
    """Only count sites (a poll site's plan has more to it: return links,
    slices, the engine's decoder), and no client Z0 already at a site (it
    must go out before the attach and come back as a Z1: `install`'s procedure)."""
    calls: list[list[Site]] = []
    cap = _capture(lambda sites: calls.append(sites), sites=[_site(SITE, B.KIND_ENTRY)])  # type: ignore[func-returns-value]
    assert not cap.install_early() and not cap.attached
    cap = _capture(lambda sites: calls.append(sites))  # type: ignore[func-returns-value]
    cap.view.client_sw.add(SITE)
    assert not cap.install_early()
    assert calls == []
