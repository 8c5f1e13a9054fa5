"""Compose a `Session` for a command line: probes, register safety, commands."""

from __future__ import annotations

import gc
import os
import re
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from typing import TYPE_CHECKING

# What a session needs only once the program runs, or a client asks (the
# analysis, the captures, the commands: pyelftools, capstone, numpy...) is
# imported there, not here: every `asyncrsp serve` starts with this module,
# and a session on a program without async code may never need them (GDB's
# own testsuite starts 93 proxies; importing it all cost ~0.7 s each).
from proxy.regsafety import (
    STUB_PROBE_QSUPPORTED,
    UNKNOWN_STUB,
    RegisterPolicy,
    decide_policy,
    detect_stub_from_command,
    read_host_xsave_layout,
    stub_reply_policy,
)
from proxy.identity import prove
from proxy.session.core import Session, SessionConfig
from proxy.session.procedure import Exchange
from proxy.shell.upstream import UpstreamSpec

if TYPE_CHECKING:
    from proxy.commands.monitor import MonitorContext

def _rss_mb() -> str:
    """The proxy's own resident memory (Linux), for `stats`, with the part that is
    the uprobe capture's BPF ring buffer: libbpf maps its data pages twice (so a
    record that wraps reads as one piece) and both mappings count as resident -
    a 64 MiB ring shows as 128 MB of RSS while the kernel holds 64 MiB."""
    try:
        with open("/proc/self/status") as fh:
            rss = next((int(line.split()[1]) for line in fh if line.startswith("VmRSS:")), None)
    except OSError:
        rss = None
    if rss is None:
        return "unknown"
    ring = 0
    try:
        with open("/proc/self/smaps") as fh:
            in_ring = False
            for line in fh:
                if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
                    in_ring = line.rstrip().endswith("anon_inode:bpf-map")
                elif in_ring and line.startswith("Rss:"):
                    ring += int(line.split()[1])
    except OSError:
        pass
    extra = f" ({ring / 1024:.0f} MB of it the BPF ring buffer, its pages mapped twice)" if ring >= 1024 else ""
    return f"{rss / 1024:.0f} MB{extra}"


def _proxy_lines(session: Session) -> list[str]:
    """What `monitor async stats` prints of the proxy: its memory, then the
    session's and the capture's lines as they wrote them."""
    last = _LAST.get(session)
    reused = [f"task threads: stops that reused the previous stop's tasks (nothing they were read from"
              f" changed): {last.reused}"] if last is not None and getattr(last, "reused", 0) else []
    return [f"proxy RSS: {_rss_mb()}", *session.stats_lines(), *reused]


