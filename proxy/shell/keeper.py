"""The keeper: the program left whole when the proxy dies without leaving.

A proxy killed with SIGKILL (or dead of a bug) cannot take its breakpoints
out. gdbserver 13.1 does not either: when its client's connection drops
while the program runs with Z0 breakpoints in it, the program dies (SIGTRAP,
or SIGSEGV: seen with 40 Z0s and `--once --attach`, a raw client closing its
socket; the fault campaign's breakpoint backend lost 8 of 10 programs so).

So the proxy starts a keeper next to it for a socket stub: a fork of the
proxy in its own session (a kill of the proxy's process group leaves it), holding
a copy of the stub socket's descriptor, the read end of a pipe, and a shared
memory mapping. The proxy writes its leave plan into that mapping whenever it
changes (JSON: every breakpoint in the stub, whether a trace experiment runs,
the detach packet, the stub's ack mode, the program's host pid; `SharedPlan`),
and `bye` on the pipe when it ends having left the program itself. The plan
changes with every breakpoint the client inserts or removes (gdb: a Z0/z0
pair around each `stepi`, 4 changes with gdb's two breakpoints); on the pipe
each change was a write and a wake-up of the keeper, which parsed it: 30-34 ms
of the keeper's CPU over 300 `stepi` (1,300-1,600 wake-ups, ~100 µs a stepi
on top of the proxy's ~600), 1.3-1.4 ms in shared memory (load 5). The keeper
reads the plan only when it must act. The pipe closing without
`bye` means the proxy is gone: the keeper stops the program (0x03, unless a stop is already waiting
on the socket), passes no signal (`QProgramSignals:`), takes every
breakpoint out, stops the trace experiment, consumes a SIGINT that waits in
the kernel (a 0x03 to a stopped program becomes one; checked in /proc for a
program of this host; a program that is stopped already - every thread in
a tracing stop, a SIGINT pending that nobody takes - is seen so in 0.5 s,
not after 10 s of waiting for a reply), then does what gdbserver does when its client
vanishes - detaches an attached program, kills one it started - and ends. Uprobes need none of this: the
kernel removes them with the proxy's links.

Not covered: a stub spawned by the proxy on a pipe (it goes with the proxy).
A remote program's pending SIGINT is read in the stub's own /proc through
vFile; a remote program that does not stop at the 0x03 gets no SIGINT of
the keeper's (its pid is not one of this host).
"""

from __future__ import annotations

import gc
import json
import mmap
import os
import select
import signal
import socket
import struct
import sys
import time
from typing import Any

from rsp.connection import Connection
from rsp.reader import Packet


class SharedPlan:
    """The leave plan in memory the proxy and its keeper share (a fork keeps the
    mapping): two slots, each ``seq, length, JSON, seq``. A write goes to the
    older slot: its first seq is zeroed, then the JSON, the second seq, and
    the first seq last, so a proxy killed in the middle of a write leaves a
    slot whose two seqs differ (or are 0) and the other slot whole. `read`
    takes the whole slot with the higher seq. A plan too large for a slot is
    written on the pipe instead (with its seq)."""

    SLOT = 1 << 18  # bytes per slot: ~8,000 breakpoints' z packets; pages are touched as used
    _SEQ = struct.Struct("<Q")
    _HEAD = struct.Struct("<QI")

    def __init__(self, buf: Any = None) -> None:
        self.buf = buf if buf is not None else mmap.mmap(-1, 2 * self.SLOT)  # MAP_SHARED | MAP_ANONYMOUS
        self.seq = 0

    def _slot(self, i: int) -> tuple[int, int, int]:
        """(first seq, length, second seq) of slot i (the second read only for a sane length)."""
        base = i * self.SLOT
        first, n = self._HEAD.unpack_from(self.buf, base)
        if n > self.SLOT - self._HEAD.size - self._SEQ.size:
            return first, n, -1
        (second,) = self._SEQ.unpack_from(self.buf, base + self._HEAD.size + n)
        return first, n, second

    def write(self, data: bytes) -> bool:
        """Store `data` (False: too large for a slot, nothing written)."""
        if len(data) > self.SLOT - self._HEAD.size - self._SEQ.size:
            self.seq += 1
            return False
        self.seq += 1
        i = 0 if self._slot(0)[0] <= self._slot(1)[0] else 1
        base = i * self.SLOT
        self._SEQ.pack_into(self.buf, base, 0)
        self._HEAD.pack_into(self.buf, base, 0, len(data))
        end = base + self._HEAD.size + len(data)
        self.buf[base + self._HEAD.size:end] = data
        self._SEQ.pack_into(self.buf, end, self.seq)
        self._SEQ.pack_into(self.buf, base, self.seq)
        return True

    def read(self) -> tuple[int, dict[str, Any] | None]:
        """(seq, plan) of the newest whole slot; (0, None) when there is none."""
        best: tuple[int, dict[str, Any] | None] = (0, None)
        for i in (0, 1):
            first, n, second = self._slot(i)
            if first == 0 or first != second or first <= best[0]:
                continue
            base = i * self.SLOT + self._HEAD.size
            try:
                best = (first, json.loads(bytes(self.buf[base:base + n])))
            except ValueError:
                continue
        return best


