"""The events every capture backend produces, in program order.

Theory of operation: a capture backend (hidden breakpoints, gdbserver
tracepoints, Linux uprobes) observes the program's resume functions and
turns each entry and each exit into one of these records. The engine folds
them in ``seq`` order and never learns which backend produced them. Fields a
backend could not collect are ``None``; the engine then infers (e.g. the
``__state`` after an exit is the ``state`` of the next entry of that task, or
is read at the next stop through ``Engine.pending_reads()``).

Addresses are runtime addresses (load bias applied). ``site`` is the runtime
``low_pc`` of the resume function, the engine's key into the inventory.
``thread`` is the OS thread id (LWP); backends that only see ``fs_base``
map it to the LWP before emitting.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PollEnter:
    seq: int
    thread: int
    site: int  # runtime low_pc of the resume function
    self_ptr: int  # the coroutine object
    sp: int  # stack pointer at entry (points at the return address)
    return_addr: int | None = None
    state: int | None = None  # __state at entry (= the state after the previous poll)
    time_ns: int | None = None
    # (self_ptr, site) of the poll it runs inside, when the backend recorded no
    # entry of that poll (uprobes, only graph changes recorded: a repeat poll of
    # a known coroutine); None: the thread's innermost poll in the stream
    parent: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class PollResumed(PollEnter):
    """The entry of a poll in progress at a stop that went out as no event (a
    repeat poll, uprobes): fed at the stop, and placed in its thread's polls
    by its ``sp`` (the polls entered after it, deeper, stay above it)."""


@dataclass(frozen=True, slots=True)
class PollExit:
    seq: int
    thread: int
    site: int  # runtime low_pc of the resume function being left
    sp: int  # stack pointer at the ret (points at the return address)
    state: int | None = None  # __state after the poll (Returned=1, Panicked=2, SuspendN=3+N)
    self_ptr: int | None = None  # when the backend knows it
    poll_result: int | None = None  # 0 Ready / 1 Pending when read from rax
    panicked: bool = False  # left through the unwinder (call _Unwind_Resume)
    time_ns: int | None = None


@dataclass(frozen=True, slots=True)
class EventsLost:
    """A backend lost events (full buffer, a breakpoint off for a moment)."""

    seq: int
    count: int
    reason: str


PollEvent = PollEnter | PollExit | EventsLost  # PollResumed is a PollEnter
