"""Domain objects produced by the binary analysis.

Everything that leaves ``proxy.analysis`` is one of these small frozen
dataclasses; pyelftools and capstone objects never do. Addresses are
link-time (file) addresses: add the PIE load bias where a runtime address
is needed.
"""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from .paths import shown

_T = TypeVar("_T")


def _fast_state(cls: type[_T]) -> type[_T]:
    """Pickle a frozen slotted dataclass's fields as a tuple, their names taken once: dataclasses'
    own ``__getstate__``/``__setstate__`` call ``fields()`` for every object (the axum debug
    build's inventory: 14,000 objects, 0.03 s of the cache write's 0.04 s, as much again to
    load it). The state holds the same values in the same order: a cache written either
    way loads."""
    assert cls.__dataclass_params__.frozen, cls  # type: ignore[attr-defined]  # (the others: slots' own)
    names = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    get = operator.attrgetter(*names)
    single = len(names) == 1
    put = object.__setattr__

    def __getstate__(self: Any) -> tuple[Any, ...]:
        return (get(self),) if single else get(self)  # type: ignore[no-any-return]

    def __setstate__(self: Any, state: Any) -> None:
        for name, value in zip(names, state):
            put(self, name, value)

    cls.__getstate__ = __getstate__  # type: ignore[attr-defined]
    cls.__setstate__ = __setstate__  # type: ignore[attr-defined]
    return cls


class CoroutineKind(enum.Enum):
    ASYNC_FN = "async fn"
    ASYNC_BLOCK = "async block"
    ASYNC_CLOSURE = "async closure"
    UNKNOWN = "coroutine"


class Era(enum.Enum):
    """How the compiler emits a coroutine's resume function."""

    MODERN = "modern"  # rustc >= 1.67: the resume fn is Future::poll itself
    GENFUTURE = "genfuture"  # rustc < 1.67: <GenFuture<T> as Future>::poll wraps it


@_fast_state
@dataclass(frozen=True, slots=True)
class SourceLoc:
    file: str
    line: int

    def __str__(self) -> str:
        """For people: a registry crate's path from its directory (proxy.analysis.paths)."""
        return f"{shown(self.file)}:{self.line}"

    @property
    def full(self) -> str:
        """``file:line`` with the file's whole path (JSON documents)."""
        return f"{self.file}:{self.line}"


@_fast_state
@dataclass(frozen=True, slots=True)
class Member:
    """A field of a state-machine variant: the awaitee or a live local."""

    name: str
    offset: int  # from the start of the coroutine object
    size: int
    type_name: str


@_fast_state
@dataclass(frozen=True, slots=True)
class State:
    """One variant of a coroutine state machine."""

    value: int  # the __state discriminant: 0 Unresumed, 1 Returned, 2 Panicked, 3+N SuspendN
    name: str  # "Unresumed", "Returned", "Panicked", "Suspend0", ...
    loc: SourceLoc | None  # for SuspendN: the .await; else fn line / closing brace
    awaitee: Member | None = None
    locals: tuple[Member, ...] = ()

    @property
    def suspend_index(self) -> int | None:
        return self.value - 3 if self.value >= 3 else None


@_fast_state
@dataclass(frozen=True, slots=True)
class Layout:
    """The memory layout of one coroutine state-machine type (an ``*_env#N``)."""

    type_name: str  # fully qualified DWARF name, e.g. "rt::a::{async_fn_env#0}"
    size: int
    state_offset: int
    state_size: int  # 1 or 2 (u16 past 256 states)
    states: tuple[State, ...]
    align: int = 8

    def state(self, value: int) -> State | None:
        for s in self.states:
            if s.value == value:
                return s
        return None


@_fast_state
@dataclass(frozen=True, slots=True)
class ResumeFn:
    """A coroutine resume function that exists as code."""

    low_pc: int
    high_pc: int
    symbol: str  # mangled linkage name ("" when unknown)
    name: str  # demangled, e.g. "rt::a::{async_fn#0}"
    path: str  # the async fn / block's path without the closure part, e.g. "rt::a"
    kind: CoroutineKind
    era: Era
    decl: SourceLoc | None
    rets: tuple[int, ...]  # addresses of every return instruction
    other_exits: tuple[int, ...] = ()  # e.g. call _Unwind_Resume (panic paths)
    layout_name: str | None = None  # key into Inventory.layouts
    self_in: str = "rdi"  # register that holds the self pointer at entry (rsi for sret)
    # Where the returned Poll<T> says Pending: (offset in the returned bytes - rax:rdx,
    # or the return slot whose address comes back in rax when self_in is rsi -,
    # size, discriminant value). None when DWARF does not tell (Pending is the
    # niche-less default variant, or no return type).
    poll_pending: tuple[int, int, int] | None = None
    # "": the coroutine's own resume function. Else the wrapper future whose ``poll`` this is
    # (e.g. ``tracing::instrument::Instrumented<ENV>``, which tokio puts around every task under
    # ``tokio_unstable``): the coroutine's resume is inlined into that poll and has no code of
    # its own, so the wrapper's poll is probed for it; self is the wrapper, ``layout_name`` the
    # coroutine's layout shifted by where it sits inside the wrapper, and a poll's time is the
    # wrapper's window (for Instrumented: the span's enter and exit included, console-subscriber's)
    wrapper: str = ""

    @property
    def panics_unseen(self) -> bool:
        """No landing pad: a panic unwinds through this function without executing any
        of its instructions (rustc 1.63's GenFuture::poll in debug), so no breakpoint in
        it sees that exit; the stack pointer on the next event must reveal it."""
        return not self.other_exits


