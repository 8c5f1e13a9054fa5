"""Is the stub's process a process of this machine, and which one?

The proxy acts on the program's host itself for some things: uprobes attach
to a pid, fork children get their code bytes back through /proc/PID/mem,
the program's file is read through /proc/PID/exe, the tokio adapter scans
/proc/PID/maps. A stub's address says nothing about that: gdbserver in a
container (its own pid namespace, a published port on 127.0.0.1) reports
the program as pid 5, and this machine's pid 5 is another process (a kernel
worker, seen). So before any host-side action the proxy proves it:

1. the stub's auxv (qXfer:auxv:read) equals /proc/PID/auxv of a host
   process: the reported pid itself, or a process whose ``NSpid:`` line
   (/proc/PID/status: its pid in each nested pid namespace) ends with the
   reported pid - a stub in a pid namespace;
2. the 16 random bytes at AT_RANDOM are the same through the stub (``m``)
   and through /proc/PID/mem (read only). auxv alone can be equal for two
   processes of one program: gdbserver turns address randomisation off, so
   the stack and AT_RANDOM's address repeat run after run. The bytes there
   are the kernel's, new for each exec;
3. the program's file, when the proxy has one, has the build-id of
   /proc/PID/exe. When the stub's path does not open here (a mount
   namespace, a container's root) the running file is read through
   /proc/PID/exe instead.

Anything else is a remote program: no host-side action, captures that work
through the stub (tracepoints, breakpoints), and the reason in one line at
connect and in `monitor async stats`. ``--local``/``--remote`` override.

The decision is sans-IO except for `HostProcs`, the few reads of /proc it
needs (a test passes its own). The stub's side comes in as the auxv blob and
one memory read, which `prove` asks for as a session procedure step.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field


AT_ENTRY = 9
AT_RANDOM = 25
RANDOM_BYTES = 16
NSPID_SCAN_LIMIT = 1 << 17  # host processes looked at for a pid-namespace stub


@dataclass(frozen=True, slots=True)
class Identity:
    """What the proxy may do on this host for the stub's program."""

    local: bool  # the program is `host_pid` of this machine
    host_pid: int | None
    stub_pid: int | None
    reason: str  # one line: why local or not
    exe: str | None = None  # the running file to read, when the stub's path is not it here
    # stub pid -> host pid, for fork children (same pid namespace, same auxv)
    translate: Callable[[int], int | None] | None = field(default=None, compare=False, repr=False)

    def host_pid_of(self, stub_pid: int) -> int | None:
        """The host pid of another process of the program's (a fork child), or None."""
        if not self.local:
            return None
        if stub_pid == self.stub_pid:
            return self.host_pid
        return self.translate(stub_pid) if self.translate is not None else None

    def line(self) -> str:
        return f"program's host: {self.reason}"


UNDECIDED = Identity(False, None, None, "not decided yet (the program has not been seen stopped)")


class HostProcs:
    """The reads of this machine's /proc that the decision needs (read only)."""

    def __init__(self, root: str = "/proc") -> None:
        self.root = root

    def auxv(self, pid: int) -> bytes | None:
        return _read(f"{self.root}/{pid}/auxv")

    def nspid(self, pid: int) -> tuple[int, ...] | None:
        data = _read(f"{self.root}/{pid}/status")
        if data is None:
            return None
        for line in data.split(b"\n"):
            if line.startswith(b"NSpid:"):
                try:
                    return tuple(int(x) for x in line.split()[1:])
                except ValueError:
                    return None
        return None

    def pid_ns(self, pid: int) -> str | None:
        try:
            return os.readlink(f"{self.root}/{pid}/ns/pid")
        except OSError:
            return None

    def pids(self) -> Iterable[int]:
        try:
            names = os.listdir(self.root)
        except OSError:
            return []
        return (int(n) for n in names if n.isdigit())

    def read_mem(self, pid: int, addr: int, size: int) -> bytes | None:
        try:
            fd = os.open(f"{self.root}/{pid}/mem", os.O_RDONLY)
        except OSError:
            return None
        try:
            return os.pread(fd, size, addr)
        except (OSError, OverflowError):
            return None
        finally:
            os.close(fd)

    def exe_build_id(self, pid: int) -> bytes | None:
        return file_build_id(f"{self.root}/{pid}/exe")

    def exe(self, pid: int) -> str:
        return f"{self.root}/{pid}/exe"

    # an emulator's process (emulator.py): its map, its sockets, its name

    def maps(self, pid: int) -> str | None:
        data = _read(f"{self.root}/{pid}/maps", 1 << 24)
        return data.decode(errors="replace") if data is not None else None

    def comm(self, pid: int) -> str | None:
        data = _read(f"{self.root}/{pid}/comm")
        return data.decode(errors="replace").strip() if data is not None else None

    def net(self, name: str) -> str | None:
        data = _read(f"{self.root}/net/{name}", 1 << 24)
        return data.decode(errors="replace") if data is not None else None

    def fd_targets(self, pid: int) -> set[str]:
        """What the process's descriptors are (``socket:[INODE]``, paths); empty when unreadable."""
        base = f"{self.root}/{pid}/fd"
        try:
            names = os.listdir(base)
        except OSError:
            return set()
        out = set()
        for n in names:
            try:
                out.add(os.readlink(f"{base}/{n}"))
            except OSError:
                continue
        return out


