"""``monitor async ...``: parse the command, answer it from the engine.

``run_monitor(text, ctx)`` is pure: it takes the monitor text (with or
without the leading ``async``) and a ``MonitorContext`` and returns the
output text, which the proxy sends as ``O`` packets. Errors are one clear
line starting with ``asyncrsp:``; nothing raises to the caller and no text
is ever evaluated as code. ``mode`` and ``capture`` are delegated to
callables the proxy provides.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from proxy.commands.top import cost_line, has_timing, render_top, timing_cells
from proxy.commands.tree import render_tree
from proxy.commands.values import ReadMemory, decode_member
from proxy.graph.engine import Engine
from proxy.graph.model import StateKind, Task


class MonitorError(ValueError):
    """A bad command line: the message is shown to the user as is."""


@dataclass(frozen=True, slots=True)
class MonitorCommand:
    name: str
    args: tuple[str, ...] = ()


@dataclass(slots=True)
class MonitorContext:
    engine: Engine | None  # None: no coroutine inventory for this program
    thread: int | None = None  # the client's current thread (LWP), default for bt
    pcs: Mapping[int, int] = field(default_factory=dict)  # thread -> pc at this stop
    read_memory: ReadMemory | None = None
    proxy_lines: Sequence[str] = ()  # the session's and the capture's stats lines, verbatim
    note: str | None = None  # why there is no engine / why the inventory is partial
    mode: Callable[[tuple[str, ...]], str] | None = None
    capture: Callable[[tuple[str, ...]], str] | None = None
    threads_command: Callable[[tuple[str, ...]], str] | None = None  # tasks as threads (proxy.threads)
    reflect: object | None = None  # proxy.reflect.ReflectSource: trees read from memory
    # every thread's `g` reply (LWP -> reply), None until the session has read them
    threads: Callable[[], Mapping[int, bytes] | None] | None = None
    mode_name: str = "full"  # the capture mode: in `off`, `tasks` is read from memory too


HELP: tuple[tuple[str, str], ...] = (
    ("tasks [--live]", "every task: id, address, state, polls, busy/idle/longest poll, last thread, parent, async fn"),
    ("top [N | TASK]", "the N tasks with the most busy time; or TASK's histogram of poll durations"),
    ("tree [TASK]", "the pending-future tree of every root task (or of TASK)"),
    ("bt [THREAD]", "logical async backtrace of a thread (the current one by default)"),
    ("edges [--parent TASK] [--completed]", "await edges PARENT -> CHILD at file:line"),
    ("where TASK", "where a task is suspended: file:line and suspend index"),
    ("locals TASK", "the locals live at the task's suspend point"),
    ("stats", "events seen, tasks, evictions, hidden stops, time spent, drops"),
    ("mode [MODE]", "show or set how poll events are captured"),
    ("capture [ARGS]", "show or change the capture backend"),
    ("threads [on|off|N|filter RE]", "tasks as threads: on/off, the cap (default 1024), a name filter"),
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
    if ctx.reflect is not None and ctx.read_memory is not None and (
            cmd.name == "tree" or (cmd.name == "tasks" and (ctx.engine is None or ctx.mode_name == "off"))):
        return _reflected(cmd, ctx)
    if ctx.engine is None:
        note = f"asyncrsp: {ctx.note or 'no async code found in this program'}"
        if cmd.name == "stats":
            return "\n".join([note, *ctx.proxy_lines])
        return note
    handlers: dict[str, Callable[[tuple[str, ...], MonitorContext, Engine], str]] = {
        "tasks": _tasks, "tree": _tree, "bt": _bt, "edges": _edges, "where": _where,
        "locals": _locals, "stats": _stats, "top": _top,
    }
    return handlers[cmd.name](cmd.args, ctx, ctx.engine)


def _reflected(cmd: MonitorCommand, ctx: MonitorContext) -> str:
    """tree (and tasks without an engine) read from memory: proxy.reflect."""
    from proxy.reflect import TASK_COLUMNS, reflect_task_rows, reflect_tasks, reflect_tree, table, thread_regs

    assert ctx.read_memory is not None
    head = _incomplete(ctx.engine) if ctx.engine is not None else []
    threads = thread_regs(dict(ctx.threads() or {})) if ctx.threads is not None else None
    if cmd.name == "tasks" and ctx.engine is None:
        _flags(cmd.args, {"--live": False})
        return "\n".join(head + [reflect_tasks(ctx.reflect, ctx.read_memory, None, ctx.pcs,  # type: ignore[arg-type]
                                                threads)])
    if cmd.name == "tasks":  # mode off after a switch: read from memory, plus every task seen before
        flags, rest = _flags(cmd.args, {"--live": False})
        _at_most(rest, 0, "tasks [--live]")
        rows = reflect_task_rows(ctx.reflect, ctx.read_memory, ctx.engine, ctx.pcs,  # type: ignore[arg-type]
                                 threads, "seen before")
        found = {r[1] for r in rows}
        for t in ctx.engine.tasks():
            if f"0x{t.self_ptr:x}" in found or (flags.get("--live") and t.finished):
                continue
            rows.append((t.label, f"0x{t.self_ptr:x}", f"{t.state} (when last seen)", "seen before", t.path))
        note = ["note: mode off: tasks read from memory at this stop, and those seen before (their state"
                " then)"]
        return "\n".join(head + note + [table([TASK_COLUMNS, *rows])])
    _at_most(list(cmd.args), 1, "tree [TASK]")
    only = None
    if cmd.args:
        task = ctx.engine.task(cmd.args[0]) if ctx.engine is not None else None
        if task is None:
            try:
                only = int(cmd.args[0], 16)
            except ValueError:
                raise MonitorError(f"no task {cmd.args[0]!r} (see 'monitor async tasks')") from None
        else:
            only = task.self_ptr
    text = reflect_tree(ctx.reflect, ctx.read_memory, ctx.engine, ctx.pcs, only, threads)  # type: ignore[arg-type]
    return "\n".join(head + [text])


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


def _task_arg(engine: Engine, ref: str) -> Task:
    task = engine.task(ref)
    if task is None:
        raise MonitorError(f"no task {ref!r} (see 'monitor async tasks')")
    return task


def _one_task(args: tuple[str, ...], engine: Engine, usage: str) -> Task:
    if len(args) != 1:
        raise MonitorError(f"usage: {usage}")
    return _task_arg(engine, args[0])


def _thread_arg(word: str) -> int:
    try:
        return int(word, 16) if word.lower().startswith("0x") else int(word, 10)
    except ValueError:
        raise MonitorError(f"bad thread {word!r}: give the thread's LWP id") from None


# ---- commands -------------------------------------------------------------------------


def _incomplete(engine: Engine) -> list[str]:
    if engine.complete:
        return []
    return ["warning: poll events were lost; the graph is incomplete until the next resync"]


def _tasks(args: tuple[str, ...], ctx: MonitorContext, engine: Engine) -> str:
    flags, rest = _flags(args, {"--live": False})
    _at_most(rest, 0, "tasks [--live]")
    tasks = engine.tasks()
    if flags.get("--live"):
        tasks = [t for t in tasks if not t.finished]
    head = _incomplete(engine)
    if ctx.note:
        head.append(f"note: {ctx.note}")
    if not tasks:
        probed = len(engine.catalog)
        if probed == 0:
            return "\n".join(head + ["no async functions found in this program"])
        return "\n".join(head + [f"no tasks seen yet ({probed} resume functions watched)"])
    timed = has_timing(engine)
    rows = [("ID", "ADDRESS", "STATE", "POLLS", *(("BUSY", "IDLE", "LONGEST") if timed else ()),
             "THREAD", "PARENT", "ASYNC FN")]
    for t in tasks:
        gen = f"/{t.generation}" if t.generation else ""
        state = str(t.state) + (" (dropped)" if t.dropped else "")
        rows.append((
            t.label, f"0x{t.self_ptr:x}{gen}", state, str(t.polls),
            *(timing_cells(engine, t) if timed else ()),
            "-" if t.last_thread is None else str(t.last_thread),
            "root" if t.parent is None else f"#{t.parent}", t.path,
        ))
    tail = [cost_line(engine)] if timed else []
    return "\n".join(head + _table(rows) + tail)


def _top(args: tuple[str, ...], ctx: MonitorContext, engine: Engine) -> str:
    try:
        return "\n".join(_incomplete(engine) + [render_top(engine, args)])
    except ValueError as e:
        raise MonitorError(str(e)) from None


def _table(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _tree(args: tuple[str, ...], ctx: MonitorContext, engine: Engine) -> str:
    _at_most(list(args), 1, "tree [TASK]")
    task = _task_arg(engine, args[0]) if args else None
    return "\n".join(_incomplete(engine) + [render_tree(engine, task)])


def _bt(args: tuple[str, ...], ctx: MonitorContext, engine: Engine) -> str:
    _at_most(list(args), 1, "bt [THREAD]")
    thread = _thread_arg(args[0]) if args else ctx.thread
    if thread is None:
        raise MonitorError("no current thread; give one: bt THREAD")
    frames = engine.backtrace(thread, ctx.pcs.get(thread))
    if not frames:
        return f"thread {thread} is not polling any coroutine"
    lines = _incomplete(engine) + [f"logical async backtrace of thread {thread}:"]
    inlined = _inlined_at_pc(ctx, thread)  # release builds: coroutines inlined into frame #0
    between, above = _inlined_between(ctx, engine, frames)  # ... and into the outer frames
    level = 0
    for i, f in enumerate(frames):
        where = "?" if f.loc is None else str(f.loc)
        verb = "at" if f.executing else "awaiting at"
        if f.level == 0 and inlined and inlined[-1][0] == _norm(f.path):
            for name, loc in inlined[:-1]:
                lines.append(f"#{level}  {name} [inlined] at {'?' if loc is None else loc}")
                level += 1
            where, verb = str(inlined[-1][1] or where), "awaiting at"
        if i > 0 and between[i - 1]:  # the .await line of this frame's own state
            where = str(between[i - 1][-1].loc or where)
        lines.append(f"#{level}  {f.path} (task #{f.task}) {verb} {where}")
        level += 1
        inner = between[i][:-1] if i < len(between) else above
        for n in inner:
            lines.append(f"#{level}  {n.label} [inlined] awaiting at {n.loc or '?'}")
            level += 1
    outer = engine.task(frames[-1].task)
    if outer is not None and outer.is_root:
        lines.append(f"#{level}  <root: polled by the executor>")
    return "\n".join(lines)


def _inlined_between(ctx: MonitorContext, engine: Engine, frames: list) -> tuple[list, list]:  # type: ignore[type-arg]
    """Coroutines stored inline between observed frames, and above the outermost one, read
    from memory (proxy.reflect.async_frames_between): their resume functions are inlined
    into the outer frame's (or into the executor's), so no poll of theirs is observed.
    ``between[i]`` ends with frame i+1's own node (for its .await line)."""
    if ctx.reflect is None or ctx.read_memory is None:
        return [[] for _ in frames[1:]], []
    from proxy.reflect import async_frames_between

    chain = []
    for f in frames:
        t = engine.task(f.task)
        layout = engine.catalog.layout_for(t.site) if t is not None else None
        if layout is None:
            return [[] for _ in frames[1:]], []
        chain.append((f.self_ptr, layout.type_name))
    from proxy.reflect import thread_regs

    threads = thread_regs(dict(ctx.threads() or {})) if ctx.threads is not None else None
    try:
        return async_frames_between(ctx.reflect, ctx.read_memory, chain, engine,  # type: ignore[arg-type]
                                    dict(ctx.pcs), threads)
    except Exception:  # noqa: BLE001 - the observed frames are still worth printing
        return [[] for _ in frames[1:]], []


