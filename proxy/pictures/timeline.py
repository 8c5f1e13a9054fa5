"""The recorded polls as a Chrome Trace Event JSON document (pure).

The format (Trace Event Format, the JSON that Perfetto's UI and
chrome://tracing open): a ``traceEvents`` list; timestamps and durations in
microseconds. What is written:

* pid 1, "tasks": one track (tid) per task, named ``task #N NAME``. Each
  recorded poll is a complete slice (``"ph": "X"``) named by the coroutine
  polled, on the track of the task it ran in: the outermost poll around it on
  its OS thread, so a task's awaited coroutines are slices nested inside its
  own polls. tid = the task's id.
* pid 2, "threads": one track per OS thread (tid = the LWP) with the same
  slices: who ran where.
* await edges as flow events (``"ph": "s"`` / ``"f"``): from the poll of the
  awaiting coroutine to the first recorded poll of the coroutine it awaits,
  once per (parent, child).
* stops as global instant events (``"ph": "i"``, ``"s": "g"``), named
  ``stop N``.

Timestamps are the capture's own (CLOCK_MONOTONIC), in µs with ns kept as
three decimals: ``ts`` = entry, ``dur`` = exit - entry, exactly as recorded.
Each slice's ``args`` carry the coroutine's id and address, the thread, and
the entry and exit sequence numbers. Wakes where the capture records them
(uprobes: each runtime task's newest, ``proxy.origins.records.WakeStats``): an
instant ``woken`` on the woken task's track, and a flow from the waker's poll to
the woken task's next poll (``wake_events``); ``otherData`` says which.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from proxy.graph.polls import Poll, StopMark

TASKS_PID = 1
THREADS_PID = 2


def nesting(polls: Iterable[Poll]) -> tuple[dict[int, Poll], dict[int, Poll]]:
    """By exit seq: the outermost poll around each poll on its thread (itself when
    outermost), and the poll directly around it (outermost polls: none).

    Polls of one thread nest by their sequence numbers (a poll entered inside
    another ends before it): a stack per thread, in entry order."""
    top: dict[int, Poll] = {}
    around: dict[int, Poll] = {}
    by_thread: dict[int, list[Poll]] = {}
    for p in polls:
        by_thread.setdefault(p.thread, []).append(p)
    for ps in by_thread.values():
        ps.sort(key=lambda p: p.enter_seq)
        stack: list[Poll] = []
        for p in ps:
            while stack and stack[-1].exit_seq < p.enter_seq:
                stack.pop()
            top[p.exit_seq] = stack[0] if stack else p
            if stack:
                around[p.exit_seq] = stack[-1]
            stack.append(p)
    return top, around


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def trace(polls: Iterable[Poll], stops: Iterable[StopMark], name_of: Callable[[int], str],
          task_names: Mapping[int, str] | None = None, *, dropped: int = 0, wakes: Iterable[Any] = (),
          task_addrs: Mapping[int, int] | None = None) -> dict[str, Any]:
    """The trace document. ``name_of(site)``: a resume function's coroutine name;
    ``task_names``: task id -> name where the stop's snapshot knows it; ``wakes``: the
    runtime tasks' wake statistics where the capture records them (``WakeStats``: the
    newest wakes of each), ``task_addrs``: task address -> id (the snapshot's tasks)."""
    polls = sorted(polls, key=lambda p: p.enter_seq)
    task_names = task_names or {}
    top, around = nesting(polls)
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": TASKS_PID, "name": "process_name", "args": {"name": "tasks"}},
        {"ph": "M", "pid": TASKS_PID, "name": "process_sort_index", "args": {"sort_index": 0}},
        {"ph": "M", "pid": THREADS_PID, "name": "process_name", "args": {"name": "threads"}},
        {"ph": "M", "pid": THREADS_PID, "name": "process_sort_index", "args": {"sort_index": 1}},
    ]
    names: dict[int, str] = {}
    tracks: dict[int, str] = {}
    threads: set[int] = set()
    slices: list[dict[str, Any]] = []
    flows: list[dict[str, Any]] = []
    linked: set[tuple[int, int]] = set()
    for p in polls:
        name = names.get(p.site)
        if name is None:
            name = names[p.site] = name_of(p.site)
        root = top[p.exit_seq]
        if root.coroutine not in tracks:
            tracks[root.coroutine] = task_names.get(root.coroutine) or names.get(root.site) or name_of(root.site)
        threads.add(p.thread)
        args = {"coroutine": p.coroutine, "self": f"0x{p.self_ptr:x}", "thread": p.thread,
                "task": root.coroutine, "enter_seq": p.enter_seq, "exit_seq": p.exit_seq}
        ts, dur = _us(p.enter_ns), _us(p.exit_ns - p.enter_ns)
        for pid, tid in ((TASKS_PID, root.coroutine), (THREADS_PID, p.thread)):
            slices.append({"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name,
                           "cat": "poll", "args": args})
        up = around.get(p.exit_seq)
        if up is not None and up.coroutine != p.coroutine and (up.coroutine, p.coroutine) not in linked:
            linked.add((up.coroutine, p.coroutine))
            fid = len(linked)
            flows.append({"ph": "s", "id": fid, "pid": TASKS_PID, "tid": root.coroutine, "ts": _us(up.enter_ns),
                          "name": "await", "cat": "await"})
            flows.append({"ph": "f", "bp": "e", "id": fid, "pid": TASKS_PID, "tid": root.coroutine, "ts": ts,
                          "name": "await", "cat": "await"})
    for tid, name in sorted(tracks.items()):
        events.append({"ph": "M", "pid": TASKS_PID, "tid": tid, "name": "thread_name",
                       "args": {"name": f"task #{tid} {name}"}})
    for tid in sorted(threads):
        events.append({"ph": "M", "pid": THREADS_PID, "tid": tid, "name": "thread_name",
                       "args": {"name": f"thread {tid}"}})
    events += slices + flows
    addrs = {top[p.exit_seq].self_ptr: top[p.exit_seq].coroutine for p in polls}
    addrs.update(task_addrs or {})
    events += wake_events(wakes, addrs, slices)
    for s in stops:
        events.append({"ph": "i", "s": "g", "pid": THREADS_PID, "tid": s.thread or 0, "ts": _us(s.time_ns),
                       "name": f"stop {s.serial}", "cat": "stop",
                       "args": {"thread": s.thread}})
    note = "polls with both timestamps as the capture recorded them (CLOCK_MONOTONIC)"
    note += ("; wakes: the newest of each task the kernel kept (uprobe capture)" if wakes
             else "; no wakes: recorded by uprobe capture with --wakes only")
    if dropped:
        note += f"; the {dropped} oldest polls recorded are no longer kept"
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"producer": "asyncrsp", "polls": len(polls), "dropped": dropped, "note": note}}


