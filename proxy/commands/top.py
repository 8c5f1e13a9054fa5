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
        return (names or {}).get(t.id) or display_name(t.path)

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
    return "\n".join([cost_line(engine), *_table(rows), *tail])


def _one(engine: Engine, task: Task, name: str) -> str:
    timing = engine.timing
    tt = timing.of(task.id)
    head = f"{task.label} {name}"
    if tt is None:
        return f"{head}: no timed poll"
    durations = timing.durations(task.id)
    busy = timing.busy_ns(task.id)
    lines = [f"{head}: {tt.polls} polls, busy {fmt_ns(busy)}, longest {fmt_ns(timing.longest_ns(task.id))}, "
             f"idle {fmt_ns(task.idle_ns)}", cost_line(engine)]
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
