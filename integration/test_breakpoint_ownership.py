"""Who owns a breakpoint in the stub (proxy/session/breakpoints.py), real gdbserver 13.1.

A client `z0` is answered by the proxy only when the proxy still needs the
stub's breakpoint there; any other `z0` reaches the stub, and the program's
code byte is its own again (read through /proc/PID/mem: gdbserver hides its
int3s from `m`)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from integration.harness.faults import _bias
from integration.harness.rawrsp import RawPeer
from integration.harness.stubs import REPO, start_proxy, start_stub
from integration.harness.tools import require_tool

sys.path.insert(0, str(REPO / "integration" / "corpus"))
import build  # noqa: E402

SUPPORTED = b"qSupported:multiprocess+;swbreak+;hwbreak+;vContSupported+"


def _bench() -> Path:
    got = build.build(configs=["debug"], programs=["tokio_bench"]).get(("debug", "tokio_bench"))
    if not isinstance(got, Path):
        pytest.skip(f"tokio_bench (debug) not built: {got}")
    return got


def _code_byte(pid: int, addr: int) -> int:
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        return os.pread(fd, 1, addr)[0]
    finally:
        os.close(fd)


def _run_a_little(peer: RawPeer) -> None:
    peer.send_packet(b"vCont;c")
    assert peer.read_ack() == b"+"
    time.sleep(0.3)
    peer.send(b"\x03")
    reply, _ = peer.read_packet()
    peer.send(b"+")
    assert reply[:1] == b"T", reply


def test_a_refused_thread_selection_does_not_hide_the_next_breakpoint_from_its_remove() -> None:
    """Fuzz seed 201: `Hgp8A72ff.73a9` (a pid gdbserver does not know: E01)
    was taken as the client's selection; its `Z0` then looked like a fork
    child's (forwarded, not recorded), and the `z0` after `Hg0` like one the
    client never set (answered OK, never forwarded): the int3 stayed."""
    require_tool("gdbserver")
    prog = _bench()
    with start_stub("gdbserver", prog, ["20000", "mt"]) as stub:
        pid = stub.find_inferior()
        assert pid is not None
        with start_proxy(stub.address, extra=["--capture", "breakpoints"]) as px:
            peer = RawPeer.connect(px.address)
            peer.request(SUPPORTED)
            peer.request(b"?")
            _run_a_little(peer)  # the program's pid is known from its first resume
            addr = _bias(pid, prog) + int.from_bytes(prog.read_bytes()[0x18:0x20], "little")  # e_entry
            before = _code_byte(pid, addr)
            assert peer.request(b"Hgp%x.1" % (pid + 0x800000)) == b"E01"
            assert peer.request(b"Z0,%x,1" % addr) == b"OK"
            assert _code_byte(pid, addr) == 0xCC
            assert peer.request(b"Hg0") == b"OK"
            assert peer.request(b"z0,%x,1" % addr) == b"OK"
            assert _code_byte(pid, addr) == before, "the client's int3 stayed in the program"
            assert peer.request(b"D;%x" % pid) == b"OK"
            peer.close()
            px.wait(timeout=15)
        stub.wait(timeout=60)
        assert "check=ok" in stub.output_text(), stub.output_text()
