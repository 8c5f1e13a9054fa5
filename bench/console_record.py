"""console-subscriber's recording (``TOKIO_CONSOLE_RECORD_PATH``), folded per task the way
console-subscriber folds its own stream: what tokio-console shows for WAKES, SELF-WAKES,
waker clones and drops, and the scheduled time (a wake to the poll it caused).

The recording is JSON lines (console-subscriber 0.5 ``record.rs``): a header, then
``{"Spawn": {"id", "at", "fields": [{"name", "value"}]}}``, ``{"Enter": {"id", "at"}}``,
``{"Exit": ...}``, ``{"Close": ...}`` and ``{"Waker": {"id", "op", "at"}}`` with ``op``
``{"Wake": {"self_wake": b}}``, ``{"WakeByRef": {...}}``, ``"Clone"`` or ``"Drop"``; ``at`` a
SystemTime. Only spans that were spawned as tasks count."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class ConsoleTask:
    id: int
    task_id: str = "?"  # tokio's id (the recording has no spawn location)
    polls: int = 0
    wakes: int = 0
    self_wakes: int = 0
    clones: int = 0
    drops: int = 0
    sched_ns: int = 0
    woken_at: int | None = None  # awaiting the poll a wake caused
    closed: bool = False
    loc: str = ""  # tokio's spawn location (`loc.file:loc.line`, tokio_unstable), "" when absent
    poll_started: int | None = None  # the last Enter's time (ns since the epoch)
    poll_ended: int | None = None  # the last Exit's
    busy_ns: int = 0  # Enter to Exit, summed
    last_wake: int | None = None
    size: int | None = None  # `size.bytes`: the spawned future's (a box's, when tokio boxed it)
    original_size: int | None = None  # `original_size.bytes`: the future's, when tokio boxed it


def _ns(at: dict[str, int]) -> int:
    return int(at["secs_since_epoch"]) * 1_000_000_000 + int(at["nanos_since_epoch"])


def fold(path: Path) -> dict[int, ConsoleTask]:
    tasks: dict[int, ConsoleTask] = {}
    with open(path) as f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a line cut by the server's exit
            if not isinstance(ev, dict) or len(ev) != 1:
                continue
            (kind, body), = ev.items()
            if not isinstance(body, dict):
                continue  # the header, {"v": 1}
            if kind == "Spawn":
                fields = {x.get("name"): x.get("value") for x in body.get("fields", [])}
                if fields.get("kind") == "task":  # (not block_on's)
                    loc = f"{fields['loc.file']}:{fields.get('loc.line')}" if fields.get("loc.file") else ""
                    tasks[body["id"]] = ConsoleTask(body["id"], str(fields.get("task.id", "?")), loc=loc,
                                                    size=fields.get("size.bytes"),
                                                    original_size=fields.get("original_size.bytes"))
                continue
            t = tasks.get(body.get("id"))
            if t is None:
                continue
            if kind == "Enter":
                t.polls += 1
                t.poll_started = _ns(body["at"])
                if t.woken_at is not None:
                    t.sched_ns += max(_ns(body["at"]) - t.woken_at, 0)
                    t.woken_at = None
            elif kind == "Exit":
                if t.poll_started is not None:
                    t.busy_ns += max(_ns(body["at"]) - t.poll_started, 0)
                t.poll_ended = _ns(body["at"])
            elif kind == "Close":
                t.closed = True
            elif kind == "Waker":
                op = body["op"]
                name = op if isinstance(op, str) else next(iter(op))
                if name in ("Wake", "WakeByRef"):
                    t.wakes += 1
                    t.last_wake = _ns(body["at"])
                    t.self_wakes += int(bool(op[name].get("self_wake"))) if isinstance(op, dict) else 0
                    if t.woken_at is None:
                        t.woken_at = _ns(body["at"])
                    if name == "Wake":
                        t.drops += 1
                elif name == "Clone":
                    t.clones += 1
                elif name == "Drop":
                    t.drops += 1
    return tasks


# tokio-console's warnings (tokio-rs/console, tokio-console/src/warnings.rs at b59758e), its
# defaults (`SelfWakePercent::DEFAULT_PERCENT` 50, `NeverYielded::DEFAULT_DURATION` 1 s), on its
# task state (tokio-console/src/state/tasks.rs): the recording carries no warning, console's
# UI computes them from these figures. Blocking and block_on tasks are never warned about; the
# fold keeps only "task" spans.
SELF_WAKE_PERCENT = 50
NEVER_YIELDED_NS = 1_000_000_000
LARGE_FUTURE = 1024  # LargeFuture::DEFAULT_MIN_SIZE_BYTES


def _running(t: ConsoleTask) -> bool:
    """`Task::is_running`: `last_poll_started > last_poll_ended` (tasks.rs:379-381)."""
    return t.poll_started is not None and (t.poll_ended is None or t.poll_started > t.poll_ended)


def console_warnings(tasks: dict[int, ConsoleTask], now_ns: int, *, self_wake_percent: int = SELF_WAKE_PERCENT,
                     never_yielded_ns: int = NEVER_YIELDED_NS) -> set[tuple[int, str]]:
    """(console's task id, "lost waker" | "self-wakes" | "never yielded" | "large future" |
    "auto-boxed future") for each warning tokio-console shows at `now_ns` (its
    `SystemTime::now()`)."""
    out: set[tuple[int, str]] = set()
    for t in tasks.values():
        if t.closed:  # `is_completed`
            continue
        # LostWaker::check: !completed && waker_count() == 0 && !running && !awakened, where
        # waker_count = clones.saturating_sub(drops) (tasks.rs:470-472; console-subscriber counts
        # a wake by value as a drop, stats.rs:198-209) and is_awakened = polls == 0 ||
        # last_wake > last_poll_started (tasks.rs:502-506)
        awakened = t.polls == 0 or (t.last_wake is not None and t.poll_started is not None
                                    and t.last_wake > t.poll_started)
        if max(t.clones - t.drops, 0) == 0 and not _running(t) and not awakened:
            out.add((t.id, "lost waker"))
        # SelfWakePercent::check: self_wakes.percent_of(wakes) > min_percent (an integer percent)
        if t.wakes and (100 * t.self_wakes) // t.wakes > self_wake_percent:
            out.add((t.id, "self-wakes"))
        # NeverYielded::check: state Running, total_polls <= 1, busy(now) >= min_duration, where
        # busy(now) adds the poll in progress (tasks.rs:418-427)
        busy = t.busy_ns + (now_ns - t.poll_started if _running(t) and t.poll_started is not None else 0)
        if _running(t) and t.polls <= 1 and busy >= never_yielded_ns:
            out.add((t.id, "never yielded"))
        # AutoBoxedFuture::check: both sizes known and different; LargeFuture::check:
        # size_bytes >= min_size (the size tokio measured: a box's when it boxed the future)
        if t.size is not None and t.original_size is not None and t.original_size != t.size:
            out.add((t.id, "auto-boxed future"))
        if t.size is not None and t.size >= LARGE_FUTURE:
            out.add((t.id, "large future"))
    return out
