"""The memory map of a program run by an emulator of this host (QEMU's user mode).

``qemu-x86_64 -g PORT prog`` / ``qemu-aarch64 -g PORT prog`` run the program inside one
process of this machine. Its gdbstub reports no pid of the program and answers no vFile,
so the program's /proc/PID/maps can be read neither here nor through the stub, and the
runtime adapters (proxy/reflect/adapters) would find only the tasks on the threads' stacks.
But QEMU's user mode maps every page of the guest into its own address space at host
address = guest address + guest_base (0 for a 64-bit guest on this x86-64 host, QEMU 7.2:
the program's PIE at guest and host 0x4000000000), and the kernel lists those mappings in
the emulator's own /proc/PID/maps beside QEMU's own (its code, its heap, its threads' stacks,
its translation buffer).

Finding it, with nothing taken on trust:

1. the emulator's process: the peer of the proxy's connection to the stub. A TCP stub's
   end is the row of /proc/net/tcp (tcp6) whose local address is the proxy's peer and
   whose remote address is the proxy's own; the process holding that socket's inode in
   /proc/*/fd holds the stub. A Unix socket stub: the peer's SO_PEERCRED pid.
2. the proof: the 16 bytes at AT_RANDOM (the guest's auxv, read through the stub) are the
   same through the stub (``m``) and in that process's memory at AT_RANDOM + guest_base
   (/proc/PID/mem, read only). QEMU writes new random bytes for each guest it starts, so a
   process that holds them holds the guest. guest_base is tried as 0, then as the host
   address of the program's file mapping less the guest address of its first page (QEMU's
   ``-B``, a 32-bit guest).
3. the map: the emulator's anonymous mappings at or above guest_base, less guest_base.
   QEMU's own anonymous mappings lie in the same range (guest_base 0): the session keeps
   only those the stub reads (QEMU's gdbstub reads only pages the guest mapped; every other
   address is an error), one probe read of a mapping's first byte each
   (queries._read_emulator_maps).

This is no proof that the emulator's pid is the program's: the identity (identity.py)
stays remote, and every read of the program's memory still goes through the stub. The
emulator's /proc is read only for its map.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from .identity import AT_RANDOM, RANDOM_BYTES, HostProcs, parse_auxv
from .procmem import Mapping, parse_maps

AT_PHDR = 3


@dataclass(frozen=True, slots=True)
class Emulator:
    """A process of this host proven to hold the stub's guest (module doc)."""

    pid: int
    base: int  # guest_base: host address = guest address + base
    how: str  # one line: which process, how found, the base

    def guest_maps(self, host: HostProcs) -> list[Mapping] | None:
        """The emulator's anonymous mappings in the guest's addresses (QEMU's own among
        them: the caller keeps what the stub reads); None when its maps cannot be read."""
        text = host.maps(self.pid)
        if text is None:
            return None
        return [Mapping(m.start - self.base, m.end - self.base, m.perms, m.offset, "")
                for m in parse_maps(text) if m.start >= self.base and not m.path]


def maps_text(mappings: Iterable[Mapping]) -> str:
    """Mappings back as /proc/PID/maps lines (parse_maps reads them)."""
    return "".join(f"{m.start:x}-{m.end:x} {m.perms} {m.offset:08x} 00:00 0 {m.path}\n" for m in mappings)


# -- 1. the process at the other end of the stub's connection ---------------------------

def _tcp_address(family: int, addr: tuple) -> str:  # type: ignore[type-arg]
    """``addr`` as /proc/net/tcp prints it: the address's 32-bit words in the host's byte
    order, hexadecimal, then ``:PORT`` in hexadecimal."""
    raw = socket.inet_pton(family, addr[0])
    words = struct.unpack(f"={len(raw) // 4}I", raw)
    return "".join(f"{w:08X}" for w in words) + f":{addr[1]:04X}"


def tcp_peer_inode(table: str, ours: str, theirs: str) -> int | None:
    """The inode of the socket whose local address is ``theirs`` and remote ``ours`` in a
    /proc/net/tcp text (addresses as ``_tcp_address`` writes them); None if no row has it."""
    for line in table.splitlines()[1:]:
        cols = line.split()
        if len(cols) > 9 and cols[1] == theirs and cols[2] == ours:
            try:
                return int(cols[9])
            except ValueError:
                return None
    return None


def socket_holders(inode: int, host: HostProcs, skip: int | None = None) -> list[int]:
    """The processes of this host with socket ``inode`` open (``skip``: the proxy itself)."""
    want = f"socket:[{inode}]"
    return [pid for pid in host.pids() if pid != skip and want in host.fd_targets(pid)]


