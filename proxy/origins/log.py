"""The spawn records of a capture, kept raw until a command shows one."""

from __future__ import annotations

from collections import OrderedDict, deque

from .records import SpawnRecord

KEEP = 65536  # records kept by task id (the newest); a server spawning a task a request cycles them
KEEP_BYTES = 64 << 20  # ... and at most this much stack kept (8,192 spawns of 8 KiB)


class SpawnLog:
    """Raw spawn records by the runtime's task id (tokio), and the newest ones without one.
    Nothing here is symbolised: ``resolve`` does that for the records a command shows."""

    def __init__(self, keep: int = KEEP, keep_bytes: int = KEEP_BYTES) -> None:
        self.keep = keep
        self.keep_bytes = keep_bytes
        self.bytes = 0
        self.by_id: OrderedDict[int, SpawnRecord] = OrderedDict()
        self.unkeyed: deque[SpawnRecord] = deque(maxlen=1024)
        self.seen = 0
        self.forgotten = 0  # records pushed out by newer ones
        self.lost = 0  # records the kernel's ring had no room for
        self.since: int | None = None  # CLOCK_MONOTONIC ns of the capture's start

    def add(self, rec: SpawnRecord) -> None:
        self.seen += 1
        if not rec.task_id:
            self.unkeyed.append(rec)
            return
        old = self.by_id.pop(rec.task_id, None)
        if old is not None:
            self.bytes -= len(old.stack)
        self.by_id[rec.task_id] = rec
        self.bytes += len(rec.stack)
        while self.by_id and (len(self.by_id) > self.keep or self.bytes > self.keep_bytes):
            _, gone = self.by_id.popitem(last=False)
            self.bytes -= len(gone.stack)
            self.forgotten += 1

    def get(self, task_id: int | None) -> SpawnRecord | None:
        return self.by_id.get(task_id) if task_id else None

    def line(self) -> str:
        return (f"spawns: {self.seen} recorded ({len(self.by_id)} kept by task id, {self.forgotten} pushed out, "
                f"{self.lost} lost); none symbolised until shown")
