"""What one build of the snapshot is given, and what it learns as it goes.

``SnapshotInputs`` is everything a caller hands over (the engine, the program's
inventory, the threads' registers and pcs, the runtime adapters, the session's
earlier stops and task ids); ``BuildState`` is the facts one build gathers
(the engine's keys, the threads' poll chains, which node runs where), shared
by the build's parts: ``engine_view`` (observed polls), ``merge`` (memory and
stacks: the merge rules), ``convert`` (the frozen values).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.analysis.model import Frame as SrcFrame
from proxy.analysis.model import Inventory
from proxy.reflect.memory import BlockReader, ReadMemory
from proxy.reflect.tree import Root
from proxy.reflect.walker import Reflector

from .ids import TaskIds
from .model import TaskState

Key = tuple[int, str]  # a coroutine: (address, state-machine type)


@dataclass(slots=True)
class EarlierStops:
    """Tasks found at earlier stops (session-owned, updated by each build)."""

    seen: dict[Key, Root] = field(default_factory=dict)
    status: dict[Key, str] = field(default_factory=dict)


@dataclass(slots=True)
class SnapshotInputs:
    inventory: Inventory | None = None
    bias: int = 0
    engine: Any = None  # proxy.graph.engine.Engine | None
    engine_origin: str = "observed"  # "seen before" when nothing observes any more (mode off)
    threads: Mapping[int, dict[str, int]] = field(default_factory=dict)  # LWP -> registers
    pcs: Mapping[int, int] = field(default_factory=dict)  # LWP -> pc at this stop
    frames_at: Callable[[int], list[SrcFrame]] | None = None  # link-time pc -> frames, inlined first
    symbol_at: Callable[[int], str | None] | None = None
    stacks: Callable[[], Any] | None = None  # -> proxy.reflect.stacks.StackFinder | None
    adapters: Sequence[Callable[[Reflector], list[Root] | None]] = ()
    now_ns: int | None = None
    earlier: EarlierStops = field(default_factory=EarlierStops)
    ids: TaskIds = field(default_factory=TaskIds)
    notes: tuple[str, ...] = ()
    memory: bool = True  # False: no memory reads at all (the tree is the engine's edges)

    @classmethod
    def from_source(cls, src: Any, **kw: Any) -> SnapshotInputs:
        """From a ``proxy.reflect.ReflectSource`` (inventory, bias, helpers); the program's
        earlier stops and ids come in ``kw``."""
        adapters = [src.discover] if getattr(src, "discover", None) is not None else []
        notes = (src.note,) if getattr(src, "note", None) else ()
        return cls(inventory=src.inventory, bias=src.bias, frames_at=src.frames_at, symbol_at=src.symbol_at,
                   stacks=src.stacks, adapters=adapters, now_ns=src.now_ns() if src.now_ns else None,
                   notes=notes + tuple(kw.pop("notes", ())), **kw)



class BuildState:
    """The facts one build gathers (see the module docstring)."""

    def __init__(self, inp: SnapshotInputs, read: ReadMemory | None) -> None:
        self.inp = inp
        self.inv = inp.inventory
        self.engine = inp.engine
        self.notes: list[str] = list(inp.notes)
        self.r: Reflector | None = None
        if read is not None and self.inv is not None and inp.memory and self.inv.layouts:
            self.r = Reflector(self.inv, inp.bias, BlockReader(read), now_ns=inp.now_ns, symbol_at=inp.symbol_at)
        self.engine_ids: dict[Key, int] = {}  # unfinished engine tasks by key
        self.finished_keys: set[Key] = set()
        self.stack_keys: dict[Key, int] = {}  # futures found on a thread's stack -> the thread
        self.engine_fns: dict[Key, tuple[int, int]] = {}  # observed coroutine -> its resume fn (link-time)
        self.chains: dict[int, list[Key | None]] = {}  # LWP -> running coroutines, innermost first
        self.chain_pcs: dict[Key, int] = {}  # a coroutine on a thread's stack -> its frame's pc (link-time)
        self.stack_chains: dict[int, list[Key | None]] = {}  # LWP -> the stack's own chain (StackFinder.chains)
        self.running: dict[int, int] = {}  # id(Node) -> thread
        self._pcf: list[list[SrcFrame]] | None = None
        self.frame_pcs: dict[int, list[int]] = {}  # LWP -> every unwound frame's link-time pc
        self._states: dict[tuple[Any, ...], tuple[str, TaskState]] = {}  # see _convert
        self._found: dict[str, tuple[str, ...]] = {}  # Root.origin -> Task.found_by
        self.mutex_holders: dict[int, tuple[Any, Any]] = {}  # Mutex address -> (Root, Node) of the task holding it
        self._snap: Any = None  # weakref to the snapshot built
        self.kept: list[Any] = []  # the nodes ``running`` names (a task lets its merged tree go once converted)
        self._graph: tuple[Any, Any, bool, Any] | None = None  # (graph, per task, complete, the read it used)
        self._bound: Any = read  # the read of the command pass now asking

