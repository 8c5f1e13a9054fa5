"""`asyncrsp resident`: one interpreter that imported the proxy once, and a
fork of it for each `serve`/`run` session.

A proxy's start is mostly Python's: the interpreter and the imports of trio
and the session (~0.2 s of CPU, 0.5 s of wall time on a loaded machine)
before the client's first packet is answered. A tool that starts a stub
many times (GDB's own testsuite starts gdbserver 93 times in
scripts/gdb-testsuite's subset; an IDE per debug session) pays it each
time. With a resident, `asyncrsp serve --resident PATH ...` hands its
command line, its working directory, its environment and its descriptors
(stdin, stdout, stderr, and the socket of `--listen fd:N`) over the Unix
socket PATH; the resident forks, the child takes them as its own and runs
the command as `asyncrsp serve ...` would have, and the caller waits for it
and exits with its status (its SIGINT, SIGTERM and SIGHUP are passed on).

The resident never runs trio itself (a fork of a running event loop would
share its epoll descriptor with the parent): it accepts with a plain
blocking loop, and a child starts trio fresh. The code a session runs is
the code the resident imported: restart it after changing the proxy.

`request` is the caller's side, standard library only: the command line
client and scripts/gdb_testsuite_wrap.py (a `python -S` wrapper that does
not wait) use it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import sys
from collections.abc import Callable, Sequence

# What a session imports, loaded once by the resident (what a session
# imports later, e.g. the DWARF reader for a Rust program, is loaded by
# each child as it needs it, as without a resident).
PRELOAD = (
    "trio",
    "proxy.app",
    "proxy.shell.serve",
    "proxy.capture.breakpoints",
    "proxy.capture.tracepoints",
    "proxy.capture.uprobes",
    "rsp.regs",  # the register description a session serves (make_session: ~9 ms, a dataclass built)
    "encodings.idna",  # the stub's address, encoded for getaddrinfo by trio (with stringprep)
)
_MAX_REQUEST = 1 << 20  # command line and environment, one JSON line
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the caller's, passed on to its session
_SIGNALS = {*_FORWARDED, signal.SIGCHLD}


class ResidentError(Exception):
    """A one-line reason a resident cannot be reached or started."""


# -- the caller's side (standard library only) -------------------------------------------

def request(path: str, argv: Sequence[str], fds: Sequence[int] = (0, 1, 2), targets: Sequence[int] | None = None,
            env: dict[str, str] | None = None, cwd: str | None = None,
            answer: bool = True) -> tuple[int, socket.socket]:
    """Start `asyncrsp ARGV` in the resident at `path`. The session gets this
    process's descriptors `fds` under the numbers `targets` (default: the
    same numbers; 0, 1 and 2 first, then e.g. the socket of `--listen fd:N`).
    Returns the session's pid and the connection on which its exit status
    comes (`wait_status`); closing it leaves the session running.
    `answer=False` does not wait for the pid (0 is returned): the request and
    the descriptors are in the socket, the resident takes them even after
    the caller has closed it or exec'd."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        msg = json.dumps({"argv": list(argv), "fds": list(fds if targets is None else targets),
                          "cwd": cwd or os.getcwd(), "env": dict(os.environ if env is None else env)})
        socket.send_fds(conn, [msg.encode() + b"\n"], list(fds))
        if not answer:
            return 0, conn
        line = _readline(conn)
    except OSError as err:
        conn.close()
        raise ResidentError(f"--resident {path}: {err.strerror or err} (is `asyncrsp resident --socket "
                            f"{path}` running?)") from None
    if not line.startswith(b"pid "):
        conn.close()
        raise ResidentError(f"--resident {path}: {line.decode(errors='replace').strip() or 'no answer'}")
    return int(line[4:]), conn


def wait_status(pid: int, conn: socket.socket, mask: set[signal.Signals] | None = None) -> int:
    """Wait for the session's end; its exit status (128+N for a signal N).
    SIGINT, SIGTERM and SIGHUP of this process are passed on to the session
    (it runs in a session of its own, out of reach of the terminal's).
    `mask`: the signal mask to restore once they are passed on (the caller
    blocked them across `request`, see client_main): those that came in
    between are passed on then."""
    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(pid, signum)
        except OSError:
            pass

    before = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    try:
        line = _readline(conn)
    finally:
        conn.close()
        for sig, handler in before.items():
            signal.signal(sig, handler)
    if line.startswith(b"exit "):
        return int(line[5:])
    return 1


