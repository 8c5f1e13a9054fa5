"""`asyncrsp inspect` on a cold binary (an empty analysis cache): its progress
on stderr when stderr is a terminal (a real pty), erased before the report;
nothing on stderr when it is a pipe."""

from __future__ import annotations

import os
import pty
import re
import subprocess
from pathlib import Path

import pytest

from integration.corpus import build, markers
from integration.harness.runcmd import LISTENING, monitor, run_session, section
from integration.harness.stubs import venv_python

ROOT = Path(__file__).resolve().parents[1]
NOW = {"ASYNCRSP_PROGRESS_DELAY": "0"}  # the line from the first step: a cold analysis' length depends on the CPU


def _inspect(prog: Path, cache: Path, stderr: int) -> subprocess.CompletedProcess[bytes]:
    # the progress line shows after 0.5 s of work, ASYNCRSP_PROGRESS_DELAY here: tokio_app's cold
    # analysis took 1.3 s on the old CPU and less than 0.5 s on this one
    return subprocess.run([venv_python(), "-m", "proxy", "inspect", str(prog)], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=stderr, env={**os.environ, **NOW, "ASYNCRSP_CACHE_DIR": str(cache)}, timeout=300,
                          check=True)


def _progress(program: str, text: str) -> bool:
    """A progress line of the analysis: `analysing PROGRAM: PHASE N/M (T s)`, of any phase."""
    return re.search(rf"\rasyncrsp: analysing {program}: [^\r]+ \d+/\d+ \(\d+ s\)", text) is not None


def _read_all(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            return out
        if not chunk:
            return out
        out += chunk


def test_cold_inspect_shows_progress_on_a_terminal_only(tmp_path: Path) -> None:
    got = build.build(configs=["debug"], programs=["tokio_app"]).get(("debug", "tokio_app"))
    if not isinstance(got, Path):
        pytest.skip(f"tokio_app (debug) not built: {got}")
    master, slave = pty.openpty()
    try:
        on_tty = _inspect(got, tmp_path / "cold1", slave)
        os.close(slave)
        slave = -1
        shown = _read_all(master).decode()
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    assert _progress("tokio_app", shown), repr(shown)
    last = shown.rsplit("\r", 2)
    assert shown.endswith("\r") and last[-2].strip() == "", repr(shown[-200:])  # erased at the end
    quiet = _inspect(got, tmp_path / "cold2", subprocess.PIPE)
    assert quiet.stderr == b"", quiet.stderr
    assert quiet.stdout == on_tty.stdout  # the report itself is the same


def test_a_session_on_a_cold_binary_shows_the_analysis_on_the_proxys_terminal(tmp_path: Path) -> None:
    """`asyncrsp run` in a terminal: the cold analysis at gdb's first stop shows
    there, erased; the first `monitor async tree` answers as usual."""
    got = build.build(configs=["debug"], programs=["tokio_app"]).get(("debug", "tokio_app"))
    if not isinstance(got, Path):
        pytest.skip(f"tokio_app (debug) not built: {got}")
    line = markers.breakpoint_markers("tokio_app")["c_after_sleep"][1]
    res = run_session([venv_python(), "-m", "proxy"], [str(build.pinned(got)), "ct"],
                      [f"break tokio_app.rs:{line}", "continue", *monitor("tree")], cwd=ROOT, stderr_tty=True,
                      env={**os.environ, **NOW, "ASYNCRSP_CACHE_DIR": str(tmp_path / "cold")})
    assert _progress("tokio_app", res.proxy), repr(res.proxy)
    assert "╼ tokio_app::c at " in section(res.gdb, "tree"), res.gdb


def test_an_attached_session_shows_the_cold_analysis_before_its_first_answer(tmp_path: Path) -> None:
    """gdb attached to a running program through serve, never resumed: the cold
    binary is analysed before the first `monitor async tree` answers (at the
    client's first stop, or at that command when the stop did not), with its
    progress on the proxy's terminal."""
    from integration.harness.stubs import OutputPump, kill_tree, start_stub
    from integration.harness.stuck import start_stuck

    got = build.build(configs=["debug"], programs=["stuck"]).get(("debug", "stuck"))
    if not isinstance(got, Path):
        pytest.skip(f"stuck (debug) not built: {got}")
    prog = build.pinned(got)
    program = start_stuck(prog, tmp_path)
    master, slave = pty.openpty()
    try:
        with start_stub("gdbserver", prog, attach=program.pid) as stub:
            proxy = subprocess.Popen([venv_python(), "-m", "proxy", "serve", "--listen", "127.0.0.1:0",
                                      "--upstream", stub.address], cwd=ROOT, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=slave, start_new_session=True,
                                     env={**os.environ, **NOW, "ASYNCRSP_CACHE_DIR": str(tmp_path / "cold")})
            os.close(slave)
            slave = -1
            err = OutputPump(os.fdopen(master, "rb", buffering=0))
            try:
                m = err.wait_for(LISTENING, 30.0)
                assert m, err.text()
                gdb = subprocess.run(["gdb", "-nx", "-batch", "-ex", "set remotetimeout 120", "-ex",
                                      f"target remote 127.0.0.1:{int(m.group(1))}", *[
                                          a for c in monitor("tree") for a in ("-ex", c)], "-ex", "detach", str(prog)],
                                     capture_output=True, text=True, timeout=300, check=False)
                out = gdb.stdout + gdb.stderr
                assert "╼ stuck::" in section(out, "tree"), out
            finally:
                if proxy.poll() is None:
                    kill_tree(proxy)
                err.join()
        assert _progress("stuck", err.text()), repr(err.text())
    finally:
        program.kill()
        program.wait()
        if slave >= 0:
            os.close(slave)
