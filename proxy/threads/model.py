"""What a task thread is, and the two number spaces it lives in.

Thread ids. A task thread's id is ``TID_BASE + n`` (``n`` = 1, 2, ... in the
order tasks are first listed, never reused in a session). Linux caps thread
ids at ``PID_MAX_LIMIT`` = 4,194,304 (2**22, ``include/linux/threads.h``) on
64-bit kernels, so an id from 2**30 up is never a real LWP; it still fits a
positive 32-bit int, which is what gdb's ``lwp`` and lldb's thread index
columns print without surprise. LLDB's Swift task threads use the same
trick (a high bit).

The synthetic stack region. A task thread's registers point into
``REGION_BASE + n * REGION_STRIDE``: non-canonical x86-64 addresses (bits
47-63 differ), which no process can map (the CPU faults on them), so nothing
the proxy serves there can shadow the program's memory. The proxy answers
``m`` there itself and refuses writes; such packets never reach the stub.
"""

from __future__ import annotations

from dataclasses import dataclass

TID_BASE = 0x4000_0000  # 2**30: above Linux's PID_MAX_LIMIT (2**22)
REGION_BASE = 0x5A5A_0000_0000_0000  # non-canonical: no process can map it
REGION_STRIDE = 1 << 20  # one MiB of synthetic stack per task thread
DEFAULT_CAP = 1024


@dataclass(frozen=True, slots=True)
class TaskFrame:
    """One coroutine of a task's logical stack (innermost first in TaskThread.frames)."""

    pc: int  # runtime pc in the coroutine's resume function at its suspend point
    self_addr: int  # the coroutine's address (its resume function's `self`)
    function: str = ""  # for tests and notes


@dataclass(frozen=True, slots=True)
class TaskThread:
    """A live task shown as a thread: ``key`` identifies it across stops."""

    key: tuple[int, str]  # (address, type) of the task's outermost coroutine
    name: str  # e.g. "task #3 stuck::lock_ab"
    extra: str  # e.g. "suspended at stuck.rs:28, waits on Mutex 0x..., held by ..."
    frames: tuple[TaskFrame, ...] = ()
    running_on: int | None = None  # the LWP that runs it now: listed there, not as its own thread


def is_task_tid(tid: int) -> bool:
    return tid >= TID_BASE


def region_of(tid: int) -> int:
    return REGION_BASE + (tid - TID_BASE) * REGION_STRIDE


def tid_of_region(addr: int) -> int | None:
    """The task thread whose synthetic stack holds addr, or None."""
    if addr < REGION_BASE:
        return None
    n = (addr - REGION_BASE) // REGION_STRIDE
    return TID_BASE + n if n < (1 << 28) else None
