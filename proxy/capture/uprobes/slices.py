"""Time-sliced uprobe capture (`--sample-time PCT`): the probes in for a slice, out for the rest."""

from __future__ import annotations

import time
from typing import Any

from proxy.graph.engine import Engine
from proxy.graph.events import PollEnter

from . import bpf as B


class TimeSlices:
    """UprobeCapture's time slices (a mixin: the state lives in UprobeCapture.__init__)."""

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
    def _slice_step(self) -> None:
        prog = self._prog
        if self.slice_duty >= 1.0 or prog is None or not self._offsets or self._stopped_at is not None:
            return
        now = time.monotonic()
        spent = now - self._slice_t0
        if not self._sliced_out:
            if spent < self.slice_on_s or (self.slices == 0 and not self._root_rets - self._nested_rets):
                return  # the first slice lasts until a task's poll was seen whole
            t0 = time.perf_counter()
            if self._link is not None:
                self._closing = prog.detach_later(self._link)
                self._link = None
            self.slice_detach_s.append(time.perf_counter() - t0)
            self._sliced_out = True
            self.slice_in_s += spent
            if not self.slices:
                self.first_slice_s = spent
            # the off time keeps the duty of what the slice lasted (a loaded proxy polls late:
            # slices of 50 ms measured 300 ms at load 9); the first may last long, idle: at most
            # 2 slices' worth
            self._last_in = spent if self.slices else min(spent, 2 * self.slice_on_s)
            self._slice_t0 = now
            return
        off_s = self._last_in * (1.0 - self.slice_duty) / self.slice_duty
        if spent < off_s:
            return
        if self.slice_budget is not None and self._slice_clock is not None:
            wall0, cpu0 = self._slice_clock
            if time.process_time() - cpu0 > self.slice_budget * (now - wall0):
                if not self._held_since:
                    self._held_since, self.slice_held = now, self.slice_held + 1
                return  # the budget spent: the program runs bare a while longer
        if self._held_since:
            self.slice_held_s += now - self._held_since
            self._held_since = 0.0
        if self._closing is not None:
            self._closing.join()  # the last slice's link is closed (it takes ~30 ms, off the loop)
            self._closing = None
        self._fold(budget_s=None)  # everything the last slice wrote (until its link was closed)
        self._end_slice(prog)
        t0 = time.perf_counter()
        try:
            self._link = prog.attach(self._path or "", self._offsets, self._pid, self._cookie_list)
        except B.BpfError as err:
            self.notices.append(f"uprobes: time slice {self.slices + 1} could not attach: {err}")
            self._offsets = []  # no more slices: the capture is out
            self._sliced_out = False
            return
        self.slice_attach_s.append(time.perf_counter() - t0)
        self._slice_clock = (now, time.process_time())
        self._sliced_out = False
        self.slice_out_s += spent
        self._slice_t0 = now
        self.slices += 1

    def _end_slice(self, prog: B.Program) -> None:
        engine = self.engine
        if engine is not None:
            for t in engine.threads():
                engine.resync_thread(t, [])
        prog.new_epoch()
        self._settled = set()
        self._resync.clear()

    def _root_ok(self, ev: PollEnter) -> bool:
        """An entry that starts a root poll for sure: called from a place (its
        return address) where root polls were seen and never a poll nested in
        another. A runtime polls its tasks from its own code; a coroutine polls
        another from inside its resume function or a combinator it calls."""
        ret = ev.return_addr
        return ret in self._root_rets and ret not in self._nested_rets

    def _feed_sliced(self, ev: Any, engine: Engine) -> bool:
        """Whether `ev` is fed (time slices): see _slice_step. Learns the root sites."""
        t = getattr(ev, "thread", None)
        if t is None:
            return True
        settled = self._settled
        enter = type(ev) is PollEnter
        if settled is not None and t not in settled:
            if not (enter and self._root_ok(ev)):
                self.slice_skipped += 1
                return False
            settled.add(t)
        if enter:
            if engine.current_scope(t) is None:
                self._root_rets.add(ev.return_addr)
            else:
                self._nested_rets.add(ev.return_addr)
        return True

    def slice_line(self) -> str | None:
        if self.slice_duty >= 1.0:
            return None
        # the share after the first slice, which lasts until a task's poll was seen whole
        # (a server waiting for its first request: probes in, nothing hit)
        in_s, out_s = self.slice_in_s, self.slice_out_s
        if self._offsets and (self.slices or self.first_slice_s):  # the period under way counts too
            now = self._stopped_at if self._stopped_at is not None else time.monotonic()
            cur = max(now - self._slice_t0, 0.0)
            if self._sliced_out:
                out_s += cur
            else:
                in_s += cur
        total = in_s + out_s - self.first_slice_s
        share = (in_s - self.first_slice_s) / total if total > 0 else 1.0
        cost = ""
        if self.slice_attach_s:
            cost = (f"; attach {1e3 * sum(self.slice_attach_s) / len(self.slice_attach_s):.2f} ms, detach "
                    f"{1e3 * sum(self.slice_detach_s) / max(len(self.slice_detach_s), 1):.2f} ms a slice")
        return (f"time-sliced: probes in {self.slice_duty:.0%} of the time at most, {self.slice_on_s * 1e3:.0f} ms "
                f"at a time (the first until a task's poll was seen whole: {self.first_slice_s:.1f} s; then "
                f"{self.slices} slices, in {in_s - self.first_slice_s:.1f} s of {total:.1f} s = "
                f"{share:.1%}); POLLS, BUSY, the histograms and the graph's edges come from the slices only "
                f"(not exact: about {share:.1%} of the polls); events dropped at slice starts (their thread's "
                f"root poll began outside the slice): {self.slice_skipped:,}{cost}{self._slice_budget_part()}")

    def _slice_budget_part(self) -> str:
        if self.slice_budget is None:
            return "; no CPU budget (slices at the duty whatever the proxy's CPU)"
        held = (f"held {self.slice_held:,} slices back for {self.slice_held_s:.1f} s in all"
                if self.slice_held else "never held a slice back")
        return (f"; the CPU budget ({self.slice_budget * 100:g}% of a core: a slice begins once the proxy's CPU "
                f"since the last one began is within it) {held}")
