"""The coroutine inventory of a binary: resume functions, their exits, their layouts.

Theory of operation (facts in DESIGN.md §4):

1. Pick the units. Resume functions are closures to the symbol table
   (``f::{{closure}}`` / ``f::{closure#0}``), and rustc 1.63's wrappers are
   ``<GenFuture<T> as Future>::poll``; ``.debug_aranges`` maps each such symbol
   to its unit. Only those units are read (a debug tokio binary: 21 of 44).
2. In each unit, a subprogram with code whose name is ``{async_fn#N}`` /
   ``{async_block#N}`` / ``{async_closure#N}`` and whose first parameter is
   ``Pin<&mut ENV>`` is a modern resume function: ENV (through the member
   ``pointer``) is its layout, followed by reference, never by name. A
   subprogram ``poll<...>`` whose first parameter is ``Pin<&mut GenFuture<ENV>>``
   is a GenFuture-era resume function: ENV through GenFuture's member ``__0``.
   The inner generator resume of 1.63 takes a ``ResumeTy`` and no described
   self, so it is not a breakpoint site of its own.
3. Every struct named ``{async_*_env#N}`` with a ``__state`` variant part is a
   layout, whether or not a resume function for it survives as code; inlined
   resume functions appear as ``DW_TAG_inlined_subroutine`` of an
   ``{async_*#N}`` subprogram and become ``InlinedCoroutine`` entries.
4. The exits of each resume function come from capstone: instructions in
   ``CS_GRP_RET``, calls to ``_Unwind_Resume`` (direct, through its PLT stub or
   its GOT slot), and direct jumps that leave the function (tail jumps; rustc
   has not been seen to emit them). Register-indirect jumps are jump tables
   inside the function and are not exits (exits.py).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from pathlib import Path

from typing import TYPE_CHECKING

from . import cache as cache_mod
from . import dies as D
from . import sieve as S
from .dwarf import STACK_TAGS, DwarfView
from .errors import AnalysisError
from .progress import Progress

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import TextIO


# capstone is imported where the exits are found (exits.py): a program without a
# coroutine never gets there. numpy and pyelftools are imported where
# they are used too: a cold analysis imports them after its unit walker has started
# (~0.1 s that the walker's process spends walking meanwhile).
from .elf import ElfImage, open_elf
from .exits import ExitFinder
from .types import MAX_DEPTH as _TYPE_DEPTH
from .types import TypeCollector
from .model import (
    CoroutineKind,
    Era,
    InlinedCoroutine,
    Inventory,
    Layout,
    Member,
    ResumeFn,
    SourceLoc,
    State,
    TypeInfo,
)

# the names the sieve judges by (one truth: proxy.analysis.sieve, which the unit walker runs too)
ASYNC_FN_RE, ASYNC_ENV_RE, RUNTIME_CELL_PREFIXES = S.ASYNC_FN_RE, S.ASYNC_ENV_RE, S.RUNTIME_CELL_PREFIXES
RUNTIME_CELLS = ("tokio::runtime::task::core::Cell<", "async_task::header::Header<", "async_task::raw::TaskVTable",
                 "async_task::raw::TaskLayout")
TASK_POLL = "tokio::runtime::task::raw::poll<"
# async-task (smol's async-executor, async-std): RawTask<F, T, S, M>::run, F = the spawned future
ASYNC_TASK_RUN = "async_task::raw::RawTask<"
# wrapper futures whose poll stands for the coroutine inlined into it (``_wrapped_polls``):
# tracing's span wrapper, around every task tokio spawns under ``tokio_unstable`` (what
# console-subscriber times) and every ``.instrument(span)``. Others qualify as well (tokio's
# ``Coop``, axum's ``MapIntoResponseFuture``) but are nested polls a request: more traps for
# coroutines no task-level figure needs, so they are left out.
WRAPPERS = ("tracing::instrument::Instrumented<",)
_KINDS = {
    "async_fn": CoroutineKind.ASYNC_FN,
    "async_block": CoroutineKind.ASYNC_BLOCK,
    "async_closure": CoroutineKind.ASYNC_CLOSURE,
}
POINTER_TAGS = (D.TAG_POINTER, 0x10, 0x42)  # pointer, reference, rvalue reference
ADDRESS_SIZE = 8  # x86-64
DYN_HOPS = 8  # type hops collected below a future met only through a vtable (``_future_poll``)
_STATE_NAMES = {0: "Unresumed", 1: "Returned", 2: "Panicked"}


def build_inventory(
    path: str | Path, *, cache_dir: Path | None = None, use_cache: bool = True,
    later: Callable[[Callable[[], object]], None] | None = None, progress: TextIO | None = None,
) -> Inventory:
    """The inventory of one ELF; cached on disk by build-id (``cache_dir`` None: the default place).
    ``later``: given the cache write instead of doing it (the proxy writes it once its answer
    has been sent). ``progress``: where a cold analysis shows its progress when it is a
    terminal (proxy.analysis.progress)."""
    elf = open_elf(path)
    if use_cache and elf.build_id:
        hit = cache_mod.load(elf.build_id, cache_dir)
        if hit is not None:
            hit.path = str(path)
            return hit
    shown = Progress(progress, f"asyncrsp: analysing {Path(path).name}")
    try:
        inv = analyse(elf, shown)
    except AnalysisError:
        raise
    except Exception as e:  # noqa: BLE001 - corrupt DWARF/CFI/lines: one line, never a traceback
        raise AnalysisError(f"{path}: corrupt debug information ({type(e).__name__}: {str(e)[:120]})") from e
    finally:
        shown.done()
    if use_cache and elf.build_id:
        if later is not None:
            later(lambda: cache_mod.store(inv, cache_dir))
        else:
            cache_mod.store(inv, cache_dir)
    return inv


def analyse(elf: ElfImage, progress: Progress = Progress.NONE) -> Inventory:
    inv = Inventory(elf.build_id, elf.path, elf.pie, elf.entry, warnings=list(elf.warnings))
    if elf.build_id is None:
        inv.warnings.append("no GNU build-id: the analysis is not cached")
    # the units are walked with stack discovery's tags, and their walks handed over to it
    # (DwarfView.hand_over): the first `monitor async tree` needs ~25 of them again
    dwarf = DwarfView.open(elf, inv.warnings, STACK_TAGS)
    if dwarf is None:
        inv.warnings.append(
            "no DWARF (.debug_info): coroutines cannot be told from closures, nothing to report;"
            " build with debug info (debug=2) for layouts"
        )
        return inv
    coll = _Collector(elf, dwarf, inv)
    coll.progress = progress
    coll.run()
    dwarf.hand_over()
    # the type collector and the collector refer to each other: without this the units'
    # arrays and every cache would wait for a full garbage collection, under whatever the
    # session reads next (a first `monitor async tree`: the stack frames' DWARF)
    coll.types = None  # type: ignore[assignment]
    del coll
    return inv


# -- unit selection -------------------------------------------------------------------------


def _symbol_sieve(elf: ElfImage) -> tuple[array[int], array[int]]:
    """(sorted addresses of the functions with a symbol that may name them as the sieve
    wants (``_symbol_may_be_named``), sorted addresses of every function with a symbol):
    a debug build's units hold ~45,000 subprograms with code, a few thousand of them
    closures or polls."""
    maybe: set[int] = set()
    every: set[int] = set()
    for sym in elf.symbols:
        if sym.is_func:
            every.add(sym.addr)
            if _symbol_may_be_named(sym.name):
                maybe.add(sym.addr)
    return array("Q", sorted(maybe)), array("Q", sorted(every))


def _symbol_may_be_named(name: str) -> bool:
    """Could the function of this symbol have a DWARF name starting with sieve.FN_PREFIXES?
    A legacy Rust symbol (``_ZN`` length-prefixed path components, ``17h<hash>E``) names
    it in its last component: ``{`` escaped as ``$u7b$`` (``{{closure}}``: closures and
    every coroutine), ``poll...``, ``run`` (generics are not in it). Any other symbol
    (v0 ``_R``, C): yes, the DWARF is asked."""
    if not name.startswith("_ZN") or not name.endswith("E"):
        return True
    if "u7b" not in name and "poll" not in name and "3run" not in name:
        return False  # no component can be one of them
    pos, last, prev = 3, "", ""
    end = len(name) - 1
    while pos < end:
        j = pos
        while j < end and name[j].isdigit():
            j += 1
        if j == pos:
            return True  # not the plain form
        n = int(name[pos:j])
        prev, last = last, name[j:j + n]
        pos = j + n
    if len(last) == 17 and last.startswith("h"):  # the hash: the name is the component before it
        last = prev
    return last.startswith(("$u7b$", "_$u7b$", "{", "poll")) or last == "run"




_FUTURE_POLL = "future..future..Future$GT$4poll"
# a Stream::poll_next: a stream met only through a dyn Stream (a StreamMap's values, async-std's
# Incoming around async-io's unfold of accept); its unit was read only when something else in it was
_STREAM_POLL_NEXT = "stream..Stream$GT$9poll_next"
_FUTURE_OBJ_DROP = "future_obj..UnsafeFutureObj$LT$T$GT$$u20$for$u20$alloc..boxed..Box$LT$F$GT$$GT$4drop"


def candidate_symbol(name: str) -> bool:
    """Could this symbol be a resume function (a closure, or GenFuture's poll), or a
    runtime's task function (tokio's ``task::raw::poll``, async-task's ``RawTask::run``)?
    A unit holding only task functions (a debug build's codegen unit of tokio's
    monomorphized ``raw::poll<T, S>``) is read for them too: without it the tokio adapter
    found no vtable, hence no task, in debug builds (tokio 1.43, tk_sync)."""
    if "4task3raw4poll" in name or ("10async_task3raw" in name and "3run" in name):
        return True
    if name.startswith("_ZN"):
        # a Future::poll: a wrapper future met only through a dyn Future (``_future_poll``)
        return "closure" in name or ("GenFuture" in name and "4poll" in name) or _FUTURE_POLL in name \
            or _STREAM_POLL_NEXT in name
    if name.startswith("_R"):
        return "NC" in name or "GenFuture" in name
    return False


# what every name candidate_symbol accepts holds (ElfImage.function_addresses asks it of
# those names only)
CANDIDATE_PARTS = (b"4task3raw4poll", b"10async_task3raw", b"closure", b"GenFuture",
                   _FUTURE_POLL.encode(), _STREAM_POLL_NEXT.encode(), b"NC")


def select_units(elf: ElfImage, dwarf: DwarfView) -> list[int]:
    """The units holding a candidate symbol's function (``candidate_symbol``), by the
    symbol tables' names: the unit walker starts before the image's symbol list is made."""
    if not dwarf.has_aranges():
        dwarf.warnings.append("no usable .debug_aranges: reading every unit (slow)")
        return list(dwarf.unit_offsets)
    units: set[int] = set()
    for addr in elf.function_addresses(candidate_symbol, CANDIDATE_PARTS):
        off = dwarf.unit_offset_at(addr)
        if off is not None:
            units.add(off)
    return sorted(units)


# -- the collector ---------------------------------------------------------------------------


@dataclass(slots=True)
class _Found:
    die: D.Die
    unit: D.Unit
    name: str
    env: D.Die | None
    era: Era


class _Collector:
    def __init__(self, elf: ElfImage, dwarf: DwarfView, inv: Inventory) -> None:
        self.elf = elf
        self.dwarf = dwarf
        self.inv = inv
        self.progress = Progress.NONE
        self._qual: dict[int, str] = {}
        # a coroutine wrapper's out-of-line poll (``_future_poll``): link low_pc -> (high_pc, its
        # return type's size, Poll's pending facts), for ``_wrapped_polls``
        self._wrapper_polls: dict[int, tuple[int, int, tuple[int, int, int] | None]] = {}
        self._tname: dict[int, str] = {}
        self._io_borrow_seen: set[int] = set()  # awaitee types whose pointer fields were searched
        self.symbol_sieve: tuple[array[int], array[int]] | None = None  # made by _symbol_tables
        self.sieve: S.Sieve | None = None
        self.types = TypeCollector(
            self, lambda t: self._is_env(t) and bool(ASYNC_ENV_RE.match(t.get(D.AT_NAME) or "")))

    def run(self) -> None:
        found: dict[int, _Found] = {}
        units = select_units(self.elf, self.dwarf)
        # walked (and sieved) in a second process while the ones before are scanned
        self.dwarf.prefetch(units, sieve=self._symbol_tables)
        self._symbol_tables()  # (made already when the walker's process started)
        try:
            # what does not depend on the scan, while the walker's process walks the first
            # units (on one core after the scan, ~0.1 s on the axum debug build); its
            # warnings said where they were before
            exit_warnings: list[str] = []
            exits = ExitFinder(self.elf, exit_warnings)
            self.inv.future_obj_drops = sorted(s.addr for s in self.elf.symbols
                                               if s.is_func and _FUTURE_OBJ_DROP in s.name)
            for i, uo in enumerate(units):
                self.progress.step("DWARF units", i, len(units))
                unit = self.dwarf.unit(uo)
                if unit is None:
                    continue
                self._scan_unit(unit, found)
                self.dwarf.trim()  # every unit: as fast as every 8th here, 11 MB less at the peak
        finally:
            self.dwarf.end_prefetch()
        self.inv.warnings += exit_warnings
        exits.warnings = self.inv.warnings
        # rustc 1.63 sometimes describes the inner generator's Pin<&mut ENV> self after all;
        # GenFuture<ENV>::poll is the breakpoint site then, the inner resume would double-count
        wrapped = {self.qualname(f.env) for f in found.values() if f.era is Era.GENFUTURE and f.env is not None}
        found = {k: f for k, f in found.items()
                 if not (f.era is Era.MODERN and f.env is not None and self.qualname(f.env) in wrapped)}
        for i, (low, f) in enumerate(sorted(found.items())):
            self.progress.step("resume functions' exits", i, len(found))
            rf = self._resume_fn(low, f, exits)
            if rf is not None:
                self.inv.resume_fns.append(rf)
        if self.inv.task_polls:
            self.inv.task_vtables = _task_vtables(self.elf, self.inv.task_polls)
        if self.inv.task_runs:
            self.inv.task_run_slots = _task_vtables(self.elf, self.inv.task_runs)
        while self.types.envs:  # coroutines met inside awaited types (MaybeDone<F>, Box<F>...)
            self._layout(self.types.envs.pop())
        self._wrapped_polls(exits)
        if self.types.truncated:
            self.inv.warnings.append("reflection types truncated: too many types reachable from awaitees")

    def _symbol_tables(self) -> tuple[array[int], array[int]]:
        """The sieve's symbol tables (``_symbol_sieve``), made once: after the walker's
        process has started, which walks meanwhile."""
        if self.symbol_sieve is None:
            self.symbol_sieve = _symbol_sieve(self.elf)
            self.sieve = S.Sieve(self.dwarf.reader.string_prefix, S.named_by_symbols(*self.symbol_sieve))
        return self.symbol_sieve

    # -- per unit ------------------------------------------------------------------------------
    def _scan_unit(self, unit: D.Unit, found: dict[int, _Found]) -> None:
        dies = unit.dies
        if not isinstance(dies, D.Dies):
            for die in list(dies.values()):
                self._scan_die(unit, die, found)
            return
        # which DIEs can matter, judged undecoded (proxy.analysis.sieve): a unit's few
        # coroutine DIEs among ~10^4 others; the unit walker's process has judged the units
        # it walked
        assert self.sieve is not None
        picked = dies.picked if dies.picked is not None else dies.sieve(self.sieve, unit.end)
        for i in picked:
            self._scan_die(unit, dies.at(i), found)

    def _scan_die(self, unit: D.Unit, die: D.Die, found: dict[int, _Found]) -> None:
        if die.tag == D.TAG_STRUCTURE:
            name = die.get(D.AT_NAME) or ""
            if ASYNC_ENV_RE.match(name):
                self._layout(die)
            elif name.startswith(RUNTIME_CELL_PREFIXES) and self.qualname(die).startswith(RUNTIME_CELLS):
                self.types.add(die.offset)  # a spawned task's cell (proxy.reflect.tokio_adapter)
        elif die.tag == D.TAG_SUBPROGRAM and die.get(D.AT_LOW_PC):
            self._task_poll(die)
            self._future_poll(die)
            f = self._classify(unit, die)
            if f is not None and die.attrs[D.AT_LOW_PC] not in found:
                found[die.attrs[D.AT_LOW_PC]] = f
        elif die.tag == D.TAG_INLINED_SUBROUTINE:
            self._inlined(unit, die)

    def _task_poll(self, die: D.Die) -> None:
        """tokio's ``raw::poll<T, S>``: its address names the task cell ``Cell<T, S>``;
        async-task's ``RawTask<F, T, S, M>::run<F, T, S, M>``: its address names F."""
        origin = self._origin(die)
        name = origin.get(D.AT_NAME) or ""
        if name.startswith("run<") and name.endswith(">"):
            if self.qualname(origin).startswith(ASYNC_TASK_RUN):
                args = _split_generics(name[len("run<"):-1])
                if len(args) == 4:
                    self.inv.task_runs[int(die.attrs[D.AT_LOW_PC])] = args[0]
                    # F's own type, for the adapter's walk: a wrapper of the spawned coroutine
                    # (async-std's SupportTaskLocals<F>, spawned as it is since async-executor
                    # 1.14) has its poll inlined into `run` in a release build, so no
                    # out-of-line poll collects it (_future_poll) and no awaitee names it
                    self.types.add(self._template_arg(origin))
            return
        if not name.startswith("poll<"):
            return
        q = self.qualname(origin)
        if q.startswith(TASK_POLL) and q.endswith(">"):
            self.inv.task_polls[int(die.attrs[D.AT_LOW_PC])] = RUNTIME_CELLS[0] + q[len(TASK_POLL):]

    def _future_poll(self, die: D.Die) -> None:
        """``poll(self: Pin<&mut T>, cx)`` of a future that is not a coroutine: T's type is
        collected (a few hops: wrappers reached only through a ``dyn Future``'s vtable, never
        from an awaitee's fields) and the function's address names it (``future_polls``)."""
        origin = self._origin(die)
        name = origin.get(D.AT_NAME) or ""
        if name not in ("poll", "poll_next") and not name.startswith(("poll<", "poll_next<")):
            return  # Stream::poll_next too: a Pin<Box<dyn Stream>>'s vtable slot 3 (a StreamMap's values)
        params = self._params(die) or self._params(origin)
        if len(params) != 2:
            return
        t = self._pin_target(self._first_param_type(die))
        if t is None or t.tag != D.TAG_STRUCTURE or self._is_env(t):
            return
        low = int(die.attrs[D.AT_LOW_PC])
        q = self.inv.future_polls[low] = self.qualname(t)
        self.types.add(t.offset, _TYPE_DEPTH - DYN_HOPS)
        if q.startswith(WRAPPERS) and "_env#" in q:  # its poll may hold the coroutine's inlined
            unit = self.dwarf.unit_of(die)
            ranges = self.dwarf.die_ranges(unit, die) if unit is not None else []
            high = max((hi for lo, hi in ranges if lo == low), default=0)
            if high:
                ret = origin.get(D.AT_TYPE)
                self._wrapper_polls[low] = (high, self._size(ret), self._poll_pending(ret))

    def _template_arg(self, die: D.Die) -> int | None:
        """The type of a generic function's first template type parameter (its DIE offset)."""
        unit = self.dwarf.unit_of(die)
        if unit is None:
            return None
        return next((unit.dies[c].get(D.AT_TYPE) for c in die.children
                     if unit.dies[c].tag == D.TAG_TEMPLATE_TYPE_PARAM), None)

    def _origin(self, die: D.Die) -> D.Die:
        return self.dwarf.origin(die)

    def _params(self, die: D.Die) -> list[D.Die]:
        unit = self.dwarf.unit_of(die)
        if unit is None:
            return []
        return [unit.dies[c] for c in die.children if unit.dies[c].tag == D.TAG_FORMAL_PARAMETER]

    def _first_param_type(self, die: D.Die) -> D.Die | None:
        params = self._params(die) or self._params(self._origin(die))
        if not params:
            return None
        p = params[0]
        t = p.get(D.AT_TYPE)
        if t is None:
            t = self._origin(p).get(D.AT_TYPE)
        return self._strip_typedefs(self.dwarf.die(t))

    def _strip_typedefs(self, t: D.Die | None) -> D.Die | None:
        for _ in range(8):
            if t is None or t.tag != D.TAG_TYPEDEF:
                return t
            t = self.dwarf.die(t.get(D.AT_TYPE))
        return t

    def _member(self, struct_die: D.Die, name: str) -> D.Die | None:
        unit = self.dwarf.unit_of(struct_die)
        if unit is None:
            return None
        for c in struct_die.children:
            m = unit.dies[c]
            if m.tag == D.TAG_MEMBER and m.get(D.AT_NAME) == name:
                return m
        return None

    def _pin_target(self, pin: D.Die | None) -> D.Die | None:
        """``Pin<&mut X>`` -> X, through the member ``pointer`` and the pointer type."""
        if pin is None or pin.tag != D.TAG_STRUCTURE:
            return None
        ptr_member = self._member(pin, "pointer")
        if ptr_member is None:
            return None
        ptr = self._strip_typedefs(self.dwarf.die(ptr_member.get(D.AT_TYPE)))
        if ptr is None or ptr.tag != D.TAG_POINTER:
            return None
        return self._strip_typedefs(self.dwarf.die(ptr.get(D.AT_TYPE)))

    def _is_env(self, t: D.Die | None) -> bool:
        return t is not None and t.tag == D.TAG_STRUCTURE and self._variant_part(t) is not None

    def _classify(self, unit: D.Unit, die: D.Die) -> _Found | None:
        origin = self._origin(die)
        name = origin.get(D.AT_NAME) or ""
        if ASYNC_FN_RE.match(name):
            ptype = self._first_param_type(die)
            env = self._pin_target(ptype)
            if env is not None and self._is_env(env):
                return _Found(die, unit, self.qualname(origin), env, Era.MODERN)
            if ptype is None and not self._params(origin) and not self._params(die):
                # line-tables-only (debug=1): names and code, no types, so no layout
                return _Found(die, unit, self.qualname(origin), None, Era.MODERN)
            return None
        env = self._genfuture_env(die) or self._genfuture_env(origin)
        if env is not None:
            return _Found(die, unit, self.qualname(env).replace("_env#", "#"), env, Era.GENFUTURE)
        return None

    # -- names ----------------------------------------------------------------------------------
    def qualname(self, die: D.Die) -> str:
        q = self._qual.get(die.offset)
        if q is not None:
            return q
        parts = [die.get(D.AT_NAME) or "?"]
        unit = self.dwarf.unit_of(die)
        p = die.parent
        while unit is not None and p is not None:
            pd = unit.dies[p]
            if pd.tag in (D.TAG_NAMESPACE, D.TAG_STRUCTURE, D.TAG_UNION, D.TAG_ENUMERATION):
                parts.append(pd.get(D.AT_NAME) or "?")
            elif pd.tag != D.TAG_SUBPROGRAM and pd.tag != D.TAG_LEXICAL_BLOCK:  # kept for stack discovery
                break
            p = pd.parent
        q = "::".join(reversed(parts))
        self._qual[die.offset] = q
        return q

    def type_name(self, off: int | None, depth: int = 0) -> str:
        if off is None:
            return "()"
        hit = self._tname.get(off)
        if hit is not None:
            return hit
        t = self.dwarf.die(off)
        if t is None or depth > 12:
            return "?"
        name = t.get(D.AT_NAME)
        if t.tag in (D.TAG_STRUCTURE, D.TAG_UNION, D.TAG_ENUMERATION, D.TAG_TYPEDEF):
            out = self.qualname(t)
        elif name:
            out = name
        elif t.tag == D.TAG_POINTER:
            out = "*" + self.type_name(t.get(D.AT_TYPE), depth + 1)
        elif t.tag == D.TAG_ARRAY:
            out = f"[{self.type_name(t.get(D.AT_TYPE), depth + 1)}; {self._array_len(t)}]"
        elif t.tag == D.TAG_SUBROUTINE_TYPE:
            out = "fn()"
        else:
            out = "?"
        self._tname[off] = out
        return out

    def _array_len(self, t: D.Die) -> str:
        unit = self.dwarf.unit_of(t)
        for c in t.children if unit else ():
            sub = unit.dies[c] if unit else None
            if sub is not None and sub.tag == D.TAG_SUBRANGE:
                if D.AT_COUNT in sub.attrs:
                    return str(sub.attrs[D.AT_COUNT])
                if D.AT_UPPER_BOUND in sub.attrs:
                    return str(sub.attrs[D.AT_UPPER_BOUND] + 1)
        return "?"

    def _size(self, off: int | None) -> int:
        t = self._strip_typedefs(self.dwarf.die(off))
        for _ in range(4):
            if t is None:
                return 0
            if D.AT_BYTE_SIZE in t.attrs:
                return int(t.attrs[D.AT_BYTE_SIZE])
            if t.tag in POINTER_TAGS:
                # Fact (rustc 1.63-1.95): pointer and reference DIEs carry no
                # DW_AT_byte_size; following DW_AT_type gave the pointee's size
                # (an Arc's NonNull field said 64, ArcInner<Mutex<u64>>).
                return ADDRESS_SIZE
            if t.tag == D.TAG_ARRAY:
                n = self._array_len(t)
                return self._size(t.get(D.AT_TYPE)) * int(n) if n.isdigit() else 0
            t = self._strip_typedefs(self.dwarf.die(t.get(D.AT_TYPE)))
        return 0

    def _loc(self, die: D.Die, file_attr: int = D.AT_DECL_FILE, line_attr: int = D.AT_DECL_LINE) -> SourceLoc | None:
        unit = self.dwarf.unit_of(die)
        if unit is None or file_attr not in die.attrs:
            return None
        f = self.dwarf.file_name(unit, die.attrs[file_attr])
        line = die.get(line_attr)
        return SourceLoc(f, int(line)) if f and line is not None else None

    # -- layouts -------------------------------------------------------------------------------------
    def _variant_part(self, env: D.Die) -> D.Die | None:
        unit = self.dwarf.unit_of(env)
        if unit is None:
            return None
        for c in env.children:
            d = unit.dies[c]
            if d.tag == D.TAG_VARIANT_PART:
                return d
        return None

    def _layout(self, env: D.Die) -> str | None:
        name = self.qualname(env)
        if name in self.inv.layouts:
            return name
        vp = self._variant_part(env)
        unit = self.dwarf.unit_of(env)
        if vp is None or unit is None:
            return None
        discr = self.dwarf.die(vp.get(D.AT_DISCR))
        if discr is None:
            self.inv.warnings.append(f"{name}: variant part without a discriminant")
            return None
        state_off = _member_offset(discr)
        state_size = self._size(discr.get(D.AT_TYPE)) or 1
        states = []
        for c in vp.children:
            v = unit.dies[c]
            if v.tag != D.TAG_VARIANT:
                continue
            st = self._state(unit, v, state_size)
            if st is not None:
                states.append(st)
        states.sort(key=lambda s: s.value)
        self.inv.layouts[name] = Layout(
            type_name=name,
            size=int(env.get(D.AT_BYTE_SIZE, 0)),
            state_offset=state_off,
            state_size=state_size,
            states=tuple(states),
            align=int(env.get(D.AT_ALIGNMENT, 8)),
        )
        return name

    def _state(self, unit: D.Unit, variant: D.Die, state_size: int) -> State | None:
        value = variant.get(D.AT_DISCR_VALUE)
        members = [unit.dies[c] for c in variant.children if unit.dies[c].tag == D.TAG_MEMBER]
        if value is None or not members:
            return None
        value &= (1 << (8 * state_size)) - 1
        m = members[0]
        base = _member_offset(m)
        vtype = self.dwarf.die(m.get(D.AT_TYPE))
        vname = (vtype.get(D.AT_NAME) if vtype else None) or _STATE_NAMES.get(value, f"Suspend{value - 3}")
        awaitee = None
        locals_: list[Member] = []
        seen: set[tuple[str, int]] = set()
        vunit = self.dwarf.unit_of(vtype) if vtype else None
        for c in vtype.children if (vtype and vunit) else ():
            f = vunit.dies[c]  # type: ignore[union-attr]
            if f.tag != D.TAG_MEMBER:
                continue
            mem = Member(
                name=f.get(D.AT_NAME) or "?",
                offset=base + _member_offset(f),
                size=self._size(f.get(D.AT_TYPE)),
                type_name=self.type_name(f.get(D.AT_TYPE)),
            )
            if mem.name == "__awaitee":
                awaitee = mem
                self.types.add(f.get(D.AT_TYPE))
                self._io_borrows(f.get(D.AT_TYPE))
            elif (mem.name, mem.offset) not in seen:  # rustc repeats some locals
                seen.add((mem.name, mem.offset))
                locals_.append(mem)
                self.types.add(f.get(D.AT_TYPE), _TYPE_DEPTH - 1)  # e.g. a MutexGuard's lock
                if mem.name == "self" and mem.type_name.startswith("&") and mem.type_name not in self.inv.fd_offsets:
                    fd = self.types.fd_offset(f.get(D.AT_TYPE))  # an I/O method's receiver
                    if fd is not None:
                        self.inv.fd_offsets[mem.type_name] = fd
        return State(value, vname, self._loc(m), awaitee, tuple(locals_))

    def _io_borrows(self, awaitee: int | None) -> None:
        """An awaited leaf future that borrows an I/O handle (tokio's ``io::util`` futures:
        ``Read { reader: &mut TcpStream, .. }``, ``WriteAll { writer, .. }``): where the fd lies
        behind each pointer field, as for an I/O method's ``self`` (``Inventory.fd_offsets``)."""
        t = self._strip_typedefs(self.dwarf.die(awaitee))
        unit = self.dwarf.unit_of(t) if t is not None and t.tag == D.TAG_STRUCTURE else None
        if unit is None or t is None or t.offset in self._io_borrow_seen:
            return
        self._io_borrow_seen.add(t.offset)
        for c in t.children:
            f = unit.dies[c]
            if f.tag != D.TAG_MEMBER:
                continue
            name = self.type_name(f.get(D.AT_TYPE))
            if name.startswith("&") and name not in self.inv.fd_offsets:
                fd = self.types.fd_offset(f.get(D.AT_TYPE))
                if fd is not None:
                    self.inv.fd_offsets[name] = fd

    # -- inlined coroutines --------------------------------------------------------------------
    def _inlined(self, unit: D.Unit, die: D.Die) -> None:
        origin = self._origin(die)
        name = origin.get(D.AT_NAME) or ""
        if not ASYNC_FN_RE.match(name):
            return
        container = die.parent
        while container is not None and unit.dies[container].tag != D.TAG_SUBPROGRAM:
            container = unit.dies[container].parent
        cdie = unit.dies[container] if container is not None else None
        if cdie is None or not cdie.get(D.AT_LOW_PC):
            return
        env = self._pin_target(self._first_param_type(origin))
        if env is None or not self._is_env(env):
            env = self._genfuture_env_around(unit, die)
        layout = self._layout(env) if env is not None and self._is_env(env) else None
        self.inv.inlined.append(
            InlinedCoroutine(
                name=self.qualname(origin),
                layout_name=layout,
                parent_low_pc=int(cdie.attrs[D.AT_LOW_PC]),
                ranges=tuple(self.dwarf.die_ranges(unit, die)),
                call_loc=self._loc(die, D.AT_CALL_FILE, D.AT_CALL_LINE),
            )
        )

    def _wrapped_polls(self, exits: ExitFinder) -> None:
        """A coroutine whose resume function was inlined into a wrapper future's poll (tokio
        under ``tokio_unstable`` spawns every task as ``tracing::instrument::Instrumented<F>``:
        the async block's poll is inlined into ``Instrumented<F>::poll``) has no code of its own
        to probe. The wrapper's poll becomes its resume function (``ResumeFn.wrapper``): self
        is the wrapper, the layout the coroutine's shifted by its offset inside the wrapper
        (a field, through ``ManuallyDrop``'s ``value``), exits the wrapper poll's."""
        have = {f.low_pc for f in self.inv.resume_fns}
        done: set[int] = set()
        for c in self.inv.inlined:
            low = c.parent_low_pc
            facts = self._wrapper_polls.get(low)
            if facts is None or low in have or low in done or c.layout_name is None:
                continue
            wrapper = self.inv.future_polls[low]
            inner = self.inv.layouts.get(c.layout_name)
            off = _field_offset(self.inv.types, wrapper, c.layout_name)
            if inner is None or off is None:
                continue
            done.add(low)
            high, ret_size, pending = facts
            shifted = _shifted_layout(inner, wrapper, off, self.inv.types[wrapper].size)
            self.inv.layouts.setdefault(wrapper, shifted)
            name = c.name
            m = ASYNC_FN_RE.match(name.split("<", 1)[0].rsplit("::", 1)[-1])
            rets, other = exits.exits(low, high)
            sym = self.elf.symbol_at(low)
            st0 = inner.state(0)
            self.inv.resume_fns.append(ResumeFn(
                low_pc=low, high_pc=high, symbol=sym.name if sym else "", name=name,
                path=name.split("<", 1)[0].rsplit("::", 1)[0], kind=_KINDS.get(m.group(1), CoroutineKind.UNKNOWN)
                if m else CoroutineKind.UNKNOWN, era=Era.MODERN, decl=st0.loc if st0 else c.call_loc,
                rets=rets, other_exits=other, layout_name=wrapper,
                self_in=_self_in(self.elf, ret_size), poll_pending=pending, wrapper=wrapper))
        self.inv.resume_fns.sort(key=lambda f: f.low_pc)

    def _genfuture_env_around(self, unit: D.Unit, die: D.Die) -> D.Die | None:
        """rustc 1.63: the inlined generator resume has no described self; its layout is
        the ENV of the nearest enclosing ``GenFuture<ENV>::poll`` (inlined or not)."""
        p = die.parent
        while p is not None:
            pd = unit.dies[p]
            if pd.tag in (D.TAG_SUBPROGRAM, D.TAG_INLINED_SUBROUTINE):
                env = self._genfuture_env(self._origin(pd))
                if env is not None:
                    return env
                if pd.tag == D.TAG_SUBPROGRAM:
                    return None
            p = pd.parent
        return None

    def _genfuture_env(self, fn: D.Die) -> D.Die | None:
        if not (fn.get(D.AT_NAME) or "").startswith("poll"):
            return None
        target = self._pin_target(self._first_param_type(fn))
        if target is None or not (target.get(D.AT_NAME) or "").startswith("GenFuture<"):
            return None
        inner = self._member(target, "__0")
        env = self._strip_typedefs(self.dwarf.die(inner.get(D.AT_TYPE))) if inner else None
        return env if env is not None and self._is_env(env) else None

    # -- resume functions --------------------------------------------------------------------------
    def _resume_fn(self, low: int, f: _Found, exits: ExitFinder) -> ResumeFn | None:
        ranges = self.dwarf.die_ranges(f.unit, f.die)
        if not ranges:
            return None
        high = max(hi for lo, hi in ranges if lo == low) if any(lo == low for lo, _ in ranges) else ranges[0][1]
        layout = self._layout(f.env) if f.env is not None else None
        origin = self._origin(f.die)
        symbol = origin.get(D.AT_LINKAGE_NAME) or origin.get(D.AT_MIPS_LINKAGE_NAME) or ""
        if not symbol:
            sym = self.elf.symbol_at(low)
            symbol = sym.name if sym else ""
        if "::" not in f.name:  # no namespaces (line tables only): take the path from the symbol
            dem = self.elf.symbol_at(low)
            if dem is not None and "::" in dem.demangled:
                f.name = dem.demangled.rsplit("::", 1)[0] + "::" + f.name
        short = f.name.rsplit("::", 1)[-1]
        m = ASYNC_FN_RE.match(short)
        kind = _KINDS.get(m.group(1), CoroutineKind.UNKNOWN) if m else CoroutineKind.UNKNOWN
        decl = self._loc(origin)
        if f.era is Era.GENFUTURE and layout is not None:
            st0 = self.inv.layouts[layout].state(0)
            decl = st0.loc if st0 else None
        rets, other = exits.exits(low, high)
        ret_size = self._size(origin.get(D.AT_TYPE))
        return ResumeFn(
            low_pc=low,
            high_pc=high,
            symbol=symbol,
            name=f.name,
            path=f.name.rsplit("::", 1)[0] if "::" in f.name else f.name,
            kind=kind,
            era=f.era,
            decl=decl,
            rets=rets,
            other_exits=other,
            layout_name=layout,
            self_in=_self_in(self.elf, ret_size),
            poll_pending=self._poll_pending(origin.get(D.AT_TYPE)),
        )

    def _poll_pending(self, off: int | None) -> tuple[int, int, int] | None:
        """Poll<T>'s discriminant (offset, size) and the value that means Pending,
        from the return type's variant part (a niche layout puts the
        discriminant inside T; Pending then has one niche value)."""
        t = self._strip_typedefs(self.dwarf.die(off))
        if t is None:
            return None
        vp = self._variant_part(t)
        unit = self.dwarf.unit_of(t)
        if vp is None or unit is None:
            return None
        discr = self.dwarf.die(vp.get(D.AT_DISCR))
        if discr is None:
            return None
        size = self._size(discr.get(D.AT_TYPE)) or 1
        for c in vp.children:
            v = unit.dies[c]
            if v.tag != D.TAG_VARIANT:
                continue
            names = [unit.dies[m].get(D.AT_NAME) for m in v.children if unit.dies[m].tag == D.TAG_MEMBER]
            if "Pending" in names:
                value = v.get(D.AT_DISCR_VALUE)
                if not isinstance(value, int):
                    return None
                return (_member_offset(discr), size, value & ((1 << (8 * size)) - 1))
        return None


def _self_in(elf: ElfImage, ret_size: int) -> str:
    """The register that holds self (the first argument) at a resume function's entry.
    SysV x86-64: a Poll<T> over 16 bytes comes back through a hidden pointer in rdi, which
    moves self to rsi. AAPCS64: that pointer goes in x8, self stays in x0."""
    if elf.machine == "EM_AARCH64":
        return "x0"
    return "rsi" if ret_size > 16 else "rdi"


def _split_generics(s: str) -> list[str]:
    """``A<B, C>, D`` -> [``A<B, C>``, ``D``]: split at top-level commas."""
    out: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(s):
        if ch in "<([":
            depth += 1
        elif ch in ">)]":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(s[start:i].strip())
            start = i + 1
    out.append(s[start:].strip())
    return out


_RELATIVE = {"EM_X86_64": 8, "EM_AARCH64": 1027}  # R_X86_64_RELATIVE, R_AARCH64_RELATIVE


def _task_vtables(elf: ElfImage, polls: dict[int, str]) -> dict[int, str]:
    """Static pointer slots holding one of ``polls``' function addresses: tokio's task
    vtables (``Vtable.poll`` is its first field, checked by the adapter against DWARF),
    async-task's ``TaskVTable.run`` slots. A PIE's slots are filled by
    R_X86_64_RELATIVE (R_AARCH64_RELATIVE) relocations (the addend is the target); a
    non-PIE's hold it as data."""
    import numpy as np

    out: dict[int, str] = {}
    # numpy over every relocation and data word (a debug build: ~10^5 of each), the
    # matches looked at one by one
    targets = np.array(sorted(polls), dtype=np.uint64)
    rela = elf.section_data(".rela.dyn") or b""
    rel = np.frombuffer(rela, dtype=np.dtype([("off", "<u8"), ("info", "<u8"), ("add", "<u8")]),
                        count=len(rela) // 24)
    relative = np.uint64(_RELATIVE.get(elf.machine, 8))
    hit = ((rel["info"] & np.uint64(0xFFFFFFFF)) == relative) & np.isin(rel["add"], targets)
    for off, addend in zip(rel["off"][hit].tolist(), rel["add"][hit].tolist()):
        out[off] = polls[addend]
    for name in (".data.rel.ro", ".data"):
        sec = elf.sections.get(name)
        data = elf.section_data(name) or b""
        if sec is None:
            continue
        words = np.frombuffer(data, dtype="<u8", count=len(data) // 8)
        for i in np.nonzero(np.isin(words, targets))[0].tolist():
            out.setdefault(sec[0] + 8 * i, polls[int(words[i])])
    return out


def _field_offset(types: dict[str, TypeInfo], outer: str, inner: str, depth: int = 3) -> int | None:
    """Where a value of type `inner` sits inside a value of type `outer`, as a field of a
    field... (structs only, `depth` levels; ``ManuallyDrop<T>`` holds T at 0): None when not
    found, or found at two places."""
    info = types.get(outer)
    if info is None or info.kind != "struct" or depth == 0:
        return None
    found: list[int] = []
    for f in info.fields:
        if f.type_name == inner or f.type_name == f"core::mem::manually_drop::ManuallyDrop<{inner}>":
            found.append(f.offset)
        else:
            sub = _field_offset(types, f.type_name, inner, depth - 1)
            if sub is not None:
                found.append(f.offset + sub)
    return found[0] if len(found) == 1 else None


def _shifted_layout(layout: Layout, name: str, off: int, size: int) -> Layout:
    """`layout` seen from a wrapper (`name`, `size` bytes) that holds the coroutine at `off`: every offset + off."""
    def member(m: Member | None) -> Member | None:
        return None if m is None else Member(m.name, m.offset + off, m.size, m.type_name)

    states = tuple(State(s.value, s.name, s.loc, member(s.awaitee), tuple(member(x) for x in s.locals))  # type: ignore[misc]
                   for s in layout.states)
    return Layout(name, size, layout.state_offset + off, layout.state_size, states, layout.align)


def _member_offset(m: D.Die) -> int:
    v = m.get(D.AT_DATA_MEMBER_LOCATION, 0)
    if isinstance(v, bytes):  # an expression: DW_OP_plus_uconst N
        if v[:1] == b"\x23":
            return D._uleb(v, 1)[0]
        return 0
    return int(v)
