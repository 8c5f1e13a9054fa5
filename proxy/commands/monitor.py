"""``monitor async ...``: parse the command, answer it from the stop's snapshot.

``run_monitor(text, ctx)`` is pure: it takes the monitor text (with or
without the leading ``async``) and a ``MonitorContext`` and returns the
output text, which the proxy sends as ``O`` packets. Errors are one clear
line starting with ``asyncrsp:``; nothing raises to the caller and no text
is ever evaluated as code. ``mode`` and ``capture`` are delegated to
callables the proxy provides.

Every question about tasks (tasks, tree, bt, edges, where, locals, waits,
deadlocks, top's names) is answered from ``ctx.snapshot()``
(proxy.snapshot): one model of the stop, so the commands agree. ``stats``
reports the engine's and the proxy's counters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from proxy.commands.tasks import USAGE as TASKS_USAGE
from proxy.commands.tasks import TasksError, render_groups, render_tasks, select
from proxy.commands.top import cost_line, render_top, timing_cells
from proxy.commands.tree import render_tree
from proxy.commands.waits import render_deadlocks, render_waits
from proxy.graph.engine import Engine
from proxy.snapshot.build import Budget
from proxy.snapshot.model import Snapshot, StateKind
from proxy.snapshot.values import ReadMemory


class MonitorError(ValueError):
    """A bad command line: the message is shown to the user as is."""


@dataclass(frozen=True, slots=True)
class MonitorCommand:
    name: str
    args: tuple[str, ...] = ()


@dataclass(slots=True)
class MonitorContext:
    engine: Engine | None  # None: no coroutine inventory for this program (stats, top)
    thread: int | None = None  # the client's current thread (LWP), default for bt
    pcs: Mapping[int, int] = field(default_factory=dict)  # thread -> pc at this stop
    read_memory: ReadMemory | None = None
    proxy_lines: Sequence[str] = ()  # the session's and the capture's stats lines, verbatim
    summary_lines: Sequence[str] = ()  # stats' short form of the session: capture, host, the proxy's cost
    note: str | None = None  # why there is no engine / why the inventory is partial
    mode: Callable[[tuple[str, ...]], str] | None = None
    capture: Callable[[tuple[str, ...]], str] | None = None
    threads_command: Callable[[tuple[str, ...]], str] | None = None  # tasks as threads (proxy.threads)
    snapshot: Callable[[], Snapshot | None] | None = None  # the stop's snapshot (built at most once)
    # the stop's snapshot without memory (the engine's tasks and timing), when the full one reads
    # more than its budget
    observed: Callable[[], Snapshot | None] | None = None
    # report|timeline|stacks FILE: (command, FILE, snapshot) -> the line to print (proxy.pictures writes it)
    pictures: Callable[[str, str, Snapshot], str] | None = None
    origins: Callable[[], object | None] | None = None  # proxy.origins.view.Origins: spawns and wakes


HELP: tuple[tuple[str, str], ...] = (
    (TASKS_USAGE, "live tasks: id, address, state and line, polls, thread, found by, async fn"),
    ("top [N | TASK]", "the N tasks with the most busy time; or TASK's histogram of poll durations"),
    ("tree [TASK]", "the pending-future tree of every live task (or of TASK)"),
    ("bt [THREAD]", "logical async backtrace of a thread (the current one by default)"),
    ("edges [--parent TASK] [--completed]", "await edges PARENT -> CHILD at file:line"),
    ("where TASK [--stack]", "where a task (or a coroutine in it) is: state, file:line and suspend index; "
     "where it was spawned and by whom (--stack: the spawning thread's frames)"),
    ("locals TASK", "the locals live at the task's suspend point"),
    ("waits", "the wait-for graph: what each task holds and waits on, and who can wake it"),
    ("deadlocks", "cycles of tasks waiting on each other, and tasks nothing can wake"),
    ("warnings [--self-wakes PCT] [--poll MS]", "tokio-console's warnings: lost wakers, tasks waking themselves "
     "in more than PCT% (50) of their wakes, polls longer than MS (1000) ms"),
    ("stats [--all]", "the capture, events and lost ones, tasks, the program's host, the proxy's cost; "
                      "--all: every counter (evictions, hidden stops, the capture's diagnostics)"),
    ("report FILE.html", "one self-contained page: tasks, parallel stacks, trees, wait-for graph, timeline"),
    ("timeline FILE.json", "the recorded polls as a Chrome trace (Perfetto's UI, chrome://tracing)"),
    ("stacks FILE.svg", "the parallel stacks of the live tasks (.svg/.png with Graphviz, .dot as text)"),
    ("mode [MODE]", "show or set how poll events are captured"),
    ("capture [ARGS]", "show or change the capture backend"),
    ("threads [on|off|N|filter RE]", "tasks as threads: on/off, the cap (default 1024), a name filter"),
    ("step [on|off]", "next/step/finish follow the coroutine across .await (docs/stepping.md)"),
    ("help", "this list"),
)
_NAMES = {h.split()[0] for h, _ in HELP}


def parse_monitor(text: str) -> MonitorCommand:
    words = text.split()
    if words and words[0] == "async":
        words = words[1:]
    if not words:
        return MonitorCommand("help")
    name = words[0]
    if name not in _NAMES:
        raise MonitorError(f"unknown command {name!r}; try 'monitor async help'")
    return MonitorCommand(name, tuple(words[1:]))


def run_monitor(text: str, ctx: MonitorContext) -> str:
    try:
        cmd = parse_monitor(text)
        return _dispatch(cmd, ctx)
    except MonitorError as e:
        return f"asyncrsp: {e}"


def _dispatch(cmd: MonitorCommand, ctx: MonitorContext) -> str:
    if cmd.name == "help":
        return _help()
    if cmd.name in ("mode", "capture", "threads"):
        handler = {"mode": ctx.mode, "capture": ctx.capture, "threads": ctx.threads_command}[cmd.name]
        if handler is None:
            raise MonitorError(f"'{cmd.name}' is not available in this session")
        return handler(cmd.args)
    if cmd.name == "stats":
        every = _stats_all(cmd.args)
        if ctx.engine is None:
            return "\n".join([f"asyncrsp: {ctx.note or 'no async code found in this program'}",
                              *(ctx.proxy_lines if every else ctx.summary_lines)])
        return _stats(ctx, ctx.engine) if every else _stats_summary(ctx, ctx.engine)
    try:
        snap = ctx.snapshot() if ctx.snapshot is not None else None
    except Budget as e:
        observed = ctx.observed() if cmd.name == "top" and ctx.observed is not None else None
        if observed is None or observed.timing is None:
            raise
        # top needs memory only for its names: a stop whose walk reads more than the budget
        # (the axum console build at its exit, 10,000 tasks retained) still gets the observed
        # tasks' figures, named by their paths
        return f"note: the snapshot was not built ({e}): async fns named by the engine's paths\n" + \
            render_top(observed.timing, cmd.args, None, _wake_columns(ctx))
    if snap is None:
        return f"asyncrsp: {ctx.note or 'no async code found in this program'}"
    if ctx.engine is not None and len(ctx.engine.catalog) == 0 and not snap.tasks:
        return "\n".join(([f"note: {ctx.note}"] if ctx.note else []) + ["no async functions found in this program"])
    handlers: dict[str, Callable[[tuple[str, ...], MonitorContext, Snapshot], str]] = {
        "tasks": _tasks, "tree": _tree, "bt": _bt, "edges": _edges, "where": _where,
        "locals": _locals, "top": _top, "waits": _waits, "deadlocks": _deadlocks, "warnings": _warnings,
    }
    if cmd.name in _PICTURES:
        return _picture(cmd, ctx, snap)
    return handlers[cmd.name](cmd.args, ctx, snap)


def _help() -> str:
    width = max(len(h) for h, _ in HELP)
    lines = ["monitor async COMMAND, answered by asyncrsp:"]
    lines += [f"  {h.ljust(width)}  {d}" for h, d in HELP]
    lines.append("TASK is a task id (#12 or 12) or an address (0x...).")
    return "\n".join(lines)


# ---- arguments ------------------------------------------------------------------------


def _flags(args: tuple[str, ...], allowed: dict[str, bool]) -> tuple[dict[str, str | bool], list[str]]:
    """Split --flags (allowed: name -> takes a value) from positional words."""
    found: dict[str, str | bool] = {}
    rest: list[str] = []
    it = iter(args)
    for word in it:
        if not word.startswith("--"):
            rest.append(word)
            continue
        if word not in allowed:
            raise MonitorError(f"unknown option {word}")
        if allowed[word]:
            value = next(it, None)
            if value is None:
                raise MonitorError(f"{word} needs a value")
            found[word] = value
        else:
            found[word] = True
    return found, rest


def _at_most(rest: list[str], n: int, usage: str) -> None:
    if len(rest) > n:
        raise MonitorError(f"too many arguments; usage: {usage}")


def _locate(snap: Snapshot, args: tuple[str, ...], usage: str):  # type: ignore[no-untyped-def]
    if len(args) != 1:
        raise MonitorError(f"usage: {usage}")
    got = snap.locate(args[0])
    if got is None:
        raise MonitorError(f"no task {args[0]!r} (see 'monitor async tasks')")
    return got


def _thread_arg(word: str) -> int:
    try:
        return int(word, 16) if word.lower().startswith("0x") else int(word, 10)
    except ValueError:
        raise MonitorError(f"bad thread {word!r}: give the thread's LWP id") from None


# ---- commands -------------------------------------------------------------------------


def _int(word: str, what: str) -> int:
    try:
        return int(word, 10)
    except ValueError:
        raise MonitorError(f"bad {what} {word!r}: give a number") from None


def _tasks(args: tuple[str, ...], ctx: MonitorContext, snap: Snapshot) -> str:
    flags, rest = _flags(args, {"--live": False, "--all": False, "--group": False, "--state": True,
                                "--fn": True, "--waits-on": True, "--limit": True})
    _at_most(rest, 0, TASKS_USAGE)
    all_ = bool(flags.get("--all"))
    limit = _int(str(flags["--limit"]), "limit") if "--limit" in flags else 50
    try:
        tasks = select(snap, all_=all_, state=_opt(flags, "--state"), fn=_opt(flags, "--fn"),
                       waits_on=_opt(flags, "--waits-on"))
    except TasksError as e:
        raise MonitorError(str(e)) from None
    if flags.get("--group"):
        return render_groups(snap, tasks, limit=limit)
    stop_timing = snap.timing
    timing = None
    if stop_timing:
        def timing(t):  # type: ignore[no-untyped-def]
            return timing_cells(stop_timing.of(t.id))
    org = _origins(ctx)
    spawned = ("SPAWNED AT", org.spawn_line) if org is not None else None
    text = render_tasks(snap, tasks, limit=limit, timing=timing, all_=all_, extra=spawned)
    if ctx.note:
        text = f"note: {ctx.note}\n{text}"
    return text + "\n" + cost_line(stop_timing) if timing is not None else text


def _opt(flags: dict[str, str | bool], name: str) -> str | None:
    v = flags.get(name)
    return v if isinstance(v, str) else None


def _top(args: tuple[str, ...], ctx: MonitorContext, snap: Snapshot) -> str:
    if snap.timing is None:
        return "no timed polls (nothing is observed in this session)"
    names = {i: n.name for i, (_, n) in snap.coroutines.items()}
    try:
        return "\n".join([*_warn(snap), render_top(snap.timing, args, names, _wake_columns(ctx))])
    except ValueError as e:
        raise MonitorError(str(e)) from None


def _warn(snap: Snapshot) -> list[str]:
    return [n for n in snap.notes if n.startswith("warning:")]


def _tree(args: tuple[str, ...], ctx: MonitorContext, snap: Snapshot) -> str:
    _at_most(list(args), 1, "tree [TASK]")
    task = None
    if args:
        task, node = _locate(snap, args, "tree [TASK]")
        if node is not task.tree:  # a coroutine inside a task: its subtree
            label = node.id if node.id is not None else task.id
            task = task.replace(id=label, addr=node.addr, type_name=node.type_name, tree=node,
                                header=f"in task {task.label}")
    org = _origins(ctx)
    text = render_tree(snap, task, org.spawn_line if org is not None else None)
    if task is None and not snap.live():
        hint = "tasks are found by observing polls, at the threads' stacks, or with --tokio-adapter"
        text = f"no pending tasks ({hint})"
    return "\n".join([*snap.notes, text])


def _bt(args: tuple[str, ...], ctx: MonitorContext, snap: Snapshot) -> str:
    _at_most(list(args), 1, "bt [THREAD]")
    thread = _thread_arg(args[0]) if args else ctx.thread
    if thread is None:
        raise MonitorError("no current thread; give one: bt THREAD")
    task = snap.on_thread(thread)
    if task is None or not task.stack:
        return f"thread {thread} is not polling any coroutine"
    lines = [*_warn(snap), f"logical async backtrace of thread {thread} (task {task.label} {task.name}):"]
    frames = task.stack
    for f in frames:
        where = "?" if f.loc is None else str(f.loc)
        verb = "at" if f.executing else "awaiting at"
        # the coroutine's own id (as `tree`, `where` and `edges` take it), not a task's
        who = f"(#{f.id})" if f.id is not None else "[inlined]" if f.inlined else "(no id)"
        lines.append(f"#{f.level}  {f.name} {who} {verb} {where}")
    lines.append(f"#{len(frames)}  <root: polled by the executor>")
    return "\n".join(lines)


def _edges(args: tuple[str, ...], ctx: MonitorContext, snap: Snapshot) -> str:
    flags, rest = _flags(args, {"--parent": True, "--completed": False})
    _at_most(rest, 0, "edges [--parent TASK] [--completed]")
    parent = flags.get("--parent")
    edges = list(snap.edges)
    if isinstance(parent, str):
        got = snap.locate(parent)
        pid = got[1].id if got is not None else None
        if pid is None:
            raise MonitorError(f"no task {parent!r} (see 'monitor async tasks')")
        edges = [e for e in edges if e.parent == pid]
    if not flags.get("--completed"):
        edges = [e for e in edges if e.status == "pending"]
    if not edges:
        return "no pending edges" if not flags.get("--completed") else "no edges"
    lines = _warn(snap)
    for e in edges:
        where = "?" if e.loc is None else str(e.loc)
        lines.append(f"#{e.parent} {e.parent_name} -> #{e.child} {e.child_name} at {where}  ({e.status})")
    return "\n".join(lines)


def _origins(ctx: MonitorContext):  # type: ignore[no-untyped-def]
    return ctx.origins() if ctx.origins is not None else None


def _wake_columns(ctx: MonitorContext):  # type: ignore[no-untyped-def]
    """top's SCHED, WAKES and SELF (proxy.commands.wakes), when the capture probes the wakers."""
    org = _origins(ctx)
    if org is None or not org.sw.want_wakes:
        return None
    from proxy.commands.wakes import WakeColumns

    return WakeColumns(org.wakes_by_future())


