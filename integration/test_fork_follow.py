"""Fork and exec through the proxy as gdbserver does them: real gdb over
extended-remote to a real `gdbserver --multi`, straight and through the
proxy, on a C program the test builds (integration/forks/forker.c). gdb's
transcripts (pids and addresses masked) must be the same both ways, and the
program must do what its source says (the child reaches `child_work`, the
followed process exits normally, the exec'd program is /bin/true).

gdb resumes a followed fork child by its process's wildcard
(`vCont;c:pCHILD.-1`); the proxy asked the stub about no thread for such a
resume and answered E01, so gdb lost the child ("Remote failure reply: E01",
then stops in `arch_fork`). With both processes kept (`detach-on-fork off`),
the parent's breakpoints went into the child's account: gdbserver makes a
stop's thread its general thread, and gdb sends no Hg before its next
`Z0`/`z0` there; the proxy kept the selection from before the stop, and the
parent's `z0` got E01 ("Cannot remove breakpoints because program is no
longer writable"). After an exec of the program, gdbserver has forgotten
every breakpoint of the process; the proxy's table still held gdb's, and
answered gdb's `Z0` at the same address of the new image OK: the program ran
past `main`."""

from __future__ import annotations

import re
import socket
import subprocess
from pathlib import Path

import pytest

from integration.harness.regsafety import REPO, ProxyProcess
from integration.harness.tools import require_tool

SOURCE = REPO / "integration" / "forks" / "forker.c"
BUILD = REPO / "integration" / "build" / "forks"

CASES = {
    "follow-child-next": (["set follow-fork-mode child", "break child_work", "run", "bt 1", "next", "next",
                           "continue"], [r"hit Breakpoint 1, child_work \(x=21\)", r"exited normally"]),
    "catch-syscall-execve": (["set follow-fork-mode child", "catch syscall execve", "catch exec", "run 1",
                              "continue", "continue", "continue"],
                             [r"Catchpoint 1 \(returned from syscall execve\)", r"executing new program: /usr/bin/true",
                              r"exited normally"]),
    "detach-on-fork-off": (["set detach-on-fork off", "break parent_work", "break child_work", "run",
                            "info inferiors", "inferior 2", "continue", "bt 1", "inferior 1", "next",
                            "kill inferiors 2", "continue"],
                           [r"hit Breakpoint 1\.1, parent_work \(x=41\)", r"hit Breakpoint 2\.2, child_work \(x=21\)",
                            r"Inferior 1 \(process \d+\) exited normally"]),
    "exec-self-break-main": (["break main", "run self", "catch syscall execve", "continue", "continue", "continue",
                              "continue"],
                             [r"returned from syscall execve", r"Breakpoint 1, main \(argc=1,",
                              r"Inferior 1 \(process \d+\) exited normally"]),
    "catch-fork-parent": (["catch fork", "break parent_work", "run", "continue", "next", "continue"],
                          [r"Catchpoint 1 \(forked process \d+\)", r"parent_work \(x=41\)", r"exited normally"]),
}


def _program() -> Path:
    out = BUILD / "forker"
    if not out.exists() or out.stat().st_mtime < SOURCE.stat().st_mtime:
        BUILD.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-g", "-O0", "-o", str(out), str(SOURCE)], check=True, capture_output=True)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _masked(text: str) -> str:
    text = re.sub(r"0x[0-9a-f]+", "ADDR", text)
    text = re.sub(r"\b(process|Thread|LWP|forked process) \d+(\.\d+)?", r"\1 N", text)
    text = re.sub(r"127\.0\.0\.1:\d+", "HOST:PORT", text)
    return re.sub(r"\b\d{4,}\b", "N", text)


def _gdb(prog: Path, port: int, commands: list[str]) -> str:
    argv = ["gdb", "-nx", "-q", "-batch", "-ex", "set confirm off", "-ex", "set pagination off",
            "-ex", f"target extended-remote 127.0.0.1:{port}", "-ex", f"set remote exec-file {prog}",
            "-ex", "set sysroot /"]
    for c in commands:
        argv += ["-ex", c]
    done = subprocess.run([*argv, str(prog)], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    return done.stdout + done.stderr


def _session(prog: Path, commands: list[str], proxied: bool) -> str:
    port = _free_port()
    server = subprocess.Popen(["gdbserver", "--once", "--multi", f"127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        if not proxied:
            return _gdb(prog, port, commands)
        with ProxyProcess(f"127.0.0.1:{port}") as px:
            out = _gdb(prog, px.port, commands)
        assert "answered E01" not in px.output(), px.output()
        return out
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize("case", sorted(CASES))
def test_fork_and_exec_through_the_proxy_as_straight(case: str) -> None:
    require_tool("gdb", "gdbserver", "gcc")
    prog = _program()
    commands, expected = CASES[case]
    straight = _session(prog, commands, proxied=False)
    proxied = _session(prog, commands, proxied=True)
    for pattern in expected:
        assert re.search(pattern, straight), straight[-3000:]
    assert _masked(proxied) == _masked(straight), proxied[-3000:]