class Keeper:
    """The proxy's side: start the keeper once there is something to keep
    (the first plan that is not empty: most sessions that never resume start
    none), keep its plan current, say bye."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.pid = 0
        self.pipe = -1
        self.plan: dict[str, Any] = {}
        self.shared: SharedPlan | None = None

    @classmethod
    def for_stub(cls, sock: Any) -> Keeper | None:
        """A keeper for the stub connection `sock` (a socket, or None: not a socket stub)."""
        return None if sock is None else cls(sock)

    def _start(self) -> bool:
        """Fork the keeper (no new interpreter: a `python -m` keeper cost
        ~65-100 ms of CPU per session, its start-up and imports, and GDB's
        testsuite starts one in nearly every one of its 93 sessions). The
        child keeps only the stub socket and the pipe's read end (the client's
        socket, the listener, uprobe links and the event loop's descriptors
        close at once: a dead proxy must look dead to its client), and never
        returns into the proxy's code."""
        fd = self.sock.fileno()
        try:
            shared = SharedPlan()
        except (OSError, ValueError):
            return False
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return False
        if pid == 0:  # pragma: no cover - the child; integration/test_program_left_whole.py runs it
            code = 1
            try:
                gc.disable()  # the proxy's objects are not this process's to finalize
                os.setsid()  # a kill of the proxy's process group leaves it
                # its own name in ps/top/pkill (comm): a fork shares the proxy's command line, and
                # `pkill asyncrsp` should not take the keeper with the proxy it outlives
                with open("/proc/self/comm", "w") as comm:
                    comm.write("asyncrsp-keeper")
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
                    signal.signal(sig, signal.SIG_DFL)
                signal.set_wakeup_fd(-1)
                null = os.open(os.devnull, os.O_RDWR)
                os.dup2(null, 0)
                os.dup2(null, 1)
                lo, hi = sorted((fd, r))
                os.closerange(3, lo)
                os.closerange(lo + 1, hi)
                os.closerange(hi + 1, 1 << 20)
                code = main([str(fd), str(r)], shared)
            finally:
                os._exit(code)
        os.close(r)
        self.pid = pid
        self.pipe = w
        self.shared = shared
        return True

    def update(self, plan: dict[str, Any]) -> None:
        if plan == self.plan:
            return
        if not self.pid and not self._start():
            return
        self.plan = plan
        data = json.dumps(plan).encode()
        assert self.shared is not None
        if not self.shared.write(data):
            self._write(b"%d " % self.shared.seq + data + b"\n")  # too large for shared memory

    def bye(self) -> None:
        """The proxy leaves the program itself (or nothing of its is there).
        Not waited for: the keeper ends on reading it, and the proxy's exit
        does not wait for that (it is reaped here if it has, else by init)."""
        if not self.pid:
            return
        self._write(b"bye\n")
        self.abandon()
        try:
            os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pass

    def abandon(self) -> None:
        """The proxy ends without having left the program: the keeper does it."""
        if self.pipe >= 0:
            try:
                os.close(self.pipe)
            except OSError:
                pass
            self.pipe = -1

    def _write(self, data: bytes) -> None:
        try:
            os.write(self.pipe, data)
        except OSError:
            pass  # the keeper is gone: nothing to do about it here


# ----------------------------------------------------------------- the keeper


