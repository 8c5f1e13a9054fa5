"""Optional tokio runtime adapter (``--tokio-adapter``): find every spawned task in memory.

Off by default: it depends on tokio's private task layout. It needs no
runtime cooperation and works when the runtime is wedged:

1. The analysis records tokio's ``raw::poll<T, S>`` functions and the static
   task ``Vtable``s that point at them (``Inventory.task_vtables``: vtable ->
   ``Cell<T, S>``), and the DWARF layout of every ``Cell<T, S>``.
2. Every task cell starts with a ``Header`` whose ``vtable`` field points at
   one of those vtables. The adapter scans the program's writable anonymous
   memory (``[heap]`` and the malloc arenas, from ``/proc/PID/maps``: local
   targets only; thread stacks, recognised by their guard page, are skipped)
   for such words, bounded by ``MAX_SCAN`` bytes. A program that is not a
   live local process (a core file, a copied snapshot) gives its ranges
   itself (``ranges``).
3. For each header at its cell type's alignment (a copy of a cell's bytes elsewhere is no
   task): ``Cell.core.stage`` is a ``Stage<T>`` enum; when it is ``Running``, its payload is
   the task's future: a root for the walker. A LocalSet's task (``spawn_local``) names the
   LocalSet's shared state in ``core.scheduler``: it is local to the thread whose stack
   awaits that LocalSet (``local_set_threads``).

Version check (checked on tokio 1.24.2, the corpus' version): ``Header`` must
have a ``vtable`` field, ``Vtable`` a ``poll`` field at offset 0, and each cell
``core.stage`` must be an enum with a ``Running`` variant; otherwise the
adapter says which of these it did not find and finds nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from proxy.analysis.model import Inventory
from proxy.host.procmem import Mapping, read_maps

from .tree import Root
from .walker import Reflector, coroutine_path

MAX_SCAN = 64 << 20
HEADER = "tokio::runtime::task::core::Header"
VTABLE = "tokio::runtime::task::raw::Vtable"


def check(inv: Inventory) -> str | None:
    """Why this binary's tokio layout is not the one the adapter knows (None: it is)."""
    if not inv.task_vtables:
        return "no tokio task vtables in this program (not tokio, or no debug info)"
    h, v = inv.types.get(HEADER), inv.types.get(VTABLE)
    if h is None or h.field("vtable") is None:
        return f"unsupported tokio layout: {HEADER} has no 'vtable' field (adapter knows tokio 1.x, checked 1.24)"
    if v is None or v.field("poll") is None or v.field("poll").offset != 0:  # type: ignore[union-attr]
        return f"unsupported tokio layout: {VTABLE}.poll is not its first field"
    return None


def heap_ranges(pid: int, limit: int = MAX_SCAN) -> list[tuple[int, int]]:
    """Writable anonymous mappings of a local process, minus thread stacks."""
    try:
        return heap_ranges_of(read_maps(pid), limit)
    except (OSError, ValueError, IndexError):
        return []


def heap_ranges_of(mappings: list[Mapping], limit: int = MAX_SCAN) -> list[tuple[int, int]]:
    """Writable anonymous mappings (a /proc/PID/maps read here or through the stub), minus
    thread stacks (an anonymous mapping right above a small ---p guard)."""
    maps = [(m.start, m.end, m.perms, m.path) for m in mappings]
    out: list[tuple[int, int]] = []
    total = 0
    prev = None
    for lo, hi, perms, name in maps:
        guard_below = prev is not None and prev[1] == lo and prev[2] == "---p" and prev[1] - prev[0] <= 64 << 10
        prev = (lo, hi, perms, name)
        if perms != "rw-p" or name not in ("", "[heap]") or guard_below:
            continue
        size = min(hi - lo, limit - total)
        if size <= 0:
            break
        out.append((lo, lo + size))
        total += size
    return out


class TokioAdapter:
    def __init__(self, inv: Inventory, bias: int, pid: int | None, local: bool,
                 ranges: Callable[[], list[tuple[int, int]]] | None = None) -> None:
        self.inv = inv
        self.bias = bias
        self.pid = pid
        self.ranges = ranges if ranges is not None else (lambda: heap_ranges(pid) if pid else [])
        self.note = check(inv)
        if self.note is None and ranges is None and not (local and pid):
            self.note = "the tokio adapter scans /proc/PID/maps: it needs a local program"
        self.vtables = {a + bias: cell for a, cell in inv.task_vtables.items()}
        h = inv.types.get(HEADER)
        f = h.field("vtable") if h is not None else None
        self.vt_off = f.offset if f is not None else 16
        self.scanned = 0  # bytes, last discovery

    name = "tokio"

    @property
    def targets(self) -> dict[int, str]:
        return self.vtables

    def discover(self, r: Reflector) -> list[Root] | None:
        from .adapters.scan import scan

        if self.note is not None:
            return None
        hits, self.scanned = scan(r, self.ranges(), [self])
        return self.roots(r, hits[0])

    def roots(self, r: Reflector, hits: dict[int, str]) -> list[Root]:
        return self.roots_upto(r, hits, None)[0]

    def roots_upto(self, r: Reflector, hits: dict[int, str], keep: int | None) -> tuple[list[Root], int]:
        """The first ``keep`` tasks by header address (all: None), and how many more there
        are: past ``keep`` only each cell's stage is read (is the task still pending?), no
        root is made (task threads list 1,024 of 10,000 tasks: proxy/threads/listing.py)."""
        roots = []
        more = 0
        plans: dict[str, CellPlan | None] = {}
        for header, cell in sorted(hits.items()):
            if cell not in plans:
                plans[cell] = cell_plan(r, cell)
            plan = plans[cell]
            if plan is None:
                continue
            if keep is not None and len(roots) >= keep:
                more += plan.pending(r, header)
                continue
            root = plan.root(r, header)
            if root is not None:
                roots.append(root)
                r.task_names[header] = f"{root.label} {coroutine_path(root.type_name)}"
        return roots, more


