"""The spawn records of a capture, kept raw until a command shows one."""

from __future__ import annotations

from collections import OrderedDict, deque

from .records import SpawnRecord

KEEP = 65536  # records kept by key (the newest); a server spawning a task a request cycles them
KEEP_BYTES = 64 << 20  # ... and at most this much stack kept (8,192 spawns of 8 KiB)


class SpawnLog:
    """Raw spawn records by the runtime's task id (tokio), by the new task's pointer
    (async-task: an allocator reuses an ended task's memory, so the newest record of a
    pointer is the task living there now), and the newest ones without a key. Nothing
    here is symbolised: ``resolve`` does that for the records a command shows."""

    def __init__(self, keep: int = KEEP, keep_bytes: int = KEEP_BYTES) -> None:
        self.keep = keep
        self.keep_bytes = keep_bytes
        self.bytes = 0
        self.by_id: OrderedDict[int, SpawnRecord] = OrderedDict()
        self.by_task: OrderedDict[int, SpawnRecord] = OrderedDict()
        self.unkeyed: deque[SpawnRecord] = deque(maxlen=1024)
        self.seen = 0
        self.forgotten = 0  # records pushed out by newer ones
        self.lost = 0  # records the kernel's ring had no room for
        self.since: int | None = None  # CLOCK_MONOTONIC ns of the capture's start

    def add(self, rec: SpawnRecord) -> None:
        self.seen += 1
        table, key = (self.by_id, rec.task_id) if rec.task_id else (self.by_task, rec.task)
        if not key:
            self.unkeyed.append(rec)
            return
        old = table.pop(key, None)
        if old is not None:
            self.bytes -= len(old.stack)
        table[key] = rec
        self.bytes += len(rec.stack)
        while len(self.by_id) + len(self.by_task) > self.keep or self.bytes > self.keep_bytes:
            oldest = min((t for t in (self.by_id, self.by_task) if t), key=lambda t: next(iter(t.values())).ts)
            _, gone = oldest.popitem(last=False)
            self.bytes -= len(gone.stack)
            self.forgotten += 1

    def get(self, task_id: int | None) -> SpawnRecord | None:
        return self.by_id.get(task_id) if task_id else None

    def of_task(self, task: int | None) -> SpawnRecord | None:
        """The newest record of a task at this address (async-task)."""
        return self.by_task.get(task) if task else None

    def keyed(self) -> list[SpawnRecord]:
        return [*self.by_id.values(), *self.by_task.values()]

    def line(self) -> str:
        return (f"spawns: {self.seen} recorded ({len(self.by_id)} kept by task id, {len(self.by_task)} by task "
                f"address, {self.forgotten} pushed out, {self.lost} lost); none symbolised until shown")