def wake_events(wakes: Iterable[Any], addrs: Mapping[int, int], slices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each recorded wake as an instant event ``woken`` on the woken task's track and, when
    another task's poll woke it, a flow from that poll to the woken task's next poll.

    ``WakeStats.future`` is the coroutine the runtime task polls first (the task's address:
    its track through ``addrs``), ``task`` its runtime header, by which a wake names its waker."""
    wakes = list(wakes)
    track_of_header = {w.task: addrs[w.future] for w in wakes if w.future in addrs}
    polls_on: dict[int, list[float]] = {}
    for sl in slices:
        if sl["pid"] == TASKS_PID:
            polls_on.setdefault(sl["tid"], []).append(sl["ts"])
    for starts in polls_on.values():
        starts.sort()
    out: list[dict[str, Any]] = []
    flow = 1 << 20  # flow ids above the await edges'
    for w in wakes:
        tid = addrs.get(w.future)
        if tid is None:
            continue
        for wk in w.last:
            ts = _us(wk.ts)
            by = track_of_header.get(wk.waker) if wk.waker else None
            out.append({"ph": "i", "s": "t", "pid": TASKS_PID, "tid": tid, "ts": ts, "name": "woken", "cat": "wake",
                        "args": {"by": f"task #{by}" if by is not None else "outside the tasks" if not wk.waker
                                 else f"task 0x{wk.waker:x}", "thread": wk.thread, "by_ref": wk.by_ref}})
            nxt = next((t for t in polls_on.get(tid, ()) if t >= ts), None)
            if by is not None and nxt is not None:
                flow += 1
                out.append({"ph": "s", "id": flow, "pid": TASKS_PID, "tid": by, "ts": ts, "name": "wake", "cat": "wake"})
                out.append({"ph": "f", "bp": "e", "id": flow, "pid": TASKS_PID, "tid": tid, "ts": nxt, "name": "wake",
                            "cat": "wake"})
    return out
