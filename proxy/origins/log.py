"""The spawn records of a capture, kept raw until a command shows one."""

from __future__ import annotations

from collections import OrderedDict, deque

from .records import SpawnRecord, decode_spawn, spawn_key

Entry = SpawnRecord | bytes  # a record decoded, or as the kernel wrote it

KEEP = 65536  # records kept by key (the newest); a server spawning a task a request cycles them
KEEP_BYTES = 64 << 20  # ... and at most this much stack kept (8,192 spawns of 8 KiB)


class SpawnLog:
    """Spawn records by the runtime's task id (tokio), by the new task's pointer
    (async-task: an allocator reuses an ended task's memory, so the newest record of a
    pointer is the task living there now), and the newest ones without a key. Kept as the
    kernel wrote them (bytes: only the key and time are read when one comes, a record
    a request on a server) and decoded when a command asks for one; nothing here is
    symbolised: ``resolve`` does that for the records a command shows."""

    def __init__(self, keep: int = KEEP, keep_bytes: int = KEEP_BYTES) -> None:
        self.keep = keep
        self.keep_bytes = keep_bytes
        self.bytes = 0
        self._ids: OrderedDict[int, Entry] = OrderedDict()
        self._tasks: OrderedDict[int, Entry] = OrderedDict()
        self._unkeyed: deque[Entry] = deque(maxlen=1024)
        self.seen = 0
        self.forgotten = 0  # records pushed out by newer ones
        self.lost = 0  # records the kernel's ring had no room for
        self.since: int | None = None  # CLOCK_MONOTONIC ns of the capture's start

    def add(self, rec: Entry) -> None:
        """A record, decoded or as the kernel wrote it (bytes: decoded when asked for)."""
        if isinstance(rec, SpawnRecord):
            task_id, task, size = rec.task_id, rec.task, len(rec.stack)
        else:
            got = spawn_key(rec)
            if got is None:
                return
            task_id, task, _when = got
            size = len(rec)
        self.seen += 1
        table, key = (self._ids, task_id) if task_id else (self._tasks, task)
        if not key:
            self._unkeyed.append(rec)
            return
        old = table.pop(key, None)
        if old is not None:
            self.bytes -= _size(old)
        table[key] = rec
        self.bytes += size
        while len(self._ids) + len(self._tasks) > self.keep or self.bytes > self.keep_bytes:
            oldest = min((t for t in (self._ids, self._tasks) if t), key=lambda t: _ts(next(iter(t.values()))))
            _, gone = oldest.popitem(last=False)
            self.bytes -= _size(gone)
            self.forgotten += 1

    def get(self, task_id: int | None) -> SpawnRecord | None:
        return _decoded(self._ids, task_id) if task_id else None

    def of_task(self, task: int | None) -> SpawnRecord | None:
        """The newest record of a task at this address (async-task)."""
        return _decoded(self._tasks, task) if task else None

    @property
    def by_id(self) -> OrderedDict[int, SpawnRecord]:
        return OrderedDict((k, r) for k in list(self._ids) if (r := _decoded(self._ids, k)) is not None)

    @property
    def by_task(self) -> OrderedDict[int, SpawnRecord]:
        return OrderedDict((k, r) for k in list(self._tasks) if (r := _decoded(self._tasks, k)) is not None)

    @property
    def unkeyed(self) -> list[SpawnRecord]:
        return [r for e in self._unkeyed if (r := _decode(e)) is not None]

    def keyed(self) -> list[SpawnRecord]:
        return [*self.by_id.values(), *self.by_task.values()]

    def line(self) -> str:
        return (f"spawns: {self.seen} recorded ({len(self.by_id)} kept by task id, {len(self.by_task)} by task "
                f"address, {self.forgotten} pushed out, {self.lost} lost); none symbolised until shown")


def _decode(e: Entry) -> SpawnRecord | None:
    return e if isinstance(e, SpawnRecord) else decode_spawn(e, 0, len(e))


def _decoded(table: OrderedDict[int, Entry], key: int | None) -> SpawnRecord | None:
    """The record at `key`, decoded once (the table keeps the decoded one in its place)."""
    e = table.get(key) if key is not None else None
    if e is None or isinstance(e, SpawnRecord):
        return e
    rec = _decode(e)
    if rec is not None:
        table[key] = rec  # an existing key: its place in the order stays
    return rec


def _size(e: Entry) -> int:
    return len(e.stack) if isinstance(e, SpawnRecord) else len(e)


def _ts(e: Entry) -> int:
    if isinstance(e, SpawnRecord):
        return e.ts
    got = spawn_key(e)
    return got[2] if got is not None else 0
