"""The stub's program is proven to be a process of this host before the proxy
acts on the host (proxy/host/identity.py), in the three places where the address
of the stub misleads:

* gdbserver in its own pid namespace on 127.0.0.1 (a container with a
  published port): it reports the program's pid in that namespace. A canary,
  the same program held stopped at exec, holds that pid on the host: its
  memory stays byte-identical, and the capture runs on the program's host pid;
* gdbserver in a mount namespace where the program's path is another file
  (here: another program's copy at the same path): the capture reads the
  running file through /proc/PID/exe;
* a truly remote stub: gdbserver in its own network and pid namespaces, the
  proxy in two others (``ip netns``, a veth pair, addresses only inside the
  two namespaces made here). The canary holds the stub's pid in the proxy's
  pid namespace; the proxy captures through the stub (tracepoints).

Real gdb, gdbserver, unshare, ip; root. Each test skips with the reason when
a tool or a permission is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from integration.corpus import build
from integration.harness.gdb import gdb_batch
from integration.harness.stubs import REPO, OutputPump, free_port, kill_tree, start_proxy, venv_python
from integration.harness.tools import require_tool

CANARY = REPO / "integration" / "harness" / "canary.py"
GDB_STEPS = ["break tokio_app.rs:34", "continue", "monitor async stats --all", "monitor async tasks", "kill"]


def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("namespaces need root")
    require_tool("gdb", "gdbserver", "unshare")


def _program(name: str = "tokio_app") -> Path:
    got = build.build(configs=["debug"], programs=[name]).get(("debug", name))
    if not isinstance(got, Path):
        pytest.skip(f"{name} (debug) not built: {got}")
    return build.pinned(got)


def _popen(argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,  # type: ignore[call-overload, no-any-return]
                            start_new_session=True, **kw)


def _canary_line(proc: subprocess.Popen[bytes], what: str) -> re.Match[bytes]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.match(rb"canary (?:pid=(\d+) )?" + what.encode() + rb"digest=(\w+)", line)
    assert m, f"canary said {line!r}"
    return m


def _stub(argv: list[str]) -> tuple[subprocess.Popen[bytes], OutputPump, int, int]:
    """Start a gdbserver command line; (process, output, its port, the program's pid as it reports it)."""
    proc = _popen(argv, stdin=subprocess.DEVNULL)
    out = OutputPump(proc.stdout)
    m = out.wait_for(re.compile(rb"Listening on port (\d+)"), 15)
    pid = re.search(rb"pid = (\d+)", out.data())
    if not m or not pid:
        kill_tree(proc)
        out.join()
        pytest.skip(f"gdbserver did not start in the namespace: {out.text()!r}")
    return proc, out, int(m.group(1)), int(pid.group(1))


def _check_capture(run: str, host_line: str) -> str:
    assert "Breakpoint 1, tokio_app::c" in run, run
    events = re.search(r"^events: (\d+) \(enters", run, re.M)
    assert events and int(events.group(1)) > 0, run  # the capture recorded polls
    assert "tokio_app::run" in run.split("ASYNC FN", 1)[-1], run  # the task table has the program's task
    m = re.search(r"^program's host: (.*)$", run, re.M)
    assert m, run
    assert re.search(host_line, m.group(1)), m.group(1)
    assert "Traceback" not in run
    return m.group(1)


def test_pid_namespace_stub_is_found_by_its_host_pid_and_the_canary_is_untouched(tmp_path: Path) -> None:
    _needs_root()
    prog = _program()
    canary = _popen([venv_python(), str(CANARY), str(prog)], stdin=subprocess.PIPE)
    try:
        c = _canary_line(canary, "")
        cpid, before = int(c.group(1)), c.group(2)
        # place the program at the canary's pid inside a new pid namespace
        # (gdbserver's own forks come first: learn their count, then aim)
        offset = 3
        for _ in range(3):
            stub, out, port, pid = _stub(
                ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
                 f"echo {cpid - offset} > /proc/sys/kernel/ns_last_pid; "
                 f"exec gdbserver --once 127.0.0.1:0 {prog}"])
            if pid == cpid:
                break
            offset += pid - cpid
            kill_tree(stub)
            out.join()
        else:
            pytest.skip(f"could not place the program at the canary's pid {cpid}")
        try:
            with start_proxy(f"127.0.0.1:{port}") as px:
                run = gdb_batch(prog, [f"target remote {px.address}", *GDB_STEPS], timeout=90).output
                px.wait(timeout=15)
                err = px.stderr_text()
        finally:
            kill_tree(stub)
            out.join()
        host = _check_capture(run, rf"pid (\d+) \(pid {cpid} in its pid namespace\), auxv and AT_RANDOM bytes equal")
        assert int(re.match(r"pid (\d+)", host).group(1)) != cpid  # type: ignore[union-attr]
        assert "program's host: pid" in err
        assert canary.stdin is not None
        canary.stdin.close()
        after = _canary_line(canary, "after ").group(2)
        assert after == before, "the canary's memory changed"
    finally:
        kill_tree(canary)