def _where(args: tuple[str, ...], ctx: MonitorContext, snap: Snapshot) -> str:
    flags, rest = _flags(args, {"--stack": False})
    task, node = _locate(snap, tuple(rest), "where TASK [--stack]")
    text = _where_node(task, node)
    org = _origins(ctx)
    if org is None or node.addr != task.addr:
        return text
    return "\n".join([text, *org.spawned_text(task, snap, physical=bool(flags.get("--stack")))])


def _where_node(task, node) -> str:  # type: ignore[no-untyped-def]
    label = f"#{node.id}" if node.id is not None else task.label
    head = f"{label} {node.name} (0x{node.addr:x})"
    st = node.state
    if st is None:
        return f"{head}: {node.detail or 'not a coroutine'}"
    if st.kind is StateKind.SUSPENDED:
        loc = "?" if st.loc is None else str(st.loc)
        index = "?" if st.suspend_index is None else str(st.suspend_index)
        return f"{head}: suspended at {loc}, suspend index {index}"
    if st.kind is StateKind.RUNNING:
        return f"{head}: {st}"
    if st.kind is StateKind.UNRESUMED:
        return f"{head}: not yet polled" + (f" (declared at {st.loc})" if st.loc else "")
    return f"{head}: {st.kind.value}"


def _locals(args: tuple[str, ...], ctx: MonitorContext, snap: Snapshot) -> str:
    task, node = _locate(snap, args, "locals TASK")
    if ctx.read_memory is None:
        raise MonitorError("memory cannot be read in this session")
    try:
        found = snap.locals_of(node)
    except LookupError as e:
        raise MonitorError(str(e)) from None
    label = f"#{node.id}" if node.id is not None else task.label
    if not found.suspended:
        return f"{label} {node.name}: no suspend point ({found.why}); no locals are live"
    where = f" at {found.loc}" if found.loc else ""
    running = node.state is not None and node.state.kind is StateKind.RUNNING
    note = " (running: values may be changing)" if running else ""
    lines = [f"{label} {node.name} {found.state}{where}{note}:"]
    if not found.values:
        lines.append("  (no locals live across this await)")
    lines += [f"  {v}" for v in found.values]
    return "\n".join(lines)


