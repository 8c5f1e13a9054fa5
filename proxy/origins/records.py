"""The kernel's spawn records and wake statistics, decoded (uprobes.bpf.c ``struct spawn_rec``,
``struct wake_stats``). Pure: bytes in, frozen values out."""

from __future__ import annotations

import struct
from dataclasses import dataclass

CHAIN = 8
HIST = 20
LAST = 4
# kind depth key cookie tid stack_len | ts ip sp task_id task | rbp rbx r12 r13 r14 r15 | chain[8] | chain_fn[8]
# | path (ret cookie fn)
SPAWN_HEAD = struct.Struct("<HBBIII5Q6Q8Q8I16s")
assert SPAWN_HEAD.size == 216
KIND_SPAWN = 6
KEY_NONE, KEY_ID, KEY_TASK = 0, 1, 2  # what a record's key is (uprobes.bpf.c struct spawn_rec)
# wakes by_ref self_wakes clones drops polls woken_at sched_ns sched_max sched_n poll_at first_ts future
# | hist[20] last_i pad | last[4] = (ts waker ret tid op)
WAKE_HEAD = struct.Struct("<13Q20III")
WAKE_LAST = struct.Struct("<QQQII")
OP_WAKE, OP_WAKE_BY_REF = 0, 1


@dataclass(frozen=True, slots=True)
class SpawnRecord:
    """A spawn as the kernel saw it: nothing resolved."""

    ts: int  # CLOCK_MONOTONIC ns
    thread: int
    task_id: int  # the runtime's id for the new task (tokio), 0: none
    task: int  # the new task's pointer (async-task: its allocation, the header's address), 0: none
    spawner: int  # the runtime task polled on the thread (its header), 0: none
    chain: tuple[tuple[int, int], ...]  # (self, resume function index) polled on the thread, innermost first
    depth: int  # polls in progress on the thread (the chain keeps the innermost CHAIN)
    regs: dict[str, int]  # rip rsp rbp rbx r12-r15: where the unwinder starts
    stack: bytes  # memory from regs["rsp"] on
    path: bytes = b""  # the spawning path (struct spawn_path): the stack its records keep is learnt per path

    def read(self, addr: int, size: int) -> bytes | None:
        off = addr - self.regs["rsp"]
        if off < 0 or off + size > len(self.stack):
            return None
        return self.stack[off:off + size]


# the head's first fields: kind depth key cookie tid stack_len | ts ip sp task_id
_SPAWN_KEY = struct.Struct("<HBBIII4Q")


def spawn_key(raw: bytes) -> tuple[int, int, int] | None:
    """(task id, task pointer, ts) of a raw record (the rest is decoded when asked for)."""
    if len(raw) < SPAWN_HEAD.size:
        return None
    kind, _depth, key, _cookie, _tid, _len, ts, _ip, _sp, value = _SPAWN_KEY.unpack_from(raw, 0)
    if kind != KIND_SPAWN:
        return None
    return (value if key == KEY_ID else 0), (value if key == KEY_TASK else 0), ts


SPAWN_PATH = slice(SPAWN_HEAD.size - 16, SPAWN_HEAD.size)  # a raw record's spawning path (struct spawn_path)


def decode_spawn(buf: bytes | memoryview, off: int, n: int) -> SpawnRecord | None:
    if n < SPAWN_HEAD.size:
        return None
    v = SPAWN_HEAD.unpack_from(buf, off)
    kind, depth, key, _cookie, tid, stack_len, ts, ip, sp, key_value, spawner = v[:11]
    if kind != KIND_SPAWN:
        return None
    task_id = key_value if key == KEY_ID else 0
    task = key_value if key == KEY_TASK else 0
    rbp, rbx, r12, r13, r14, r15 = v[11:17]
    selfs, fns, path = v[17:25], v[25:33], v[33]
    chain = tuple((s, f) for s, f in zip(selfs, fns) if s)
    stack_len = min(stack_len, n - SPAWN_HEAD.size)
    stack = bytes(buf[off + SPAWN_HEAD.size:off + SPAWN_HEAD.size + stack_len])
    regs = {"rip": ip, "rsp": sp, "rbp": rbp, "rbx": rbx, "r12": r12, "r13": r13, "r14": r14, "r15": r15}
    return SpawnRecord(ts, tid, task_id, task, spawner, chain, depth, regs, stack, path)


@dataclass(frozen=True, slots=True)
class Wake:
    ts: int
    waker: int  # the runtime task whose poll woke it (header), 0: none (a driver, a timer, another thread)
    ret: int  # the waker function's return address (runtime)
    thread: int
    by_ref: bool
    fn: int | None = None  # the resume function (index) polled innermost on the waking thread


@dataclass(frozen=True, slots=True)
class WakeStats:
    """One runtime task's wakes, folded in the kernel since the capture began."""

    task: int  # header (tokio) or raw pointer (async-task)
    wakes: int
    by_ref: int
    self_wakes: int
    clones: int
    drops: int
    polls: int
    woken_at: int  # woken and not polled since (ns), 0: not
    sched_ns: int
    sched_max: int
    sched_n: int
    poll_at: int
    first_ts: int
    future: int  # the coroutine its poll polls first (the graph's task), 0: not seen
    hist: tuple[int, ...]  # scheduling delays: bucket b < 2^(b+10) ns
    last: tuple[Wake, ...]  # newest first

    @property
    def wakers(self) -> int:
        """Wakers alive that the capture saw made: clones - drops (wakes by value drop)."""
        return self.clones - self.drops


def decode_wakes(task: int, raw: bytes) -> WakeStats:
    v = WAKE_HEAD.unpack_from(raw, 0)
    last_i = v[33]
    last: list[Wake] = []
    for k in range(min(last_i, LAST)):
        i = (last_i - 1 - k) % LAST
        ts, waker, ret, tid, op = WAKE_LAST.unpack_from(raw, WAKE_HEAD.size + i * WAKE_LAST.size)
        last.append(Wake(ts, waker, ret, tid, op & 0xff == OP_WAKE_BY_REF, (op >> 8) - 1 if op >> 8 else None))
    return WakeStats(task, *v[:13], tuple(v[13:33]), tuple(last))