def _norm(path: str) -> str:
    from proxy.reflect.tree import norm

    return norm(path)


def _inlined_at_pc(ctx: MonitorContext, thread: int) -> list[tuple[str, object]]:
    """Async frames at the thread's pc, innermost first, ending with the physical one, each
    with its line (the pc's line, then each inlined call's .await line), like gdb's bt."""
    src, pc = ctx.reflect, ctx.pcs.get(thread)
    frames_at = getattr(src, "frames_at", None)
    if frames_at is None or pc is None:
        return []
    try:
        frames = frames_at(pc - src.bias)  # type: ignore[attr-defined]
    except Exception:  # no line table for this pc: no inlined frames, not an error
        return []
    out: list[tuple[str, object]] = []
    for f in frames:
        if "{" not in f.function or " as " in f.function:
            if out:
                break
            continue
        out.append((_norm(f.function), f.loc))
        if not f.inlined:
            break
    return out if len(out) > 1 else []


def _edges(args: tuple[str, ...], ctx: MonitorContext, engine: Engine) -> str:
    flags, rest = _flags(args, {"--parent": True, "--completed": False})
    _at_most(rest, 0, "edges [--parent TASK] [--completed]")
    parent = flags.get("--parent")
    pid = _task_arg(engine, parent).id if isinstance(parent, str) else None
    edges = engine.edges(parent=pid)
    if not flags.get("--completed"):
        edges = [e for e in edges if e.pending]
    if not edges:
        return "no pending edges" if not flags.get("--completed") else "no edges"
    lines = _incomplete(engine)
    for e in edges:
        p, c = engine.task(e.parent), engine.task(e.child)
        status = "completed" if e.completed else "dropped" if e.dropped else "pending"
        where = "?" if e.loc is None else str(e.loc)
        lines.append(
            f"#{e.parent} {p.path if p else '?'} -> #{e.child} {c.path if c else '?'} at {where}"
            f"  ({status})"
        )
    return "\n".join(lines)