class _LazyLines(Sequence[str]):
    """`_proxy_lines`, read only when a command prints them: every monitor
    command gets a context, and the RSS line reads /proc/self/smaps (about
    20 ms with the capture's mappings; a fuzzing client's monitor commands
    spent a tenth of the proxy's time there)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._lines: list[str] | None = None

    def _get(self) -> list[str]:
        if self._lines is None:
            self._lines = _proxy_lines(self._session)
        return self._lines

    def __len__(self) -> int:
        return len(self._get())

    def __getitem__(self, i):  # type: ignore[no-untyped-def,override]
        return self._get()[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())


def _proxy_stats(session: Session) -> dict[str, object]:
    """The same lines as the JSON document's `proxy` object: "key: value" lines
    by key (a repeated key gets " (2)", " (3)"...: nothing is overwritten)."""
    out: dict[str, object] = {}
    for line in _proxy_lines(session):
        key, sep, value = line.partition(": ")
        if sep:
            base = name = key.strip()
            n = 2
            while name in out:
                name, n = f"{base} ({n})", n + 1
            out[name] = value
    return out


_REFLECT: weakref.WeakKeyDictionary[Session, object] = weakref.WeakKeyDictionary()
_ADAPTERS: weakref.WeakKeyDictionary[Session, str] = weakref.WeakKeyDictionary()


def _reflect_source(session: Session, engine: object) -> object | None:
    """The session's reflection source (proxy.reflect), built once; None when unavailable."""
    from proxy.reflect.source import make_source, source_without_capture

    target = session.target
    inv = getattr(target, "inventory", None)
    src = _REFLECT.get(session)
    if src is not None and (inv is None or getattr(src, "inventory", None) is inv):
        return src if not isinstance(src, str) else None
    # host-side reads (/proc/PID/exe, auxv, maps) only for a process proven to be the program's
    ident = session.identity
    local = ident.local and session.config.local_exe is not None
    if inv is not None and (target.bias or not inv.pie):
        src = make_source(inv, target.bias, local=bool(target.local))
    else:  # attached and never resumed: no target yet
        pid = ident.host_pid if local else None
        path = session.exec_file if ident.exe is None else ident.exe
        path = path or (session.config.local_exe(pid) if local and pid else None)
        # a cold analysis's cache write once the answer is out (session.after_answer)
        src = source_without_capture(path, pid, local, later=session.after_answer.append)
        # What the analysis made (the image's symbols, the inventory, the walks handed to
        # stack discovery: ~110,000 objects on the axum debug build) lives as long as the
        # session: kept out of later collections (settle_heap's reason). Without this, the
        # collection the command's end let through (snapshot.build.paused_gc) walked all of
        # it before the answer went out (0.03-0.1 s). No gc.collect() first (settle_heap's):
        # the cyclic garbage made so far stays (import-time objects and pyelftools' parse
        # structures, ~1,100 objects once).
        gc.freeze()
    wanted = _ADAPTERS.get(session, "auto")
    if wanted != "off" and not isinstance(src, str):
        from proxy.reflect.adapters import choose

        pid = getattr(target, "pid", None) if target is not None and target.local else ident.host_pid
        local = bool(target.local) if target is not None else local
        found = choose(src.inventory, src.bias, pid, local, wanted)  # type: ignore[attr-defined]
        src.discover = found.discover if found.adapters else None  # type: ignore[attr-defined]
        src.note = found.note  # type: ignore[attr-defined]
    _REFLECT[session] = src
    return src if not isinstance(src, str) else None


_SNAPSHOTS: weakref.WeakKeyDictionary[Session, object] = weakref.WeakKeyDictionary()
_DOCS: weakref.WeakKeyDictionary[Session, tuple[object, dict[tuple[str, str], bytes]]] = weakref.WeakKeyDictionary()


def _snapshot_key(session: Session, engine: Any, src: object) -> tuple[Any, ...]:
    stopped = getattr(session, "_stopped", None)
    return (getattr(stopped, "serial", None), id(engine), engine.cursor_seq if engine is not None else None,
            session.mode, id(src))


def _snapshot_builder(session: Session, read: Callable[[int, int], bytes | None] | None, engine: Any,
                      src: Any, stop: int, adapters: Callable[[list[Any]], list[Any]] | None = None,
                      ) -> Callable[[], Any]:
    """``build()`` of the stop's snapshot from the session's inputs; ``adapters`` may replace
    the runtime adapters (task threads read only the tasks they list: proxy.threads.listing)."""
    from proxy.reflect import thread_regs
    from proxy.snapshot import SnapshotInputs, build_snapshot

    origin = "seen before" if session.mode == "off" else "observed"
    notes = []
    if session.mode == "off":
        notes.append("note: mode off: tasks read from memory at this stop; observed ones are those seen before")

    def build() -> Any:
        raw = session.monitor_threads() if session.monitor_threads is not None else None
        threads = thread_regs(dict(raw or {}))
        if src is not None:
            inputs = SnapshotInputs.from_source(src, engine=engine, engine_origin=origin, threads=threads,
                                                pcs=session.stop_pcs(), notes=notes, missed=session.monitor_missed)
            if adapters is not None:
                inputs.adapters = adapters(list(inputs.adapters))
        else:
            inputs = SnapshotInputs(inventory=engine.catalog.inventory, bias=engine.catalog.load_bias,
                                    engine=engine, engine_origin=origin, pcs=session.stop_pcs(), notes=tuple(notes),
                                    memory=False)
        return build_snapshot(inputs, read, stop=stop)

    return build


