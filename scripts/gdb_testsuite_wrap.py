"""The GDBSERVER the testsuite starts in the proxy ways of scripts/gdb-testsuite
(see gdb_testsuite.py's docstring). Run with `python -S`: it starts once per
gdbserver start (93 times in the subset), so it imports the standard library
only, and little of it."""

from __future__ import annotations

import json
import os
import re
import socket
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_COMM = re.compile(r"^(?P<host>[^:]*):(?P<port>\d+)$")
_ARG_OPTIONS = ("--wrapper",)  # gdbserver options that take words up to "--"


def _comm_index(args: list[str]) -> int | None:
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--wrapper":
            i = args.index("--", i) + 1 if "--" in args[i:] else len(args)
            continue
        if a.startswith("--"):
            i += 1
            continue
        return i if _COMM.match(a) else None
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wrap(run_dir: str, proxy_args: list[str], gdbserver: str, args: list[str]) -> None:
    """Be the GDBSERVER the testsuite starts (see the module docstring)."""
    i = _comm_index(args)
    if i is None:
        os.execv(gdbserver, [gdbserver, *args])
    m = _COMM.match(args[i])
    assert m is not None
    host = m.group("host") or "0.0.0.0"
    if host == "localhost":
        host = "127.0.0.1"
    private = _free_port()
    extra = list(proxy_args)
    if "--once" in args[:i]:
        extra.append("--once")
    log = os.path.join(run_dir, f"proxy-{os.getpid()}.log")
    if os.environ.get("GDB_TESTSUITE_PACKETS"):  # for diagnosis: every byte each proxy exchanged
        extra += ["--log-packets", os.path.join(run_dir, f"packets-{os.getpid()}.log")]
    # The port the testsuite asked for is bound here and handed to the proxy
    # (`--listen fd:N`): gdbserver starts at once, and a client that connects
    # before the proxy has loaded waits in the listen backlog.
    try:
        sock = socket.socket(socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(m.group("port"))))
        sock.listen(128)
    except OSError:
        print("Can't bind address: Address already in use.", flush=True)
        sys.exit(1)
    env = dict(os.environ, PYTHONPATH=ROOT)
    # PYTHONDONTWRITEBYTECODE (set in some sandboxes) would make each of the
    # 93 proxies compile the modules changed since the last bytecode again.
    for k in ("LD_LIBRARY_PATH", "TCLLIBPATH", "PYTHONDONTWRITEBYTECODE"):
        env.pop(k, None)
    listen = f"fd:{sock.fileno()}"
    argv = [os.environ.get("GDB_TESTSUITE_PYTHON", sys.executable), "-m", "proxy.cli", "serve", "--listen", listen,
            "--upstream", f"127.0.0.1:{private}", *extra]
    with open(log, "w") as fh:
        fh.write("gdbserver " + " ".join(args) + "\n")
    resident = os.environ.get("GDB_TESTSUITE_RESIDENT")
    if resident:
        _in_resident(resident, argv[3:], log, env, sock)  # without "python -m proxy.cli"
    else:
        _spawn_proxy(argv, log, env, sock)
    sock.close()
    args = [*args[:i], f"127.0.0.1:{private}", *args[i + 1:]]
    os.execv(gdbserver, [gdbserver, *args])


def _spawn_proxy(argv: list[str], log: str, env: dict[str, str], sock: socket.socket) -> None:
    # The proxy must not be gdbserver's child (this process becomes gdbserver):
    # gdbserver waits for any child (waitpid -1) and would reap it. A child
    # starts it in its own session and exits; init adopts it. posix_spawn,
    # not subprocess: this runs at each of the testsuite's gdbserver starts.
    child = os.fork()
    if child == 0:
        os.set_inheritable(sock.fileno(), True)
        os.posix_spawn(argv[0], argv, env, setsid=True, file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, log, os.O_WRONLY | os.O_APPEND, 0),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ])
        os._exit(0)
    os.waitpid(child, 0)


def _in_resident(path: str, args: list[str], log: str, env: dict[str, str], sock: socket.socket) -> None:
    """The session in the runner's `asyncrsp resident` (a fork of one
    interpreter that imported the proxy once): its stdin /dev/null, its
    stdout and stderr the log, the listening socket under the number its
    `--listen fd:N` names. The wrapper waits neither for the fork nor for
    the pid (gdbserver starts at once; the runner finds the sessions by the
    run's mark in their environment)."""
    from proxy.shell.resident import request  # standard library only; PYTHONPATH: the repository

    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        _, conn = request(path, args, fds=[null, out, out, sock.fileno()], targets=[0, 1, 2, sock.fileno()],
                          env=env, answer=False)
    finally:
        os.close(null)
        os.close(out)
    conn.close()


if __name__ == "__main__":
    wrap(sys.argv[1], json.loads(sys.argv[3]), sys.argv[2], sys.argv[4:])
