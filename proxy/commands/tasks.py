"""``monitor async tasks``: the live tasks of the stop's snapshot, as a table.

* one row per live task (id, address, state, the innermost coroutine's line
  (where it runs, or the .await it waits at), polls and timing
  when observed, thread, what found it, async fn); finished coroutine
  instances are one line at the end, ``tasks --all`` lists the ones still
  retained;
* ``--group``: tasks waiting at the same ``.await`` line (same state, same
  async fn) are one row with a count, the way Delve groups goroutines;
* filters: ``--state running|suspended|unresumed``, ``--fn REGEX`` (the async
  fn's name), ``--waits-on WHAT`` (a resource kind such as ``Mutex``, an
  address, or ``#N``: waits on task N's JoinHandle or on what #N holds);
* at most ``--limit N`` rows (default 50; 0: all), then a count of the rest
  and how to see them.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from proxy.snapshot.model import Snapshot, StateKind, Task

DEFAULT_LIMIT = 50
STATES = {"running": StateKind.RUNNING, "suspended": StateKind.SUSPENDED,
          "unresumed": StateKind.UNRESUMED, "not-yet-polled": StateKind.UNRESUMED,
          "finished": StateKind.FINISHED, "panicked": StateKind.PANICKED, "unknown": StateKind.UNKNOWN}
USAGE = "tasks [--all] [--group] [--state STATE] [--fn REGEX] [--waits-on WHAT] [--limit N]"


class TasksError(ValueError):
    pass


def select(snap: Snapshot, *, all_: bool = False, state: str | None = None, fn: str | None = None,
           waits_on: str | None = None) -> list[Task]:
    tasks = list(snap.tasks) if all_ else snap.live()
    if state is not None:
        kind = STATES.get(state.lower())
        if kind is None:
            raise TasksError(f"unknown state {state!r}; one of {', '.join(sorted(set(STATES) - {'not-yet-polled'}))}")
        tasks = [t for t in tasks if t.state.kind is kind]
    if fn is not None:
        try:
            rx = re.compile(fn)
        except re.error as e:
            raise TasksError(f"bad --fn regex {fn!r}: {e}") from None
        tasks = [t for t in tasks if any(rx.search(n.name) for n in t.coroutines())]
    if waits_on is not None:
        tasks = [t for t in tasks if _waits_on(snap, t, waits_on)]
    return tasks


def _waits_on(snap: Snapshot, t: Task, what: str) -> bool:
    w = what.lower()
    target: int | None = None
    if w.startswith("#"):
        other = snap.task(what)
        if other is None:
            return False
        held = {h.resource for h in other.holds}
        for wait in t.waits:
            if wait.resource in held or (wait.wakers is not None and other.id in wait.wakers):
                return True
        return False
    if w.startswith("0x"):
        try:
            target = int(w, 16)
        except ValueError:
            raise TasksError(f"bad address {what!r}") from None
    for wait in t.waits:
        if target is not None and wait.resource.addr == target:
            return True
        if target is None and wait.resource.kind.lower() == w:
            return True
    return False


def render_tasks(snap: Snapshot, tasks: list[Task], *, limit: int = DEFAULT_LIMIT, timing: Callable[[Task], tuple[str, str, str]] | None = None,
                 all_: bool = False, extra: tuple[str, Callable[[Task], str]] | None = None) -> str:
    """``extra``: (heading, cell of a task) of one more column, the last (SPAWNED AT: a cell without
    spaces); left out when no task shown has a value in it."""
    lines = list(snap.notes)
    if not tasks:
        lines.append("no live tasks" + ("" if snap.tasks else " found"))
    else:
        head = ("ID", "ADDRESS", "STATE", "AT", "POLLS", *(("BUSY", "IDLE", "LONGEST") if timing else ()),
                "THREAD", "FOUND BY", "ASYNC FN")
        rows = [head]
        shown = tasks if limit <= 0 else tasks[:limit]
        cells = [extra[1](t) for t in shown] if extra else []
        if any(c != "-" for c in cells):
            rows[0] = (*head, extra[0])  # type: ignore[index]
        else:
            cells = []
        for i, t in enumerate(shown):
            s = t.stats
            rows.append((t.label, f"0x{t.addr:x}", _state(t), str(t.location or "-"), str(s.polls) if s else "-",
                         *(timing(t) if timing else ()),
                         str(_thread(t)) if _thread(t) is not None else "-",
                         ", ".join(t.found_by), t.name, *((cells[i],) if cells else ())))
        lines += table(rows)
        if len(tasks) > len(shown):
            lines.append(f"... {len(tasks) - len(shown)} more tasks ({len(tasks)} in all): "
                         "tasks --limit 0 for all, --group to group them by .await line, or filter"
                         " with --state / --fn / --waits-on")
    if snap.finished and not all_:
        lines.append(f"{snap.finished} finished since the start; tasks --all lists those still retained")
    return "\n".join(lines)


def _state(t: Task) -> str:
    """The task's state without its line (AT says where its innermost coroutine is)."""
    return t.state.word


def _thread(t: Task) -> int | None:
    if t.state.thread is not None:
        return t.state.thread
    return t.stats.last_thread if t.stats is not None else None


def render_groups(snap: Snapshot, tasks: list[Task], *, limit: int = DEFAULT_LIMIT) -> str:
    """One row per (state, line, async fn) with the count and the first ids."""
    groups: dict[tuple[str, str, str], list[Task]] = {}
    keys: dict[tuple[object, ...], tuple[str, str, str]] = {}  # the row of each (state, line, fns): made once
    for t in tasks:
        f = t.frame
        raw = (t.state.kind, t.state.thread, f.loc if f is not None else t.state.loc, t.name,
               f.name if f is not None else None)
        key = keys.get(raw)
        if key is None:
            kind = t.state.word
            loc = str(t.location) if t.location is not None else "-"
            key = keys[raw] = (kind, loc, _innermost(t))
        groups.setdefault(key, []).append(t)
    lines = list(snap.notes)
    if not groups:
        lines.append("no live tasks")
        return "\n".join(lines)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    shown = ordered if limit <= 0 else ordered[:limit]
    rows = [("COUNT", "STATE", "AT", "ASYNC FN", "TASKS")]
    for (kind, loc, name), members in shown:
        ids = " ".join(t.label for t in members[:4]) + (" ..." if len(members) > 4 else "")
        rows.append((str(len(members)), kind, loc, name, ids))
    lines += table(rows)
    lines.append(f"{len(tasks)} tasks in {len(groups)} groups")
    if len(ordered) > len(shown):
        lines.append(f"... {len(ordered) - len(shown)} more groups: tasks --group --limit 0 for all")
    if snap.finished:
        lines.append(f"{snap.finished} finished since the start; tasks --all lists those still retained")
    return "\n".join(lines)


def _innermost(t: Task) -> str:
    """The group's async fn: the task's, and the coroutine whose line AT is when it is another."""
    f = t.frame
    if f is not None and f.name != t.name:
        return f"{t.name} > {f.name}"
    return t.name


def table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