def _snapshot_of(session: Session, read: Callable[[int, int], bytes | None] | None):  # type: ignore[no-untyped-def]
    """The stop's snapshot (proxy.snapshot), built at most once per stop: the one model every
    command, table and document renders. None when there is neither an engine nor a program
    file to read memory with."""
    from proxy.snapshot import SnapshotStore

    engine = session.engine
    src = _reflect_source(session, engine)
    if src is None and engine is None:
        return None
    store = _SNAPSHOTS.get(session)
    if store is None:
        store = _SNAPSHOTS[session] = SnapshotStore()
    key = _snapshot_key(session, engine, src)
    capped = _CAPPED.get(session)
    adapters = None
    if capped is not None and capped[0] == key and read is not None and store.held(key) is None:  # type: ignore[attr-defined]
        # task threads built their capped snapshot at this stop: the full one reads none of
        # that memory again (each block as it got it) and takes the runtime's tasks it found
        read = _reusing(read, capped[1])
        listing = _LISTINGS.get(session)
        adapters = getattr(listing, "uncapped", None) if getattr(listing, "key", None) == key else None
    build = _snapshot_builder(session, read, engine, src, key[0] or 0, adapters=adapters)
    missed = session.monitor_missed or (lambda: False)
    if read is None:
        return build()
    snap = store.get(key, build, missed)  # type: ignore[attr-defined]
    snap.bind(read)  # what it makes on demand (trees, the wait-for graph) reads through this pass
    if store.held(key) is snap:  # type: ignore[attr-defined]
        _CAPPED.pop(session, None)
    return snap


# The memory a capped task-threads build read at a stop (snapshot key -> {(addr, size): bytes}),
# for the full build of the same stop (a monitor command after the IDE listed the threads).
_CAPPED: weakref.WeakKeyDictionary[Session, tuple[Any, dict[tuple[int, int], bytes]]] = weakref.WeakKeyDictionary()


def _remembering(read: Callable[[int, int], bytes | None], kept: dict[tuple[int, int], bytes],
                 ) -> Callable[[int, int], bytes | None]:
    def remember(addr: int, size: int) -> bytes | None:
        data = read(addr, size)
        if data is not None:
            kept[(addr, size)] = data
        return data
    return remember


def _reusing(read: Callable[[int, int], bytes | None], kept: dict[tuple[int, int], bytes],
             ) -> Callable[[int, int], bytes | None]:
    def reuse(addr: int, size: int) -> bytes | None:
        data = kept.get((addr, size))
        return data if data is not None else read(addr, size)
    return reuse


def _context(session: Session, read: Callable[[int, int], bytes | None]) -> MonitorContext:
    from proxy.commands.monitor import MonitorContext

    cap = session.capture
    engine = session.engine
    if engine is not None and cap is not None:
        engine.timing.set_backend(cap.name)  # its benchmark cost, until the run calibrates its own
    note = session.target.note if session.target is not None else None
    if cap is None and engine is None:
        note = note or f"poll capture is off (mode {session.mode})"
    elif engine is None and note is None:
        note = "the program has not run under the proxy yet (no probes planted)"
    made: list[object] = []

    def snapshot():  # type: ignore[no-untyped-def]
        if not made:  # once per command pass
            made.append(_snapshot_of(session, read))
        return made[0]

    src = _REFLECT.get(session)
    return MonitorContext(
        engine=engine,
        thread=session.current_thread(),
        pcs=session.stop_pcs(),
        read_memory=read,
        proxy_lines=_LazyLines(session),
        note=note,
        mode=lambda args: _mode_command(session, args),
        capture=lambda args: _capture_command(session, args),
        threads_command=lambda args: _threads_command(session, args),
        snapshot=snapshot,
        inventory=getattr(src, "inventory", None),
    )


def _mode_command(session: Session, args: tuple[str, ...]) -> str:
    """`monitor async mode [full|tasks|entry|off]`: show, or switch after this command."""
    from proxy import capture as capture_backends

    if not args:
        return f"mode: {session.mode}\n" + "".join(f"  {m}: {MODE_LOSES[m]}\n" for m in capture_backends.MODES)
    mode = args[0]
    if mode not in capture_backends.MODES:
        return f"asyncrsp: unknown mode {mode!r}; one of {', '.join(capture_backends.MODES)}"
    if session.running:
        return "asyncrsp: the program is running; stop it first"
    session.request_switch(mode=mode)
    return f"mode: {session.mode} -> {mode}"


