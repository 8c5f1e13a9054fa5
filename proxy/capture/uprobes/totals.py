"""What the kernel counts that the records do not carry: every coroutine instance's exact
totals (polls, raw time, hits inside) from the BPF program's map when polls are folded there
(sampling, only changes recorded, catching up), given to the engine's timing at each stop;
the polls of instances whose totals came closed in the stream; the polls in progress at a
stop whose entries went out as no record (read from each thread's scope stack); and the
coroutines elided in the kernel (done inside one poll of their parent). A part of the
uprobes capture (`cap.totals`); the capture's module docstring has the whole picture.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from proxy.graph.engine import Engine
from proxy.graph.events import PollResumed

from . import bpf as B
from .decode import F_STATE, InstanceTotals

if TYPE_CHECKING:
    from .capture import UprobeCapture


class KernelTotals:
    """The kernel's counts, folded into the engine at stops (the module's docstring)."""

    def __init__(self, cap: UprobeCapture) -> None:
        self.c = cap
        self.kernel: tuple[int, int, int, int] | None = None  # instances, polls, recorded, unseen polls
        self.closed_polls = 0  # polls of the instances whose totals came closed (InstanceTotals)
        self.polls_by_fn: dict[int, int] = {}  # resume function index -> polls of its closed instances
        self.live_polls_by_fn: dict[int, int] = {}  # ... of its live instances (the kernel's map, at sync)
        self.pending_fed = 0  # entries of polls in progress at stops, read from the threads' scopes
        self.elided_at_stops = 0  # elided coroutines read from the threads' storage at stops

    def elided_by_fn(self) -> dict[int, int]:
        """Resume function (runtime low_pc) -> its polls elided (CFG_ELIDE), from the kernel."""
        if self.c._prog is None or self.c.decoder is None:
            return {}
        sites = self.c.decoder.sites
        out: dict[int, int] = {}
        for cookie, n in self.c._prog.site_hits(list(range(len(sites))), "site_elided").items():
            if n and sites[cookie].kind == B.KIND_ENTRY:
                out[sites[cookie].site] = out.get(sites[cookie].site, 0) + n
        return out

    def elided_line(self, c: dict[str, int]) -> str:
        by_fn = self.elided_by_fn()
        names = ""
        if by_fn and self.c.engine is not None:
            cat = self.c.engine.catalog
            top3 = sorted(by_fn.items(), key=lambda kv: -kv[1])[:3]
            names = " (" + ", ".join(f"{cat.type_key(site)}: {n:,}" for site, n in top3) + \
                (", ..." if len(by_fn) > 3 else "") + ")"
        held = " (and, while catching up, tasks done in their first poll)" if self.c.catchup is not None else ""
        return (f"recorded: every poll, but for coroutines created and completed inside one poll of their "
                f"parent{held}: {c.get('elided', 0):,} such polls counted in the kernel, not recorded{names}; they "
                "are finished tasks that take their ids (not in top or tasks --all); entries held back "
                f"and sent late: {c.get('flushed', 0):,}, read at stops: {self.pending_fed:,}")

    def feed_pending(self) -> None:
        """At a stop (only changes recorded, or nested coroutines elided): the polls
        in progress whose entries went out as no record, fed to the engine from each
        thread's scope stack (bottom first, after every record), and marked recorded
        in the kernel so that their exits go out; with each, the coroutines elided on
        the thread before it, and then those elided since (their task ids in order)."""
        prog, engine, dec = self.c._prog, self.c.engine, self.c.decoder
        if prog is None or engine is None or dec is None or not self.c._pid:
            return
        try:
            tids = sorted(int(t) for t in os.listdir(f"/proc/{self.c._pid}/task"))
        except OSError:
            return
        for tid in tids:
            pending, elided = prog.pending_entries(tid)
            for sc, below in pending:
                sp, self_ptr, ts, _hits, ret, state, _fn, _rec, _off, _size, cookie, flags, before, _ip = sc
                if before:  # elided before it (CFG_ELIDE): their task ids come first
                    engine.elided(before)
                    self.elided_at_stops += before
                if cookie >= len(dec.sites):
                    continue
                p_site = self.c._fn_site.get(below[1]) if below is not None else None
                engine.feed(PollResumed(dec.next_seq(), tid, dec.sites[cookie].site, self_ptr, sp, ret or None,
                                        state if flags & F_STATE else None, ts,
                                        (below[0], p_site) if below is not None and p_site else None))
                self.pending_fed += 1
            if elided:  # elided since the thread's last record, after the polls in progress began
                engine.elided(elided)
                self.elided_at_stops += elided

    def credit(self, tot: InstanceTotals, engine: Engine) -> None:
        """An instance's exact totals (closed: its address starts a new life, or it
        completed) to the engine's node for it, when the kernel counts the polls
        (otherwise every poll was recorded)."""
        self.closed_polls += tot.polls
        self.polls_by_fn[tot.fn] = self.polls_by_fn.get(tot.fn, 0) + tot.polls
        if not self.c._folded:
            return
        site = self.c._fn_site.get(tot.fn)
        node = engine.node_at(tot.self_ptr, site) if site is not None else None
        if node is not None and tot.polls:
            engine.timing.set_totals(node, tot.polls, tot.raw_ns, tot.hits)

    def apply(self) -> None:
        """At a stop: every live instance's exact totals from the kernel's map to the
        engine's timing; what was recorded of them, for `stats` and `top`."""
        prog, engine = self.c._prog, self.c.engine
        if prog is None or engine is None:
            return
        polls = recorded = unseen = 0
        totals = prog.instances()
        # The kernel counts a poll at its entry, the engine at its exit: a poll the
        # engine holds open (its entry recorded, or read at this stop) is in the
        # kernel's count already and will be counted again when its exit is folded.
        # Its raw time and hits are added at the exit on both sides.
        open_polls: dict[int, int] = {}
        for t in engine.threads():
            for sc in engine.scopes(t):
                if not sc.nested:
                    open_polls[sc.task] = open_polls.get(sc.task, 0) + 1
        polled_unseen: dict[int, int] = {}
        for (self_ptr, fn), (n, raw, hits, rec) in totals.items():
            polls += n
            recorded += rec
            site = self.c._fn_site.get(fn)
            node = engine.node_at(self_ptr, site) if site is not None else None
            if node is None:
                unseen += n
            elif n:
                engine.timing.set_totals(node, max(n - open_polls.get(node, 0), 0), raw, hits)
                polled_unseen[node] = n - rec - open_polls.get(node, 0)
        engine.polled_unseen(polled_unseen)  # a task may have ended in one: its state is read now
        self.kernel = (len(totals), polls, recorded, unseen)
        self.live_polls_by_fn = {}
        for (_self_ptr, fn), (n, _raw, _hits, _rec) in totals.items():
            self.live_polls_by_fn[fn] = self.live_polls_by_fn.get(fn, 0) + n
        if self.c.catchup is not None:
            notes = [n for n in (self.c.catchup.note(recorded, polls), self.c.nested_links.note_for_top()) if n]
            engine.timing.sampled = "; ".join(notes) or None
            return
        if self.c.changes:
            # said once a poll was not recorded (until then every poll is in the histograms)
            counters = prog.counters()  # one read of the kernel's counters
            folded = counters.get("skipped", 0) - counters.get("flushed", 0)
            engine.timing.sampled = (
                f"only the polls that changed the graph recorded ({recorded:,} of {polls:,} polls of the live "
                "instances); POLLS and BUSY are exact (every poll counted in the kernel), LONGEST and the "
                "histograms from the recorded polls") if folded > 0 else None
            return
        engine.timing.sampled = (
            f"sampled: one root poll in {self.c.sample_every} per coroutine instance recorded, at random "
            f"({recorded:,} of {polls:,} polls of the live instances); POLLS and BUSY are exact "
            "(counted in the kernel), LONGEST and histograms from the recorded polls")
