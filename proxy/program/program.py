"""One debugged process, and everything known about it.

A ``Program`` is made once per process the proxy (or ``asyncrsp ps``) looks at,
live or not (the model: drgn's ``Program``, the same object for a live process
and a core). It owns:

* the reflection source: the binary's inventory, its load bias, the runtime
  adapters (``proxy.reflect.ReflectSource``, found once: ``Stop.find_source``);
* what is kept across stops: the tasks found at earlier stops and their ids
  (``EarlierStops``, ``TaskIds``);
* the current stop's ``Snapshot`` (``SnapshotStore``: at most one per stop) and
  the documents rendered from it;
* task threads' state between stops (``TaskThreads``).

``snapshot(stop, read)`` is the one way to the stop's snapshot; ``build`` is the
one function that builds one (the full snapshot, the capped one of task threads,
a core's or a stopped copy's). Every answer renders what it returns: monitor
commands, qXfer documents, ``info os`` tables, task threads, ``ps``/``tree``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from .stops import ReadMemory, Stop
from .taskthreads import TaskThreads

if TYPE_CHECKING:
    from proxy.snapshot.inputs import EarlierStops
    from proxy.snapshot.ids import TaskIds
    from proxy.snapshot.model import Snapshot
    from proxy.snapshot.store import SnapshotStore

# Made when first asked for: every session has a Program, and one on a program without async
# code may never build a snapshot (its imports: the analysis' and the engine's models).

Adapters = Callable[[list[Any]], list[Any]]


class Program:
    def __init__(self, *, adapters: str = "auto", source: Any = None) -> None:
        self.adapters = adapters  # which runtime adapters to look for: auto | off | tokio | ...
        self._source: Any = source  # ReflectSource, or a string saying why there is none
        self._kept: tuple[EarlierStops, TaskIds] | None = None
        self._store: SnapshotStore | None = None
        self._docs: tuple[Snapshot, dict[tuple[str, str], bytes]] | None = None
        self.threads = TaskThreads(self)

    @property
    def store(self) -> SnapshotStore:
        """The current stop's snapshot (at most one per stop)."""
        if self._store is None:
            from proxy.snapshot.store import SnapshotStore

            self._store = SnapshotStore()
        return self._store

    @property
    def earlier(self) -> EarlierStops:
        """The tasks found at earlier stops (rule 7 of proxy.snapshot.build)."""
        return self._across()[0]

    @property
    def ids(self) -> TaskIds:
        """Task ids kept across stops (proxy.snapshot.ids)."""
        return self._across()[1]

    def _across(self) -> tuple[EarlierStops, TaskIds]:
        """What is kept across stops, for one source (a new inventory starts them again)."""
        if self._kept is None:
            from proxy.snapshot.ids import TaskIds
            from proxy.snapshot.inputs import EarlierStops

            self._kept = (EarlierStops(), TaskIds())
        return self._kept

    # ---- what is known of the binary ---------------------------------------------------------------

    def source(self, stop: Stop) -> Any:
        """The reflection source (None: none: ``note`` says why)."""
        found = stop.find_source(self._source, self.adapters)
        if found is not self._source:
            if self._source is not None and not isinstance(self._source, str):
                self._kept = None
            self._source = found
        return found if not isinstance(found, str) else None

    @property
    def inventory(self) -> Any:
        """The binary's inventory once a source was found (proxy.analysis.model.Inventory)."""
        return getattr(self._source, "inventory", None)

    # ---- the stop's snapshot ------------------------------------------------------------------

    def key(self, stop: Stop, src: Any) -> tuple[Hashable, ...]:
        """What changes the answer: the stop, the engine and its position, the mode, the source."""
        engine = stop.engine
        return (stop.serial, id(engine), engine.cursor_seq if engine is not None else None, stop.mode, id(src))

    def held(self, stop: Stop, src: Any) -> Snapshot | None:
        """The stop's complete snapshot when it is built already."""
        return self.store.held(self.key(stop, src))

    def snapshot(self, stop: Stop, read: ReadMemory | None) -> Snapshot | None:
        """The stop's snapshot, built at most once per stop. None: neither an engine nor a
        program file to read memory with."""
        src = self.source(stop)
        if src is None and stop.engine is None:
            return None
        key = self.key(stop, src)
        adapters = None
        if read is not None and self.store.held(key) is None:
            read, adapters = self.threads.for_full_build(key, read)
        if read is None:
            return self.build(stop, None, src, key)
        snap = self.store.get(key, lambda: self.build(stop, read, src, key, adapters))
        snap.bind(read)  # what it makes on demand (trees, the wait-for graph) reads through this question
        if self.store.held(key) is snap:
            self.threads.full_built()
        return snap

    def observed(self, stop: Stop) -> Snapshot | None:
        """The stop's snapshot of what was observed only (no memory read: the engine's tasks and
        timing), when the full one cannot be made (it reads more than its budget)."""
        if stop.engine is None:
            return None
        return self.build(stop, None, None, self.key(stop, None), memory=False)

    def build(self, stop: Stop, read: ReadMemory | None, src: Any, key: tuple[Hashable, ...],
              adapters: Adapters | None = None, memory: bool = True) -> Snapshot:
        """The one builder of a snapshot, from the stop's facts and what the program keeps;
        ``adapters`` may replace the runtime adapters (task threads read only the tasks they
        list: proxy.threads.listing); ``memory`` False: the observed tasks only."""
        from proxy.snapshot.build import build_snapshot
        from proxy.snapshot.inputs import SnapshotInputs

        engine = stop.engine
        origin = "seen before" if stop.mode == "off" else "observed"
        notes: list[str] = []
        if stop.mode == "off":
            notes.append("note: mode off: tasks read from memory at this stop; observed ones are those seen before")
        threads = (stop.registers() or {}) if memory else {}
        if src is not None:
            inputs = SnapshotInputs.from_source(src, engine=engine, engine_origin=origin, threads=threads,
                                                pcs=stop.pcs(), notes=notes,
                                                earlier=self.earlier, ids=self.ids)
            if adapters is not None:
                inputs.adapters = adapters(list(inputs.adapters))
        else:
            inputs = SnapshotInputs(inventory=engine.catalog.inventory, bias=engine.catalog.load_bias,
                                    engine=engine, engine_origin=origin, pcs=stop.pcs(), notes=tuple(notes),
                                    memory=False, earlier=self.earlier, ids=self.ids)
        serial = key[0]
        return build_snapshot(inputs, read, stop=serial if isinstance(serial, int) else 0)

    # ---- what is rendered from it -------------------------------------------------------------

    def document(self, snap: Snapshot, name: tuple[str, str], render: Callable[[], bytes]) -> bytes:
        """A document rendered from ``snap``, made once per snapshot: every chunk of one document
        at one stop comes from the same bytes (the proxy's counters, its RSS, change between
        two reads)."""
        docs = self._docs
        if docs is None or docs[0] is not snap:
            docs = self._docs = (snap, {})
        doc = docs[1].get(name)
        if doc is None:
            doc = docs[1][name] = render()
        return doc

    def lines(self) -> Sequence[str]:
        """What ``stats`` prints of the program beyond the session's lines."""
        return self.threads.lines()