def _capture_command(session: Session, args: tuple[str, ...]) -> str:
    """`monitor async capture [NAME]`: show the backend and the alternatives, or switch."""
    from proxy import capture as capture_backends

    if not args:
        cap = session.capture
        lines = [f"capture: {cap.name if cap is not None else 'none'} (mode {session.mode})"
                 + (f" - {cap.why}" if cap is not None and cap.why else "")]
        for name in capture_backends.names():
            reason = capture_backends.unavailable(name, session.target)
            lines.append(f"  {name}: {'available' if reason is None else reason}")
        probes = session.probes_line()
        if probes is not None:
            lines.append(probes)
        return "\n".join(lines)
    name = args[0]
    reason = capture_backends.unavailable(name, session.target) if name != "auto" else None
    if reason is not None:
        return f"asyncrsp: {reason}"
    if session.running:
        return "asyncrsp: the program is running; stop it first"
    session.request_switch(capture=name)
    current = session.capture.name if session.capture is not None else "none"
    return f"capture: {current} -> {name}"


# What each mode gives up (stats, `monitor async mode`, README).
MODE_LOSES = {
    "full": "entries and exits observed: exact Ready/Pending and poll times",
    "tasks": "tasks' polls only (uprobes, after 0.5 s of learning which resume functions are tasks' roots): "
             "exact per-task poll counts and busy times counted in the kernel; the polls of the coroutines "
             "inside a task are not seen, its await tree is read from memory at each stop",
    "entry": "entries only: exits inferred from the next entry on the thread (stack pointer), "
             "so Ready/Pending lag by one poll and poll durations are unknown",
    "off": "nothing planted, zero overhead while running: tasks/edges/bt hold only what was seen before;"
           " `tree` (and `tasks` with no graph) is read from memory at each stop (reflection): no poll"
           " counts, no parent edges beyond what memory shows, tasks found only if seen before"
           " or by a runtime adapter (--adapters)",
}


_TASKS: weakref.WeakKeyDictionary[Session, object] = weakref.WeakKeyDictionary()
_LISTINGS: weakref.WeakKeyDictionary[Session, object] = weakref.WeakKeyDictionary()


def task_threads(session: Session, read: Callable[[int, int], bytes | None]) -> tuple[list[object], object, int, int]:
    """The live tasks at this stop for task threads: a snapshot of the stop (the same tasks,
    names, states and logical stacks every command shows) through proxy.threads.adapter; the
    stop's full snapshot when it is built, else one with the runtime's tasks cut to the cap
    (proxy.threads.listing). Also: how many tasks were cut."""
    from proxy.threads.adapter import TaskSource
    from proxy.threads.listing import SLACK, LastStop, Listing

    engine = session.engine
    src = _reflect_source(session, engine)
    if src is None or not getattr(src, "inventory").layouts:  # no coroutine: no task
        return [], None, 0, 0
    view = session.task_view
    store = _SNAPSHOTS.get(session)
    key = _snapshot_key(session, engine, src)
    snap = store.held(key) if store is not None else None  # type: ignore[attr-defined]
    if snap is not None:
        snap.bind(read)
    unread = 0
    last: LastStop | None = None
    missed = session.monitor_missed or (lambda: False)
    if snap is None and (view is None or view.pattern):  # a filter looks at every task
        snap = _snapshot_of(session, read)
    elif snap is None:
        raw = session.monitor_threads() if session.monitor_threads is not None else {}
        if raw is None:  # the threads' registers first: the session reads them and asks again
            return [], None, 0, 0
        keep = view.cap + SLACK
        got = _LAST.get(session)
        last = got if isinstance(got, LastStop) else _LAST.setdefault(session, LastStop())
        fingerprint = _task_inputs(session, engine, src, keep, raw)
        # compared without asking the stub for anything (a remote program's bytes not read
        # yet are "changed": asking would cost passes of the read loop for nothing)
        same = last.same(fingerprint, session.monitor_peek) if session.monitor_peek is not None else None
        if same is not None:
            return same  # type: ignore[no-any-return]
        listing = _LISTINGS.get(session)
        if not isinstance(listing, Listing) or listing.key != key or listing.keep != keep:
            listing = _LISTINGS[session] = Listing(key, keep)
        capped = _CAPPED.get(session)
        if capped is None or capped[0] != key:
            capped = _CAPPED[session] = (key, {})
        recording = last.recording(listing, _remembering(read, capped[1]))
        snap = _snapshot_builder(session, recording, engine, src, key[0] or 0, adapters=listing.adapters)()
        unread = listing.unread
    if snap is None or missed():
        return [], None, 0, 0  # memory still to read: the session reads it and asks again
    ts = _TASKS.get(session)
    if not isinstance(ts, TaskSource) or ts.src is not src:
        ts = _TASKS[session] = TaskSource(src)
    result = (*ts.from_snapshot(snap), unread)
    if last is not None and not missed():
        last.keep(fingerprint, recording, result)
    return result  # type: ignore[return-value]


