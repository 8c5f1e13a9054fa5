"""The `asyncrsp` command line (also `python -m proxy`)."""

from __future__ import annotations

import argparse
import gc
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from proxy.session.core import Session
    from proxy.shell.upstream import UpstreamSpec

# trio and the session (proxy.app, proxy.shell.serve) are imported after the
# listening socket is open (_serve): the client may connect while they load.

DEFAULT_LISTEN = "127.0.0.1:2345"


def _add_paths(p: argparse.ArgumentParser) -> None:
    p.add_argument("--paths", choices=("short", "full"), default="short",
                   help="how source files are shown: short (default) = a registry crate's from its "
                        "directory, tokio-1.53.2/src/sync/watch.rs:999, the standard library's from "
                        "library/; full = the path the binary names (JSON documents always have it)")


def _add_common(p: argparse.ArgumentParser) -> None:
    _add_paths(p)
    p.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                   help=f"where the client connects (default {DEFAULT_LISTEN}; port 0 picks a free one), or fd:N: "
                        "a listening socket inherited as descriptor N")
    p.add_argument("--probe", action="append", default=[], metavar="REGEX",
                   help="plant a hidden entry breakpoint on every function whose name matches (repeatable; "
                        "with --capture uprobes a uprobe counts it instead, without stopping the program)")
    p.add_argument("--log-packets", metavar="FILE", help="write every byte exchanged to FILE")
    p.add_argument("--resident", metavar="SOCKET",
                   help="run the session in the resident listening on SOCKET (`asyncrsp resident`): "
                        "no interpreter start-up or imports; this process waits for it")
    p.add_argument("--mode", choices=("full", "tasks", "entry", "off"), default="full",
                   help="poll capture: full = entry and exit breakpoints on every resume function; "
                        "tasks (uprobes; others: full) = after 0.5 s, only the resume functions polled as "
                        "tasks' roots, counted exactly in the kernel, the await trees read at stops; "
                        "entry = entries only (exits inferred); off = plant nothing")
    p.add_argument("--capture", default="auto", choices=("auto", "uprobes", "tracepoints", "breakpoints"),
                   help="how poll events are captured: uprobes (in the kernel; the program's own host, root), "
                        "tracepoints (inside gdbserver), breakpoints (hidden stops, any stub); "
                        "auto = the cheapest that can run (default)")
    p.add_argument("--trace-buffer", type=_trace_buffer_size, metavar="SIZE",
                   help="tracepoint capture: gdbserver's trace buffer (e.g. 64K, 2M; default 2M); "
                        "the proxy drains it with hidden stops before it fills")
    p.add_argument("--inproc", action="store_true",
                   help="tracepoint capture: the program runs with gdbserver's in-process agent "
                        f"({INPROC_AGENT} preloaded; `run --inproc` arranges it): fast tracepoints "
                        "(a jump instead of a trap) where the binary allows it - not position-independent")
    p.add_argument("--step-over-probes", action="store_true",
                   help="breakpoint capture: step over every hidden breakpoint (two resumes) instead of "
                        "emulating the probed instruction (one resume); for diagnosis")
    p.add_argument("--adapters", default="auto", type=_adapters, metavar="auto|off|NAME[,NAME]",
                   help="reflection: runtime adapters that find every spawned task by scanning the program's "
                        "heap for task headers (local programs): tokio, async-task (smol, async-std), "
                        "futures-executor (futures' LocalPool). "
                        "auto (default): every runtime whose task layout is in the program; off: none; "
                        "names force those (a missing layout is then reported)")
    p.add_argument("--tokio-adapter", action="store_true",
                   help="the same as --adapters tokio (tokio's adapter only, its layout checked at start)")
    p.add_argument("--trace-probe", action="append", default=[], metavar="REGEX",
                   help="tracepoint capture: count the entries and rets of every function whose name "
                        "matches inside gdbserver (repeatable; `monitor async stats` shows the counts)")
    p.add_argument("--task-threads", action="store_true",
                   help="show each live task as an extra thread with its logical stack (monitor async threads)")
    p.add_argument("--sample", type=int, default=1, metavar="N",
                   help="uprobe capture: record one root poll in N of each coroutine instance (new ones "
                        "always); poll counts and busy times stay exact (counted in the kernel), the "
                        "graph and the poll histograms see the recorded polls only (default 1: all)")
    p.add_argument("--uprobe-rets", action="store_true",
                   help="uprobe capture: keep the exits of resume functions polled through a vtable on their "
                        "rets (single-stepped by the kernel) instead of probing the return sites their polls "
                        "are seen to return to; for comparison")
    p.add_argument("--uprobe-changes", action="store_true",
                   help="uprobe capture, full mode: record only the polls that change the graph (a new "
                        "coroutine, state, parent or thread, a completion); repeat polls are counted in the "
                        "kernel, POLLS and BUSY stay exact (default: every poll recorded)")
    p.add_argument("--uprobe-every", action="store_true",
                   help="uprobe capture, full mode: record the coroutines created and completed inside one "
                        "poll of their parent too (by default they are counted in the kernel, not recorded, "
                        "and make no graph task: the graph at any stop is the same); for comparison")
    p.add_argument("--wakes", action="store_true",
                   help="uprobe capture: probe spawns and wakers too: every spawn keeps its stack for where "
                        "TASK and the tasks' SPAWNED AT, the wakers feed top's SCHED, WAKES and SELF, warnings "
                        "and the observed wakes in waits/deadlocks (docs/wakes.md; costs a busy server about a "
                        "third of its requests)")
    p.add_argument("--lost-wakers", action="store_true",
                   help="uprobe capture: --wakes and the waker clones and drops too, for warnings' lost waker "
                        "(the most hit waker functions: on the axum service 3 more probe hits a request)")
    p.add_argument("--uprobe-strict", action="store_true",
                   help="uprobe capture, full mode: record every poll even when the proxy falls behind (by "
                        "default the kernel then samples 1 root poll in 64 per coroutine until the proxy has "
                        "caught up, POLLS and BUSY staying exact; strict, the unread records grow, are lost "
                        "past the backlog, and a stop waits for them to be folded)")
    p.add_argument("--uprobe-budget", type=_budget, metavar="PCT",
                   help="uprobe capture, full mode: the share of one core the proxy may use while the program "
                        "runs (default 10; measured with the proxy's own CPU clock). Past it the proxy folds "
                        "nothing until its next tick, and once its unread records pass ~0.25 s of folding the "
                        "kernel samples (as without a budget when the proxy falls behind); POLLS and BUSY stay "
                        "exact, stats says what was sampled and what the proxy took. While it samples, the "
                        "probes of the coroutines polled only inside other polls are taken out (the tasks' "
                        "stay: their POLLS and BUSY exact; the nested coroutines' polls, edges and histograms "
                        "are then of the in time only). 0: no budget, and every probe stays in")
    p.add_argument("--sample-time", type=_percent, metavar="PCT",
                   help="uprobe capture: time slices, the probes in for PCT%% of the running time (50 ms at a "
                        "time) and out for the rest (the program runs bare); counts, busy times and the graph "
                        "come from the slices only, and stats and top say so (default 100: always in)")
    p.add_argument("--only", metavar="REGEX", help="capture only resume functions whose name matches")
    p.add_argument("--exclude", metavar="REGEX", help="do not capture resume functions whose name matches")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--local", dest="host", action="store_const", const="local",
                       help="take the pid the stub reports as this host's process without proving it "
                            "(default: proved by the stub's auxv and random bytes against /proc)")
    where.add_argument("--remote", dest="host", action="store_const", const="remote",
                       help="never act on this host's processes (no uprobes, no /proc reads or writes)")
    p.add_argument("--registers", choices=("safe", "full"),
                   help="safe: keep gdbserver<14 from corrupting AVX-512 registers (default when it could); "
                        "full: forward xmlRegisters as the client sent it")