def _read(path: str, limit: int = 1 << 20) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit)
    except OSError:
        return None


def parse_auxv(blob: bytes | None) -> dict[int, int]:
    """auxv pairs (64-bit) up to AT_NULL; garbage gives what parsed before it."""
    from proxy.analysis.elf import parse_auxv  # pyelftools: imported when a session needs it

    return parse_auxv(blob) if blob else {}


def file_build_id(path: str) -> bytes | None:
    """The GNU build-id note of an ELF file (64/32-bit little-endian), or None.
    Reads the program headers' PT_NOTE segments only; any garbage is None."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF" or head[5] != 1:
                return None
            wide = head[4] == 2
            if wide:
                phoff, = struct.unpack_from("<Q", head, 32)
                phentsize, phnum = struct.unpack_from("<HH", head, 54)
            else:
                phoff, = struct.unpack_from("<I", head, 28)
                phentsize, phnum = struct.unpack_from("<HH", head, 42)
            if phnum > 256 or phentsize < (56 if wide else 32):
                return None
            fh.seek(phoff)
            table = fh.read(phentsize * phnum)
            for i in range(phnum):
                ph = table[i * phentsize:(i + 1) * phentsize]
                if len(ph) < phentsize:
                    break
                if struct.unpack_from("<I", ph, 0)[0] != 4:  # PT_NOTE
                    continue
                if wide:
                    off, = struct.unpack_from("<Q", ph, 8)
                    size, = struct.unpack_from("<Q", ph, 32)
                else:
                    off, = struct.unpack_from("<I", ph, 4)
                    size, = struct.unpack_from("<I", ph, 16)
                fh.seek(off)
                from proxy.analysis.elf import note_build_id

                found = note_build_id(fh.read(min(size, 1 << 16)))
                if found is not None:
                    return found
    except (OSError, struct.error, ValueError, OverflowError):
        return None
    return None


# -- the decision --------------------------------------------------------------------

def candidates(stub_pid: int, stub_auxv: bytes, host: HostProcs,
               limit: int = NSPID_SCAN_LIMIT) -> list[tuple[int, str]]:
    """Host processes whose auxv equals the stub's: (host pid, how it was found).
    The reported pid first; then processes in a nested pid namespace whose
    innermost pid is the reported one."""
    out: list[tuple[int, str]] = []
    if host.auxv(stub_pid) == stub_auxv:
        out.append((stub_pid, f"pid {stub_pid}"))
    for n, pid in enumerate(host.pids()):
        if n >= limit:
            break
        if pid == stub_pid:
            continue
        ns = host.nspid(pid)
        if ns is None or len(ns) < 2 or ns[-1] != stub_pid:
            continue
        if host.auxv(pid) == stub_auxv:
            out.append((pid, f"pid {pid} (pid {stub_pid} in its pid namespace)"))
    return out


def decide(stub_pid: int | None, stub_auxv: bytes | None, stub_random: bytes | None,
           program_path: str | None, *, override: str | None = None,
           host: HostProcs | None = None,
           build_id: Callable[[str], bytes | None] = file_build_id) -> Identity:
    """The identity from what the stub said (its pid, auxv blob, the bytes
    it read at AT_RANDOM) and what this host shows.

    `override`: "local" takes the stub's pid as this host's (no proof),
    "remote" never acts on the host."""
    host = host or HostProcs()
    if override == "remote":
        return Identity(False, None, stub_pid, "remote (--remote): nothing is done on this host")
    if stub_pid is None:
        return Identity(False, None, None, "remote: the stub reported no pid")
    if override == "local":
        return Identity(True, stub_pid, stub_pid, f"pid {stub_pid} (--local: taken as is, not checked)",
                        translate=lambda p: p)
    if not stub_auxv:
        return Identity(False, None, stub_pid, "remote: the stub sends no auxv to compare with this host's "
                        f"processes (--local if pid {stub_pid} here is the program)")
    vec = parse_auxv(stub_auxv)
    rnd = vec.get(AT_RANDOM)
    if rnd is not None and stub_random and host.auxv(stub_pid) == stub_auxv \
            and host.read_mem(stub_pid, rnd, RANDOM_BYTES) == stub_random:
        # The reported pid itself has the stub's auxv and the kernel's random
        # bytes of this exec: proved, without the scan of every host process
        # for a pid-namespace stub (10-90 ms on a busy machine, at every
        # session's first resume). Only the program's own fork relatives share
        # those bytes, and one of them in a nested pid namespace under the very
        # same pid number is not a case worth that cost.
        found = [(stub_pid, f"pid {stub_pid}")]
    else:
        found = candidates(stub_pid, stub_auxv, host)
    if not found:
        return Identity(False, None, stub_pid, f"remote: no process of this host has the auxv of the stub's "
                        f"pid {stub_pid}")
    proven: list[tuple[int, str]] = []
    unread = False
    for pid, how in found:
        if rnd is None or not stub_random:
            proven.append((pid, how + ", auxv equal"))
            continue
        mine = host.read_mem(pid, rnd, RANDOM_BYTES)
        if mine is None:
            unread = True
            proven.append((pid, how + ", auxv equal (its AT_RANDOM bytes unreadable)"))
        elif mine == stub_random:
            proven.append((pid, how + ", auxv and AT_RANDOM bytes equal"))
    if len(proven) != 1:
        why = ("several processes match and their random bytes cannot be told apart" if proven and unread
               else "several processes match" if proven
               else "the auxv matches but the AT_RANDOM bytes differ")
        return Identity(False, None, stub_pid, f"remote: {why} (stub pid {stub_pid})")
    pid, how = proven[0]
    exe: str | None = None
    running = host.exe_build_id(pid)
    if program_path is not None:
        theirs = _build_id_or_missing(program_path, build_id)
        if theirs is _MISSING:
            exe = host.exe(pid)
            how += f"; {program_path} does not open here: the running file is read through {exe}"
        elif running is not None and theirs is not None and theirs != running:
            # the stub's path names another file here (a container's root, a
            # mount namespace): the running one is read through /proc/PID/exe
            exe = host.exe(pid)
            how += f"; {program_path} here is another build: the running file is read through {exe}"
        elif running is not None and theirs == running:
            how += ", build-id equal"
    ns = host.pid_ns(pid)
    want = host.auxv(pid)

    def translate(child: int) -> int | None:
        return _child_host_pid(child, ns, want, host)

    return Identity(True, pid, stub_pid, how, exe=exe, translate=translate)


_MISSING = object()


def _build_id_or_missing(path: str, build_id: Callable[[str], bytes | None]) -> object:
    if not os.path.exists(path):
        return _MISSING
    return build_id(path)


def _child_host_pid(child: int, ns: str | None, auxv: bytes | None, host: HostProcs) -> int | None:
    """A fork child's host pid: in the program's pid namespace, innermost pid
    `child`, and the parent's auxv (a fork copies it). None when not found."""
    if auxv is None:
        return None
    if host.pid_ns(child) == ns and host.auxv(child) == auxv:
        ids = host.nspid(child)
        if ids is not None and ids[-1] == child:
            return child
    for n, pid in enumerate(host.pids()):
        if n >= NSPID_SCAN_LIMIT:
            break
        ids = host.nspid(pid)
        if ids is None or ids[-1] != child or host.pid_ns(pid) != ns:
            continue
        if host.auxv(pid) == auxv:
            return pid
    return None


