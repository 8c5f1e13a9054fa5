"""Helpers for the register-safety integration tests: build the C programs,
start the asyncrsp proxy CLI, drive gdb/gdb-MI/lldb in batch mode.

The proxy is driven only through its CLI contract:

    python -m proxy serve --listen 127.0.0.1:0 --upstream '|gdbserver - PROG'
                          [--probe REGEX] [--registers safe|full]

which prints ``asyncrsp: listening on 127.0.0.1:<port>`` on stderr when ready
and serves one session.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[2]
HERE = REPO / "integration" / "regsafety"  # the C reproducers
BUILD = REPO / "integration" / "build" / "regsafety"
PYTHON = REPO / ".venv" / "bin" / "python"
if not PYTHON.exists():
    PYTHON = Path(sys.executable)

LISTENING = re.compile(r"asyncrsp: listening on 127\.0\.0\.1:(\d+)")

# Program environment for every run, direct or through the proxy: gdbserver's
# `--wrapper env -i --` starts the program with an empty environment, so the
# stack (rsp, rbp, and every register that points into it) is at the same
# address whoever spawned gdbserver with whatever environment.  gdbserver
# disables ASLR by default, and the wrapper's exec keeps that personality.
WRAPPER = ["--wrapper", "env", "-i", "--"]


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    m = re.search(r"^flags\s*:(.*)$", text, re.M)
    return set(m.group(1).split()) if m else set()


def build_c(source: str, *flags: str) -> Path:
    """Compile integration/regsafety/<source> into integration/build/regsafety/."""
    src = HERE / source
    out = BUILD / src.stem
    if out.exists() and out.stat().st_mtime >= src.stat().st_mtime:
        return out
    BUILD.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    subprocess.run(["gcc", "-g", *flags, "-o", str(tmp), str(src)], check=True,
                   capture_output=True, text=True)
    tmp.replace(out)
    return out


def gdbserver_upstream(argv: list[str]) -> str:
    return "|" + shlex.join(["gdbserver", *WRAPPER, "-", *argv])


@dataclass
class ProxyProcess:
    """One `python -m proxy serve` serving one session; stderr is collected."""

    upstream: str
    extra: list[str] = field(default_factory=list)
    proc: subprocess.Popen[str] | None = None
    port: int = 0
    lines: list[str] = field(default_factory=list)
    _ready: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> ProxyProcess:
        argv = [str(PYTHON), "-m", "proxy", "serve", "--listen", "127.0.0.1:0",
                "--upstream", self.upstream, *self.extra]
        self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(60) or not self.port:
            self.__exit__(None, None, None)
            raise RuntimeError("proxy did not print 'asyncrsp: listening on ...':\n" + self.output())
        return self

    def _drain(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            m = LISTENING.search(line)
            if m and not self.port:
                self.port = int(m.group(1))
                self._ready.set()
        self._ready.set()

    def output(self) -> str:
        return "".join(self.lines)

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=30)  # it serves one session, then exits
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_gdb(prog: Path, target: str, commands: list[str], *, timeout: float = 240,
            mi: bool = False) -> str:
    """gdb -nx in batch mode: `target remote TARGET`, then `commands` (CLI),
    or in MI mode the commands are MI commands read from stdin."""
    if mi:
        script = "\n".join([f"-target-select remote {target}", *commands, "-gdb-exit"]) + "\n"
        done = subprocess.run(["gdb", "-nx", "-q", "--interpreter=mi2", str(prog)], input=script,
                              capture_output=True, text=True, timeout=timeout)
        return done.stdout + done.stderr
    BUILD.mkdir(parents=True, exist_ok=True)
    script_path = BUILD / f"gdb-{os.getpid()}-{time.monotonic_ns()}.gdb"
    script_path.write_text("\n".join(["set confirm off", "set pagination off", "set width 0",
                                      f"target remote {target}", *commands]) + "\n")
    try:
        done = subprocess.run(["gdb", "-nx", "-q", "-batch", "-x", str(script_path), str(prog)],
                              capture_output=True, text=True, timeout=timeout)
    finally:
        script_path.unlink(missing_ok=True)
    return done.stdout + done.stderr


def run_lldb(prog: Path, port: int, commands: list[str], *, timeout: float = 120) -> str:
    argv = ["lldb", "--no-lldbinit", "-b", "-o", f"target create {prog}",
            "-o", f"gdb-remote 127.0.0.1:{port}"]
    for c in commands:
        argv += ["-o", c]
    # Debian's lldb 14 looks for its Python package in the wrong place
    # (`lldb -P` says /usr/lib/local/...): point it at python3-lldb-14's files,
    # or every stop prints "No module named 'lldb.embedded_interpreter'".
    env = dict(os.environ)
    pydirs = sorted(Path("/usr/lib/llvm-14/lib").glob("python3.*/dist-packages"))
    if pydirs:
        env["PYTHONPATH"] = str(pydirs[-1])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=env)
    return done.stdout + done.stderr


@dataclass
class TcpGdbserver:
    """gdbserver --once on a free loopback port (for lldb, which cannot spawn
    a stub on a pipe); prints 'Listening on port N'."""

    argv: list[str]
    proc: subprocess.Popen[str] | None = None
    port: int = 0

    def __enter__(self) -> TcpGdbserver:
        self.proc = subprocess.Popen(["gdbserver", "--once", *WRAPPER, "127.0.0.1:0", *self.argv],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            m = re.search(r"Listening on port (\d+)", line)
            if m:
                self.port = int(m.group(1))
                break
        if not self.port:
            raise RuntimeError("gdbserver did not print its port")
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def have(tool: str) -> bool:
    return shutil.which(tool) is not None


# The ymm16 reproducer (ymm16.c): STOPS breakpoint stops, then its verdict line.
STOPS = 1000
RESULT = re.compile(r"(preserved|lost) (\d+)/(\d+) armed (\d+)/(\d+)")


def bp_site(prog: Path) -> int:
    nm = subprocess.run(["nm", str(prog)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"^([0-9a-f]+) T bp_site$", nm, re.M)
    assert m, "bp_site missing from the reproducer's symbols"
    return int(m.group(1), 16)


def parse_result(text: str) -> tuple[str, int, int]:
    """-> (verdict, lost_or_preserved_count, armed)"""
    m = RESULT.search(text)
    assert m, f"the reproducer printed no result:\n{text[-2000:]}"
    verdict, count, n, armed, _ = m.groups()
    assert int(n) == STOPS
    return verdict, int(count), int(armed)