_PICTURES = {"report": "report FILE.html", "timeline": "timeline FILE.json", "stacks": "stacks FILE.svg"}


def _picture(cmd: MonitorCommand, ctx: MonitorContext, snap: Snapshot) -> str:
    """report / timeline / stacks FILE: written by the proxy, on its host (proxy.pictures)."""
    usage = _PICTURES[cmd.name]
    if len(cmd.args) != 1:
        raise MonitorError(f"usage: {usage}")
    if ctx.pictures is None:
        raise MonitorError(f"'{cmd.name}' is not available in this session")
    return ctx.pictures(cmd.name, cmd.args[0], snap)


def _waits(args: tuple[str, ...], ctx: MonitorContext, snap: Snapshot) -> str:
    _at_most(list(args), 0, "waits")
    return render_waits(snap, _observed(ctx, snap))


def _deadlocks(args: tuple[str, ...], ctx: MonitorContext, snap: Snapshot) -> str:
    _at_most(list(args), 0, "deadlocks")
    return render_deadlocks(snap, _observed(ctx, snap))


def _warnings(args: tuple[str, ...], ctx: MonitorContext, snap: Snapshot) -> str:
    import time

    from proxy.origins.warnings import NEVER_YIELDED_NS, SELF_WAKE_PERCENT, render_warnings

    flags, rest = _flags(args, {"--self-wakes": True, "--poll": True})
    _at_most(rest, 0, "warnings [--self-wakes PCT] [--poll MS]")
    org = _origins(ctx)
    if org is None or not org.sw.want_wakes:
        raise MonitorError("warnings need the wake probes: uprobe capture with --wakes")
    pct = _int(str(flags["--self-wakes"]), "percent") if "--self-wakes" in flags else SELF_WAKE_PERCENT
    ms = _int(str(flags["--poll"]), "duration") * 1_000_000 if "--poll" in flags else NEVER_YIELDED_NS
    return render_warnings(snap, org, ctx.engine, time.monotonic_ns(), self_wake_percent=pct, never_yielded_ns=ms)