class _Wire:
    """A blocking RSP client on the stub socket, in the proxy's ack mode
    (rsp.connection does the framing and the acks)."""

    def __init__(self, sock: socket.socket, noack: bool) -> None:
        self.sock = sock
        self.gone = False  # the program exited
        self.conn = Connection()
        if noack:
            self.conn.set_no_ack()

    def send(self, body: bytes) -> None:
        self.conn.send_packet(body)
        self._flush()

    def _flush(self) -> None:
        out = self.conn.data_to_send()
        if out:
            self.sock.sendall(out)

    def packet(self, timeout: float) -> bytes | None:
        """The next packet's body (notifications skipped), or None."""
        deadline = time.monotonic() + timeout
        while True:
            while (ev := self.conn.next_event()) is not None:
                self._flush()
                if isinstance(ev, Packet):
                    return ev.body
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                return None
            data = self.sock.recv(65536)
            if not data:
                raise EOFError("the stub closed the connection")
            self.conn.feed(data)

    def request(self, body: bytes, timeout: float = 3.0) -> bytes | None:
        """The reply to `body`. A stop reply that comes meanwhile is not it
        (a second stop after the 0x03 and the keeper's own SIGINT, under
        load: the detach was once answered `T05swbreak...`), unless `body`
        resumes; an exit ends the wait (`self.gone`)."""
        self.send(body)
        resumes = body.startswith((b"vCont;", b"c", b"s"))
        deadline = time.monotonic() + timeout
        while (got := self.packet(max(deadline - time.monotonic(), 0.0))) is not None:
            if got[:1] in (b"W", b"X"):
                self.gone = True
                return got
            if resumes or got[:1] not in (b"T", b"S"):
                return got
        return None


def _is_stop(body: bytes | None) -> bool:
    return body is not None and body[:1] in (b"T", b"S", b"W", b"X")


# How long a program of this host must look held (every thread in a tracing
# stop, a SIGINT pending that nobody takes) before the keeper takes it for
# stopped without a stop reply.
HELD_FOR = 0.5


def _held(pid: int) -> bool:
    """The program is stopped by its tracer and stays so: a SIGINT waits in
    the kernel (the 0x03's, or the keeper's own) and every thread is in a
    tracing stop. A running thread would take the SIGINT at once."""
    from proxy.host.procmem import sigint_pending  # here only: the keeper starts with every session

    try:
        if not sigint_pending(pid):
            return False
        for t in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{t}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] not in ("t", "T"):
                    return False
    except (OSError, IndexError):
        return False
    return True


def _wait_stop(wire: _Wire, pid: int | None, timeout: float) -> tuple[bytes | None, bool]:
    """The stop reply after an interrupt, or (None, True) once a program of
    this host has looked held for HELD_FOR s: it was stopped already (the
    proxy died in a hidden stop, gdbserver waiting for its next packet), and
    neither the 0x03 nor a SIGINT brings a reply. Without this the keeper
    waited out 2 s and 8 s: the program stood still 10 s after the proxy's
    death (most proxy kills under breakpoint capture, fault campaign)."""
    deadline = time.monotonic() + timeout
    since = None
    while (left := deadline - time.monotonic()) > 0:
        got = wire.packet(min(left, 0.1))
        if got is not None:
            return got, False
        if pid and _held(pid):
            since = since if since is not None else time.monotonic()
            if time.monotonic() - since >= HELD_FOR:
                return None, True
        else:
            since = None
    return None, False


def _sigint_waiting(wire: _Wire, pid: int | None, stub_pid: int | None) -> bool:
    """A SIGINT waits in the kernel for the program: this host's /proc for a
    program of this host; otherwise the stub's own /proc/PID/status, read
    through vFile (as the session does, lifecycle.sigint_waiting_now). A
    0x03 to a program stopped in a hidden stop becomes such a SIGINT: with
    `--remote`, 7 of 15 programs died of it after the keeper's detach
    (`scripts/fault-campaign --victims proxy --backends breakpoints
    --proxy-arg=--remote`)."""
    if pid:
        from proxy.host.procmem import sigint_pending  # here only: the keeper starts with every session

        try:
            return sigint_pending(pid)
        except OSError:
            return False
    from proxy.host.procmem import sigint_in_status
    from proxy.session.wire import stub_file
    from rsp.errors import MalformedPacket
    from rsp.framing import rle_expand

    def expanded(reply: bytes | None) -> bytes:
        try:  # gdbserver run-length encodes its replies, a file's text too ("VmLck:\t *\" 0 kB")
            return rle_expand(reply or b"")
        except MalformedPacket:
            return b""  # no vFile reply: unreadable

    steps = stub_file(b"/proc/%d/status" % stub_pid)
    try:
        bodies = next(steps)
        while True:
            replies = [wire.request(body) for body in bodies]  # the close goes out whatever the read said
            bodies = steps.send([expanded(r) for r in replies])
    except StopIteration as done:
        text = done.value
    return text is not None and sigint_in_status(text.decode(errors="replace"))