_LAST: weakref.WeakKeyDictionary[Session, object] = weakref.WeakKeyDictionary()


def _task_inputs(session: Session, engine: Any, src: Any, keep: int, raw: dict[int, bytes]) -> tuple[Any, ...]:
    """What a capped task-threads build depends on besides the bytes it reads
    (proxy.threads.listing.LastStop): the engine's position, the mode, the threads'
    registers and the stop's pcs, the cap, and the ranges the runtime adapters scan
    (/proc/PID/maps of a local program: a new arena holds tasks the last scan never read)."""
    discovery = getattr(src.discover, "__self__", None)  # proxy.reflect.adapters.Discovery
    ranges = discovery.ranges() if discovery is not None and hasattr(discovery, "ranges") else ()
    return (id(engine), engine.cursor_seq if engine is not None else None, session.mode, id(src), keep,
            tuple(sorted(raw.items())), tuple(sorted(session.stop_pcs().items())), tuple(ranges))


def _threads_command(session: Session, args: tuple[str, ...]) -> str:
    """`monitor async threads [on|off|N|filter REGEX|filter]`: tasks as threads."""
    view = session.task_view
    if view is None:
        return "asyncrsp: task threads are not available in this session"
    if args:
        word = args[0]
        if word == "on":
            view.enabled, view.off_at_resume = True, False
        elif word == "off":
            # The client may have a task thread selected now: its registers and stack stay
            # answered until the program resumes (the client lists threads again at the stop).
            view.off_at_resume = view.enabled
        elif word == "filter":
            pattern = " ".join(args[1:]) or None
            try:
                re.compile(pattern or "")
            except re.error as err:
                return f"asyncrsp: bad filter {pattern!r}: {err}"
            view.pattern = pattern
        elif word.isdigit() and int(word) > 0:
            view.cap = int(word)
        else:
            return "asyncrsp: usage: threads [on|off|N|filter [REGEX]]"
        if word != "off":
            view.stale()
            session._threads_doc = None
    state = ("on (off from the next resume)" if view.off_at_resume else "on") if view.enabled else "off"
    flt = f", filter {view.pattern!r}" if view.pattern else ""
    return (f"task threads: {state}, cap {view.cap}{flt}; ids from 0x40000000, synthetic stacks at "
            f"0x5a5a000000000000 (non-canonical: never mapped)")


def monitor(text: str, session: Session, read: Callable[[int, int], bytes | None]) -> str:
    from proxy.commands.monitor import run_monitor
    from proxy.snapshot.build import paused_gc

    with paused_gc():  # the snapshot's trees and stacks are made on demand by the command
        return run_monitor(text, _context(session, read))


