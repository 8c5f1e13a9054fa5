"""Full mode under load: the kernel samples while the proxy is behind.

Full mode records every poll (`capture.py`), and the proxy folds each record
in Python (~10 µs). A busy server writes more than one core's worth of that:
the axum benchmark, ~22,000 requests/s at 8 records each, needs 1.5-1.9
cores of folding and the proxy gets ~0.6. Without a bound the unread records
(the ring, then the backlog copied out of it) grow until the backlog is full
and records are lost, and a stop waits for all of them to be folded first
(~6 s after 5 s of load, docs/history/2026-speed.md).

`CatchUp` bounds them. After each fold the capture tells it how many records
are unread; past the high-water mark the BPF program is switched to sampling
(`sample_every` N, one map write, no relinking): one root poll in N per
coroutine instance recorded, every new instance's first poll recorded. Once
the proxy is down to the low-water mark, and at every stop (everything is
folded then), every poll is recorded again. The marks are in seconds of
folding (the cost per record is measured as the capture folds), so the time
a stop waits for the fold stays about the high-water mark's.

What stays exact: under the catch-up the kernel folds every poll into its
instance's totals all the time (`CFG_ADAPT`, no `CFG_NOFOLD`), and the
capture gives the engine those totals at each stop (`set_totals` replaces
what the recorded polls added up to: a poll both recorded and folded counts
once). A life whose every poll was recorded sends no totals (the engine
counted it); one with unrecorded polls sends them when its address starts a
new life. So POLLS and BUSY of every task are exact across the switches;
the graph's edges and states, the histograms and LONGEST come from the
recorded polls, and `top` and `stats` say so once any sampling happened.
While sampling, a new task's first poll is held back (CFG_HOLD_NEW): a task
done in its first poll writes nothing (counted in the kernel, the engine's
ids and finished count kept), one that suspends goes out late, so every task
alive at a stop is in the graph.

The CPU budget (`--uprobe-budget`, 10% of a core by default): being behind
is not the only harm. On a 2-core machine a watcher that folds whenever
records are unread is always runnable and takes its CPU from the program
(the axum benchmark: ~0.97 of a core, the single-threaded server got ~0.65).
So while the program runs the fold is paced by the process's own CPU clock
(a token bucket: `budget` CPU seconds a second, at most `BURST_S` saved up;
everything the process did counts, the fold, the ring, the unwinder): once
spent, the capture folds nothing until the next tick, the unread records
grow, and past the high mark the kernel samples. The share of the time every
poll was recorded then follows the budget (about budget / the CPU that
recording every poll would need). At a stop the program does not run: the
fold takes what it needs, so a stop still waits for about the high mark.

The nested probes follow the budget (`NestedProbes`, full mode under a CPU
budget): while the kernel samples, the probes of the resume functions polled
only inside other polls (the kernel counts, per entry site, the entries made
with a poll in progress on their thread: `site_nested`) are taken out (their
link closed: no trap at all there), and the tasks' own probes stay, so the
kernel still folds every task poll into its totals (POLLS and BUSY exact). On
the axum benchmark a request then traps 4 times instead of 10. They come back
once the proxy caught up (every poll recorded again) and were out at least
`MIN_OUT_S`, and at every stop (the stop folds everything). What the out time
costs the user: the nested coroutines' polls, the edges under the tasks and
the histograms are of the in time only (nested.py `_nested_step` says how the
graph stays consistent across the switches).
"""

from __future__ import annotations

HIGH_S = 0.25  # fold time of the unread records past which the kernel samples
LOW_S = 0.05  # ... under which every poll is recorded again
COST_S = 10e-6  # a record's fold before any is measured (axum, docs/history/2026-speed.md)
BUDGET = 0.10  # share of one core the watcher may take while the program runs (--uprobe-budget)
BURST_S = 0.05  # CPU seconds the watcher may save up in a quiet spell and spend at once
MIN_OUT_S = 0.5  # the nested probes stay out at least this long once taken out (NestedProbes)


