"""Bad input and faults.

* A corrupt checksum from the client is NAKed and the retransmission served
  (real gdbserver behind the proxy, a hand-written raw client in front).
* A corrupt checksum from the stub is NAKed and the retransmission used.
  This needs a stub that sends a corrupt packet on purpose, which no real
  stub does: here, and only here, a MOCK stub (FakeStub below) is used.
* A stub that dies mid-session (SIGKILL to gdbserver) gives gdb a clear
  error and the proxy exits by itself, without a traceback.
* A client that disconnects while the program runs leaves no proxy
  breakpoint: the program's code bytes (read from /proc/PID/mem) equal the
  ELF file's, and the program runs on to a normal exit.
* Oversized and malformed packets are rejected without crashing the proxy.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from integration.harness.gdb import gdb_batch, gdb_cli
from integration.harness.rawrsp import RawPeer, checksum, frame
from integration.harness.stubs import gone_within, pid_alive, spawn_proxy, start_proxy, start_stub
from integration.harness.tools import require_tool

SUPPORTED = b"qSupported:multiprocess+;swbreak+;hwbreak+;vContSupported+"


def _assert_no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr


# --------------------------------------------------------------- client side


def test_client_corrupt_checksum_is_naked_and_recovered(programs: dict[str, Path]) -> None:
    require_tool("gdbserver")
    with start_stub("gdbserver", programs["exitcode"], ["3"]) as stub, \
            start_proxy(stub.address) as px:
        peer = RawPeer.connect(px.address)
        peer.send_packet(SUPPORTED, corrupt=True)
        assert peer.read_ack() == b"-"
        reply = peer.request(SUPPORTED)          # the retransmission is served
        assert b"PacketSize=" in reply
        stop = peer.request(b"?")
        assert stop[:1] in (b"S", b"T"), stop
        peer.send_packet(b"k")
        peer.close()
        px.wait(timeout=10)
        _assert_no_traceback(px.stderr_text())


# ----------------------------------------------------------------- stub side


class FakeStub:
    """MOCK stub (a real stub never corrupts a checksum on purpose): answers a
    handful of packets, corrupts the checksum of its FIRST reply, and records
    whether the proxy NAKed it and got the retransmission."""

    REPLIES = {b"qSupported": b"PacketSize=4000;swbreak+;hwbreak+", b"?": b"S05",
               b"qAttached": b"1", b"qC": b"QC1", b"qfThreadInfo": b"m1",
               b"qsThreadInfo": b"l", b"H": b"OK", b"m": b"c3c3c3c3", b"g": b"00" * 560,
               b"k": b"OK", b"D": b"OK", b"vKill": b"OK"}

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.naks = 0
        self.corrupted = False
        self.received: list[bytes] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _reply_for(self, payload: bytes) -> bytes:
        for prefix in sorted(self.REPLIES, key=len, reverse=True):
            if payload.startswith(prefix):
                return self.REPLIES[prefix]
        return b""

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        peer = RawPeer(conn, timeout=30)
        try:
            while True:
                payload, ok = peer.read_packet()
                peer.send(b"+" if ok else b"-")
                if not ok:
                    continue
                self.received.append(payload)
                self._answer(peer, self._reply_for(payload))
        except (EOFError, OSError):
            return

    def _answer(self, peer: RawPeer, reply: bytes) -> None:
        first = not self.corrupted
        self.corrupted = True
        peer.send_packet(reply, corrupt=first)
        ack = peer.read_ack()
        while ack == b"-":
            self.naks += 1
            peer.send_packet(reply)
            ack = peer.read_ack()

    def close(self) -> None:
        self.listener.close()


def test_stub_corrupt_checksum_is_naked_and_recovered() -> None:
    fake = FakeStub()
    px = spawn_proxy(f"127.0.0.1:{fake.port}")
    try:
        peer = RawPeer.connect(px.address)
        assert b"PacketSize=" in peer.request(SUPPORTED)
        assert peer.request(b"?").startswith(b"S05")
        assert fake.corrupted and fake.naks >= 1, "the proxy did not NAK the corrupt reply"
        peer.send_packet(b"k")
        peer.close()
        px.wait(timeout=10)
        _assert_no_traceback(px.stderr_text())
    finally:
        px.close()
        fake.close()


# ------------------------------------------------------------ stub dies


def test_stub_death_gives_clear_error_and_proxy_exits(programs: dict[str, Path]) -> None:
    require_tool("gdb", "gdbserver")
    prog = programs["spin"]
    with start_stub("gdbserver", prog, ["30"]) as stub, \
            start_proxy(stub.address, probes=["^probed$"], extra=["--capture", "breakpoints"]) as px:
        con = gdb_cli(prog)
        try:
            con.cmd(f"target remote {px.address}")
            assert "Breakpoint 1" in con.cmd("break main")
            assert "Breakpoint 1, main" in con.cmd("continue")
            os.killpg(stub.proc.pid, signal.SIGKILL)
            out = con.cmd("continue", timeout=30)
            assert re.search(r"Remote connection closed|Remote communication error|"
                             r"connection closed|Couldn't|not being run", out), out
            code = px.wait(timeout=15)
        finally:
            con.close()
        stderr = px.stderr_text()
        _assert_no_traceback(stderr)
        assert re.search(r"stub|upstream", stderr, re.I), f"no clear message: {stderr!r}"
        assert code is not None


# ------------------------------------------------------- client disconnects


def _code_bytes(prog: Path, pid: int) -> tuple[bytes, bytes]:
    """(.text as in the ELF file, .text as in the live process)."""
    with open(prog, "rb") as f:
        elf = ELFFile(f)
        text = elf.get_section_by_name(".text")
        file_bytes, vaddr = text.data(), text["sh_addr"]
    base = None
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            cols = line.split()
            if len(cols) >= 6 and os.path.realpath(cols[5]) == os.path.realpath(prog) \
                    and int(cols[2], 16) == 0:
                base = int(cols[0].split("-")[0], 16)
                break
    assert base is not None, "program not mapped"
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(base + vaddr)
        return file_bytes, mem.read(len(file_bytes))


# How each capture backend watches spin's `probed`: hidden breakpoint,
# in-stub tracepoint, or count-only uprobe.
CAPTURE_PROBES = {
    "breakpoints": (["^probed$"], ["--capture", "breakpoints"]),
    "tracepoints": ([], ["--capture", "tracepoints", "--trace-probe", "^probed$"]),
    "uprobes": (["^probed$"], ["--capture", "uprobes"]),
}


def _require_capture(capture: str, stats: str) -> None:
    """A backend that cannot run here falls back to breakpoints and says why."""
    if f"capture: {capture}" not in stats:
        reason = re.search(r"^.*capture %s:.*$" % capture, stats, re.M)
        pytest.skip(f"{capture} capture cannot run here: {reason.group(0) if reason else stats[-300:]}")


@pytest.mark.parametrize("capture", list(CAPTURE_PROBES))
def test_client_disconnect_leaves_no_breakpoint(capture: str, programs: dict[str, Path]) -> None:
    require_tool("gdb", "gdbserver")
    prog = programs["spin"]
    probes, extra = CAPTURE_PROBES[capture]
    # 8 s: under load, attaching gdbserver and the proxy's capture took over 4 s,
    # and a program that ended before the client vanished proved nothing.
    victim = subprocess.Popen([str(prog), "8"], stdout=subprocess.PIPE, start_new_session=True)
    try:
        time.sleep(0.2)
        with start_stub("gdbserver", prog, attach=victim.pid) as stub, \
                start_proxy(stub.address, probes=probes, extra=extra) as px:
            con = gdb_cli(prog)
            con.cmd(f"target remote {px.address}")
            con.start("continue")
            time.sleep(1.0)                       # probes fire at a high rate now
            con.close()                           # SIGKILL: the client just vanishes
            px.wait(timeout=15)
            stub.wait(timeout=15)                 # gdbserver detaches an attached process
            _assert_no_traceback(px.stderr_text())
            if "; using breakpoints" in px.stderr_text():  # the session's fallback notice
                pytest.skip(f"{capture} capture cannot run here: {px.stderr_text()[-300:]}")
        if not pid_alive(victim.pid):
            code = victim.wait(timeout=5)
            pytest.fail(f"the program died when the client disconnected (status {code}; "
                        f"-N is signal N): {victim.stdout.read()!r}" if victim.stdout else "")
        in_file, in_memory = _code_bytes(prog, victim.pid)
        diff = [hex(i) for i, (a, b) in enumerate(zip(in_file, in_memory)) if a != b]
        assert not diff, f"code differs from the ELF at .text offsets {diff[:8]}"
        out, _ = victim.communicate(timeout=15)
        assert victim.returncode == 0 and b"spun ok" in out, (victim.returncode, out)
    finally:
        if victim.poll() is None:
            victim.kill()
            victim.wait()


@pytest.mark.parametrize("capture", list(CAPTURE_PROBES))
def test_kill_takes_the_capture_out_first_and_ends_cleanly(capture: str, programs: dict[str, Path],
                                                           tmp_path: Path) -> None:
    """`kill` with a capture installed: the proxy takes its probes out of the
    program before the stub sees the kill (gdbserver 13.1 crashes on a QTStop
    after the process is gone), the program is gone, and the proxy and the
    stub both exit normally."""
    require_tool("gdb", "gdbserver")
    prog = programs["spin"]
    probes, extra = CAPTURE_PROBES[capture]
    log = tmp_path / "packets.log"
    with start_stub("gdbserver", prog, ["20"]) as stub, \
            start_proxy(stub.address, probes=probes, extra=[*extra, "--log-packets", str(log)]) as px:
        run = gdb_batch(prog, [f"target remote {px.address}", "break probed", "continue", "continue",
                               "delete", "monitor async stats --all", "kill"], timeout=60)
        _require_capture(capture, run.output)
        pid = stub.find_inferior()
        assert px.wait(timeout=20) == 0, px.stderr_text()
        assert stub.wait(timeout=20) == 0, stub.output_text()
        _assert_no_traceback(px.stderr_text())
    assert re.search(r"\[Inferior 1 \(process \d+\) killed\]", run.output), run.output
    assert pid is None or gone_within(pid, 10), "the program outlived the kill"
    sent = [line for line in log.read_text().splitlines() if " s< " in line]
    kill = next(i for i, line in enumerate(sent) if "$vKill" in line or "$k#" in line)
    last_out = {"breakpoints": "$z0,", "tracepoints": "$QTinit", "uprobes": None}[capture]
    if last_out is not None:  # uprobes leave locally: no stub packet to order
        outs = [i for i, line in enumerate(sent) if last_out in line]
        assert outs and outs[-1] < kill, "\n".join(sent[-12:])


# ---------------------------------------------------- oversized / malformed


MALFORMED = [
    pytest.param(b"$" + b"A" * 2_000_000 + b"#00", id="oversized-2MB"),
    pytest.param(frame(b"m zz,zz"), id="bad-m-arguments"),
    pytest.param(frame(b"Z0,notanaddress,1"), id="bad-Z0"),
    pytest.param(b"$qC#zz", id="non-hex-checksum"),
    pytest.param(b"$qC$qC#" + b"%02x" % checksum(b"qC"), id="dollar-inside"),
    pytest.param(bytes(range(256)) * 4, id="binary-junk"),
    pytest.param(frame(b"vCont;q:zz"), id="bad-vCont"),
    pytest.param(frame(b"qXfer:features:read:target.xml:zz,zz"), id="bad-qXfer"),
    pytest.param(frame(b"H"), id="bare-H"),
]


@pytest.mark.parametrize("junk", MALFORMED)
def test_malformed_input_does_not_crash(junk: bytes, programs: dict[str, Path]) -> None:
    """After the junk, the proxy either still serves the same client (a good
    ``?`` gets a stop reply) or ends the session on purpose; never a crash."""
    require_tool("gdbserver")
    with start_stub("gdbserver", programs["exitcode"], ["3"]) as stub, \
            start_proxy(stub.address) as px:
        peer = RawPeer.connect(px.address, timeout=20)
        assert b"PacketSize=" in peer.request(SUPPORTED)
        peer.send(junk)
        time.sleep(0.3)
        peer.buf = b""
        try:
            peer.sock.settimeout(0.5)
            while peer.sock.recv(65536):
                pass
        except (TimeoutError, OSError):
            pass
        peer.sock.settimeout(20)
        try:
            stop = peer.request(b"?")
            assert stop[:1] in (b"S", b"T"), stop
            still_serving = True
        except (EOFError, ConnectionError):
            still_serving = False
        peer.close()
        code = px.wait(timeout=15)
        stderr = px.stderr_text()
        _assert_no_traceback(stderr)
        assert still_serving or code is not None, stderr
