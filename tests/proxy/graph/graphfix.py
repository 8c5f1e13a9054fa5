"""A hand-built inventory and an event builder for the engine tests.

The programs modelled (src/main.rs, link-time addresses, a PIE load bias):

    async fn c() { sleep().await }                     // Suspend0 at :2
    async fn b() { c().await }                         // Suspend0 at :5  (call returns to B_RET_C)
    async fn a() { b().await }                         // Suspend0 at :9  (call returns to A_RET_B)
    async fn x() / y() { ... .await }                  // Suspend0 at :13 / :16
    async fn sel() { select!{x(), y()} }               // Suspend0 at :20 (returns to SEL_RET_X/Y)
    async fn child() { ... .await }                    // spawned, Suspend0 at :25
"""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.analysis.model import (
    CoroutineKind,
    Era,
    Inventory,
    Layout,
    Member,
    ResumeFn,
    SourceLoc,
    State,
)
from proxy.graph.engine import Catalog, Engine
from proxy.graph.events import EventsLost, PollEnter, PollEvent, PollExit

BIAS = 0x5555_5555_0000
FILE = "src/main.rs"

# link-time low_pc of each resume fn
LOW = {"c": 0x1000, "b": 0x2000, "a": 0x3000, "x": 0x4000, "y": 0x5000, "sel": 0x6000, "child": 0x7000}
DECL = {"c": 1, "b": 4, "a": 8, "x": 12, "y": 15, "sel": 19, "child": 24}
AWAIT = {"c": 2, "b": 5, "a": 9, "x": 13, "y": 16, "sel": 20, "child": 25}
# link-time return addresses of the calls to a child's resume fn, and their lines
RET = {("b", "c"): 0x2040, ("a", "b"): 0x3040, ("sel", "x"): 0x6040, ("sel", "y"): 0x6080}
RET_LINE = {0x2040: 5, 0x3040: 9, 0x6040: 21, 0x6080: 22}
PC_LINE = {0x1020: 2}  # a breakpoint inside c


def site(name: str) -> int:
    return LOW[name] + BIAS


def ret(parent: str, child: str) -> int:
    return RET[(parent, child)] + BIAS


def layout(name: str) -> Layout:
    loc = SourceLoc(FILE, AWAIT[name])
    locals_ = (
        Member("n", 16, 4, "u32"),
        Member("flag", 20, 1, "bool"),
        Member("name", 24, 16, "&str"),
    )
    return Layout(
        type_name=f"rt::{name}::{{async_fn_env#0}}",
        size=64,
        state_offset=8,
        state_size=1,
        states=(
            State(0, "Unresumed", SourceLoc(FILE, DECL[name])),
            State(1, "Returned", SourceLoc(FILE, AWAIT[name] + 1)),
            State(2, "Panicked", SourceLoc(FILE, AWAIT[name] + 1)),
            State(3, "Suspend0", loc, Member("__awaitee", 32, 32, "X"), locals_),
        ),
    )


def inventory() -> Inventory:
    inv = Inventory(build_id="f00d", path="/tmp/prog", pie=True, entry=0x100)
    for name, low in LOW.items():
        lay = layout(name)
        inv.layouts[lay.type_name] = lay
        inv.resume_fns.append(
            ResumeFn(
                low_pc=low, high_pc=low + 0x100, symbol=f"_ZN2rt{name}", name=f"rt::{name}::{{async_fn#0}}",
                path=f"rt::{name}", kind=CoroutineKind.ASYNC_FN, era=Era.MODERN,
                decl=SourceLoc(FILE, DECL[name]), rets=(low + 0xf0,), layout_name=lay.type_name,
            )
        )
    return inv


def line_for_pc(pc: int) -> SourceLoc | None:
    if pc + 1 in RET_LINE:
        return SourceLoc(FILE, RET_LINE[pc + 1])
    if pc in PC_LINE:
        return SourceLoc(FILE, PC_LINE[pc])
    return None


def catalog() -> Catalog:
    return Catalog(inventory(), BIAS, line_for_pc)


def engine(**kw: int) -> Engine:
    return Engine(catalog(), **kw)  # type: ignore[arg-type]


@dataclass
class Script:
    """Builds events with increasing seq and a simulated stack per thread."""

    seq: int = 0
    sp: dict[int, int] = field(default_factory=dict)  # thread -> current sp
    open: dict[int, list[tuple[str, int]]] = field(default_factory=dict)
    events: list[PollEvent] = field(default_factory=list)
    time: int = 0

    def _next(self) -> int:
        self.seq += 1
        self.time += 1000
        return self.seq

    def enter(self, name: str, obj: int, *, thread: int = 1, parent: str | None = None,
              state: int | None = None) -> PollEnter:
        stack = self.open.setdefault(thread, [])
        sp = (stack[-1][1] - 0x100) if stack else 0x7FFF_0000 + thread * 0x10_0000
        parent = parent or (stack[-1][0] if stack else None)
        ra = RET.get((parent, name), 0x9990) + BIAS if parent is not None else 0x9999 + BIAS
        ev = PollEnter(self._next(), thread, site(name), obj, sp, ra, state, self.time)
        stack.append((name, sp))
        self.events.append(ev)
        return ev

    def exit(self, state: int | None, *, thread: int = 1, panicked: bool = False,
             obj: int | None = None) -> PollExit:
        name, sp = self.open[thread].pop()
        if panicked:
            sp -= 0x40  # inside the frame: after the prologue
        ev = PollExit(self._next(), thread, site(name), sp, state, obj, None, panicked, self.time)
        self.events.append(ev)
        return ev

    def lost(self, count: int = 5) -> EventsLost:
        ev = EventsLost(self._next(), count, "test")
        self.events.append(ev)
        return ev

    def drop_open(self, thread: int, n: int = 1) -> None:
        """Forget the innermost n scopes without an exit event (a missed exit)."""
        for _ in range(n):
            self.open[thread].pop()


def snapshot(e, pcs=None):  # type: ignore[no-untyped-def]
    """The engine-only snapshot of a hand-built graph (proxy.snapshot.build rule 9)."""
    from proxy.snapshot import SnapshotInputs, build_snapshot

    return build_snapshot(SnapshotInputs(inventory=e.catalog.inventory, bias=BIAS, engine=e, pcs=pcs or {},
                                         memory=False), None)


def monitor_context(e, **kw):  # type: ignore[no-untyped-def]
    from proxy.commands.monitor import MonitorContext

    # observed: the memory-less snapshot the program gives when the full one is over budget
    return MonitorContext(e, snapshot=lambda: snapshot(e, kw.get("pcs")), observed=lambda: snapshot(e, kw.get("pcs")),
                          **kw)