class CatchUp:
    """When to sample (sans-IO: the capture gives it the unread records and the
    clock, it answers with the `sample_every` to write; the kernel's hit counter
    at each switch gives the share of the hits sampled)."""

    def __init__(self, every: int = 64, high_s: float = HIGH_S, low_s: float = LOW_S,
                 marks: tuple[int, int] | None = None, budget: float | None = None) -> None:
        self.every = max(int(every), 2)
        self.budget = budget if budget is not None and 0 < budget < 1 else None  # None: fold at will
        self._tokens = 0.0  # CPU seconds the watcher may still spend (below 0: overspent)
        self._clock: tuple[float, float] | None = None  # (wall, CPU) at the last look while running
        self.run_s = 0.0  # the program's running time under the budget (looks while running)
        self.cpu_s = 0.0  # the watcher's CPU over that time
        self.held = 0  # looks that folded nothing: the budget spent
        self.high_s, self.low_s = high_s, low_s
        self.fixed = marks  # (high, low) in records, instead of the measured ones (tests)
        self.cost_s = COST_S
        self.sampling = False
        self.t0: float | None = None
        self.switches = 0  # times it went to sampling
        self.sampled_s = 0.0  # time spent sampling, closed periods
        self._since = 0.0
        self.hits_sampled = 0  # probe hits while sampling, closed periods
        self._hits_at = 0
        self.peak = 0  # most records unread at a look
        self.longest_s = 0.0  # the longest sampling period

    def measured(self, records: int, seconds: float) -> None:
        """A fold of `records` took `seconds` (the consumer's cost per record)."""
        if records >= 256 and seconds > 0:
            self.cost_s = 0.8 * self.cost_s + 0.2 * seconds / records

    def allowance(self, now: float, cpu: float) -> float | None:
        """While the program runs, at each look: the seconds of folding the budget
        allows now (0: none until the next look; None: no budget). `cpu` is the
        process's own CPU clock: whatever it spent since the last look is paid."""
        if self.budget is None:
            return None
        if self._clock is not None:
            dw, dc = max(now - self._clock[0], 0.0), max(cpu - self._clock[1], 0.0)
            self.run_s += dw
            self.cpu_s += dc
            self._tokens = max(min(self._tokens + self.budget * dw - dc, BURST_S), -BURST_S)
        self._clock = (now, cpu)
        if self._tokens <= 0:
            self.held += 1
            return 0.0
        return self._tokens

    def stopped(self) -> None:
        """The program stopped: the fold at the stop is not paced (the program does not
        run), and the clock starts again at the first look after the resume."""
        self._clock = None

    def marks(self) -> tuple[int, int]:
        """(high, low) water in records."""
        if self.fixed is not None:
            return self.fixed
        return max(round(self.high_s / self.cost_s), 1000), max(round(self.low_s / self.cost_s), 100)

    def step(self, unread: int, now: float) -> int | None:
        """After a fold, `unread` records left: the `sample_every` to write now, or
        None (no change; then `switched` once it is written)."""
        if self.t0 is None:
            self.t0 = now
        self.peak = max(self.peak, unread)
        high, low = self.marks()
        if not self.sampling and unread > high:
            return self.every
        if self.sampling and unread <= low:
            return 1
        return None

    def switched(self, every: int, now: float, hits: int) -> None:
        """The program now samples 1 in `every` (1: records every poll)."""
        if every > 1 and not self.sampling:
            self.sampling, self._since, self._hits_at = True, now, hits
            self.switches += 1
        elif every <= 1 and self.sampling:
            self.sampling = False
            self.sampled_s += now - self._since
            self.longest_s = max(self.longest_s, now - self._since)
            self.hits_sampled += max(hits - self._hits_at, 0)

    def totals(self, now: float, hits: int) -> tuple[float, float, int]:
        """(seconds sampled, seconds since the first look, hits while sampling) so far."""
        s, h = self.sampled_s, self.hits_sampled
        if self.sampling:
            s += now - self._since
            h += max(hits - self._hits_at, 0)
        return s, (now - self.t0) if self.t0 is not None else 0.0, h

    def line(self, now: float, hits: int) -> str:
        """`stats`: when and how long the capture sampled."""
        high, low = self.marks()
        s, total, h = self.totals(now, hits)
        head = (f"catch-up: every poll recorded while the proxy keeps up; past {high:,} unread records "
                f"(~{high * self.cost_s:.2f} s of folding at {self.cost_s * 1e6:.1f} µs a record) the kernel "
                f"samples 1 root poll in {self.every} per instance until {low:,} are left")
        head += ("; while sampling a new task's first poll is held back (done in it: counted, not recorded)"
                 + self.budget_part())
        if not self.switches:
            return head + f"; never behind (at most {self.peak:,} unread)"
        return (head + f"; sampled {self.switches} times ({'sampling now; ' if self.sampling else ''}"
                f"{s:.1f} s of {total:.1f} s = {s / total if total > 0 else 0:.1%} of the time, the longest "
                f"{self.longest_s:.2f} s; {h:,} of {hits:,} probe hits = {h / hits if hits else 0:.1%} in "
                f"sampled periods; at most {self.peak:,} unread); POLLS and BUSY exact (every poll counted "
                "in the kernel), the graph's edges, the histograms and LONGEST from the recorded polls")

    def budget_part(self) -> str:
        """`stats`: the budget and what the watcher took while the program ran."""
        if self.budget is None:
            return "; no CPU budget (the proxy folds whenever records are unread)"
        share = self.cpu_s / self.run_s if self.run_s > 0 else 0.0
        return (f"; CPU budget {self.budget * 100:g}% of a core while the program runs: the proxy took "
                f"{self.cpu_s:.2f} s of CPU in {self.run_s:.1f} s running = {share:.1%} of a core "
                f"(folding held {self.held:,} times)")

    def note(self, recorded: int, polls: int) -> str | None:
        """`top`'s caveat once sampling happened (None: every poll recorded so far)."""
        if not self.switches:
            return None
        return (f"sampled while the proxy was behind ({self.switches} times, {self.sampled_s:.1f} s; "
                f"{recorded:,} of {polls:,} polls of the live instances recorded): POLLS and BUSY are exact "
                "(counted in the kernel), LONGEST and histograms from the recorded polls; tasks done in their "
                "first poll while sampling are not rows (stats counts them)")