def _observed(ctx: MonitorContext, snap: Snapshot):  # type: ignore[no-untyped-def]
    """The observed wakes as evidence (uprobe capture with its wake probes), else None."""
    org = _origins(ctx)
    return org.wake_words(snap) if org is not None and org.sw.want_wakes else None


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    from proxy.commands.tasks import table

    return table(rows)


def _stats_all(args: tuple[str, ...]) -> bool:
    """`stats` (the summary) or `stats --all` (every counter)."""
    if args not in ((), ("--all",)):
        raise MonitorError("usage: stats [--all]")
    return bool(args)


def _stats_summary(ctx: MonitorContext, engine: Engine) -> str:
    """What a user needs: the capture, the events and the lost ones, the tasks,
    the program's host, the proxy's cost; `stats --all` for the diagnostics."""
    s = engine.stats()
    summary = list(ctx.summary_lines)
    head = [line for line in summary if line.startswith("capture")]
    events = f"events: {s.events} recorded, {s.events_lost} lost" + ("" if s.complete else " (the graph is incomplete)")
    tasks = f"tasks: {s.tasks_live} live, {s.tasks_seen} seen"
    rest = [line for line in summary if not line.startswith("capture")]
    return "\n".join([*head, events, tasks, *rest, "(every counter: monitor async stats --all)"])


