"""asyncrsp's own commands run by the tests: `asyncrsp(*args)` (one CLI run, captured),
`start_cli` (a proxy command listening on a free port), `gdb_at` (gdb in batch mode at a
port), `serve_core` (gdb through `asyncrsp serve --core`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from integration.harness.stubs import free_port

ROOT = Path(__file__).resolve().parents[2]


def asyncrsp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "proxy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def gdb_at(port: int, prog: Path, commands: list[str], leave: str = "detach", gdb_path: str = "gdb",
           setup: tuple[str, ...] = ()) -> str:
    """``setup``: commands before the connection (gdb-multiarch's ``set sysroot /``)."""
    gdb = [gdb_path, "-nx", "-batch", "-ex", "set pagination off", "-ex", "set remotetimeout 60"]
    for c in setup:
        gdb += ["-ex", c]
    gdb += ["-ex", f"target remote 127.0.0.1:{port}"]
    for c in commands:
        gdb += ["-ex", c]
    gdb += ["-ex", leave, str(prog)]
    return subprocess.run(gdb, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=180, check=False).stdout


def start_cli(args: list[str], command: str = "serve") -> tuple[subprocess.Popen[str], int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "proxy", command, "--listen", f"127.0.0.1:{port}", *args],
                            cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if command == "run":  # first the gdb command line
        assert line.startswith(f"asyncrsp: connect with:  gdb -ex 'target remote 127.0.0.1:{port}' "), line
        line = proc.stderr.readline()
    assert "listening on" in line, line + proc.stderr.read()
    return proc, port


def finish(proc: subprocess.Popen[str]) -> str:
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def serve_core(core: Path, prog: Path, commands: list[str], extra: list[str] = (),  # type: ignore[assignment]
               command: str = "serve", gdb_path: str = "gdb", setup: tuple[str, ...] = ()) -> str:
    proxy, port = start_cli(["--core", str(core), *extra], command)
    try:
        return gdb_at(port, prog, commands, gdb_path=gdb_path, setup=setup)
    finally:
        finish(proxy)