def random_address(stub_auxv: bytes | None) -> int | None:
    return parse_auxv(stub_auxv).get(AT_RANDOM)


def read_stub_random(stub_auxv: bytes | None, exchange: Callable[[tuple[bytes, ...]], object]
                     ) -> Generator[object, list[bytes], bytes | None]:
    """The 16 bytes at AT_RANDOM as the stub reads them (one `m`), or None."""
    rnd = random_address(stub_auxv)
    if rnd is None:
        return None
    (reply,) = yield exchange((b"m%x,%x" % (rnd, RANDOM_BYTES),))
    try:
        data = bytes.fromhex(reply.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        data = b""
    return data if len(data) == RANDOM_BYTES else None


# -- as a session procedure step ------------------------------------------------------

def prove(stub_pid: int | None, stub_auxv: bytes | None, program_path: str | None, *,
          override: str | None = None, host: HostProcs | None = None,
          exchange: Callable[[tuple[bytes, ...]], object]) -> Generator[object, list[bytes], Identity]:
    """`decide`, reading the AT_RANDOM bytes through the stub first: yields
    `exchange((b"m<addr>,10",))` and receives its reply."""
    stub_random: bytes | None = None
    if override is None and stub_pid is not None:
        stub_random = yield from read_stub_random(stub_auxv, exchange)
    return decide(stub_pid, stub_auxv, stub_random, program_path, override=override, host=host)