def _stats(ctx: MonitorContext, engine: Engine) -> str:
    s = engine.stats()
    lines = [
        f"events: {s.events} (enters {s.enters}, exits {s.exits}, lost {s.events_lost},"
        f" rejected {s.rejected})",
    ]
    if s.rejected_reasons:
        lines.append("  rejected: " + ", ".join(f"{r} {n}" for r, n in s.rejected_reasons))
    lines += [
        f"tasks: {s.tasks_live} live, {s.tasks_retained} retained, {s.tasks_seen} seen;"
        f" evicted {s.completed_evicted} completed, {s.stale_evicted} stale"
        + (f"; {s.ended_unseen} ended in a poll not recorded (read at stops)" if s.ended_unseen else ""),
        f"edges: {s.edges}; pending state reads: {s.pending_reads}",
        f"exits missed (recovered by sp): {s.exits_missed}; unmatched exits: {s.unmatched_exits}",
        f"graph: {'complete' if s.complete else 'incomplete (events lost)'}",
        (f"event log: {s.log_entries} entries, rewind as far back as "
         + ("the start" if s.oldest_rewind_seq is None else f"seq {s.oldest_rewind_seq}")
         if s.log_kept else "event log: off (this capture cannot be rewound)"),
        f"resume functions watched: {len(engine.catalog)}",
    ]
    lines += ctx.proxy_lines
    return "\n".join(lines)