def leave(sock: socket.socket, plan: dict[str, Any]) -> str:
    """Take the proxy's things out of the program and detach; returns what was done."""
    wire = _Wire(sock, bool(plan.get("noack")))
    stopped = False
    while (got := wire.packet(0.2)) is not None:  # replies the proxy never read
        if got[:1] in (b"W", b"X"):
            return "the program had ended"
        stopped = stopped or _is_stop(got)
    pid = plan.get("host_pid")
    # Not "all threads in a tracing stop" from /proc alone: under tracepoints
    # the threads sit in such stops all the time (the keeper once took a
    # running program for a stopped one and talked to gdbserver's interrupt
    # reader). With a SIGINT pending that no thread takes, it is stopped
    # (_wait_stop). A 0x03 to a program that was stopped after all leaves a
    # SIGINT in the kernel, consumed below.
    if not stopped:
        sock.sendall(b"\x03")
        got, held = _wait_stop(wire, pid, 2.0)
        if got is None and not held and pid:
            # gdbserver 13.1 interrupts with a kill of the program's process
            # group: an attached program that leads none is never stopped
            # ("Sending SIGINT to process group of pid N failed"). The
            # program's own SIGINT stops it the same way (passed to nobody:
            # QProgramSignals below). Under tracepoints the 0x03 did not stop
            # a program that leads its group either (8 of 12 runs, 8 s of
            # waiting: the keeper gave up, and gdbserver's own exit path left
            # the tracepoints in: SIGTRAP); the program's own SIGINT did.
            # Rarely, gdbserver 13.1, busy with tracepoint hits, then lost a
            # thread ("resuming thread: No such process") and asserted at its
            # exit (known limit).
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                pass
            got, held = _wait_stop(wire, pid, 8.0)
        if got is not None and got[:1] in (b"W", b"X"):
            return "the program had ended"
    wire.request(b"QProgramSignals:")
    for z in plan.get("z", []):
        wire.request(z.encode())
    if plan.get("trace") and not wire.gone:  # QTStop after the exit crashes gdbserver 13.1
        wire.request(b"QTStop")
        wire.request(b"QTinit")
    if wire.gone:
        return "the program had ended"
    stub_pid = plan.get("stub_pid")
    if pid or stub_pid:
        for _ in range(3):
            if not _sigint_waiting(wire, pid, stub_pid):
                break
            got = wire.request(b"vCont;c")  # stops at once with the SIGINT, passed to nobody
            if got is not None and got[:1] in (b"W", b"X"):
                return "the program had ended"
    # What gdbserver does when its client vanishes: an attached program is
    # detached, one it started is killed (gdbserver --once).
    detach = plan.get("detach", "D").encode()
    attached = wire.request(b"qAttached" + (b":" + detach[2:] if detach.startswith(b"D;") else b""))
    if attached == b"0":
        wire.request(b"vKill;" + detach[2:] if detach.startswith(b"D;") else b"k", timeout=5.0)
        return f"{len(plan.get('z', []))} breakpoint(s) out, the program it started killed (as gdbserver does)"
    reply = wire.request(detach, timeout=5.0)
    return f"{len(plan.get('z', []))} breakpoint(s) out, detach {reply.decode(errors='replace') if reply else 'unanswered'}"


def main(argv: list[str], shared: SharedPlan | None = None) -> int:
    sock = socket.socket(fileno=int(argv[0]))
    plan: dict[str, Any] | None = None
    seq = 0
    with os.fdopen(int(argv[1]), "rb") as pipe:
        for line in pipe:
            if line == b"bye\n":
                return 0
            head, _, body = line.partition(b" ")  # "SEQ PLAN": a plan too large for shared memory
            try:
                seq, plan = int(head), json.loads(body)
            except ValueError:
                continue
    if shared is not None:
        newer, got = shared.read()
        if got is not None and newer > seq:
            plan = got
    if not plan or not (plan.get("z") or plan.get("trace")):
        return 0  # nothing of the proxy's in the program
    try:
        done = leave(sock, plan)
    except (OSError, EOFError) as err:
        done = f"could not leave the program: {err}"
    print(f"asyncrsp: the proxy ended without leaving the program; its keeper did: {done}",
          file=sys.stderr, flush=True)
    sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
