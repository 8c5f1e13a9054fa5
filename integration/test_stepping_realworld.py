"""Stepping across `.await` in real programs nobody on the project wrote (../shared/realworld:
tokio's own examples, built by the gauntlet's `realworld-debug` configuration): gdb's CLI on
a pty -> asyncrsp -> gdbserver -> the server, a real TCP client talking to it.

Stopped in a connection's handler on an `.await` that waits for the client's next line, gdb's
`next` waits for it (the proxy holds the step while the program runs); the client then sends
its line, and the step ends on the handler's next line in the same connection (its peer
address or its database handle unchanged), whichever worker thread polls it.
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path

import pytest

from integration.corpus import build
from integration.harness.console import ConsoleTimeout, PtyConsole
from integration.harness.gdb import gdb_cli
from integration.harness.stubs import free_port, start_proxy

# (program, source file, the handler's .await line waiting for the client, a local of the
# connection, the client's line, the source text of the line the step must reach)
CASES = [
    ("tokio_echo_tcp", "echo-tcp.rs", "match socket.read(&mut buf).await {", "addr", "hello"),
    ("tokio_tinydb", "tinydb.rs", "while let Some(result) = lines.next().await {", "db", "GET foo"),
    ("tokio_chat", "chat.rs", "let Some(Ok(username)) = lines.next().await else {", "addr", "alice"),
]
SOURCES = Path(__file__).resolve().parents[2] / "shared" / "realworld" / "tokio-examples"


def _program(name: str) -> Path:
    """The gauntlet's build of the program (the `realworld-debug` configuration)."""
    reason = build.skip_reason("realworld-debug")
    if reason is not None:
        pytest.skip(str(reason))
    return build.pinned(build.binary("realworld-debug", name))


def _line_of(source: str, text: str) -> int:
    lines = (SOURCES / source).read_text().splitlines()
    return next(i + 1 for i, line in enumerate(lines) if text in line)


def _connect(port: int) -> socket.socket:
    deadline = time.monotonic() + 60
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _stopped_threads(prog: Path) -> int | None:
    """How many threads of the running `prog` are in a ptrace stop (state `t`); None: not found."""
    for exe in Path("/proc").glob("[0-9]*/exe"):
        try:
            if exe.resolve() != prog.resolve():
                continue
            return sum(1 for st in exe.parent.glob("task/*/stat")
                       if st.read_text().rpartition(")")[2].split()[0] == "t")
        except OSError:
            continue
    return None


def _next_until_it_waits(g: PtyConsole, client: socket.socket, send: str, prog: Path) -> str:
    """`next` until one waits (the .await suspended), then the client's line; the output
    of the step that waited. A step waits when the program runs with none of its threads
    in a ptrace stop for a second (the proxy continued it until the coroutine's next poll);
    a step that is only slow (a loaded machine) keeps threads stopped while gdb steps."""
    for _ in range(4):
        g.start("next")
        free_since = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                g.wait_prompt(timeout=0.25)  # the call that makes the future, then its first poll
                break
            except ConsoleTimeout:
                if _stopped_threads(prog) == 0:
                    free_since = free_since if free_since is not None else time.monotonic()
                    if time.monotonic() - free_since >= 1.0:
                        client.sendall(send.encode() + b"\n")
                        return g.wait_prompt(timeout=120)
                else:
                    free_since = None
        else:
            raise AssertionError(f"a next neither ended nor waited: {g.transcript[-4:]}")
    raise AssertionError(f"no next waited for the client: {g.transcript[-4:]}")


@pytest.mark.parametrize("name,source,await_text,local,send", CASES, ids=[c[0] for c in CASES])
def test_next_over_a_handlers_await_while_a_client_talks(name: str, source: str, await_text: str,
                                                          local: str, send: str) -> None:
    prog = _program(name)
    line = _line_of(source, await_text)
    port = free_port()
    with start_proxy(f"|gdbserver --once - {prog} 127.0.0.1:{port}", extra=["--capture", "breakpoints"]) as px:
        with gdb_cli(prog, init=("set remotetimeout 60",), timeout=120) as g:
            g.cmd(f"target remote {px.address}")
            g.cmd(f"break {source}:{line}")
            g.start("continue")
            with _connect(port) as client:
                hit = g.wait_prompt(timeout=120)
                assert f"{source}:{line}" in hit, hit
                g.cmd("delete")
                before = g.cmd(f"print {local}")
                out = _next_until_it_waits(g, client, send, prog)
                after = g.cmd(f"print {local}")
                stats = g.cmd("monitor async step")
                g.cmd("kill")
    m = re.search(rf"^(\d+)\t", out, re.M)
    assert m and int(m.group(1)) > line, out  # the handler's next line
    assert not re.search(r"/usr/share/cargo|/rustc/|tokio::runtime", out), out  # not in tokio
    assert "SIGTRAP" not in out, out
    assert re.sub(r"^\$\d+ = ", "", before.strip()) == re.sub(r"^\$\d+ = ", "", after.strip()), (before, after)
    assert "steps taken over: 1" in stats, stats
    print(f"{name}: next over {source}:{line} ended at {m.group(1)}; {stats.strip()}")
