"""Start real RSP stubs and the asyncrsp proxy for integration tests.

Theory of operation: every process is started in its own session
(``start_new_session=True``) and registered with a :class:`ProcessJanitor`.
Cleanup collects the whole descendant tree from ``/proc`` *before* killing
(so a debuggee whose parent already died is still found), sends SIGKILL to
each process group and to each descendant, then reaps. Every start function
is a context manager, so a failing test never leaves an orphan behind.

Stubs and how they announce readiness (checked on this machine):

* ``gdbserver --once 127.0.0.1:0 PROG ARGS`` prints ``Process PROG created;
  pid = N`` and ``Listening on port P`` on stderr (``--attach PID`` prints
  ``Attached; pid = N``). Port 0 works.
* ``lldb-server gdbserver 127.0.0.1:0 --pipe FD -- PROG ARGS`` (Debian's
  lldb-server 14) writes the chosen port as decimal text to FD, NUL-ended.
* ``qemu-x86_64 -g PORT PROG ARGS`` (qemu-user 7.2) needs a concrete port and
  prints nothing; it accepts exactly ONE connection, so readiness must not be
  probed by connecting: we watch ``/proc/net/tcp`` for the LISTEN socket.
  QEMU's gdbstub loads the program at 0x4000000000, names the thread
  ``Thread 1.<tid>`` (multiprocess, pid 1), and offers no
  ``qXfer:exec-file`` and no ``qXfer:libraries-svr4`` (so gdb shows ``??``
  inside libc).
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import debuggers

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT = 10.0
PROXY_READY = re.compile(rb"asyncrsp: listening on 127\.0\.0\.1:(\d+)")


class StubStartError(RuntimeError):
    """A stub or the proxy did not become ready; carries its output."""


def venv_python() -> str:
    cand = REPO / ".venv" / "bin" / "python"
    return str(cand) if cand.exists() else sys.executable


# --------------------------------------------------------------- processes


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
    return out


def descendants(pid: int) -> list[int]:
    """All descendants of ``pid`` (children first found, depth-first)."""
    seen: list[int] = []
    stack = [pid]
    while stack:
        for child in _children(stack.pop()):
            if child not in seen:
                seen.append(child)
                stack.append(child)
    return seen


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def gone_within(pid: int, timeout: float) -> bool:
    """``pid`` is gone (or a zombie) within ``timeout`` seconds: a killed multi-threaded
    program takes a while to exit when the machine is loaded (seen: still there right after
    gdbserver itself had exited)."""
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def kill_tree(proc: subprocess.Popen[bytes], extra_pids: Sequence[int] = ()) -> None:
    """SIGKILL ``proc``'s process group, its descendants and ``extra_pids``."""
    victims = [proc.pid, *descendants(proc.pid), *extra_pids]
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    for pid in victims:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    for pid in victims[1:]:  # orphans that became ours (subreaper): reap them
        with contextlib.suppress(OSError):
            os.waitpid(pid, os.WNOHANG)


