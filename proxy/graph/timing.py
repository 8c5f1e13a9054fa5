"""Poll timing per task: poll count, busy time with the capture's own cost
taken out, longest poll, and a histogram of poll durations.

Theory of operation (pure, no clock): the graph state calls `PollTiming.poll`
at the end of every poll whose entry and exit both carry a timestamp
(tracepoints and uprobes record one at the hit; the breakpoints backend uses
the proxy's clock when it handles the hit). The raw duration, exit - entry,
is too long by the capture's cost: every event recorded while the poll ran
stalled the program (a ptrace stop stops every thread of the program while
gdbserver steps over), and so did the rest of the entry's own stop. With
``k`` events recorded between the entry and the exit (the gap in their
sequence numbers, on any thread) the poll's own time is about

    raw - (k + 1) * cost

where ``cost`` is the time one event takes from the program (what
``bench/bench_capture.py`` measures as µs per event). The cost is
calibrated from the run itself: a poll with no event inside (a leaf:
``yield_now``, a timer, a channel) costs exactly one event's worth (the tail
of the entry stop plus the head of the exit stop) on top of its work, which
is usually a few µs. The cost is the lower quartile of the last
`LEAF_SAMPLES` leaf polls: the shortest one is the cost on an idle machine,
but on a loaded one a stopped thread waits for a CPU after each resume, so
the typical stop costs more than the cheapest (measured: 67 µs minimum, ms
typical at load 6 on 2 cores). Until `MIN_LEAVES` leaves are seen the
backend's figure from the benchmark (`DEFAULT_COST_US`) is used. Busy times
are clamped at 0 per poll.

Busy time is inclusive: a poll's time includes the polls of the futures it
awaits (as tokio-console counts a task's busy time). Idle time (exit to
next entry) comes from the graph state (`TaskRec.idle_ns`): the capture's
cost never falls into it except for the stops of other threads.

A rewind of the engine refolds logged events; `poll` ignores exits at or
below the highest sequence number already counted, so nothing counts twice.
"""

from __future__ import annotations

from collections import OrderedDict, deque

SAMPLES = 1024  # poll durations kept per task for the histogram
MAX_TASKS = 50_000  # tasks with timing kept (the least recently polled are forgotten first)
MIN_LEAVES = 8  # polls with no event inside needed before the run calibrates the cost
LEAF_SAMPLES = 4096  # the last leaf polls' durations kept for the calibration
LEAF_QUANTILE = 0.25
# µs one event costs the program, from bench/bench_capture.py (debug ct, this machine)
DEFAULT_COST_US = {"tracepoints": 150.0, "breakpoints": 900.0, "uprobes": 12.0}


class TaskTiming:
    """One task's polls with both timestamps. One is made for every new coroutine
    instance (uprobes on a server: one or more a request), so it is a plain slotted
    class with its samples in a list trimmed by halves (`PollTiming.poll`), cheaper
    to make and to feed than a dataclass holding a deque(maxlen=SAMPLES)."""

    __slots__ = ("polls", "raw_ns", "events", "longest", "_samples")

    def __init__(self) -> None:
        self.polls = 0  # polls with both timestamps
        self.raw_ns = 0  # sum of exit - entry
        self.events = 0  # sum over those polls of 1 + events recorded inside
        self.longest = (0, 0)  # (raw_ns, events) of the poll with the longest raw time
        self._samples: list[tuple[int, int]] = []  # (raw_ns, events) per poll, the last SAMPLES..2*SAMPLES

    @property
    def samples(self) -> list[tuple[int, int]]:
        """(raw_ns, events) of the last `SAMPLES` polls, oldest first."""
        s = self._samples
        return s[-SAMPLES:] if len(s) > SAMPLES else s


