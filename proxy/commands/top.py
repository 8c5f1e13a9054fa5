"""``monitor async top [N | TASK]`` and the timing columns of ``tasks``.

Pure renderers of the snapshot's timing (proxy/snapshot/timing.py: the engine's
`PollTiming` at the stop):

* ``top [N]``: the N (default 20) tasks with the most busy time, with their
  polls, busy time (the capture's cost per event subtracted), mean and
  longest poll, idle time and async fn; the first line says which cost was
  subtracted and where it comes from;
* ``top TASK``: the histogram of that task's poll durations (the last
  `timing.SAMPLES` polls, cost subtracted), powers of two in µs.
"""

from __future__ import annotations

from typing import Any

from proxy.graph.timing import SAMPLES, fmt_ns, histogram
from proxy.snapshot.timing import StopTiming, TaskTiming

DEFAULT_TOP = 20
BAR = 40


def timing_cells(task: TaskTiming | None) -> tuple[str, str, str]:
    """(busy, idle, longest) for the ``tasks`` table; '-' when the task has no timed poll."""
    if task is None or not task.timed:
        return "-", "-", "-"
    return fmt_ns(task.busy_ns), fmt_ns(task.idle_ns), fmt_ns(task.longest_ns)


def cost_line(timing: StopTiming) -> str:
    cost, source = timing.cost()
    line = f"capture cost subtracted: {fmt_ns(cost)} per event ({source})"
    if timing.sampled:
        line += "\n" + timing.sampled
    return line


def render_top(timing: StopTiming, args: tuple[str, ...], names: dict[int, str] | None = None,
               wakes: Any = None) -> str:
    """``top [N]`` or ``top TASK`` (a task is ``#ID`` or an address); errors raise ValueError.
    ``names``: task id -> the snapshot's name of that coroutine (the same as every command's).
    ``wakes``: the tasks' wake columns and scheduling delays (``proxy.commands.wakes.WakeColumns``)."""
    from proxy.snapshot.names import display_name

    def name(t: TaskTiming) -> str:
        return ((names or {}).get(t.id) or display_name(t.path)) + window_mark(t)

    if len(args) > 1:
        raise ValueError("usage: top [N | TASK]")
    if args and not args[0].isdigit():
        task = timing.task(args[0])
        if task is None:
            raise ValueError(f"no task {args[0]!r} (see 'monitor async tasks')")
        return "\n".join([_one(timing, task, name(task)), *(wakes.histogram(task) if wakes is not None else [])])
    limit = int(args[0]) if args else DEFAULT_TOP
    if not timing:
        return "no timed polls yet (the capture records no timestamps, or no poll has ended)"
    tasks = timing.ranked()
    extra = wakes.head if wakes is not None else ()
    rows: list[tuple[str, ...]] = [("ID", "BUSY", "POLLS", "MEAN", "LONGEST", "IDLE", *extra, "ASYNC FN")]
    for t in tasks[:limit]:
        rows.append((t.label, fmt_ns(t.busy_ns), str(t.polls), fmt_ns(t.busy_ns / t.polls),
                     fmt_ns(t.longest_ns), fmt_ns(t.idle_ns), *(wakes.cells(t) if wakes else ()), name(t)))
    more = len(tasks) - limit
    tail = [f"... {more} more (monitor async top N)"] if more > 0 else []
    tail += window_notes(tasks[:limit])
    tail += wakes.notes() if wakes is not None else []
    return "\n".join([cost_line(timing), *_table(rows), *tail])


def window_mark(task: TaskTiming) -> str:
    """' [in W::poll]' for a coroutine probed through its wrapper's poll (``ResumeFn.wrapper``:
    its own poll inlined there): its POLLS are the wrapper's, its BUSY the wrapper's window."""
    w = _wrapper(task)
    return f" [in {w}::poll]" if w else ""


def window_notes(tasks: list[TaskTiming]) -> list[str]:
    """What each window mark shown means (once per wrapper)."""
    seen = sorted({w for t in tasks if (w := _wrapper(t))})
    return [f"[in {w}::poll]: the coroutine's poll is inlined into {w}<F>::poll (no code of its own): BUSY is "
            f"that poll's window{WRAPPER_WINDOWS.get(w, '')}" for w in seen]


# what a wrapper's window holds besides the coroutine's poll
WRAPPER_WINDOWS = {"Instrumented": ", the span's enter and exit included (tracing's dispatch and the subscriber's "
                   "callbacks: console-subscriber times from inside the enter to inside the exit)"}


def _wrapper(task: TaskTiming) -> str:
    from proxy.analysis.inventory import WRAPPERS

    for w in WRAPPERS:
        if task.type_name.startswith(w):
            return w[:-1].rsplit("::", 1)[-1]
    return ""


def _one(timing: StopTiming, task: TaskTiming, name: str) -> str:
    head = f"{task.label} {name}"
    if not task.timed:
        return f"{head}: no timed poll"
    notes = window_notes([task])
    durations = timing.durations(task.id)
    lines = [f"{head}: {task.polls} polls, busy {fmt_ns(task.busy_ns)}, longest {fmt_ns(task.longest_ns)}, "
             f"idle {fmt_ns(task.idle_ns)}", cost_line(timing), *notes]
    kept = f"the last {len(durations)}" if task.polls > len(durations) else f"all {len(durations)}"
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
