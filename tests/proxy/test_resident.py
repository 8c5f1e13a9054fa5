"""`asyncrsp resident` and `serve --resident`: a session forked from one
interpreter that imported the proxy once (proxy/shell/resident.py). The
`resident` fixture is in conftest.py; test_listen.py runs a whole session
(output, exit status, inherited socket, directory) both ways."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from proxy.shell.resident import ResidentError, listen_fds, request, split_resident

ROOT = Path(__file__).resolve().parents[2]
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def test_the_resident_option_is_taken_out_before_the_programs_arguments() -> None:
    assert split_resident(["serve", "--resident", "/s", "--once", "--upstream", "h:1"]) == (
        "/s", ["serve", "--once", "--upstream", "h:1"])
    assert split_resident(["run", "--resident=/s", "--", "./app", "--resident", "x"]) == (
        "/s", ["run", "--", "./app", "--resident", "x"])
    assert split_resident(["serve", "--upstream", "h:1"]) == (None, ["serve", "--upstream", "h:1"])
    assert listen_fds(["serve", "--listen", "fd:7", "--upstream", "h:1"]) == [7]
    assert listen_fds(["serve", "--listen=fd:9"]) == [9]
    assert listen_fds(["serve", "--listen", "127.0.0.1:0"]) == []
    assert listen_fds(["run", "--", "./app", "--listen", "fd:3"]) == []


def test_no_resident_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ResidentError, match="is `asyncrsp resident --socket .*` running"):
        request(str(tmp_path / "none.sock"), ["serve"])
    proc = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "--resident", str(tmp_path / "none.sock"),
                           "--upstream", "127.0.0.1:1"], env=ENV, cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("asyncrsp: --resident ") and proc.stderr.count("\n") == 1


def test_a_bad_command_line_is_the_sessions_usage_error(resident: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "proxy.cli", "serve", "--resident", resident, "--no-such-option"],
                          env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "asyncrsp serve: error: " in proc.stderr


def test_the_callers_sigterm_reaches_the_session(resident: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", "--resident", resident,
                             "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1"],
                            stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith("asyncrsp: listening on 127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the session itself is gone: its port is free
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except ConnectionRefusedError:
                break
            time.sleep(0.05)
        else:
            pytest.fail("the session still listens after its caller's SIGTERM")
    finally:
        proc.kill()
        proc.wait()


def test_a_resident_that_is_there_already_is_not_replaced(resident: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "proxy.cli", "resident", "--socket", resident],
                          env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "a resident already listens there" in proc.stderr


def test_a_signal_at_once_after_the_pid_reaches_the_session_not_the_resident(resident: str) -> None:
    """The caller may signal the session the moment it has its pid, before
    the child has put its own handlers in place: the signals are blocked
    across the fork, so the resident's (SIGTERM: stop the loop) never run in
    the child. Seen: a session that lived on after such a SIGTERM."""
    from proxy.shell.resident import wait_status

    for _ in range(5):
        pid, conn = request(resident, ["serve", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:1"],
                            fds=[0, 1, 2])
        os.kill(pid, signal.SIGTERM)
        conn.settimeout(30)
        assert wait_status(pid, conn) == 128 + signal.SIGTERM