class PollTiming:
    def __init__(self) -> None:
        # least recently polled first: an OrderedDict, whose oldest entry is O(1) to
        # find (a dict's first key after many deletions at its front was a scan past
        # their dummy slots: ~15 µs a call, 7% of the consumer's time on the server
        # benchmark once 50,000 tasks were kept)
        self.tasks: OrderedDict[int, TaskTiming] = OrderedDict()
        self.default_cost_ns: int | None = None  # the backend's benchmark figure (set by the session)
        self.backend: str | None = None
        self.leaf_polls = 0
        self._leaves: deque[int] = deque(maxlen=LEAF_SAMPLES)
        self._cost_cache: tuple[int, int] | None = None  # (leaf_polls, cost) of the last sort
        self._high = -1
        self.sampled: str | None = None  # what was sampled, when polls were (said by top)

    # ---- feeding (from GraphState) -----------------------------------------------
    def poll(self, task: int, enter_seq: int, exit_seq: int, enter_ns: int, exit_ns: int) -> None:
        if exit_seq <= self._high:
            return  # refolded after a rewind: counted already
        self._high = exit_seq
        raw = exit_ns - enter_ns
        if raw < 0:
            raw = 0
        hits = exit_seq - enter_seq  # 1 + the events recorded inside
        if hits <= 1:
            hits = 1
            self.leaf_polls += 1
            self._leaves.append(raw)
        # Least recently polled first out: a server's connection tasks live for
        # the whole run while ~one short task per request passes by; forgetting
        # the oldest-created (as before) restarted the connections' counts after
        # 50,000 requests (bench/bench_server.py: top had 11,206 of 66,913 polls).
        tasks = self.tasks
        t = tasks.get(task)
        if t is None:
            if len(tasks) >= MAX_TASKS:
                tasks.popitem(last=False)
            t = tasks[task] = TaskTiming()
        else:
            tasks.move_to_end(task)
        # TaskTiming.add, inline (a call per poll is ~0.1 µs of the consumer's ~5)
        t.polls += 1
        t.raw_ns += raw
        t.events += hits
        s = t._samples
        s.append((raw, hits))
        if len(s) >= 2 * SAMPLES:
            del s[:SAMPLES]
        if raw > t.longest[0]:
            t.longest = (raw, hits)

    def set_totals(self, task: int, polls: int, raw_ns: int, events: int) -> None:
        """A task's exact totals counted elsewhere (uprobe capture folds every poll
        in the kernel and records a sample of them): they replace what the
        recorded polls added up to; the duration samples stay the recorded ones."""
        t = self.tasks.get(task)
        if t is None:
            if len(self.tasks) >= MAX_TASKS:
                self.tasks.popitem(last=False)
            t = self.tasks[task] = TaskTiming()
        else:
            self.tasks.move_to_end(task)
        t.polls, t.raw_ns, t.events = polls, raw_ns, events

    def set_backend(self, name: str | None) -> None:
        """The capture backend in use: its benchmark cost until the run calibrates its own."""
        if name != self.backend:
            self.backend = name
            us = DEFAULT_COST_US.get(name or "")
            self.default_cost_ns = int(us * 1000) if us is not None else None

    # ---- questions ----------------------------------------------------------------
    def cost(self) -> tuple[int, str]:
        """(ns per event subtracted, where the figure comes from)."""
        if self.leaf_polls >= MIN_LEAVES:
            if self._cost_cache is None or self._cost_cache[0] != self.leaf_polls:
                leaves = sorted(self._leaves)
                self._cost_cache = (self.leaf_polls, leaves[int(len(leaves) * LEAF_QUANTILE)])
            return self._cost_cache[1], (f"calibrated: the lower quartile of {len(self._leaves)} polls "
                                         "with no event inside")
        if self.default_cost_ns is not None:
            return self.default_cost_ns, f"{self.backend}'s figure from bench/bench_capture.py"
        return 0, "not known: raw durations"

    def of(self, task: int) -> TaskTiming | None:
        return self.tasks.get(task)

    def busy_ns(self, task: int) -> int:
        t = self.tasks.get(task)
        if t is None:
            return 0
        c, _ = self.cost()
        if len(t.samples) == t.polls:  # every poll kept: clamp each at 0
            return sum(max(r - e * c, 0) for r, e in t.samples)
        return max(t.raw_ns - t.events * c, 0)

    def longest_ns(self, task: int) -> int:
        t = self.tasks.get(task)
        if t is None:
            return 0
        c, _ = self.cost()
        cands = [t.longest, *t.samples]
        return max(max(r - e * c, 0) for r, e in cands)

    def durations(self, task: int) -> list[int]:
        """The last `SAMPLES` poll durations of the task, cost subtracted (ns)."""
        t = self.tasks.get(task)
        if t is None:
            return []
        c, _ = self.cost()
        return [max(r - e * c, 0) for r, e in t.samples]


def fmt_ns(ns: int | float) -> str:
    """1234 -> '1us', 2_500_000 -> '2.5ms'; 3 significant digits."""
    if ns < 1_000:
        return f"{ns:.0f}ns"
    for unit, div in (("us", 1e3), ("ms", 1e6), ("s", 1e9)):
        v = ns / div
        if v < 1000 or unit == "s":
            return f"{v:.3g}{unit}"
    return f"{ns:.0f}ns"  # pragma: no cover - the loop always returns


def histogram(values: list[int]) -> list[tuple[int, int, int]]:
    """Buckets of powers of two in µs: (low ns, high ns, count), empty ends trimmed."""
    if not values:
        return []
    buckets: dict[int, int] = {}
    for v in values:
        us = v // 1000
        b = us.bit_length()  # 0: < 1 µs; b: [2^(b-1), 2^b) µs
        buckets[b] = buckets.get(b, 0) + 1
    lo, hi = min(buckets), max(buckets)
    out = []
    for b in range(lo, hi + 1):
        low = 0 if b == 0 else (1 << (b - 1)) * 1000
        out.append((low, (1 << b) * 1000, buckets.get(b, 0)))
    return out