@_fast_state
@dataclass(frozen=True, slots=True)
class InlinedCoroutine:
    """A coroutine inlined into another resume function (release builds)."""

    name: str
    layout_name: str | None
    parent_low_pc: int  # the out-of-line resume fn that contains it
    ranges: tuple[tuple[int, int], ...]
    call_loc: SourceLoc | None


@_fast_state
@dataclass(frozen=True, slots=True)
class Frame:
    """A source frame for a pc; inlined frames come innermost first."""

    function: str
    loc: SourceLoc | None
    inlined: bool = False


@dataclass(slots=True)  # not frozen: pickled by its slots, one object
class Inventory:
    """Everything the proxy needs to know about one binary's coroutines."""

    build_id: str | None
    path: str
    pie: bool
    entry: int
    resume_fns: list[ResumeFn] = field(default_factory=list)
    layouts: dict[str, Layout] = field(default_factory=dict)
    inlined: list[InlinedCoroutine] = field(default_factory=list)
    # non-coroutine types reachable from awaitees, by name (proxy.reflect walks them)
    types: dict[str, "TypeInfo"] = field(default_factory=dict)
    # tokio's raw::poll<T, S> functions (link addr) and task vtables (link addr of the
    # static Vtable) -> the task cell type Cell<T, S> (proxy.reflect.tokio_adapter)
    task_polls: dict[int, str] = field(default_factory=dict)
    task_vtables: dict[int, str] = field(default_factory=dict)
    # async-task's RawTask<F, T, S, M>::run functions (link addr) -> F, the spawned future's type,
    # and the static TaskVTable slots holding them (link addr of the `run` slot) -> F
    # (proxy.reflect.adapters.async_task)
    task_runs: dict[int, str] = field(default_factory=dict)
    task_run_slots: dict[int, str] = field(default_factory=dict)
    # an I/O handle's OS file descriptor: a coroutine local's pointer type ("&tokio::net::
    # tcp::stream::TcpStream") -> offset of the fd (an i32) inside the value it points at
    fd_offsets: dict[str, int] = field(default_factory=dict)
    # every out-of-line ``Future::poll`` of a type that is not a coroutine (link addr) -> that
    # type: the concrete future behind a ``Pin<Box<dyn Future>>`` whose vtable's poll slot
    # points there (axum's and tower's boxed service futures); its type is in ``types``
    future_polls: dict[int, str] = field(default_factory=dict)
    # futures' ``<Box<F> as UnsafeFutureObj<T>>::drop`` functions (link addr): the static
    # ``drop_fn`` word of every ``LocalFutureObj``/``FutureObj`` a LocalPool keeps
    # (proxy.reflect.adapters.future_obj)
    future_obj_drops: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # partial results say why

    def resume_fn_at(self, addr: int) -> ResumeFn | None:
        for f in self.resume_fns:
            if f.low_pc <= addr < f.high_pc:
                return f
        return None


@_fast_state
@dataclass(frozen=True, slots=True)
class Field:
    """A member of a struct (or of one enum variant): offset from the start of the value."""

    name: str
    offset: int
    size: int
    type_name: str


@_fast_state
@dataclass(frozen=True, slots=True)
class Variant:
    """One variant of a Rust enum; ``discr`` None is the default (niche-holding) variant."""

    name: str
    discr: int | None
    fields: tuple[Field, ...] = ()


@_fast_state
@dataclass(frozen=True, slots=True)
class TypeInfo:
    """The layout of a non-coroutine type reachable from an ``__awaitee`` (reflection).

    kind: "struct", "enum" (``discr`` + ``variants``), "union", "pointer"
    (``pointee``), "base", "array" (``pointee`` = element type) or "other".
    """

    name: str
    kind: str
    size: int
    fields: tuple[Field, ...] = ()
    pointee: str | None = None
    discr: Field | None = None
    variants: tuple[Variant, ...] = ()
    align: int = 0  # a struct's, union's or enum's DW_AT_alignment; 0 when DWARF does not say

    def field(self, name: str) -> Field | None:
        for f in self.fields:
            if f.name == name:
                return f
        return None

    def variant_for(self, value: int) -> Variant | None:
        default = None
        for v in self.variants:
            if v.discr is None:
                default = v
            elif v.discr == value:
                return v
        return default
