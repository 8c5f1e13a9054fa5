"""Full mode's nested probes follow the CPU budget: out while the kernel samples (catchup.py decides when)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from proxy.graph.engine import Engine
from proxy.graph.events import PollEnter, PollExit

from . import bpf as B

SETTLE_NS = 2_000_000_000  # after the nested probes came back: at most this long (stream time) dropping their events


if TYPE_CHECKING:
    from .capture import UprobeCapture


class NestedLinks:
    """The nested probes' own link, a part the capture holds (``capture.nested_links``): which
    resume functions are polled only inside other polls, their link while in, its closes and
    the settling after it came back. When to take them out is ``capture.nested``'s
    (catchup.NestedProbes); the main link, the sites and the BPF program are the capture's (``c``)."""

    def __init__(self, capture: UprobeCapture) -> None:
        self.c = capture
        self.split_done = False  # the main link was split into the tasks' link and the nested one
        self.inner_only: set[int] = set()  # resume functions (index) only ever entered inside another poll
        self.root_fn_ids: set[int] = set()  # ... entered at a thread's root at least once (never taken out)
        self.inner_sites: set[int] = set()  # the nested link's functions (runtime low_pc)
        self.cookies: list[int] = []  # the nested link's sites
        self.link: int | None = None  # the nested link while in
        self.closing: list[Any] = []  # threads closing a nested (or, at the split, the main) link
        self.dedupe_on = False  # the split's new link and the old one both in: hits run twice
        self.kept_links: list[int] = []  # sites moved out of the nested link (found polled at a root)
        self.extra: list[int] = []  # nested return sites learned while in: closed with the nested link
        self.settle_ns: int | None = None  # the nested link came back (CLOCK_MONOTONIC ns): see settling
        self.settle_seen = 0  # the latest record time fed since
        self.dropped = 0  # nested events dropped: inside a task's poll begun before they came back
        self.forgotten = 0  # nested coroutines the graph forgot when their probes came back
        self.note: str | None = None  # why the nested probes stay in

    # Full mode under a CPU budget (catchup.py NestedProbes). While the kernel
    # samples (the proxy behind or its budget spent), most polls are not
    # recorded, yet every probe still traps: on the axum benchmark the 6 traps a
    # request of the coroutines polled inside a connection's poll cost the server
    # ~9.6 µs of its 27. So while it samples, the probes of the resume functions
    # only ever entered inside another poll (the kernel counts those entries per
    # site: `site_nested`) are out: their link is closed, and the tasks' probes
    # stay in their own link, so the kernel keeps folding every task poll into
    # its totals (POLLS and BUSY exact). The first time, the main link is split:
    # the tasks' link (with the return sites serving any other function) is
    # attached before the old links are closed (both in meanwhile: a hit at a
    # site both hold runs twice, the second dropped, CFG_DEDUPE); from then on
    # only the nested link is closed and attached again. The graph across:
    # * a nested poll in progress when its link closes never gets its exit: the
    #   kernel pops its scope at the task poll's exit, the engine counts a missed
    #   exit there (and asks its state);
    # * when the nested probes come back (once the catch-up records every poll
    #   again and they were out long enough, or at a stop: before the resume),
    #   everything is folded first, and the graph forgets the nested coroutines
    #   not polling now (`Engine.forget_idle`: they may have completed or moved
    #   on unseen; the tree at a stop comes from memory under each task anyway);
    # * then a thread's nested events are dropped while it is in a task poll
    #   begun before they came back (`_settling`): an inner coroutine entered
    #   before would be missing between the task and the ones entered after, and
    #   its exit would match nothing.
    # A function first polled at a thread's root while its probes are out is
    # not seen then (found at the next in time: it stays in from then on); new
    # return sites learned after the split stay in their own links.
    def step(self) -> None:
        ns, prog, cu = self.c.nested, self.c._prog, self.c.catchup
        if ns is None or prog is None or cu is None or self.c._link is None:
            return
        self.reap(prog)
        if not self.c._running:
            return  # stopped (the shell polls on its tick): as they are until the resume (before_resume)
        now = time.monotonic()
        want = ns.want(cu.sampling, now)
        if want is True:
            self.take_out(prog, now)
        elif want is False:
            self.put_back(prog, now)

    def reap(self, prog: B.Program) -> None:
        """The closes done: their threads joined, CFG_DEDUPE off after the split's swap;
        the settling over (see `_settling`)."""
        if self.closing and not any(th.is_alive() for th in self.closing):
            for th in self.closing:
                th.join()
            self.closing = []
            if self.dedupe_on:
                prog.set_dedupe(False)
                self.dedupe_on = False
        if self.settle_ns is not None and self.settle_seen > self.settle_ns + 10_000_000:
            eng = self.c.engine
            old = eng is not None and any(
                sc and (sc[0].time_ns or 0) < self.settle_ns for sc in (eng.scopes(t) for t in eng.threads()))
            if not old or self.settle_seen > self.settle_ns + SETTLE_NS:
                self.settle_ns = None

    def _classify(self, prog: B.Program) -> None:
        """Which resume functions were only ever entered inside another poll (the kernel's
        `site_nested` against `site_hits`, per entry site): `_inner_only`. Once entered at
        a thread's root, a function is a task's and stays in."""
        by_fn: dict[int, list[int]] = {}
        for i, st in enumerate(self.c._att_sites):
            if st.spec.kind == B.KIND_ENTRY:
                by_fn.setdefault(st.spec.fn, []).append(i)
        cookies = [c for cs in by_fn.values() for c in cs]
        hits, nested = prog.site_hits(cookies), prog.site_hits(cookies, "site_nested")
        inner = set()
        for fn, cs in by_fn.items():
            h, n = sum(hits.get(c, 0) for c in cs), sum(nested.get(c, 0) for c in cs)
            if h > n:
                self.root_fn_ids.add(fn)
            elif h and fn not in self.root_fn_ids:
                inner.add(fn)
        self.inner_only = inner

    @staticmethod
    def served(seen: dict[tuple[int, int], int]) -> dict[int, set[int]]:
        """Return address -> the resume functions (index) seen returning there (`seen`:
        the kernel's ``rets_seen``)."""
        served: dict[int, set[int]] = {}
        for ret, fn in seen:
            served.setdefault(ret, set()).add(fn)
        return served

    def _fns_of(self, cookie: int, served: dict[int, set[int]]) -> set[int]:
        """The resume functions a site serves: its own, or those returning at a return site."""
        st = self.c._att_sites[cookie]
        if st.spec.kind == B.KIND_RETSITE:
            return served.get(self.c.returns.retsite_ret.get(cookie, -1), set())
        return {st.spec.fn} if st.spec.kind in (B.KIND_ENTRY, B.KIND_EXIT, B.KIND_UNWIND) else set()

    def _is_inner(self, cookie: int, served: dict[int, set[int]]) -> bool:
        """A return site is inner when each function returning there is."""
        return self.inner_fns(self._fns_of(cookie, served))

    def inner_fns(self, fns: set[int]) -> bool:
        return bool(fns) and fns <= self.inner_only

    def _split_links(self, prog: B.Program) -> bool:
        """The first time out: the main link and the return sites' links become the
        tasks' link (attached first) and the nested sites (attached when they come back)."""
        self._classify(prog)
        if not self.inner_only:
            return False
        served = self.served(prog.rets_seen())
        main = list(self.c._cookie_list) if self.c._cookie_list is not None else list(range(len(self.c._offsets)))
        rets = [c for _link, cs in self.c.returns.retsite_links for c in cs]
        inner = [c for c in main + rets if self._is_inner(c, served)]
        keep = [c for c in main + rets if c not in set(inner)]
        if not inner or not keep:
            return False
        prog.set_dedupe(True)
        try:
            link = prog.attach(self.c._path or "", [self.c._att_sites[c].file_offset for c in keep], self.c._pid, keep)
        except B.BpfError as err:
            prog.set_dedupe(False)
            self.c.nested, self.note = None, f"the tasks' probes could not be linked apart ({err})"
            self.c.notices.append(f"uprobes: nested probes stay in: {self.note}")
            return False
        old = [self.c._link, *(lk for lk, _cs in self.c.returns.retsite_links)]
        self.c._link, self.c._cookie_list = link, keep
        self.c._offsets = [self.c._att_sites[c].file_offset for c in keep]
        self.c.returns.retsite_links = []
        self.cookies = inner
        self.dedupe_on = True
        self.closing += [prog.detach_later(lk) for lk in old if lk is not None]
        self.split_done = True
        return True

    def take_out(self, prog: B.Program, now: float) -> None:
        assert self.c.nested is not None
        if self.closing:
            return  # the last close (or the split's) is not done yet
        # the return addresses the nested functions' entries noted while in are
        # learned now, not at the next step: a function polled through a vtable
        # keeps its rets probed until then, and those would trap at every return
        # while its entries are out (each an exit without its entry: 17,700 in
        # the first 0.3 s out on the axum benchmark, single-stepped)
        self.c.returns.step(force=True)
        if not self.split_done:
            if not self._split_links(prog):
                return
        else:
            if self.link is None and not self.extra:
                return
            self._classify(prog)
            served = self.served(prog.rets_seen())
            moved = [c for c in self.cookies if self._fns_of(c, served) & self.root_fn_ids]
            if moved:  # polled at a thread's root since: in a link of their own, for good
                prog.set_dedupe(True)
                try:
                    self.kept_links.append(prog.attach(self.c._path or "", [self.c._att_sites[c].file_offset
                                                                           for c in moved], self.c._pid, moved))
                except B.BpfError as err:
                    prog.set_dedupe(False)
                    self.c.notices.append(f"uprobes: nested probes stay in: {err}")
                    self.c.nested = None
                    return
                self.dedupe_on = True
                self.cookies = [c for c in self.cookies if c not in set(moved)]
            self.closing += [prog.detach_later(lk) for lk in (self.link, *self.extra)
                                     if lk is not None]
            self.link, self.extra = None, []
        fns = {self.c._att_sites[c].spec.fn for c in self.cookies
               if self.c._att_sites[c].spec.kind == B.KIND_ENTRY}
        self.inner_sites = {self.c._fn_site[f] for f in fns if f in self.c._fn_site}
        self.c.nested.moved(True, now)

    def put_back(self, prog: B.Program, now: float) -> None:
        assert self.c.nested is not None
        if any(th.is_alive() for th in self.closing):
            return  # the close is not done yet: the next look
        self.reap(prog)
        if not self.cookies:
            self.c.nested.moved(False, now)
            return
        if self.c._running:
            self.c.fold.run(budget_s=None)  # the graph up to now first (the catch-up left little unread)
        self.forget_inner()
        t = time.monotonic_ns()  # the BPF program's clock (CLOCK_MONOTONIC)
        try:
            self.link = prog.attach(self.c._path or "", [self.c._att_sites[c].file_offset
                                                               for c in self.cookies],
                                            self.c._pid, self.cookies)
        except B.BpfError as err:
            self.note = f"the nested probes could not be attached again ({err}): they stay out"
            self.c.notices.append(f"uprobes: {self.note}")
            self.c.nested.moved(False, now)
            self.c.nested = None
            return
        self.settle_ns, self.settle_seen = t, 0
        self.c.nested.moved(False, now)

    def forget_inner(self) -> None:
        """The graph forgets the nested coroutines not polling now (stale while their probes were out)."""
        if self.c.engine is not None and self.inner_sites:
            self.forgotten += self.c.engine.forget_idle(self.inner_sites)

    def settling(self, ev: Any, engine: Engine) -> bool:
        """After the nested probes came back: whether `ev` (an entry or exit of a nested
        function) is dropped, its thread being in a task poll begun before they came back."""
        t = getattr(ev, "time_ns", None)
        if t is not None and t > self.settle_seen:
            self.settle_seen = t
        if type(ev) not in (PollEnter, PollExit) or ev.site not in self.inner_sites:
            return False
        scopes = engine.scopes(ev.thread)
        if scopes and (scopes[0].time_ns or 0) < (self.settle_ns or 0):
            self.dropped += 1
            return True
        return False

    def line(self) -> str | None:
        """`stats`: the nested probes' out time and what it costs."""
        ns = self.c.nested
        if ns is None:
            if self.note:
                return f"nested probes: {self.note}"
            return None
        if not self.split_done:
            return ("nested probes: taken out while the kernel samples (the resume functions polled only inside "
                    "other polls; none out so far)")
        out, run = ns.totals(time.monotonic())
        names = sorted({self.c._fn_name(self.c._att_sites[c].spec.fn)[:50] for c in self.cookies
                        if self.c._att_sites[c].spec.kind == B.KIND_ENTRY})
        return (f"nested probes out {out / run if run > 0 else 0:.0%} of the running time (budget; {out:.1f} s of "
                f"{run:.1f} s, {ns.outs} times, the longest {ns.longest_s:.1f} s{', out now' if ns.out else ''}): "
                f"{len(names)} resume functions polled only inside other polls ({', '.join(names[:3])}"
                f"{' ...' if len(names) > 3 else ''}); their polls, the edges under the tasks and the histograms "
                f"are of the in time only, tasks' POLLS and BUSY exact (their probes stay in); nested coroutines "
                f"forgotten when their probes came back: {self.forgotten:,}, their events dropped inside "
                f"a task poll begun before: {self.dropped:,}; `--uprobe-budget 0` keeps every probe in")

    def note_for_top(self) -> str | None:
        ns = self.c.nested
        if ns is None or not ns.outs:
            return None
        return (f"nested probes out {ns.share(time.monotonic()):.0%} of the running time (budget): their polls, "
                "the edges and histograms are of the in time only; tasks' POLLS and BUSY exact")
