"""`serve --listen fd:N`: a listening socket handed over by whoever bound it
(a supervisor, or scripts/gdb-testsuite's wrapper, which binds the port the
testsuite asked for and starts gdbserver at once)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.shell.listen import ServeError, inherited_socket

ROOT = Path(__file__).resolve().parents[3]


def test_an_inherited_listening_socket_is_taken_as_it_is() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    fd = os.dup(srv.fileno())
    got = inherited_socket(f"fd:{fd}")
    assert got is not None and got.fileno() == fd
    assert got.getsockname() == srv.getsockname()
    with socket.create_connection(srv.getsockname()):
        conn, _ = got.accept()  # the same queue as the original's
        conn.close()
    got.close()
    srv.close()
    assert inherited_socket("127.0.0.1:0") is None


def test_what_is_not_a_listening_tcp_socket_is_one_line() -> None:
    a, b = socket.socketpair()
    with pytest.raises(ServeError, match="not a listening TCP socket"):
        inherited_socket(f"fd:{a.fileno()}")
    assert a.fileno() >= 0  # left open: not the proxy's to close
    r, w = os.pipe()
    with pytest.raises(ServeError, match="not an open socket|not a listening TCP socket"):
        inherited_socket(f"fd:{r}")
    with pytest.raises(ServeError, match="expected fd:N"):
        inherited_socket("fd:x")
    for fd in (r, w):
        os.close(fd)
    a.close()
    b.close()


@pytest.mark.parametrize("via", ["itself", "resident"])
def test_serve_says_where_it_listens_on_an_inherited_socket(via: str, tmp_path: Path,
                                                              request: pytest.FixtureRequest) -> None:
    """The same through `serve --resident` (the session forked by the
    resident takes the caller's descriptors under the caller's numbers, its
    stderr, its exit status and its working directory: the relative
    --log-packets file lands there)."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    extra = ["--resident", request.getfixturevalue("resident")] if via == "resident" else []
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "serve", *extra, "--listen", f"fd:{srv.fileno()}",
                             "--upstream", "127.0.0.1:1", "--once", "--log-packets", "packets.log"],
                            pass_fds=(srv.fileno(),), stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    srv.close()
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().strip() == f"asyncrsp: listening on 127.0.0.1:{port}"
        with socket.create_connection(("127.0.0.1", port)):  # no stub on port 1: one line, exit 2
            assert proc.wait(timeout=30) == 2
        assert "cannot reach the stub" in proc.stderr.read()
        assert (tmp_path / "packets.log").exists()
    finally:
        proc.kill()
        proc.wait()