class OutputPump:
    """Drain a pipe on a thread into a buffer (so a chatty child never blocks).

    ``data()`` drains the pipe itself first, so it holds everything written
    before the call: under load the thread lagged the writers. After a
    detach gdbserver (13.1, --once) stays until the program exits, reaps it
    and says nothing: its output is the only sign of its exit. Seen: the
    detach scenario straight against gdbserver (6 of 40 runs at load 5;
    test_transparent[detach-gdb-gdbserver-uprobes] once in a suite run) read
    the output once the program was gone, and had neither its line nor
    gdbserver's "Detaching" in it. Every read is a non-blocking one
    under the lock (the thread only waits for data outside it), so the bytes
    stay in order."""

    def __init__(self, stream: object) -> None:
        self._stream = stream
        self._fd = stream.fileno()  # type: ignore[attr-defined]
        os.set_blocking(self._fd, False)
        self._buf = bytearray()
        self._eof = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        """Read what the pipe holds now (under the lock)."""
        while not self._eof:
            try:
                chunk = os.read(self._fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if not chunk:
                self._eof = True
            self._buf += chunk

    def _run(self) -> None:
        while not self._eof:
            try:
                select.select([self._fd], [], [])
            except (OSError, ValueError):
                return
            with self._lock:
                self._drain()

    def data(self) -> bytes:
        with self._lock:
            self._drain()
            return bytes(self._buf)

    def text(self) -> str:
        return self.data().decode(errors="replace")

    def wait_for(self, pattern: re.Pattern[bytes], timeout: float) -> re.Match[bytes] | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = pattern.search(self.data())
            if m:
                return m
            if not self._thread.is_alive():
                return pattern.search(self.data())
            time.sleep(0.01)
        return None

    def join(self, timeout: float = 2.0) -> None:
        self._thread.join(timeout)


# -------------------------------------------------------------------- stubs


@dataclass
class StubProc:
    """A running stub: connect a client to ``address``."""

    kind: str
    proc: subprocess.Popen[bytes]
    port: int
    output: OutputPump
    inferior_pid: int | None = None
    extra_pids: list[int] = field(default_factory=list)
    attached: bool = False  # --attach: the program is not ours to kill

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def output_text(self) -> str:
        return self.output.text()

    def find_inferior(self) -> int | None:
        """The debuggee's pid (the stub itself for QEMU)."""
        if self.inferior_pid is not None:
            return self.inferior_pid
        if self.kind == "qemu":
            return self.proc.pid
        kids = descendants(self.proc.pid)
        return kids[0] if kids else None

    def wait(self, timeout: float = 10.0) -> int:
        return self.proc.wait(timeout=timeout)

    def close(self) -> None:
        pids = list(self.extra_pids)
        if self.inferior_pid and not self.attached:
            pids.append(self.inferior_pid)
        kill_tree(self.proc, pids)
        self.output.join()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_listening(port: int) -> bool:
    """True when some socket LISTENs on port (127.0.0.1 or any address),
    found without connecting (QEMU binds INADDR_ANY)."""
    want = {f"0100007F:{port:04X}", f"00000000:{port:04X}"}
    with contextlib.suppress(OSError), open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            cols = line.split()
            if cols[1] in want and cols[3] == "0A":
                return True
    return False


def _popen(argv: Sequence[str], **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True, **kw)


def _fail(what: str, proc: subprocess.Popen[bytes], out: OutputPump) -> StubStartError:
    kill_tree(proc)
    out.join()
    return StubStartError(f"{what} did not become ready: {out.text()!r}")


INPROC_AGENT = "/usr/lib/libinproctrace.so"


def _start_gdbserver_inproc(program: Path, args: Sequence[str], attach: int | None) -> StubProc:
    """gdbserver starting the program with its in-process agent preloaded
    (what ``asyncrsp run --inproc`` does): fast tracepoints become possible."""
    return _start_gdbserver(program, args, attach, wrapper=("--wrapper", "env", f"LD_PRELOAD={INPROC_AGENT}", "--"))


def _start_gdbserver(program: Path, args: Sequence[str], attach: int | None,
                     wrapper: Sequence[str] = ()) -> StubProc:
    if attach is not None:
        argv = debuggers.argv("gdbserver", "--once", "--attach", "127.0.0.1:0", str(attach))
    else:
        argv = debuggers.argv("gdbserver", "--once", *wrapper, "127.0.0.1:0", str(program), *args)
    proc = _popen(argv)
    out = OutputPump(proc.stdout)
    m = out.wait_for(re.compile(rb"Listening on port (\d+)"), READY_TIMEOUT)
    if not m:
        raise _fail("gdbserver", proc, out)
    pid = re.search(rb"pid = (\d+)", out.data())
    return StubProc("gdbserver", proc, int(m.group(1)), out,
                    inferior_pid=attach if attach is not None else (int(pid.group(1)) if pid else None),
                    attached=attach is not None)


def _start_lldb_server(program: Path, args: Sequence[str], attach: int | None) -> StubProc:
    rfd, wfd = os.pipe()
    target = ["--attach", str(attach)] if attach is not None else ["--", str(program), *args]
    argv = debuggers.argv("lldb-server", "gdbserver", "127.0.0.1:0", "--pipe", str(wfd), *target)
    proc = _popen(argv, pass_fds=(wfd,))
    os.close(wfd)
    out = OutputPump(proc.stdout)
    port = b""
    deadline = time.monotonic() + READY_TIMEOUT
    try:
        while b"\0" not in port and time.monotonic() < deadline:
            ready, _, _ = select.select([rfd], [], [], 0.1)
            if ready:
                chunk = os.read(rfd, 64)
                if not chunk:
                    break
                port += chunk
    finally:
        os.close(rfd)
    digits = port.split(b"\0")[0]
    if not digits.isdigit():
        raise _fail("lldb-server", proc, out)
    return StubProc("lldb-server", proc, int(digits), out, inferior_pid=attach,
                    attached=attach is not None)


def _start_qemu(program: Path, args: Sequence[str], attach: int | None, emulator: str = "qemu-x86_64") -> StubProc:
    if attach is not None:
        raise StubStartError(f"{emulator} user mode cannot attach to a running process")
    for _ in range(5):  # the port can be taken between free_port() and bind
        port = free_port()
        proc = _popen([emulator, "-g", str(port), str(program), *args])
        out = OutputPump(proc.stdout)
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline and proc.poll() is None:
            if port_listening(port):
                return StubProc("qemu", proc, port, out)
            time.sleep(0.01)
        kill_tree(proc)
    raise StubStartError(f"{emulator} did not listen: {out.text()!r}")


def _start_qemu_aarch64(program: Path, args: Sequence[str], attach: int | None) -> StubProc:
    """An aarch64 program under qemu-aarch64 with no ``-L``: the cross loader under
    /usr/aarch64-linux-gnu and the multiarch libc6:arm64 that QEMU falls back to are of
    different builds, and ``pthread_create`` spins forever in a list walk (a multi-threaded
    runtime never reaches main's first line); without ``-L`` the multiarch loader and libc
    match. The client then needs ``set sysroot /``."""
    return _start_qemu(program, args, attach, "qemu-aarch64")


STARTERS = {"gdbserver": _start_gdbserver, "gdbserver-inproc": _start_gdbserver_inproc,
            "lldb-server": _start_lldb_server, "qemu": _start_qemu, "qemu-aarch64": _start_qemu_aarch64}
STUB_TOOLS = {"gdbserver": "gdbserver", "gdbserver-inproc": "gdbserver", "lldb-server": "lldb-server", "qemu": "qemu-x86_64",
              "qemu-aarch64": "qemu-aarch64"}


@contextlib.contextmanager
def start_stub(kind: str, program: Path, args: Sequence[str] = (),
               attach: int | None = None, wrapper: Sequence[str] = ()) -> Iterator[StubProc]:
    """Start stub ``kind`` ("gdbserver", "lldb-server", "qemu") on ``program``;
    `wrapper`: gdbserver's ``--wrapper ... --`` words."""
    if wrapper:
        if kind != "gdbserver":
            raise ValueError(f"only gdbserver takes a --wrapper, not {kind}")
        stub = _start_gdbserver(program, args, attach, wrapper=wrapper)
    else:
        stub = STARTERS[kind](program, args, attach)
    try:
        yield stub
    finally:
        stub.close()


# -------------------------------------------------------------------- proxy


@dataclass
class ProxyProc:
    """A running ``python -m proxy serve``; clients connect to ``address``."""

    proc: subprocess.Popen[bytes]
    port: int
    stderr: OutputPump

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stderr_text(self) -> str:
        return self.stderr.text()

    def wait(self, timeout: float = 10.0) -> int:
        """The proxy's exit code (raises TimeoutExpired if it does not exit)."""
        code = self.proc.wait(timeout=timeout)
        self.stderr.join()
        return code

    def close(self) -> None:
        kill_tree(self.proc)
        self.stderr.join()


def proxy_argv(upstream: str, probes: Sequence[str] = (), extra: Sequence[str] = (),
               interp: Sequence[str] = ()) -> list[str]:
    """`interp`: words between the interpreter and ``-m proxy`` (``-m cProfile -o FILE``)."""
    argv = [venv_python(), *interp, "-m", "proxy", "serve", "--listen", "127.0.0.1:0", "--upstream", upstream]
    for p in probes:
        argv += ["--probe", p]
    return argv + list(extra)


def spawn_proxy(upstream: str, probes: Sequence[str] = (), extra: Sequence[str] = (),
                interp: Sequence[str] = ()) -> ProxyProc:
    """Start the proxy and wait for its ready line; caller must ``close()``."""
    proc = subprocess.Popen(proxy_argv(upstream, probes, extra, interp), stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, cwd=REPO)
    err = OutputPump(proc.stderr)
    m = err.wait_for(PROXY_READY, READY_TIMEOUT)
    if not m:
        kill_tree(proc)
        err.join()
        raise StubStartError(f"proxy did not print its ready line: {err.text()!r}")
    return ProxyProc(proc, int(m.group(1)), err)


@contextlib.contextmanager
def start_proxy(upstream: str, probes: Sequence[str] = (),
                extra: Sequence[str] = (), interp: Sequence[str] = ()) -> Iterator[ProxyProc]:
    """``with start_proxy(stub.address, probes=["^probed$"]) as px: ...``"""
    px = spawn_proxy(upstream, probes, extra, interp)
    try:
        yield px
    finally:
        px.close()


def wait_orphan(pid: int, timeout: float = 30.0) -> int | None:
    """Exit status (as ``os.waitstatus_to_exitcode``) of ``pid`` once it became
    our child (requires the subreaper fixture) and exited; None on timeout or
    when it never became ours."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            # Not ours yet. A zombie still counts: its parent (the stub, after a
            # detach) may exit first and hand it to us (lldb-server 19 lets the
            # detached program end before it exits itself).
            if not os.path.exists(f"/proc/{pid}"):
                return None
            time.sleep(0.02)
            continue
        if got == pid:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    return None


def become_subreaper() -> None:
    """Make this process the subreaper of orphaned descendants (idempotent)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
