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
                    tasks[body["id"]] = ConsoleTask(body["id"], str(fields.get("task.id", "?")))
                continue
            t = tasks.get(body.get("id"))
            if t is None:
                continue
            if kind == "Enter":
                t.polls += 1
                if t.woken_at is not None:
                    t.sched_ns += max(_ns(body["at"]) - t.woken_at, 0)
                    t.woken_at = None
            elif kind == "Close":
                t.closed = True
            elif kind == "Waker":
                op = body["op"]
                name = op if isinstance(op, str) else next(iter(op))
                if name in ("Wake", "WakeByRef"):
                    t.wakes += 1
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