class NestedProbes:
    """When full mode's nested-only probes are in (sans-IO: the capture gives it
    the catch-up's state and the clock, it answers take out / put back / leave).

    Out while the catch-up samples (the proxy behind, or its CPU budget spent);
    back in once the catch-up records every poll again and they were out at
    least `min_out_s` (hysteresis: each switch costs a link's close, ~30 ms of
    the kernel's in a thread, and an attach, 10-24 ms, and the graph forgets
    the nested coroutines it knew; the catch-up's own marks already keep the
    switches seconds apart under a steady load), and at a stop whatever the
    time (everything is folded then: the catch-up records every poll again)."""

    def __init__(self, min_out_s: float = MIN_OUT_S) -> None:
        self.min_out_s = min_out_s
        self.out = False
        self.outs = 0  # times taken out
        self.out_s = 0.0  # closed out periods
        self.longest_s = 0.0
        self._since = 0.0  # the current out period's start
        self.t0: float | None = None  # the first look
        self.stopped_s = 0.0  # time the program was stopped (not running time)
        self._stopped_at: float | None = None

    def want(self, sampling: bool, now: float, stopped: bool = False) -> bool | None:
        """True: take the nested probes out now; False: put them back now; None: leave them."""
        if self.t0 is None:
            self.t0 = now
        if not self.out:
            return True if sampling and not stopped else None
        if stopped or (not sampling and now - self._since >= self.min_out_s):
            return False
        return None

    def moved(self, out: bool, now: float) -> None:
        """The probes are now out (True) or in (False)."""
        if out and not self.out:
            self.out, self._since = True, now
            self.outs += 1
        elif not out and self.out:
            self.out = False
            spent = now - self._since - self._stopped_within(now)
            self.out_s += spent
            self.longest_s = max(self.longest_s, spent)

    def _stopped_within(self, now: float) -> float:
        return (now - self._stopped_at) if self._stopped_at is not None and self._stopped_at >= self._since else 0.0

    def stop(self, now: float) -> None:
        if self._stopped_at is None:
            self._stopped_at = now

    def resume(self, now: float) -> None:
        if self._stopped_at is not None:
            self.stopped_s += now - self._stopped_at
            if self.out:  # out across the stop: the stop is not out time
                self._since += now - self._stopped_at
            self._stopped_at = None

    def totals(self, now: float) -> tuple[float, float]:
        """(seconds out, seconds running since the first look)."""
        out = self.out_s + (now - self._since - self._stopped_within(now) if self.out else 0.0)
        stopped = self.stopped_s + (now - self._stopped_at if self._stopped_at is not None else 0.0)
        run = (now - self.t0 - stopped) if self.t0 is not None else 0.0
        return max(out, 0.0), max(run, 0.0)

    def share(self, now: float) -> float:
        out, run = self.totals(now)
        return out / run if run > 0 else 0.0