def qxfer(obj: str, annex: str, session: Session,
          read: Callable[[int, int], bytes | None] | None = None) -> bytes | None:
    from proxy.commands.document import graph_document, graph_document_empty
    from proxy.commands.osdata import handles, osdata_table, render

    if obj == "osdata" and not handles(annex):
        return None
    snap = _snapshot_of(session, read)
    if snap is None:
        if obj == "osdata":
            return render(annex, [])
        note = session.target.note if session.target is not None else None
        return graph_document_empty(note or f"poll capture is off (mode {session.mode})")
    # every chunk of one document at one stop must come from the same bytes: the proxy's
    # counters (its RSS) change between two reads, so the document is made once per snapshot
    docs = _DOCS.get(session)
    if docs is None or docs[0] is not snap:
        docs = _DOCS[session] = (snap, {})
    doc = docs[1].get((obj, annex))
    if doc is None:
        from proxy.snapshot.build import paused_gc

        with paused_gc():  # every task's tree and stack, made on demand
            doc = osdata_table(annex, snap) if obj == "osdata" else graph_document(snap, session.engine,
                                                                                    _proxy_stats(session))
        docs[1][(obj, annex)] = doc
    return doc


def register_policy(upstream: UpstreamSpec, requested: str | None) -> RegisterPolicy:
    """DESIGN.md §3 rule 11: decide before the first qSupported goes upstream."""
    info = detect_stub_from_command(upstream.argv) if upstream.kind == "spawn" else UNKNOWN_STUB
    layout = read_host_xsave_layout() if upstream.is_local else None
    return decide_policy(
        requested=requested,
        stub_is_local=upstream.is_local,
        stub_kind=info.kind,
        stub_version=info.version,
        host_layout=layout,
    )


def stub_classifier(upstream: UpstreamSpec, requested: str | None) -> Callable[[bytes], tuple[bool, str]] | None:
    """For a stub we did not spawn: decide the register mode from its qSupported reply."""
    if requested is not None or upstream.kind == "spawn":
        return None
    layout = read_host_xsave_layout() if upstream.is_local else None

    def classify(reply: bytes) -> tuple[bool, str]:
        policy = stub_reply_policy(reply, stub_is_local=upstream.is_local, host_layout=layout)
        return policy.safe, policy.notice()

    return classify


def local_exe(pid: int) -> str | None:
    """The program's file of a local process (stubs without qXfer:exec-file)."""
    if pid <= 1:
        return None
    try:
        path = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None
    # QEMU user mode reports pid 1 or its own process: its file is not the program.
    if os.path.basename(path).startswith("qemu-"):
        return None
    # The file was replaced or removed after the program started (a rebuild: the corpus's
    # binaries are replaced by rename while attached programs run): the link then reads
    # "PATH (deleted)", a name that opens nothing (reflection found no source and said
    # "poll capture is off", and gdb, loading the new file, mislocated every frame: seen
    # once in 66 attaches of `stuck`). /proc/PID/exe itself still opens the running file.
    if path.endswith(" (deleted)"):
        return f"/proc/{pid}/exe"
    # The stub and its program run in a chroot or another mount namespace (a
    # Debian chroot's lldb-server, which has no qXfer:exec-file): the link then
    # reads a path of their view, which here names another file or none (seen:
    # the chroot's directory under its /tmp mount). /proc/PID/exe opens the
    # running file whatever namespace it came from.
    return path if os.path.exists(path) else f"/proc/{pid}/exe"


def load_inventory(path: str) -> object:
    """The program's inventory (proxy.analysis.inventory); for a program without
    Rust code (no Rust-mangled symbol: C, such as GDB's own testsuite's programs)
    the empty one the analysis would find, without the analysis and its imports
    (numpy, the DWARF reader: ~0.3 s of each session)."""
    from proxy.analysis.elf import open_elf

    elf = open_elf(path)
    if not elf.has_rust_symbols():
        from proxy.analysis.model import Inventory

        return Inventory(elf.build_id, elf.path, elf.pie, elf.entry, warnings=list(elf.warnings))
    from proxy.analysis.inventory import build_inventory

    return build_inventory(path)