def _readline(conn: socket.socket) -> bytes:
    """One line, a byte at a time: what follows stays in the socket. A session
    that ends at once has its exit status sent right behind its pid (seen
    under load: both lines in one read, and the pid unreadable)."""
    buf = b""
    while not buf.endswith(b"\n"):
        try:
            data = conn.recv(1)
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue
        if not data:
            break
        buf += data
    return buf


def split_resident(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """`--resident PATH` (or `--resident=PATH`) out of a command line, before
    a `--` (the program's own arguments are not looked at)."""
    out: list[str] = []
    path = None
    i = 0
    args = list(argv)
    while i < len(args):
        a = args[i]
        if a == "--":
            out += args[i:]
            break
        if a == "--resident" and i + 1 < len(args):
            path = args[i + 1]
            i += 2
            continue
        if a.startswith("--resident="):
            path = a.split("=", 1)[1]
            i += 1
            continue
        out.append(a)
        i += 1
    return path, out


def listen_fds(argv: Sequence[str]) -> list[int]:
    """The descriptor of `--listen fd:N` in a command line, if any (it is
    handed to the session with 0, 1 and 2)."""
    for i, a in enumerate(argv):
        if a == "--":
            break
        text = argv[i + 1] if a == "--listen" and i + 1 < len(argv) else a[9:] if a.startswith("--listen=") else ""
        if text.startswith("fd:") and text[3:].isdigit():
            return [int(text[3:])]
    return []


def client_main(path: str, argv: Sequence[str]) -> int:
    """`asyncrsp serve --resident PATH ...`: the session in the resident,
    this process waiting for it."""
    # The session may exist (and listen) before the resident's answer, its
    # pid, is here; a signal then would kill this process and leave the
    # session running (seen under load: a SIGTERM sent once the session
    # listened). Held back from the request on, until they can be passed on.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
    try:
        pid, conn = request(path, argv, fds=[0, 1, 2, *listen_fds(argv)])
    except ResidentError as err:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        print(f"asyncrsp: {err}", file=sys.stderr)
        return 2
    return wait_status(pid, conn, mask)


# -- the resident ---------------------------------------------------------------------------

def preload(prepare: Callable[[], object] = lambda: None) -> None:
    """Import what every session imports; ``prepare``: what else to make once (the command
    line's parser, built once for every session)."""
    import gc
    import importlib

    gc.disable()  # as cli._serve: module objects are not garbage
    try:
        for name in PRELOAD:
            importlib.import_module(name)
        _warm_uprobes()
        prepare()
    finally:
        gc.freeze()  # the children share these pages: no collection touches them
        gc.enable()


def _warm_uprobes() -> None:
    """What every session with a --probe paid under `--capture auto`, done
    once: the host check (~3.6 ms: platform, the per-boot mark) and libbpf
    through ctypes (~2 ms). Both are cached in the module, so the forks share
    them; a host without uprobes only learns why here."""
    from proxy.capture.uprobes import bpf, capture

    ok, _ = capture.UprobeCapture.available(None)
    if ok:
        try:
            bpf.libbpf()
        except bpf.BpfError:
            pass  # said again by the session that needs it


def bind(path: str) -> socket.socket:
    """The resident's Unix socket; a stale socket file (nobody listening) is replaced."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)
        else:
            probe.close()
            srv.close()
            raise ResidentError(f"--socket {path}: a resident already listens there")
        finally:
            probe.close()
    try:
        srv.bind(path)
    except OSError as err:
        srv.close()
        raise ResidentError(f"--socket {path}: {err.strerror or err}") from None
    srv.listen(64)
    return srv


def serve_resident(srv: socket.socket, main: Callable[[list[str]], int]) -> int:
    """Accept requests until SIGTERM/SIGINT; fork a session for each, and
    send each caller its session's exit status when it ends. The sessions
    running then go on."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop through the wakeup fd
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    waiting: dict[int, socket.socket] = {}
    try:
        while not stopping:
            ready, _, _ = select.select([srv, r], [], [])
            if r in ready:
                os.read(r, 4096)
                _reap(waiting)
            if srv in ready and not stopping:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    continue
                pid = _start(conn, srv, r, w, waiting, main)
                if pid:
                    waiting[pid] = conn
                else:
                    conn.close()
    finally:
        signal.set_wakeup_fd(-1)
        os.close(r)
        os.close(w)
        for conn in waiting.values():
            conn.close()  # the sessions go on; their callers see no status
    return 0


def _reap(waiting: dict[int, socket.socket]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        conn = waiting.pop(pid, None)
        if conn is not None:
            try:
                conn.sendall(b"exit %d\n" % (code if code >= 0 else 128 - code))
            except OSError:
                pass
            conn.close()


def _start(conn: socket.socket, srv: socket.socket, r: int, w: int, waiting: dict[int, socket.socket],
           main: Callable[[list[str]], int]) -> int:
    """Read one request and fork its session; the session's pid (0: refused)."""
    conn.settimeout(5)  # a caller that connects and says nothing does not hold the resident
    fds: list[int] = []
    try:
        msg, fds, _flags, _addr = socket.recv_fds(conn, _MAX_REQUEST, 16)
        while not msg.endswith(b"\n") and len(msg) < _MAX_REQUEST:
            more = conn.recv(_MAX_REQUEST)
            if not more:
                break
            msg += more
        req = json.loads(msg)
        argv = [str(a) for a in req["argv"]]
        targets = [int(f) for f in req["fds"]]
    except (OSError, ValueError, KeyError, TypeError):
        for fd in fds:
            os.close(fd)
        return 0
    if len(fds) != len(targets):
        for fd in fds:
            os.close(fd)
        _answer(conn, b"error: the descriptors did not come with the request\n")
        return 0
    # The caller may signal the session as soon as it has the pid: the child
    # must not take such a signal with the resident's handlers (SIGTERM would
    # only set the resident's stop flag). Blocked across the fork, the child
    # unblocks them once its own handlers are in place.
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        for fd in fds:
            os.close(fd)
        _answer(conn, b"error: fork failed\n")
        return 0
    if pid == 0:  # pragma: no cover - the child; tests/test_resident.py runs it
        code = 1
        try:
            _become(fds, targets, req, keep=(srv, conn, *waiting.values()), pipe=(r, w))
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
            code = main(argv)
        except SystemExit as exc:  # argparse's errors and --help
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
        except BaseException:  # noqa: BLE001 - the child never returns into the resident's loop
            import traceback

            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code or 0)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
    for fd in fds:
        os.close(fd)
    conn.settimeout(None)
    _answer(conn, b"pid %d\n" % pid)
    return pid


def _answer(conn: socket.socket, text: bytes) -> None:
    try:
        conn.sendall(text)
    except OSError:
        pass


def _become(fds: list[int], targets: list[int], req: dict, keep: tuple[socket.socket, ...],  # type: ignore[type-arg]
            pipe: tuple[int, int]) -> None:
    """The child takes the caller's descriptors under the caller's numbers,
    its directory and environment, and a session and signals of its own;
    the resident's sockets and pipe close."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in keep:
        s.close()
    for fd in pipe:
        os.close(fd)
    os.setsid()
    # Move the received descriptors out of the way first: one of them may
    # sit on another's target number.
    high = [_dup_high(fd) for fd in fds]
    for fd in fds:
        os.close(fd)
    for src, dst in zip(high, targets):
        os.dup2(src, dst, inheritable=dst <= 2)
    for src in high:
        os.close(src)
    os.chdir(req.get("cwd") or "/")
    env = req.get("env")
    if isinstance(env, dict):
        os.environ.clear()
        os.environ.update({str(k): str(v) for k, v in env.items()})


def _dup_high(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 256)


def resident_main(path: str, main: Callable[[list[str]], int], prepare: Callable[[], object]) -> int:
    """`asyncrsp resident --socket PATH`: ``main`` runs each session's command line (the
    CLI's), ``prepare`` is made once before the first (its parser)."""
    try:
        srv = bind(path)
    except ResidentError as err:
        print(f"asyncrsp: {err}", file=sys.stderr)
        return 2
    try:
        preload(prepare)
        print(f"asyncrsp: resident on {path} (pid {os.getpid()}): `asyncrsp serve --resident {path} ...` "
              "runs its session here", file=sys.stderr, flush=True)
        return serve_resident(srv, main)
    finally:
        srv.close()
        try:
            os.unlink(path)
        except OSError:
            pass
