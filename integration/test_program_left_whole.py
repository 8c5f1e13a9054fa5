"""The program left whole by a client that leaves, real gdbserver 13.1: no int3
and no signal it did not have.

Who owns a breakpoint in the stub (proxy/session/breakpoints.py): a client `z0` is answered by the proxy only when the proxy still needs the
stub's breakpoint there; any other `z0` reaches the stub, and the program's
code byte is its own again (read through /proc/PID/mem: gdbserver hides its
int3s from `m`).

Signals: gdbserver turns a 0x03 into a real SIGINT for the program (a kill of its
process group). When that SIGINT is not the stop the client gets (the
program was stopped already, or another thread's breakpoint stop won), it
waits in the kernel, and the detach delivers it: the program dies of it
(fuzz-client seeds 200 and 300: no result after a detach that answered OK).
The proxy sends a Ctrl-C that comes while the program is stopped only after
the next continue, and consumes a SIGINT that crossed a stop before it
forwards the detach (checked in /proc for a program of this host).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.corpus import build
from integration.harness.faults import _bias
from integration.harness.rawrsp import RawPeer
from integration.harness.stubs import REPO, start_proxy, start_stub
from integration.harness.tools import require_tool
from proxy.host.procmem import sigint_pending

SUPPORTED = b"qSupported:multiprocess+;swbreak+;hwbreak+;vContSupported+"


def _bench() -> Path:
    got = build.build(configs=["debug"], programs=["tokio_bench"]).get(("debug", "tokio_bench"))
    if not isinstance(got, Path):
        pytest.skip(f"tokio_bench (debug) not built: {got}")
    return build.pinned(got)


def _code_byte(pid: int, addr: int) -> int:
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        return os.pread(fd, 1, addr)[0]
    finally:
        os.close(fd)


def _run_a_little(peer: RawPeer) -> None:
    reply = peer.run_a_little()
    assert reply[:1] == b"T", reply


@contextlib.contextmanager
def _detached_session(extra: list[str]) -> Iterator[tuple[int, RawPeer, Path]]:
    """gdbserver running tokio_bench, the proxy, a raw client; at the end the
    client detaches and the program must print its right result."""
    require_tool("gdbserver")
    prog = _bench()
    with start_stub("gdbserver", prog, ["20000", "mt"]) as stub:
        pid = stub.find_inferior()
        assert pid is not None
        with start_proxy(stub.address, extra=extra) as px:
            peer = RawPeer.connect(px.address)
            peer.request(SUPPORTED)
            peer.request(b"?")
            yield pid, peer, prog
            assert peer.request(b"D;%x" % pid) == b"OK"
            peer.close()
            px.wait(timeout=15)
        stub.wait(timeout=120)
        assert "check=ok" in stub.output_text(), stub.output_text()


def _stop(peer: RawPeer) -> bytes:
    reply, _ = peer.read_packet()
    peer.send(b"+")
    return reply


def test_a_refused_thread_selection_does_not_hide_the_next_breakpoint_from_its_remove() -> None:
    """Fuzz seed 201: `Hgp8A72ff.73a9` (a pid gdbserver does not know: E01)
    was taken as the client's selection; its `Z0` then looked like a fork
    child's (forwarded, not recorded), and the `z0` after `Hg0` like one the
    client never set (answered OK, never forwarded): the int3 stayed."""
    with _detached_session(["--capture", "breakpoints"]) as (pid, peer, prog):
        _run_a_little(peer)  # the program's pid is known from its first resume
        addr = _bias(pid, prog) + int.from_bytes(prog.read_bytes()[0x18:0x20], "little")  # e_entry
        before = _code_byte(pid, addr)
        assert peer.request(b"Hgp%x.1" % (pid + 0x800000)) == b"E01"
        assert peer.request(b"Z0,%x,1" % addr) == b"OK"
        assert _code_byte(pid, addr) == 0xCC
        assert peer.request(b"Hg0") == b"OK"
        assert peer.request(b"z0,%x,1" % addr) == b"OK"
        # a remove may linger in the stub while the program stays stopped (the next stop's
        # re-insert is then free: proxy/session/breakpoints.py); it leaves before the program runs
        _run_a_little(peer)
        assert _code_byte(pid, addr) == before, "the client's int3 stayed in the program"


def test_ctrl_c_while_stopped_then_detach_leaves_the_program_whole() -> None:
    with _detached_session(["--mode", "off"]) as (pid, peer, _):
        peer.send(b"\x03")  # stopped: held for the next continue
        time.sleep(0.3)
        assert not sigint_pending(pid), "a SIGINT was queued while the program was stopped"
        peer.send_packet(b"vCont;c")
        assert peer.read_ack() == b"+"
        assert _stop(peer)[:3] == b"T02"  # the next continue stops at once
        peer.send(b"\x03")
        time.sleep(0.3)
        assert not sigint_pending(pid), "a SIGINT was queued while the program was stopped"



# A 0x03 that crosses a stop (the proxy forwarded it while the stop reply was
# on its way) leaves the same kernel SIGINT; the proxy consumes it before a
# detach (lifecycle.proc_leave). Its timing could not be forced with real
# gdbserver in 200 tries: tests/proxy/session/test_core.py pins that path.


@pytest.mark.parametrize("capture", ["breakpoints"])  # tracepoints: scripts/fault-campaign (a 13 s run)
def test_a_sigkilled_proxy_leaves_the_program_whole(capture: str) -> None:
    """gdbserver 13.1 does not take Z0 breakpoints out when its client
    vanishes while the program runs (it died of SIGTRAP or SIGSEGV: 8 of 10
    fault-campaign runs). The proxy's keeper (proxy/shell/keeper.py), in its
    own session, takes them out and detaches."""
    import os
    import signal

    from integration.harness.fuzzclient import stray_int3

    import subprocess

    require_tool("gdbserver")
    prog = _bench()
    # 60,000 iterations (4 s alone): the kill comes mid-run, not during the program's exit
    bench = subprocess.Popen([str(prog), "60000", "mt"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    with start_stub("gdbserver", prog, attach=bench.pid) as stub:
        pid = bench.pid
        with start_proxy(stub.address, extra=["--capture", capture]) as px:
            peer = RawPeer.connect(px.address)
            peer.request(SUPPORTED)
            peer.request(b"?")
            peer.send_packet(b"vCont;c")
            assert peer.read_ack() == b"+"
            time.sleep(1.0)
            assert _keepers_of(px.proc.pid) == 1  # the keeper runs, named as itself (a fork shares the cmdline)
            os.killpg(px.proc.pid, signal.SIGKILL)
            stub.wait(timeout=120)  # the keeper detached (or gdbserver's own exit did): gdbserver --once ends
            try:
                stray = stray_int3(pid, prog, _bias(pid, prog))
            except OSError:
                stray = []  # it ended already (its memory is gone)
            assert not stray
            px.stderr.join(10)
            assert "its keeper did" in px.stderr_text(), px.stderr_text()
    out, _ = bench.communicate(timeout=120)
    assert bench.returncode == 0 and b"check=ok" in out, (bench.returncode, out)


def _keepers_of(parent: int) -> int:
    """How many children of `parent` call themselves asyncrsp-keeper (/proc/PID/comm)."""
    import os

    n = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/comm") as f:
                comm = f.read().strip()
        except (OSError, ValueError, IndexError):
            continue
        n += ppid == parent and comm == "asyncrsp-keeper"
    return n


def _libc_exit(pid: int) -> int:
    """libc's `_exit` in the running program (where the fast tracepoints' exit guard goes)."""
    from proxy.analysis.elf import open_elf

    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        f = line.split()
        if len(f) >= 6 and os.path.basename(f[5]).startswith("libc.so") and int(f[2], 16) == 0:
            sym = next(s for s in open_elf(f[5]).symbols_named("_exit") if s.is_func)
            return int(f[0].split("-")[0], 16) + sym.addr
    raise AssertionError(f"no libc in {pid}'s maps")


def _no_core() -> None:
    # gdb 13.1 in batch mode may dump core when its remote connection drops
    # mid-`continue` (an 85 MB core file in the working directory)
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _loop_line() -> int:
    src = REPO / "integration" / "programs" / "probe_count.c"
    return next(i for i, ln in enumerate(src.read_text().splitlines(), 1) if "+= probed(" in ln)


@pytest.mark.timeout(180)
def test_a_sigkilled_proxy_takes_the_fast_tracepoints_guards_out() -> None:
    """Fast tracepoints (gdbserver's in-process agent) come with the proxy's
    own Z0 guards on pthread_create and libc's `_exit` (proxy/capture/
    tracepoints.py: gdbserver 13.1 asserts or dies without them). They are
    outside the session's breakpoint table, and `QTStop` leaves them in: a
    keeper that only stopped the experiment left the int3 at `_exit`, and
    the program died of SIGTRAP at its end. The keeper's plan lists them."""
    import signal
    import subprocess

    from integration.harness import programs as cprogs
    from integration.harness.fuzzclient import stray_int3
    from integration.harness.stubs import INPROC_AGENT

    require_tool("gdb", "gdbserver")
    if not os.path.exists(INPROC_AGENT):
        pytest.skip(f"no {INPROC_AGENT} (gdbserver's in-process agent)")
    prog = cprogs.build("probe_count", nopie=True)
    n = 1_000_000_000  # about 2 s alone: it runs while gdbserver attaches, and after the keeper left
    # its own process group (gdbserver's 0x03 is a kill of the group), the agent preloaded
    bench = subprocess.Popen([str(prog), str(n), "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env={**os.environ, "LD_PRELOAD": INPROC_AGENT}, start_new_session=True)
    try:
        time.sleep(0.2)  # the loader has run the agent's constructor (its jump pads)
        exit_at = _libc_exit(bench.pid)
        original = _code_byte(bench.pid, exit_at)
        with start_stub("gdbserver", prog, attach=bench.pid) as stub:
            with start_proxy(stub.address, extra=["--capture", "tracepoints", "--trace-probe", "^probed$",
                                                  "--inproc"]) as px:
                # attached: the switch to fast tracepoints comes at the client's first stop
                gdb = subprocess.Popen(["gdb", "-nx", "-batch", "-iex", "set sysroot /",
                                        "-ex", f"target remote {px.address}",
                                        "-ex", f"break probe_count.c:{_loop_line()}", "-ex", "continue",
                                        "-ex", "delete", "-ex", "continue", str(prog)],
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       preexec_fn=_no_core)
                deadline = time.monotonic() + 60
                while _code_byte(bench.pid, exit_at) != 0xCC:  # the exit guard is in
                    assert time.monotonic() < deadline, px.stderr_text()
                    assert bench.poll() is None, "the program ended before the guards were planted"
                    time.sleep(0.05)
                os.killpg(px.proc.pid, signal.SIGKILL)
                stub.wait(timeout=60)  # the keeper detached: gdbserver --once ends
                gdb.wait(timeout=30)
                assert _code_byte(bench.pid, exit_at) == original
                assert not stray_int3(bench.pid, prog, 0)  # no tracepoint left either (non-PIE)
                px.stderr.join(10)
                assert "its keeper did" in px.stderr_text(), px.stderr_text()
        out, _ = bench.communicate(timeout=120)
        assert bench.returncode == 0 and f"calls={n}".encode() in out, (bench.returncode, out)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