def _adapters(text: str) -> str:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names in (["auto"], ["off"]):
        return ",".join(names)  # argparse checks the default too: no import of the adapters for it
    from proxy.reflect.adapters import NAMES

    if names and all(n in NAMES for n in names):
        return ",".join(names)
    raise argparse.ArgumentTypeError(f"{text!r}: want auto, off, or adapter names from {', '.join(NAMES)}")


def _percent(text: str) -> int:
    try:
        v = int(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 1 <= v <= 100:
        raise argparse.ArgumentTypeError(f"a percentage from 1 to 100, not {v}")
    return v


def _budget(text: str) -> float:
    """--uprobe-budget: a share of one core in percent, 0 (no budget) to 99."""
    try:
        v = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a percentage: {text!r}") from None
    if not 0 <= v < 100:
        raise argparse.ArgumentTypeError(f"a percentage from 0 (no budget) to 99, not {text}")
    return v


def _trace_buffer_size(text: str) -> int:
    from proxy.capture.tracepoints import parse_size

    try:
        return parse_size(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asyncrsp", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="proxy between an RSP client and a stub")
    up = s.add_mutually_exclusive_group(required=True)
    up.add_argument("--upstream", metavar="HOST:PORT|unix:PATH|'|COMMAND'",
                    help="the stub: a TCP address, a Unix socket, or a command to spawn on a pipe")
    up.add_argument("--core", metavar="FILE", help="serve a core file (gcore or kernel dump), read-only")
    s.add_argument("--elf", metavar="PATH", help="the program's file (default: asked from the stub, "
                                                  "or for --core the file the core names)")
    s.add_argument("--once", action="store_true",
                   help="end after the first client leaves (as gdbserver --once); by default a client that "
                        "hangs up without detaching or killing leaves the stub and the capture for the next")
    _add_common(s)
    r = sub.add_parser("run", help="start gdbserver on PROGRAM behind the proxy and print the gdb command")
    _add_common(r)
    r.add_argument("--core", metavar="FILE", help="serve this core file instead of running a program "
                                                  "(PROGRAM, if given, is the core's program file)")
    r.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM [ARGS]")
    for name, what in (("ps", "a table of the tasks"), ("tree", "the pending-future tree of every task")):
        c = sub.add_parser(name, help=f"{what} of a running process (stopped only to copy it) or a core file, "
                                      "with the wait-for cycles")
        c.add_argument("pid", nargs="?", type=int, metavar="PID")
        c.add_argument("--core", metavar="FILE", help="read a core file instead of a process")
        c.add_argument("--elf", metavar="PROG", help="with --core: the program's file")
        c.add_argument("--json", action="store_true", help="machine-readable output")
        c.add_argument("--html", metavar="FILE", help="write one self-contained HTML report instead (the tasks, "
                                                      "parallel stacks, trees, the wait-for graph)")
        _add_paths(c)
    d = sub.add_parser("resident", help="import the proxy once and run each `serve --resident SOCKET` "
                                        "session as a fork of this process")
    d.add_argument("--socket", required=True, metavar="PATH", help="the Unix socket the sessions are asked on")
    dr = sub.add_parser("doctor", help="check this host for each capture and feature, one line each, "
                                       "with what to do when something is missing (exit 0: all ok, "
                                       "1: something to do, 2: run cannot start a program here)")
    dr.add_argument("--json", action="store_true", help="machine-readable output")
    i = sub.add_parser("inspect", help="print the async structure of a program without running it")
    i.add_argument("program", metavar="PROGRAM")
    i.add_argument("--json", action="store_true", help="machine-readable output")
    i.add_argument("--tree", action="store_true", help="the static await tree")
    _add_paths(i)
    return parser


_PARSERS: list[argparse.ArgumentParser] = []


def _parser() -> argparse.ArgumentParser:
    """build_parser's, built once: `asyncrsp resident` builds it before it
    forks (10-30 ms a session otherwise; parse_args leaves it as it was)."""
    if not _PARSERS:
        _PARSERS.append(build_parser())
    return _PARSERS[0]


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["serve"], ["run"]):
        # Before argparse and the shell's modules: the resident's child parses
        # the command line (its errors come out on this process's stderr).
        from proxy.shell.resident import client_main, split_resident

        path, rest = split_resident(argv)
        if path is not None:
            return client_main(path, rest)
    args = _parser().parse_args(argv)
    if getattr(args, "paths", None):
        from proxy.analysis.paths import set_style

        set_style(args.paths)
    from proxy.shell.listen import ServeError
    from proxy.shell.upstream import UpstreamError

    try:
        if args.command == "resident":
            from proxy.shell.resident import resident_main

            return resident_main(args.socket, main, _parser)
        if args.command == "inspect":
            return _inspect(args)
        if args.command == "doctor":
            from proxy.doctor.main import doctor_main

            return doctor_main(sys.stdout, sys.stderr, as_json=args.json)
        if args.command in ("ps", "tree"):
            from proxy.ps.main import main as ps_main

            return ps_main(args.command, args.pid, args.core, args.elf, args.json, html=args.html)
        return _serve(args)
    except (ServeError, UpstreamError) as err:
        print(f"asyncrsp: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


INPROC_AGENT = "/usr/lib/libinproctrace.so"  # gdbserver's in-process agent (Debian's gdbserver package)


def _serve(args: argparse.Namespace) -> int:
    from proxy.shell.listen import ServeError, inherited_socket, listen_socket, parse_listen
    from proxy.shell.upstream import UpstreamSpec

    given = inherited_socket(args.listen)
    host, port = given.getsockname()[:2] if given is not None else parse_listen(args.listen)
    elf = getattr(args, "elf", None)
    hint: str | None = None  # `run`: the program named in the gdb command it prints
    if args.core is not None:
        upstream = _core_upstream(args, elf)
        elf = None  # the image already maps it
        if args.command == "run":
            hint = getattr(upstream.image, "exec_file", None) or ""
    elif args.command == "run":
        prog = [a for a in args.program if a != "--"] if args.program[:1] == ["--"] else list(args.program)
        if not prog:
            raise ServeError("run: give the program after --, e.g. asyncrsp run -- ./app")
        try:
            Path(prog[0]).stat()
        except FileNotFoundError:
            raise ServeError(f"run: no such program: {prog[0]}") from None
        except OSError as err:  # a directory on the way this user may not enter
            raise ServeError(f"run: {prog[0]}: {err.strerror}") from None
        gdbserver = _gdbserver_for_run()
        # --once: a stdio gdbserver otherwise "reopens" its closed stdin forever.
        wrapper: tuple[str, ...] = ()
        if args.inproc:
            if not Path(INPROC_AGENT).exists():
                raise ServeError(f"run --inproc: no {INPROC_AGENT} (Debian: apt-get install gdbserver)")
            # gdbserver starts the program through the wrapper: only the program
            # gets the agent, not the shell or gdbserver.
            wrapper = ("--wrapper", "env", f"LD_PRELOAD={INPROC_AGENT}", "--")
        upstream = UpstreamSpec("spawn", argv=(gdbserver, "--once", *wrapper, "-", *prog))
        elf = prog[0]
        hint = prog[0]
    else:
        upstream = UpstreamSpec.parse(args.upstream)
    if elf is not None and not Path(elf).exists():
        raise ServeError(f"--elf {elf}: no such file")
    log = open(args.log_packets, "w", buffering=1) if args.log_packets else None  # noqa: SIM115
    try:
        sock = given if given is not None else listen_socket(host, port)
        sockname = sock.getsockname()
        if hint is not None:  # after the listen: the port --listen HOST:0 picked
            shown = "127.0.0.1" if sockname[0] in ("0.0.0.0", "") else sockname[0]
            print(f"asyncrsp: connect with:  gdb -ex 'target remote {shown}:{sockname[1]}' {shlex.quote(hint)}",
                  file=sys.stderr, flush=True)
        print(f"asyncrsp: listening on {sockname[0]}:{sockname[1]}", file=sys.stderr, flush=True)
        # No garbage collection while the session's modules load (module
        # objects are not garbage; the collector walking them again and again
        # cost ~15% of the import time, which every proxy start pays), and
        # what they made is frozen out of later collections.
        gc.disable()
        try:
            import trio

            from proxy.app import make_session
            from proxy.shell.serve import ServeOptions, serve
        finally:
            gc.freeze()
            gc.enable()

        # `run` starts gdbserver --once on a pipe: one client.
        opts = ServeOptions(host, port, upstream, log_packets=log,
                            once=args.command == "run" or getattr(args, "once", False), sock=sock)
        def make(up: UpstreamSpec) -> Session:
            return make_session(up, probes=args.probe, elf=elf, registers=args.registers,
                                mode=args.mode, only=args.only, exclude=args.exclude,
                                capture=args.capture, options=vars(args),
                                emulate=not args.step_over_probes, task_threads_on=args.task_threads,
                                host=args.host)

        return trio.run(serve, opts, make)
    finally:
        if log is not None:
            log.close()


def _gdbserver_for_run() -> str:
    """gdbserver's path, or ServeError with the doctor's line for what stops `run`
    (no gdbserver on PATH, a ptrace_scope that forbids tracing)."""
    from proxy.host.checks import run_problem
    from proxy.host.read import SimulationError, read_run_facts
    from proxy.shell.listen import ServeError

    try:
        why = run_problem(read_run_facts())
    except SimulationError as err:
        raise ServeError(str(err)) from None
    gdbserver = shutil.which("gdbserver")
    if why is not None or gdbserver is None:
        raise ServeError(f"run: {why}")
    return gdbserver


def _core_upstream(args: argparse.Namespace, elf: str | None) -> UpstreamSpec:
    """`--core FILE`: open the core now (a bad core is one line before anything listens)."""
    from proxy.corefile import CoreError, open_core
    from proxy.shell.listen import ServeError
    from proxy.shell.upstream import UpstreamSpec

    if args.command == "run":
        prog = [a for a in args.program if a != "--"]
        elf = prog[0] if prog else None
    try:
        image = open_core(args.core, elf)
    except CoreError as err:
        raise ServeError(str(err)) from None
    return UpstreamSpec("core", path=args.core, image=image)


def _inspect(args: argparse.Namespace) -> int:
    try:
        from proxy.analysis.report import inspect_main
    except ImportError:
        print("asyncrsp: inspect is not available yet in this build", file=sys.stderr)
        return 2
    return inspect_main(args.program, as_json=args.json, tree=args.tree, out=sys.stdout, progress=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
