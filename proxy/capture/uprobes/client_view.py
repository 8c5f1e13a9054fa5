"""What the client sees of a program under uprobes: as if no probe were in it.

* ``m``/``x`` replies over a site get the file's bytes back (gdbserver hides
  its own breakpoints, not the kernel's int3s);
* a client ``Z0``/``z0`` at a site goes to the stub as ``Z1``/``z1`` (a uprobe
  swallows a software breakpoint at its address), and its ``hwbreak`` stop is
  reported as the ``swbreak`` it was;
* a client write over a site, or a fifth debug register wanted, hands the
  session over to the breakpoints backend;
* a forked child gets the file's bytes back at every site; an exec stops the
  capture.

``ClientView`` is a part ``UprobeCapture`` holds (``capture.view``): it owns the client's own
breakpoints (those made hardware at sites among them); the sites, the mask and the links it
reads are the capture's (``c``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from proxy.host.procmem import host_pid_of, restore_code
from proxy.procedure import Forward, Handover, Procedure
from rsp.errors import MalformedPacket
from rsp.packets.breakpoints import SOFTWARE, parse_breakpoint
from rsp.packets.memory import build_memory_reply, parse_memory_reply, parse_read_memory, parse_write_memory

from .host import stub_pid

if TYPE_CHECKING:
    from .capture import UprobeCapture

DEBUG_REGISTERS = 4  # x86-64: DR0-DR3, shared with the client's own Z1-Z4


class ClientView:
    """The client's packets and their replies (see the module docstring)."""

    def __init__(self, capture: UprobeCapture) -> None:
        self.c = capture
        self.client_sw: set[int] = set()  # Z0 forwarded as Z0 (before install, or not a site)
        self.hw_converted: set[int] = set()  # Z0 at a site forwarded as Z1
        self.client_hw: set[tuple[int, int, int]] = set()  # the client's own Z1-Z4
        self.children_cleaned = 0  # forked children whose copies of the probes were taken out

    def client_request(self, body: bytes) -> Any:
        """Z0/z0 at a site -> Z1/z1; a write over a site or a 5th debug register -> hand over."""
        c = body[:1]
        if c in (b"Z", b"z"):
            return self._client_z(body)
        if c in (b"M", b"X") and self.c._sites_by_addr:
            try:
                w = parse_write_memory(body)
            except MalformedPacket:
                return None
            if self._overlaps(w.addr, len(w.data)):
                return _verdict("Handover", "the client writes code at a uprobe site")
        return None

    def _client_z(self, body: bytes) -> Any:
        try:
            bp = parse_breakpoint(body)
        except MalformedPacket:
            return None
        if bp.type != SOFTWARE:
            if bp.insert:
                self.client_hw.add(bp.key)
            else:
                self.client_hw.discard(bp.key)
            return None
        at_site = bp.addr in self.c._sites_by_addr and self.c.attached
        if bp.insert:
            if bp.addr in self.hw_converted:
                return _verdict("Forward", b"Z1" + body[2:])
            if not at_site:
                self.client_sw.add(bp.addr)
                return None
            if len(self.client_hw) + len(self.hw_converted) >= DEBUG_REGISTERS:
                return _verdict("Handover", "a client breakpoint at a uprobe site and no free debug register")
            self.hw_converted.add(bp.addr)
            return _verdict("Forward", b"Z1" + body[2:])
        if bp.addr in self.hw_converted:
            self.hw_converted.discard(bp.addr)
            return _verdict("Forward", b"z1" + body[2:])
        self.client_sw.discard(bp.addr)
        return None

    def client_reply(self, request: bytes, reply: bytes) -> bytes:
        if reply[:1] in (b"W", b"X") and request.startswith(b"vCont") and self._own_exit(reply):
            self.c._close_links()  # the process is gone: fold its last events, free the links
            return reply
        c = request[:1]
        if c in (b"m", b"x") and self.c._mask and reply and reply[:1] != b"E":
            return self._mask_m(request, reply)
        if self.hw_converted and b"hwbreak" in reply and reply[:1] in (b"T", b"S"):
            return self._swbreak(reply)
        return reply

    def _own_exit(self, reply: bytes) -> bool:
        """The exit of our process (not of a forked child the client follows too)."""
        from rsp.packets.stop import parse_stop_reply

        try:
            pid = parse_stop_reply(reply).pid
        except MalformedPacket:
            return True
        return pid is None or not self.c._pid or pid == stub_pid(self.c.target, self.c._pid)

    # Fork and exec, as gdbserver reports them to a client that asked for
    # fork-events+ / exec-events+ (gdb does); the session calls these hooks.
    # * fork: the kernel copies the parent's code pages with the uprobes' int3s
    #   in them, and a uprobe_multi link filtered by pid neither records the
    #   child nor takes them out of it (checked on Linux 6.18,
    #   integration/test_uprobes.py: the child runs, each of its calls traps
    #   into the kernel for nothing). The child is stopped at the report: its
    #   memory gets the file's bytes back through /proc/CHILD/mem. The capture
    #   stays with the parent.
    # * vfork: the child shares the parent's memory until it execs: nothing of
    #   its own to clean (and its calls are not recorded: another pid).
    # * exec: a new image. A link on the same file would probe it again (the
    #   kernel keys uprobes by inode) with a plan made for the old one: the
    #   links close and the capture stops, said in stats.
    def forked(self, child: object) -> Procedure | None:
        pid = int(getattr(child, "pid", 0) or getattr(child, "tid", 0) or 0)
        if pid > 0 and pid != stub_pid(self.c.target, self.c._pid) and self.c._mask:
            host = host_pid_of(self.c.target, pid)
            if host is None:
                self.c.notices.append(f"uprobes: forked child {pid} keeps the probes' int3s: it is not a "
                                    "process of this host the proxy can prove")
                return None
            self._clean_child(host)
        return None

    def exec_happened(self, path: str | None) -> None:
        self.c._close_links()
        self.c._mask, self.c._sites_by_addr = [], {}
        self.hw_converted.clear()  # the stub forgets breakpoints at an exec, and so does gdb
        self.c.note = (f"uprobes: the program exec'd {path or '?'}: capture stopped, the probes are out "
                     "of the new image (start a new session to capture it)")
        self.c.notices.append(self.c.note)

    def _clean_child(self, pid: int) -> None:
        """Put the file's bytes back at every site in a forked child's memory."""
        try:
            failed = restore_code(pid, self.c._mask)
        except OSError as err:
            self.c.notices.append(f"uprobes: forked child {pid} keeps the probes' int3s: {err}")
            return
        self.children_cleaned += 1
        if failed:
            self.c.notices.append(f"uprobes: forked child {pid}: {failed} probe sites could not be restored")

    def _mask_m(self, request: bytes, reply: bytes) -> bytes:
        """The file's bytes at the sites in a memory read's reply: ``m``, or
        ``x``, which gdb >= 16 sends to a stub that offers binary-upload+
        (gdbserver >= 16: its reply is ``b`` + escaped bytes; lldb-server's has
        no ``b``). gdbserver hides only its own breakpoints, not the kernel's
        uprobe int3s: without this gdb 16 read them (x/8xb at a site: 0xcc)."""
        try:
            req = parse_read_memory(request)
            b_prefix = req.binary and "binary-upload" in getattr(self.c.target, "stub_features", ())
            data = parse_memory_reply(reply, binary=req.binary, b_prefix=b_prefix)
        except (MalformedPacket, ValueError):
            return reply
        if not data or not self._overlaps(req.addr, len(data)):
            return reply
        return build_memory_reply(mask_bytes(req.addr, data, self.c._mask), binary=req.binary, b_prefix=b_prefix)

    def _overlaps(self, addr: int, size: int) -> bool:
        return any(a < addr + size and addr < a + len(o) for a, o in self.c._mask)

    def _swbreak(self, reply: bytes) -> bytes:
        """A stop at a client breakpoint we made hardware is reported as the software stop it was."""
        from rsp.packets.stop import parse_stop_reply

        try:
            sr = parse_stop_reply(reply)
        except MalformedPacket:
            return reply
        pc = sr.register_value(16)
        if pc is None or pc not in self.hw_converted:
            return reply
        return reply.replace(b"hwbreak:", b"swbreak:")


def mask_bytes(addr: int, data: bytes, mask: list[tuple[int, bytes]]) -> bytes:
    """`data` read at `addr` with every site's original bytes put back."""
    out = bytearray(data)
    end = addr + len(data)
    for a, orig in mask:
        if a >= end or a + len(orig) <= addr:
            continue
        for i, b in enumerate(orig):
            j = a + i - addr
            if 0 <= j < len(out):
                out[j] = b
    return bytes(out)


def _verdict(kind: str, arg: Any) -> Forward | Handover:
    return Forward(arg) if kind == "Forward" else Handover(arg)