class CellPlan:
    """Where a ``Cell<T, S>``'s stage, its discriminant and its running future lie (offsets
    from the header), found once per cell type: 100,000 tasks of one type are 100,000 reads
    of the same few offsets, not 100,000 walks through the types."""

    __slots__ = ("stage", "enum", "discr", "size", "tid", "futures", "core", "local", "align")

    def __init__(self, stage: int, enum: Any, tid: int | None, core: tuple[int, str] | None,
                 local: int | None = None, align: int = 0) -> None:
        self.stage, self.enum, self.tid = stage, enum, tid
        # A cell is allocated at its type's alignment (`repr(align(128))` on x86-64 and AArch64:
        # tokio pads it to a cache line): a header anywhere else is a copy of a cell's bytes.
        # Fact (axum's chat, release, one run in two): two headers in the main heap at 120 mod
        # 128, state 0xcc (a new task's) and no owner, the send and receive tasks of a user
        # just built there and moved into their boxes, were shown as two more tasks, not yet
        # polled, beside the two users' real ones.
        self.align = align
        self.core = core  # (offset, type) of a Core with `spawned_at` (read per task), else None
        self.local = local  # offset of a LocalSet task's `core.scheduler` pointer (its Shared), else None
        self.discr, self.size = stage + enum.discr.offset, enum.discr.size
        self.futures: dict[int, tuple[int, str] | None] = {}  # discriminant -> (offset, type) of Running

    def pending(self, r: Reflector, header: int) -> bool:
        """The task at ``header`` still runs its future (what ``root`` would make a root of)."""
        return self._running(r, header) is not None

    def _running(self, r: Reflector, header: int) -> tuple[int, str] | None:
        if self.align > 1 and header % self.align:
            return None
        value = r.mem.u(header + self.discr, self.size)
        if value is None:
            return None
        fut = self.futures.get(value, _UNSET)
        if fut is _UNSET:
            fut = self.futures[value] = self._future(r, value)
        return fut  # type: ignore[no-any-return]

    def root(self, r: Reflector, header: int) -> Root | None:
        fut = self._running(r, header)
        if fut is None:
            return None  # unreadable, finished or consumed: not pending
        tid = r.mem.word(header + self.tid) if self.tid is not None else None
        label = f"tokio#{tid}" if tid is not None else ""
        at = spawn_location(r, header + self.core[0], self.core[1]) if self.core is not None else None
        owner = r.mem.word(header + self.local) if self.local is not None else None
        return Root(header + fut[0], fut[1], label, "tokio runtime",
                    header=f"spawned task, header 0x{header:x}" + (f", spawned at {at}" if at else ""),
                    owner=owner or None)

    def _future(self, r: Reflector, value: int) -> tuple[int, str] | None:
        v = self.enum.variant_for(value)
        if v is None or v.name != "Running" or not v.fields:
            return None
        from .describers.combinators import unwrap

        off, ftype = unwrap(r, self.stage + v.fields[0].offset, v.fields[0].type_name)  # by type only
        return off, ftype


_UNSET: Any = object()


def cell_plan(r: Reflector, cell: str) -> CellPlan | None:
    """The cell's plan; None when its layout is not one the adapter knows."""
    c = r.type(cell)
    core = c.field("core") if c is not None else None
    core_t = r.type(core.type_name) if core is not None else None
    stage = core_t.field("stage") if core_t is not None else None
    if core is None or core_t is None or stage is None:
        return None
    tid_f = core_t.field("task_id")
    off, tname = core.offset + stage.offset, stage.type_name
    for _ in range(4):  # CoreStage { stage: UnsafeCell { __0: UnsafeCell { value: Stage } } }
        t = r.type(tname)
        if t is None or t.kind == "enum" or len(t.fields) != 1:
            break
        off, tname = off + t.fields[0].offset, t.fields[0].type_name
    st = r.type(tname)
    if st is None or st.kind != "enum" or st.discr is None:
        return None
    spawned = (core.offset, core.type_name) if core_t.field("spawned_at") is not None else None
    sched = core_t.field("scheduler")
    local = None
    if sched is not None and sched.type_name.startswith(LOCAL_SHARED):
        from .describers.fields import _path

        at = _path(r, 0, sched.type_name, "ptr", "pointer")
        local = core.offset + sched.offset + at if at is not None else None
    return CellPlan(off, st, core.offset + tid_f.offset if tid_f is not None else None, spawned, local,
                     c.align if c is not None else 0)


