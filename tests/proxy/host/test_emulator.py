"""proxy/host/emulator.py: the emulator's process at the stub's end of the connection, the
proof that it holds the program (the AT_RANDOM bytes), and its map in the guest's addresses.

A table stands in for /proc in the proof's cases (FakeHost); the socket cases talk to a real
child process over real sockets and read this machine's /proc. integration/
test_qemu_corpus.py and test_qemu_aarch64.py run it under QEMU."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from proxy.host.emulator import Emulator, EmulatorHost, find_emulator, maps_text, stub_peer_pids, tcp_peer_inode
from proxy.host.identity import AT_RANDOM, HostProcs
from proxy.host.procmem import parse_maps

RANDOM = bytes(range(16))
GUEST_RANDOM = 0x400298BA80


def auxv(**kv: int) -> bytes:
    keys = {"phdr": 3, "random": AT_RANDOM}
    return b"".join(struct.pack("<QQ", keys[k], v) for k, v in kv.items()) + b"\0" * 16


@dataclass
class FakeHost(HostProcs):
    maps_of: dict[int, str] = field(default_factory=dict)
    mem: dict[tuple[int, int], bytes] = field(default_factory=dict)  # (pid, addr) -> bytes

    def maps(self, pid: int) -> str | None:
        return self.maps_of.get(pid)

    def read_mem(self, pid: int, addr: int, size: int) -> bytes | None:
        return self.mem.get((pid, addr))

    def comm(self, pid: int) -> str | None:
        return "qemu-x86_64" if pid in self.maps_of else None


QEMU_MAPS = """4000000000-400006e000 r--p 00000000 fe:00 5342690 /build/stuck
400018b000-40001ac000 rw-p 00000000 00:00 0
400218b000-400218c000 ---p 00000000 00:00 0
400218c000-400298c000 rw-p 00000000 00:00 0
5630d66d5000-5630d68c7000 rw-p 00000000 00:00 0 [heap]
7f6750000000-7f6750021000 rw-p 00000000 00:00 0
7ffcfbb16000-7ffcfbb37000 rw-p 00000000 00:00 0 [stack]
"""


def test_the_process_holding_the_random_bytes_is_the_emulator() -> None:
    host = FakeHost({9: "", 10: QEMU_MAPS}, {(10, GUEST_RANDOM): RANDOM, (9, GUEST_RANDOM): b"x" * 16})
    found = find_emulator([9, 10], "the peer", auxv(random=GUEST_RANDOM), RANDOM, None, host)
    assert isinstance(found, Emulator) and (found.pid, found.base) == (10, 0), found
    assert "process 10 (qemu-x86_64)" in found.how and "guest base 0x0" in found.how


def test_a_guest_base_comes_from_the_program_files_mapping(tmp_path: Path) -> None:
    """QEMU's -B: the guest's first page (AT_PHDR's) is the file's mapping at offset 0."""
    prog = tmp_path / "stuck"
    prog.write_bytes(b"")
    base = 0x100000000000
    maps = f"{0x4000000000 + base:x}-{0x400006e000 + base:x} r--p 00000000 fe:00 1 {prog}\n"
    host = FakeHost({5: maps}, {(5, GUEST_RANDOM + base): RANDOM})
    found = find_emulator([5], "the peer", auxv(phdr=0x4000000040, random=GUEST_RANDOM), RANDOM, str(prog), host)
    assert isinstance(found, Emulator) and found.base == base, found


def test_no_process_holds_the_guest() -> None:
    """A docker-proxy or any other process at the stub's end: not the program's memory."""
    host = FakeHost({7: QEMU_MAPS}, {(7, GUEST_RANDOM): b"y" * 16})
    why = find_emulator([7], "the peer", auxv(random=GUEST_RANDOM), RANDOM, None, host)
    assert why == ("process 7 (qemu-x86_64) at the stub's end of the connection does not hold the program's "
                   "memory (AT_RANDOM bytes differ)")
    # a process whose memory cannot be read here (another user's, ptrace rules): said so
    assert find_emulator([7], "", auxv(random=GUEST_RANDOM), RANDOM, None, FakeHost({7: QEMU_MAPS})) == (
        "process 7 (qemu-x86_64) at the stub's end of the connection: its /proc/PID/maps or mem cannot be read here")
    assert find_emulator([], "no socket here", auxv(random=GUEST_RANDOM), RANDOM, None, host) == "no socket here"
    assert "no auxv" in str(find_emulator([7], "", None, RANDOM, None, host))
    assert "no auxv" in str(find_emulator([7], "", auxv(random=GUEST_RANDOM), None, None, host))


def test_the_guest_map_is_the_anonymous_mappings_less_the_base() -> None:
    base = 0x100000000000
    shifted = "".join(f"{m.start + base:x}-{m.end + base:x} {m.perms} {m.offset:08x} 00:00 0 {m.path}\n"
                      for m in parse_maps(QEMU_MAPS))
    host = FakeHost({3: "1000-2000 rw-p 00000000 00:00 0\n" + shifted})
    got = Emulator(3, base, "").guest_maps(host)
    assert got is not None
    # below the base (QEMU's own) and named ones (QEMU's [heap] and [stack], files) are not the guest's
    assert [(m.start, m.end, m.perms) for m in got] == [
        (0x400018B000, 0x40001AC000, "rw-p"), (0x400218B000, 0x400218C000, "---p"),
        (0x400218C000, 0x400298C000, "rw-p"), (0x7F6750000000, 0x7F6750021000, "rw-p")]
    assert parse_maps(maps_text(got)) == got
    assert Emulator(4, 0, "").guest_maps(host) is None


def test_a_tcp_peer_row() -> None:
    table = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:5BA1 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 111 1
   1: 0100007F:5BA1 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 222 1
   2: 0100007F:D431 0100007F:5BA1 01 00000000:00000000 00:00000000 00000000     0        0 333 1
"""
    assert tcp_peer_inode(table, "0100007F:D431", "0100007F:5BA1") == 222
    assert tcp_peer_inode(table, "0100007F:D432", "0100007F:5BA1") is None
    # a connection still in the listener's queue (not accepted): inode 0
    assert tcp_peer_inode(table.replace(" 222 ", " 0 "), "0100007F:D431", "0100007F:5BA1") == 0


SERVER = """
import socket, sys
family = socket.AF_UNIX if sys.argv[1] == "unix" else socket.AF_INET
s = socket.socket(family)
s.bind(sys.argv[2] if family == socket.AF_UNIX else ("127.0.0.1", 0))
s.listen(1)
print(s.getsockname()[1] if family != socket.AF_UNIX else "ready", flush=True)
c, _ = s.accept()
c.sendall(b"a")
c.recv(1)
"""


@pytest.mark.parametrize("kind", ["tcp", "unix"])
def test_the_peer_of_a_real_connection_is_found(kind: str, tmp_path: Path) -> None:
    """A child process listens (as QEMU's stub does); the process at the other end of our
    connection is found in this machine's /proc (TCP) or by SO_PEERCRED (a Unix socket)."""
    path = str(tmp_path / "stub.sock")
    child = subprocess.Popen([sys.executable, "-c", SERVER, kind, path], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        ready = child.stdout.readline().strip()
        if kind == "tcp":
            sock = socket.create_connection(("127.0.0.1", int(ready)))
        else:
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(path)
        with sock:
            assert sock.recv(1) == b"a"  # accepted: until then the peer socket is no process's (inode 0)
            pids, how = stub_peer_pids(sock)
            assert pids == [child.pid], (pids, how)
            assert how.startswith("the peer of the stub's TCP connection" if kind == "tcp" else "the Unix socket's peer")
            # the emulator's proof then fails: the child holds no guest
            why = EmulatorHost().find(sock, auxv(random=GUEST_RANDOM), RANDOM, None)
            assert isinstance(why, str) and f"process {child.pid} (python" in why, why
            sock.sendall(b"x")
    finally:
        child.wait(timeout=10)


def test_a_connection_with_no_peer_here() -> None:
    """A socket whose other end is no socket of this host's table (a stub of another host)."""
    class Remote:
        family = socket.AF_INET

        def getsockname(self) -> tuple[str, int]:
            return ("10.9.8.7", 40000)

        def getpeername(self) -> tuple[str, int]:
            return ("10.9.8.6", 1234)

    pids, how = stub_peer_pids(Remote())
    assert pids == [] and "a stub of another host" in how
    assert stub_peer_pids(object())[0] == []
    assert EmulatorHost().find(None, None, None, None) == "the stub's connection is not a socket"