def test_mount_namespace_stub_whose_path_is_another_file_here(tmp_path: Path) -> None:
    _needs_root()
    prog, other = _program(), _program("stuck")
    inside = tmp_path / "app"
    inside.mkdir()
    shutil.copy2(other, inside / "tokio_app")  # what this host has at the stub's path
    stub, out, port, pid = _stub(
        ["unshare", "--mount", "sh", "-c",
         f"mount -t tmpfs none {inside} && cp {prog} {inside}/tokio_app && "
         f"exec gdbserver --once 127.0.0.1:0 {inside}/tokio_app"])
    try:
        with start_proxy(f"127.0.0.1:{port}") as px:
            run = gdb_batch(prog, [f"target remote {px.address}", *GDB_STEPS], timeout=90).output
            px.wait(timeout=15)
    finally:
        kill_tree(stub)
        out.join()
    _check_capture(run, rf"pid {pid}, auxv and AT_RANDOM bytes equal; {inside}/tokio_app here is another build: "
                        rf"the running file is read through /proc/{pid}/exe")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def test_remote_stub_in_other_network_and_pid_namespaces(tmp_path: Path) -> None:
    _needs_root()
    require_tool("ip")
    prog = _program()
    tag = f"{os.getpid() % 100000}"
    ns_stub, ns_proxy = f"asyncrsp-s{tag}", f"asyncrsp-p{tag}"
    try:
        _ip("netns", "add", ns_stub)
        _ip("netns", "add", ns_proxy)
    except subprocess.CalledProcessError as err:
        pytest.skip(f"ip netns add: {err.stderr.decode(errors='replace').strip()}")
    try:
        _ip("link", "add", f"ar{tag}a", "netns", ns_stub, "type", "veth", "peer", "name", f"ar{tag}b",
            "netns", ns_proxy)
        _ip("-n", ns_stub, "addr", "add", "10.231.7.1/24", "dev", f"ar{tag}a")
        _ip("-n", ns_proxy, "addr", "add", "10.231.7.2/24", "dev", f"ar{tag}b")
        _ip("-n", ns_stub, "link", "set", f"ar{tag}a", "up")
        _ip("-n", ns_proxy, "link", "set", f"ar{tag}b", "up")
        _ip("-n", ns_proxy, "link", "set", "lo", "up")  # gdb reaches the proxy at its own address
        stub, out, port, pid = _stub(
            ["ip", "netns", "exec", ns_stub, "unshare", "--pid", "--fork", "--mount-proc",
             "gdbserver", "--once", "10.231.7.1:0", str(prog)])
        listen = free_port()
        env = dict(os.environ, PYTHONPATH=str(REPO))
        proxy = subprocess.Popen(
            ["ip", "netns", "exec", ns_proxy, "unshare", "--pid", "--fork", "--mount-proc",
             venv_python(), str(CANARY), "--pid", str(pid), str(prog), "--",
             venv_python(), "-m", "proxy", "serve", "--listen", f"10.231.7.2:{listen}",
             "--upstream", f"10.231.7.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO, env=env,
            start_new_session=True)
        try:
            c = _canary_line(proxy, "")
            assert int(c.group(1)) == pid, "the canary does not hold the stub's pid"
            outs, errs = OutputPump(proxy.stdout), OutputPump(proxy.stderr)
            assert errs.wait_for(re.compile(rb"listening on"), 30), errs.text()
            time.sleep(0.2)
            res = subprocess.run(["ip", "netns", "exec", ns_proxy, "gdb", "-nx", "-batch",
                                  "-iex", "set pagination off", "-iex", "set confirm off",
                                  "-ex", f"target remote 10.231.7.2:{listen}",
                                  *[a for s in GDB_STEPS for a in ("-ex", s)], str(prog)],
                                 capture_output=True, text=True, timeout=120, check=False)
            run = res.stdout + res.stderr
            m = outs.wait_for(re.compile(rb"canary after digest=(\w+)"), 30)
            assert m, (run, errs.text())
            after = m.group(1).decode()
        finally:
            kill_tree(proxy)
            kill_tree(stub)
            out.join()
        _check_capture(run, rf"remote: no process of this host has the auxv of the stub's pid {pid}")
        assert re.search(r"^capture: tracepoints", run, re.M), run
        assert after == c.group(2).decode(), "the canary's memory changed"
    finally:
        subprocess.run(["ip", "netns", "del", ns_stub], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", ns_proxy], check=False, capture_output=True)