LOCAL_SHARED = "alloc::sync::Arc<tokio::task::local::Shared"  # a LocalSet task's scheduler
LOCAL_SET = "tokio::task::local::LocalSet"
RUN_UNTIL = "tokio::task::local::RunUntil<"


def local_set_threads(r: Reflector, on_stacks: dict[tuple[int, str], int]) -> dict[int, int]:
    """The thread that runs each LocalSet (by the address of its ``Shared``, what its tasks'
    ``core.scheduler`` points at): a LocalSet runs where a future found on a thread's stack
    awaits it, as ``run_until``'s ``RunUntil { local_set: &LocalSet, .. }`` (``LocalSet::
    block_on`` is ``rt.block_on(self.run_until(f))``) or as the LocalSet itself
    (``local.await``). Its tasks are ``spawn_local``'s: they are polled only there. Fact
    (hyper's single_threaded: a current-thread runtime and a LocalSet per server thread):
    attached late, the servers' connection tasks said nothing of their thread."""
    from .describers.fields import _path

    out: dict[int, int] = {}
    for (addr, tname), tid in on_stacks.items():
        if tname not in r.inv.layouts:
            continue
        for n in r.walk(addr, tname).iter():
            lay = r.inv.layouts.get(n.type_name) if n.kind == "coroutine" and n.value is not None else None
            st = lay.state(n.value) if lay is not None else None
            aw = st.awaitee if st is not None else None
            if aw is None:
                continue
            if aw.type_name.startswith(RUN_UNTIL):
                at = _path(r, n.addr + aw.offset, aw.type_name, "local_set")
                local_set = r.mem.word(at) if at is not None else None
            elif aw.type_name == LOCAL_SET:
                local_set = n.addr + aw.offset
            else:
                continue
            shared = _local_set_shared(r, local_set) if local_set else None
            if shared:
                out.setdefault(shared, tid)
    return out


def _local_set_shared(r: Reflector, local_set: int) -> int | None:
    """``LocalSet { context: Rc<Context { shared: Arc<Shared>, .. }>, .. }``: the Shared's
    ArcInner address (the field names and offsets from the program's DWARF)."""
    from .describers.fields import _path
    from .describers.io import shared_inner_type

    at = _path(r, local_set, LOCAL_SET, "context", "ptr", "pointer")
    ctx = r.mem.word(at) if at is not None else None
    rc = r.type(LOCAL_SET)
    rc_f = rc.field("context") if rc is not None else None
    inner = shared_inner_type(r, rc_f.type_name) if rc_f is not None else None
    if not ctx or inner is None:
        return None
    at = _path(r, ctx, inner, "value", "shared", "ptr", "pointer")
    return r.mem.word(at) if at is not None else None


def spawn_location(r: Reflector, core_addr: int, core_type: str) -> str | None:
    """``Core.spawned_at: &'static Location`` (tokio >= 1.46 built with ``tokio_unstable``):
    ``file:line:col`` of the ``spawn`` call, or None when the layout has no such field."""
    core_t = r.type(core_type)
    f = core_t.field("spawned_at") if core_t is not None else None
    p = r.mem.word(core_addr + f.offset) if f is not None else None
    t = r.type(r.type(f.type_name).pointee or "") if f is not None and r.type(f.type_name) else None
    fields = {x.name: x for x in t.fields} if t is not None else {}
    file_f = fields.get("file") or fields.get("filename")  # &str; rustc >= 1.9x: NonNull<str>
    if not p or file_f is None or not {"line", "col"} <= set(fields):
        return None
    from .describers.fields import _find_field

    data_at = _find_field(r, file_f.type_name, "data_ptr")  # the str fat pointer: (data_ptr, length)
    len_at = _find_field(r, file_f.type_name, "length")
    data = r.mem.word(p + file_f.offset + (data_at[0] if data_at else 0))
    n = r.mem.word(p + file_f.offset + (len_at[0] if len_at else 8))
    line = r.mem.u(p + fields["line"].offset, 4)
    col = r.mem.u(p + fields["col"].offset, 4)
    name = r.mem.read(data, n) if data and n is not None and 0 < n < 4096 else None
    if name is None or line is None or col is None:
        return None
    return f"{name.decode(errors='replace')}:{line}:{col}"


def task_future(r: Reflector, inv: Inventory | None, bias: int, header: int) -> tuple[int, str] | None:
    """The future a task header's cell runs ((address, type)), for a JoinHandle's target
    (proxy.snapshot.waits); None when the task is not running any more or its cell is unknown."""
    if inv is None or check(inv) is not None:
        return None
    h = inv.types.get(HEADER)
    f = h.field("vtable") if h is not None else None
    vt = r.mem.word(header + (f.offset if f is not None else 16))
    cell = inv.task_vtables.get(vt - bias) if vt is not None and vt > bias else None
    plan = cell_plan(r, cell) if cell is not None else None
    root = plan.root(r, header) if plan is not None else None
    return (root.addr, root.type_name) if root is not None else None