def make_session(
    upstream: UpstreamSpec,
    *,
    probes: Sequence[str] = (),
    elf: str | None = None,
    registers: str | None = None,
    mode: str = "full",
    only: str | None = None,
    exclude: str | None = None,
    capture: str = "auto",
    options: dict[str, object] | None = None,
    emulate: bool = True,
    task_threads_on: bool = False,
    host: str | None = None,
) -> Session:
    """`host`: "local" / "remote" overrides the proof that the stub's program is this
    host's process (proxy/identity.py); None proves it."""
    policy = register_policy(upstream, registers)

    def resolve(path: str | None, entry: int | None) -> list[object]:
        from proxy.symbols import resolve_probes

        return resolve_probes(path, entry, probes)  # type: ignore[return-value]

    def merge_osdata_types(body: bytes | None) -> bytes:
        from proxy.commands import osdata

        return osdata.merge_osdata_types(body)

    def make_capture(name, m, target):  # type: ignore[no-untyped-def]
        from proxy import capture as capture_backends

        return capture_backends.make_capture(name, m, target, only=only, exclude=exclude, options=options)

    def open_program(path, entry, pid, feats):  # type: ignore[no-untyped-def]
        from proxy.capture.target import open_target

        return open_target(path, entry, pid, local=False, stub_features=feats, load_inventory=load_inventory)

    def sigint_pending(pid: int) -> bool:
        from proxy.capture.procmem import sigint_pending as pending

        return pending(pid)

    def local_memory(session: Session) -> object | None:
        """The stop's data pages through /proc/PID/mem, only for a program identity proved
        to be this host's (proxy/reflect/localmem.py); None: every read through `m`."""
        ident = session.identity
        if not ident.local:
            return None
        # the stopped process: a fork child's own pid when the stop names one (multiprocess)
        stop = getattr(session, "_last_stop", None)
        stub_pid = stop.thread.pid if stop is not None and stop.thread is not None else None
        pid = ident.host_pid if not stub_pid or stub_pid <= 1 else ident.host_pid_of(stub_pid)
        if not pid:
            return None
        from proxy.reflect.localmem import open_local

        return open_local(pid)

    target_xml = None
    if policy.safe:
        try:
            from rsp.regs import amd64_linux_target_xml
        except ImportError:  # pragma: no cover - until rsp.regs lands
            pass
        else:
            target_xml = amd64_linux_target_xml()
    cfg = SessionConfig(
        registers_safe=policy.safe,
        resolve_probes=resolve if probes else None,
        elf_path=elf,
        monitor=monitor,
        qxfer=qxfer,
        merge_osdata_types=merge_osdata_types,
        target_xml=target_xml,
        make_capture=make_capture,
        capture_name=capture,
        mode=mode,
        emulate=emulate,
        open_target=open_program,
        classify_stub=stub_classifier(upstream, registers) if policy.safe else None,
        stub_probe=STUB_PROBE_QSUPPORTED,
        local_exe=local_exe,
        sigint_pending=sigint_pending,
        task_threads=task_threads,
        local_memory=local_memory,
        identify=lambda pid, auxv, path: prove(pid, auxv, path, override=host, exchange=Exchange),
    )
    if upstream.kind == "core":
        # Nothing runs: no capture, no probes, no target to find at a first resume;
        # reflection reads the image (its auxv, its anonymous memory), never /proc.
        cfg.make_capture = cfg.open_target = cfg.resolve_probes = cfg.local_exe = cfg.classify_stub = cfg.sigint_pending = None
        cfg.identify = cfg.local_memory = None
        cfg.mode = "off"
    session = Session(cfg)
    from proxy.threads.view import TaskThreadView

    session.task_view = TaskThreadView(enabled=task_threads_on)
    session.register_notice = policy.notice()
    if upstream.kind == "core":
        from proxy.corefile.program import image_source

        image = upstream.image
        _REFLECT[session] = image_source(image)  # type: ignore[arg-type]
        session.register_notice = (f"serving {image.origin} (pid {image.pid}, "  # type: ignore[union-attr]
                                   f"{len(image.threads)} threads), read-only")  # type: ignore[union-attr]
    opts = options or {}
    _ADAPTERS[session] = "tokio" if opts.get("tokio_adapter") else (opts.get("adapters") or "auto")
    return session
