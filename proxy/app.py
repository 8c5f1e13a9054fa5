"""Compose a `Session` for a command line: probes, register safety, commands."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from typing import TYPE_CHECKING

# What a session needs only once the program runs, or a client asks (the
# analysis, the captures, the commands: pyelftools, capstone, numpy...) is
# imported there, not here: every `asyncrsp serve` starts with this module,
# and a session on a program without async code may never need them (GDB's
# own testsuite starts 93 proxies; importing it all cost ~0.7 s each).
from proxy.host.regsafety import (
    STUB_PROBE_QSUPPORTED,
    UNKNOWN_STUB,
    RegisterPolicy,
    decide_policy,
    detect_stub_from_command,
    read_host_xsave_layout,
    stub_reply_policy,
)
from proxy.host.identity import prove
from proxy.program import Program, SessionStop
from proxy.session.core import Session, SessionConfig
from proxy.procedure import Exchange
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
    program = session.program
    return [f"proxy RSS: {_rss_mb()}", *session.queries.stats_lines(), *(program.lines() if program is not None else ())]


def _summary_lines(session: Session) -> list[str]:
    """What `monitor async stats` prints of the session in its short form: the
    capture and why, the program's host, and what the proxy cost (its CPU and
    memory, the program's hidden stops); the rest is `stats --all`'s."""
    import time

    cap = session.capture
    own = session.capture_call("stats_lines") if cap is not None else None
    lines = [own[0] if own else f"capture: {cap.name if cap is not None else 'none'} (mode {session.mode})"]
    lines += [f"capture note: {text}" for text in (session.capture_notice, getattr(cap, "note", None)) if text]
    s = session.stats
    stops = f"{s.hidden_stops} hidden stops ({s.hidden_time * 1e3:.1f} ms)"
    return [*lines, session.identity.line(), *_map_line(session),
            f"proxy's cost: {time.process_time():.2f} s of CPU, RSS {_rss_mb()}; the program: {stops}"]


def _map_line(session: Session) -> list[str]:
    """Where the runtime adapters' map of a program of another host came from, or why none."""
    q = session.queries
    if session.identity.local or not session.config.remote_maps or not (q.remote_maps_how or q.remote_maps_why):
        return []
    return [f"program's memory map: {q.remote_maps_how if q.remote_maps is not None else 'none: ' + str(q.remote_maps_why)}"]


class _LazyLines(Sequence[str]):
    """Lines read only when a command prints them: every monitor command gets
    a context, and the RSS line reads /proc/self/smaps (about 20 ms with the
    capture's mappings; a fuzzing client's monitor commands spent a tenth of
    the proxy's time there)."""

    def __init__(self, make: Callable[[], list[str]]) -> None:
        self._make = make
        self._lines: list[str] | None = None

    def _get(self) -> list[str]:
        if self._lines is None:
            self._lines = self._make()
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
    program = session.program

    def snapshot():  # type: ignore[no-untyped-def]
        if not made:  # once per command pass
            made.append(program.snapshot(SessionStop(session), read))
        return made[0]

    return MonitorContext(
        engine=engine,
        thread=session.current_thread(),
        pcs=session.stop_pcs(),
        read_memory=read,
        proxy_lines=_LazyLines(lambda: _proxy_lines(session)),
        summary_lines=_LazyLines(lambda: _summary_lines(session)),
        note=note,
        mode=lambda args: _mode_command(session, args),
        capture=lambda args: _capture_command(session, args),
        threads_command=lambda args: _threads_command(session, args),
        pictures=lambda name, path, snap: _picture_command(session, name, path, snap),
        snapshot=snapshot,
        observed=lambda: program.observed(SessionStop(session)),
        origins=_origins_of(cap, engine, read),
    )


def _picture_command(session: Session, name: str, path: str, snap: Any) -> str:
    """`monitor async report|timeline|stacks FILE`: written on the proxy's host (proxy.pictures)."""
    import time

    from proxy.pictures import files

    engine = session.engine
    program = getattr(getattr(engine, "catalog", None), "inventory", None)
    program_path = getattr(program, "path", None) or session.exec_file or "the program"
    title = f"{Path(program_path).name} at stop {snap.stop}"
    cap = session.capture
    subtitle = (f"{program_path}; capture: {cap.name if cap is not None else 'off'}, mode {session.mode}; "
                f"written by asyncrsp {time.strftime('%Y-%m-%d %H:%M:%S')}")
    sw = getattr(cap, "origins", None)  # uprobe capture: the kernel's wake statistics (proxy.origins)
    wakes = list(sw.wakes().values()) if sw is not None and sw.active else []
    try:
        if name == "timeline":
            return files.write_timeline(path, engine, snap, wakes)
        if name == "stacks":
            return files.write_stacks(path, snap, title=title)
        return files.write_report(path, snap, engine, title=f"asyncrsp: {title}", subtitle=subtitle, wakes=wakes)
    except files.PictureError as err:
        return f"asyncrsp: {err}"


def _origins_of(cap: Any, engine: Any, read: Callable[[int, int], bytes | None]) -> Any:
    """Spawns and wakes for this command pass (proxy.origins), when the capture records them."""
    sw = getattr(cap, "origins", None)
    if sw is None or not sw.active or engine is None:
        return None
    from proxy.origins.view import Origins

    made: list[Any] = []

    def make() -> Any:
        if not made:
            made.append(Origins(sw, engine.catalog.inventory, engine.catalog.load_bias, read))
        return made[0]
    return make


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
        probes = session.queries.probes_line()
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


