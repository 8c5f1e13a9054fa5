"""``monitor async top [N | TASK]`` and the timing columns of ``tasks``.

Pure renderers over the engine's `PollTiming` (proxy/graph/timing.py):

* ``top [N]``: the N (default 20) tasks with the most busy time, with their
  polls, busy time (the capture's cost per event subtracted), mean and
  longest poll, idle time and async fn; the first line says which cost was
  subtracted and where it comes from;
* ``top TASK``: the histogram of that task's poll durations (the last
  `timing.SAMPLES` polls, cost subtracted), powers of two in µs.
"""

from __future__ import annotations

from proxy.graph.engine import Engine
from proxy.graph.model import Task
from proxy.graph.timing import SAMPLES, histogram

DEFAULT_TOP = 20
BAR = 40


def fmt_ns(ns: int | float) -> str:
    """1234 -> '1us', 2_500_000 -> '2.5ms'; 3 significant digits."""
    if ns < 1_000:
        return f"{ns:.0f}ns"
    for unit, div in (("us", 1e3), ("ms", 1e6), ("s", 1e9)):
        v = ns / div
        if v < 1000 or unit == "s":
            return f"{v:.3g}{unit}"
    return f"{ns:.0f}ns"  # pragma: no cover - the loop always returns


def has_timing(engine: Engine) -> bool:
    return bool(engine.timing.tasks)


def timing_cells(engine: Engine, task: Task) -> tuple[str, str, str]:
    """(busy, idle, longest) for the ``tasks`` table; '-' when the task has no timed poll."""
    t = engine.timing.of(task.id)
    if t is None:
        return "-", "-", "-"
    return fmt_ns(engine.timing.busy_ns(task.id)), fmt_ns(task.idle_ns), fmt_ns(engine.timing.longest_ns(task.id))


def cost_line(engine: Engine) -> str:
    cost, source = engine.timing.cost()
    line = f"capture cost subtracted: {fmt_ns(cost)} per event ({source})"
    if engine.timing.sampled:
        line += "\n" + engine.timing.sampled
    return line


def render_top(engine: Engine, args: tuple[str, ...], names: dict[int, str] | None = None) -> str:
    """``top [N]`` or ``top TASK`` (a task is ``#ID`` or an address); errors raise ValueError.
    ``names``: task id -> the snapshot's name of that coroutine (the same as every command's)."""
    from proxy.snapshot.names import display_name

    def name(t: Task) -> str:
        return ((names or {}).get(t.id) or display_name(t.path)) + window_mark(t)

    if len(args) > 1:
        raise ValueError("usage: top [N | TASK]")
    if args and not args[0].isdigit():
        task = engine.task(args[0])
        if task is None:
            raise ValueError(f"no task {args[0]!r} (see 'monitor async tasks')")
        return _one(engine, task, name(task))
    limit = int(args[0]) if args else DEFAULT_TOP
    if not has_timing(engine):
        return "no timed polls yet (the capture records no timestamps, or no poll has ended)"
    timing = engine.timing
    tasks = [t for t in engine.tasks() if timing.of(t.id) is not None]
    tasks.sort(key=lambda t: (-timing.busy_ns(t.id), t.id))
    rows: list[tuple[str, ...]] = [("ID", "BUSY", "POLLS", "MEAN", "LONGEST", "IDLE", "ASYNC FN")]
    for t in tasks[:limit]:
        tt = timing.of(t.id)
        assert tt is not None
        busy = timing.busy_ns(t.id)
        rows.append((t.label, fmt_ns(busy), str(tt.polls), fmt_ns(busy / tt.polls),
                     fmt_ns(timing.longest_ns(t.id)), fmt_ns(t.idle_ns), name(t)))
    more = len(tasks) - limit
    tail = [f"... {more} more (monitor async top N)"] if more > 0 else []
    tail += window_notes(tasks[:limit])
    return "\n".join([cost_line(engine), *_table(rows), *tail])


def window_mark(task: Task) -> str:
    """' [in W::poll]' for a coroutine probed through its wrapper's poll (``ResumeFn.wrapper``:
    its own poll inlined there): its POLLS are the wrapper's, its BUSY the wrapper's window."""
    w = _wrapper(task)
    return f" [in {w}::poll]" if w else ""


def window_notes(tasks: list[Task]) -> list[str]:
    """What each window mark shown means (once per wrapper)."""
    seen = sorted({w for t in tasks if (w := _wrapper(t))})
    return [f"[in {w}::poll]: the coroutine's poll is inlined into {w}<F>::poll (no code of its own): BUSY is "
            f"that poll's window{WRAPPER_WINDOWS.get(w, '')}" for w in seen]


# what a wrapper's window holds besides the coroutine's poll
WRAPPER_WINDOWS = {"Instrumented": ", the span's enter and exit included (tracing's dispatch and the subscriber's "
                   "callbacks: console-subscriber times from inside the enter to inside the exit)"}


def _wrapper(task: Task) -> str:
    from proxy.analysis.inventory import WRAPPERS

    for w in WRAPPERS:
        if task.type_name.startswith(w):
            return w[:-1].rsplit("::", 1)[-1]
    return ""


def _one(engine: Engine, task: Task, name: str) -> str:
    timing = engine.timing
    tt = timing.of(task.id)
    head = f"{task.label} {name}"
    if tt is None:
        return f"{head}: no timed poll"
    notes = window_notes([task])
    durations = timing.durations(task.id)
    busy = timing.busy_ns(task.id)
    lines = [f"{head}: {tt.polls} polls, busy {fmt_ns(busy)}, longest {fmt_ns(timing.longest_ns(task.id))}, "
             f"idle {fmt_ns(task.idle_ns)}", cost_line(engine), *notes]
    kept = f"the last {len(durations)}" if tt.polls > len(durations) else f"all {len(durations)}"
    lines.append(f"poll durations ({kept} polls; at most {SAMPLES} kept):")
    buckets = histogram(durations)
    peak = max(c for _, _, c in buckets)
    for low, high, count in buckets:
        bar = "#" * (round(count * BAR / peak) if count else 0)
        lines.append(f"  {fmt_ns(low):>7} .. {fmt_ns(high):<7} {count:6d} {bar}")
    return "\n".join(lines)


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    from proxy.commands.tasks import table

    return table(rows)