def _where(args: tuple[str, ...], ctx: MonitorContext, engine: Engine) -> str:
    t = _one_task(args, engine, "where TASK")
    head = f"{t.label} {t.path} (0x{t.self_ptr:x})"
    if t.state.kind is StateKind.SUSPENDED:
        loc = "?" if t.state.loc is None else str(t.state.loc)
        index = "?" if t.state.suspend_index is None else str(t.state.suspend_index)
        return f"{head}: suspended at {loc}, suspend index {index}"
    if t.state.kind is StateKind.RUNNING:
        return f"{head}: running on thread {t.state.thread}"
    if t.state.kind is StateKind.UNRESUMED:
        decl = engine.loc_of(t)
        return f"{head}: not yet polled" + (f" (declared at {decl})" if decl else "")
    return f"{head}: {t.state.kind.value.lower()}" + (" (dropped)" if t.dropped else "")


def _locals(args: tuple[str, ...], ctx: MonitorContext, engine: Engine) -> str:
    t = _one_task(args, engine, "locals TASK")
    if ctx.read_memory is None:
        raise MonitorError("memory cannot be read in this session")
    layout = engine.catalog.layout_for(t.site)
    if layout is None:
        raise MonitorError(f"no layout for {t.path} (no debug info for its type)")
    if t.finished or t.state_value is None or t.state_value < 3:
        return f"{t.label} {t.path}: no suspend point ({t.state}); no locals are live"
    state = layout.state(t.state_value)
    if state is None:
        raise MonitorError(f"{t.path} has no state {t.state_value}")
    where = f" at {state.loc}" if state.loc else ""
    note = " (running: values may be changing)" if t.state.kind is StateKind.RUNNING else ""
    lines = [f"{t.label} {t.path} {state.name}{where}{note}:"]
    if not state.locals:
        lines.append("  (no locals live across this await)")
    for m in state.locals:
        lines.append("  " + decode_member(m, t.self_ptr, ctx.read_memory))
    return "\n".join(lines)


def _stats(args: tuple[str, ...], ctx: MonitorContext, engine: Engine) -> str:
    _at_most(list(args), 0, "stats")
    s = engine.stats()
    lines = [
        f"events: {s.events} (enters {s.enters}, exits {s.exits}, lost {s.events_lost},"
        f" rejected {s.rejected})",
    ]
    if s.rejected_reasons:
        lines.append("  rejected: " + ", ".join(f"{r} {n}" for r, n in s.rejected_reasons))
    lines += [
        f"tasks: {s.tasks_live} live, {s.tasks_retained} retained, {s.tasks_seen} seen;"
        f" evicted {s.completed_evicted} completed, {s.stale_evicted} stale",
        f"edges: {s.edges}; pending state reads: {s.pending_reads}",
        f"exits missed (recovered by sp): {s.exits_missed}; unmatched exits: {s.unmatched_exits}",
        f"graph: {'complete' if s.complete else 'incomplete (events lost)'}",
        f"event log: {s.log_entries} entries, rewind as far back as "
        + ("the start" if s.oldest_rewind_seq is None else f"seq {s.oldest_rewind_seq}"),
        f"resume functions watched: {len(engine.catalog)}",
    ]
    lines += ctx.proxy_lines
    return "\n".join(lines)