def task_threads(session: Session, read: Callable[[int, int], bytes | None]) -> tuple[list[object], object, int, int]:
    """The live tasks at this stop for task threads (proxy.program.taskthreads); their spawn
    lines when the capture records spawns (proxy.origins)."""
    origins = _origins_of(session.capture, session.engine, read)
    return session.program.threads.tasks(SessionStop(session), read, session.task_threads.view,  # type: ignore[no-any-return]
                                         origins)


def _threads_command(session: Session, args: tuple[str, ...]) -> str:
    """`monitor async threads [on|off|N|filter REGEX|filter]`: tasks as threads."""
    part = session.task_threads
    view = part.view
    if view is None:
        return "asyncrsp: task threads are not available in this session"
    refused = part.refused()
    if refused is not None:
        return f"asyncrsp: {refused}"
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
            part.doc = None
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
    program = session.program
    snap = program.snapshot(SessionStop(session), read)
    if snap is None:
        if obj == "osdata":
            return render(annex, [])
        note = session.target.note if session.target is not None else None
        return graph_document_empty(note or f"poll capture is off (mode {session.mode})")
    def render() -> bytes:
        from proxy.snapshot.build import paused_gc

        with paused_gc():  # every task's tree and stack, made on demand
            org = _origins_of(session.capture, session.engine, read)
            extra = (lambda t, o=org(): o.document_fields(t, snap)) if org is not None else None
            return osdata_table(annex, snap) if obj == "osdata" else graph_document(snap, session.engine,
                                                                                     _proxy_stats(session), extra)

    return program.document(snap, (obj, annex), render)


def register_policy(upstream: UpstreamSpec, requested: str | None, elf: str | None = None) -> RegisterPolicy:
    """DESIGN.md §3 rule 11: decide before the first qSupported goes upstream. A program of
    another CPU (``--elf``'s header) has no x86 XSAVE state for gdbserver 13 to corrupt."""
    from proxy.arch import for_machine, machine_of

    arch = for_machine(machine_of(elf)) if elf and requested is None else None
    if arch is not None and arch.name != "x86-64":
        return RegisterPolicy(False, f"the program is {arch.name}: gdbserver 13's XSAVE bug is x86-64's")
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

    return build_inventory(path, progress=sys.stderr)  # the proxy's terminal, if it has one


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
    host's process (proxy/host/identity.py); None proves it."""
    policy = register_policy(upstream, registers, elf)

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
        from proxy.host.procmem import sigint_pending as pending

        return pending(pid)

    def local_memory(session: Session) -> object | None:
        """The stop's data pages through /proc/PID/mem, only for a program identity proved
        to be this host's (proxy/host/localmem.py); None: every read through `m`."""
        ident = session.identity
        if not ident.local:
            return None
        # the stopped process: a fork child's own pid when the stop names one (multiprocess)
        stop = getattr(session, "last_stop", None)
        stub_pid = stop.thread.pid if stop is not None and stop.thread is not None else None
        pid = ident.host_pid if not stub_pid or stub_pid <= 1 else ident.host_pid_of(stub_pid)
        if not pid:
            return None
        from proxy.host.localmem import open_local

        return open_local(pid)

    def live_memory(pid: int) -> object | None:
        from proxy.host.localmem import open_live

        return open_live(pid)

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
        live_memory=live_memory,
        identify=lambda pid, auxv, path: prove(pid, auxv, path, override=host, exchange=Exchange),
    )
    if upstream.kind == "core":
        # Nothing runs: no capture, no probes, no target to find at a first resume;
        # reflection reads the image (its auxv, its anonymous memory), never /proc.
        cfg.make_capture = cfg.open_target = cfg.resolve_probes = cfg.local_exe = cfg.classify_stub = cfg.sigint_pending = None
        cfg.identify = cfg.local_memory = cfg.live_memory = None
        cfg.mode = "off"
    session = Session(cfg)
    from proxy.threads.view import TaskThreadView

    opts = options or {}
    session.program = Program(adapters="tokio" if opts.get("tokio_adapter") else str(opts.get("adapters") or "auto"))

    session.task_threads.view = TaskThreadView(enabled=task_threads_on)
    session.register_notice = policy.notice()
    if upstream.kind == "core":
        from proxy.corefile.program import image_source

        image = upstream.image
        session.set_arch(image.arch)  # type: ignore[union-attr]  # the core's CPU: its `g` block, its stack
        session.program = Program(adapters=session.program.adapters,  # type: ignore[arg-type]
                                  source=image_source(image, progress=sys.stderr))
        session.register_notice = (f"serving {image.origin} (pid {image.pid}, "  # type: ignore[union-attr]
                                   f"{len(image.threads)} threads), read-only")  # type: ignore[union-attr]
    session.config.remote_maps = session.program.adapters != "off" and upstream.kind != "core"
    if session.config.remote_maps and host != "remote" and upstream.kind in ("tcp", "unix"):
        from proxy.host.emulator import EmulatorHost

        session.config.emulator = EmulatorHost()  # a stub with no pid and no vFile: QEMU's user mode
    return session
