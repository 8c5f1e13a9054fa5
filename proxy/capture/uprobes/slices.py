"""Time-sliced uprobe capture (`--sample-time PCT`): the probes in for a slice, out for the rest."""

from __future__ import annotations

import time
from typing import Any

from proxy.graph.engine import Engine
from proxy.graph.events import PollEnter

from typing import TYPE_CHECKING

from . import bpf as B

if TYPE_CHECKING:
    from .capture import UprobeCapture


class TimeSlices:
    """`--sample-time PCT`, a part the capture holds (``capture.slicing``): the slices' clock,
    what the budget held back, the roots learnt and the threads settled. The links, the
    BPF program and the duty (``slice_duty``, which other modes read) are the capture's (``c``)."""

    def __init__(self, capture: UprobeCapture, on_s: float, cpu_budget: float | None) -> None:
        self.c = capture
        duty = capture.slice_duty
        self.on_s = on_s
        self.last_in = 0.0  # how long the last slice had the probes in
        # the watcher's CPU budget holds the next slice back (see step)
        self.budget = cpu_budget if duty < 1.0 and cpu_budget and 0 < cpu_budget < 1 else None
        self.clock: tuple[float, float] | None = None  # (wall, process CPU) at the last slice's start
        self.held = 0  # slices held back by the budget
        self.held_s = 0.0  # ... the off time added
        self.held_since = 0.0  # the next slice held back since (0: not held)
        self.t0 = 0.0
        self.in_s = 0.0  # time with the probes in (while the capture was polled)
        self.first_s = 0.0  # the first slice: until a task's poll was seen whole
        self.out_s = 0.0
        self.count = 0  # slices so far
        self.attach_s: list[float] = []  # what each re-attach and detach took
        self.detach_s: list[float] = []
        self.settled: set[int] | None = None  # threads whose events are fed (None: all)
        self.root_rets: set[int] = set()  # return addresses of polls seen at the root of a thread
        self.nested_rets: set[int] = set()  # ... and of polls seen inside another poll
        self.skipped = 0  # events dropped because their thread's root poll began outside the slice

    # `--sample-time PCT`: the probes are in for `slice_on_s` (50 ms; as long as
    # the shell's next poll comes), then out (the links closed: the kernel takes
    # the int3s out, the program runs bare) for as long as makes the duty PCT%
    # of that. Closing the link is what removes the int3s; a disabled program
    # would still trap. Closing waits for the kernel (~30 ms: a thread does it,
    # off the proxy's loop; the probes record until it returns). The first
    # slice lasts until a task's poll was seen whole (the roots below are
    # learnt). Before the next slice attaches, the close done:
    # * the ring is folded (the records written before the close), then every
    #   poll still open in the engine is dropped (its exit comes after the
    #   slice: resync_thread with no frames) and the kernel's scope and thread
    #   tables are cleared, so an entry without its exit never pairs with a
    #   later exit at the same (thread, sp);
    # * in the next slice a thread's events are fed only from its first entry
    #   called from where only root polls (tasks) were seen called from, its
    #   return address (_root_ok): a slice that begins in the middle of a
    #   task's poll would otherwise make the inner coroutines look like tasks
    #   of their own. tokio_bench polls one async fn both as a spawned task
    #   and inside its main future, at times at the same stack pointer: the
    #   function or the sp is not enough (integration/test_uprobes.py). The first slice starts at install, the program
    #   stopped: every thread is fed from the start and the roots are learnt.
    # The watcher's CPU budget (`--uprobe-budget`, 10% of a core) holds the next
    # slice back until the proxy's CPU since the last slice began is within the
    # budget of the time since: a slice of every probe records every poll, and
    # folding them took the proxy ~19% of a core at 10% duty on the axum
    # benchmark (2.5 µs a request of the watcher's against the server's 11.1).
    # The duty is then what the budget allows (`stats` gives the share).
    def step(self) -> None:
        prog = self.c._prog
        if self.c.slice_duty >= 1.0 or prog is None or not self.c._offsets or self.c._stopped_at is not None:
            return
        now = time.monotonic()
        spent = now - self.t0
        if not self.c._sliced_out:
            if spent < self.on_s or (self.count == 0 and not self.root_rets - self.nested_rets):
                return  # the first slice lasts until a task's poll was seen whole
            t0 = time.perf_counter()
            if self.c._link is not None:
                self.c._closing = prog.detach_later(self.c._link)
                self.c._link = None
            self.detach_s.append(time.perf_counter() - t0)
            self.c._sliced_out = True
            self.in_s += spent
            if not self.count:
                self.first_s = spent
            # the off time keeps the duty of what the slice lasted (a loaded proxy polls late:
            # slices of 50 ms measured 300 ms at load 9); the first may last long, idle: at most
            # 2 slices' worth
            self.last_in = spent if self.count else min(spent, 2 * self.on_s)
            self.t0 = now
            return
        off_s = self.last_in * (1.0 - self.c.slice_duty) / self.c.slice_duty
        if spent < off_s:
            return
        if self.budget is not None and self.clock is not None:
            wall0, cpu0 = self.clock
            if time.process_time() - cpu0 > self.budget * (now - wall0):
                if not self.held_since:
                    self.held_since, self.held = now, self.held + 1
                return  # the budget spent: the program runs bare a while longer
        if self.held_since:
            self.held_s += now - self.held_since
            self.held_since = 0.0
        if self.c._closing is not None:
            self.c._closing.join()  # the last slice's link is closed (it takes ~30 ms, off the loop)
            self.c._closing = None
        self.c.fold.run(budget_s=None)  # everything the last slice wrote (until its link was closed)
        self.end_slice(prog)
        t0 = time.perf_counter()
        try:
            self.c._link = prog.attach(self.c._path or "", self.c._offsets, self.c._pid, self.c._cookie_list)
        except B.BpfError as err:
            self.c.notices.append(f"uprobes: time slice {self.count + 1} could not attach: {err}")
            self.c._offsets = []  # no more slices: the capture is out
            self.c._sliced_out = False
            return
        self.attach_s.append(time.perf_counter() - t0)
        self.clock = (now, time.process_time())
        self.c._sliced_out = False
        self.out_s += spent
        self.t0 = now
        self.count += 1

    def end_slice(self, prog: B.Program) -> None:
        engine = self.c.engine
        if engine is not None:
            for t in engine.threads():
                engine.resync_thread(t, [])
        prog.new_epoch()
        self.settled = set()
        self.c.fold.resync.clear()

    def _root_ok(self, ev: PollEnter) -> bool:
        """An entry that starts a root poll for sure: called from a place (its
        return address) where root polls were seen and never a poll nested in
        another. A runtime polls its tasks from its own code; a coroutine polls
        another from inside its resume function or a combinator it calls."""
        ret = ev.return_addr
        return ret in self.root_rets and ret not in self.nested_rets

    def feed(self, ev: Any, engine: Engine) -> bool:
        """Whether `ev` is fed (time slices): see _slice_step. Learns the root sites."""
        t = getattr(ev, "thread", None)
        if t is None:
            return True
        settled = self.settled
        enter = type(ev) is PollEnter
        if settled is not None and t not in settled:
            if not (enter and self._root_ok(ev)):
                self.skipped += 1
                return False
            settled.add(t)
        if enter:
            if engine.current_scope(t) is None:
                self.root_rets.add(ev.return_addr)
            else:
                self.nested_rets.add(ev.return_addr)
        return True

    def line(self) -> str | None:
        if self.c.slice_duty >= 1.0:
            return None
        # the share after the first slice, which lasts until a task's poll was seen whole
        # (a server waiting for its first request: probes in, nothing hit)
        in_s, out_s = self.in_s, self.out_s
        if self.c._offsets and (self.count or self.first_s):  # the period under way counts too
            now = self.c._stopped_at if self.c._stopped_at is not None else time.monotonic()
            cur = max(now - self.t0, 0.0)
            if self.c._sliced_out:
                out_s += cur
            else:
                in_s += cur
        total = in_s + out_s - self.first_s
        share = (in_s - self.first_s) / total if total > 0 else 1.0
        cost = ""
        if self.attach_s:
            cost = (f"; attach {1e3 * sum(self.attach_s) / len(self.attach_s):.2f} ms, detach "
                    f"{1e3 * sum(self.detach_s) / max(len(self.detach_s), 1):.2f} ms a slice")
        return (f"time-sliced: probes in {self.c.slice_duty:.0%} of the time at most, {self.on_s * 1e3:.0f} ms "
                f"at a time (the first until a task's poll was seen whole: {self.first_s:.1f} s; then "
                f"{self.count} slices, in {in_s - self.first_s:.1f} s of {total:.1f} s = "
                f"{share:.1%}); POLLS, BUSY, the histograms and the graph's edges come from the slices only "
                f"(not exact: about {share:.1%} of the polls); events dropped at slice starts (their thread's "
                f"root poll began outside the slice): {self.skipped:,}{cost}{self._budget_part()}")

    def _budget_part(self) -> str:
        if self.budget is None:
            return "; no CPU budget (slices at the duty whatever the proxy's CPU)"
        held = (f"held {self.held:,} slices back for {self.held_s:.1f} s in all"
                if self.held else "never held a slice back")
        return (f"; the CPU budget ({self.budget * 100:g}% of a core: a slice begins once the proxy's CPU "
                f"since the last one began is within it) {held}")