def stub_peer_pids(sock: object, host: HostProcs | None = None) -> tuple[list[int], str]:
    """The processes of this host holding the stub's end of ``sock`` (the proxy's connected
    socket), and how they were found; an empty list and why not."""
    host = host or HostProcs()
    try:
        family = sock.family  # type: ignore[attr-defined]
        if family == socket.AF_UNIX:
            cred = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))  # type: ignore[attr-defined]
            pid = struct.unpack("3i", cred)[0]
            return ([pid], "the Unix socket's peer") if pid > 0 else ([], "the Unix socket names no peer process")
        if family not in (socket.AF_INET, socket.AF_INET6):
            return [], "the stub's connection is not a socket of this host"
        ours = _tcp_address(family, sock.getsockname())  # type: ignore[attr-defined]
        theirs = _tcp_address(family, sock.getpeername())  # type: ignore[attr-defined]
    except (OSError, ValueError, AttributeError, struct.error):
        return [], "the stub's connection has no socket addresses"
    table = host.net("tcp6" if family == socket.AF_INET6 else "tcp") or ""
    inode = tcp_peer_inode(table, ours, theirs)
    if inode is None:
        return [], "no socket of this host is the stub's end of the connection (a stub of another host)"
    if inode == 0:  # in the listener's queue: no process holds it until accept()
        return [], "the stub's end of the connection is not accepted yet"
    pids = socket_holders(inode, host, skip=os.getpid())
    if not pids:
        return [], f"no process of this host holds the stub's end of the connection (socket {inode})"
    return pids, f"the peer of the stub's TCP connection (socket {inode})"


# -- 2. the proof ------------------------------------------------------------------------

def _bases(host_maps: list[Mapping], vec: dict[int, int], exec_file: str | None) -> list[int]:
    """guest_base candidates: 0, then each mapping of the program's file at offset 0 less the
    guest address of the program's first page (AT_PHDR's page: the headers follow the ELF
    header in the first segment)."""
    out = [0]
    phdr = vec.get(AT_PHDR)
    if exec_file and phdr is not None:
        path = os.path.realpath(exec_file)
        out += [m.start - (phdr & ~0xFFF) for m in host_maps if m.path == path and m.offset == 0]
    return list(dict.fromkeys(b for b in out if b >= 0))


def find_emulator(pids: list[int], found_how: str, stub_auxv: bytes | None, stub_random: bytes | None,
                  exec_file: str | None, host: HostProcs | None = None) -> Emulator | str:
    """The process among ``pids`` that holds the stub's guest, with its guest_base; else why
    none does (one line)."""
    host = host or HostProcs()
    if not pids:
        return found_how
    vec = parse_auxv(stub_auxv)
    rnd = vec.get(AT_RANDOM)
    if rnd is None or not stub_random or len(stub_random) != RANDOM_BYTES:
        return "the stub sends no auxv and AT_RANDOM bytes to find the program in the emulator's memory with"
    unread = []
    for pid in pids:
        text = host.maps(pid)
        if text is None:
            unread.append(pid)
            continue
        bases = _bases(parse_maps(text), vec, exec_file)
        got = [host.read_mem(pid, rnd + base, RANDOM_BYTES) for base in bases]
        for base, data in zip(bases, got):
            if data == stub_random:
                name = host.comm(pid) or "?"
                return Emulator(pid, base, f"the emulator's process {pid} ({name}) on this host, {found_how}, "
                                f"proven by the AT_RANDOM bytes at guest base {base:#x}: its /proc/{pid}/maps")
        if all(d is None for d in got):
            unread.append(pid)
    who = ", ".join(f"{p} ({host.comm(p) or '?'})" for p in pids)
    if len(unread) == len(pids):
        return f"process {who} at the stub's end of the connection: its /proc/PID/maps or mem cannot be read here"
    return f"process {who} at the stub's end of the connection does not hold the program's memory (AT_RANDOM bytes differ)"


class EmulatorHost:
    """What a session asks of this host about an emulator (SessionConfig.emulator)."""

    def __init__(self, host: HostProcs | None = None) -> None:
        self.host = host or HostProcs()

    def find(self, sock: object, stub_auxv: bytes | None, stub_random: bytes | None,
             exec_file: str | None) -> Emulator | str:
        if sock is None:
            return "the stub's connection is not a socket"
        pids, how = stub_peer_pids(sock, self.host)
        return find_emulator(pids, how, stub_auxv, stub_random, exec_file, self.host)

    def maps(self, emulator: Emulator) -> list[Mapping] | None:
        return emulator.guest_maps(self.host)
