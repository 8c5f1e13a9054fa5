"""Small pure helpers for the session: packet builders and parsers for the
few bits of RSP the session core reads itself (pc and sp from a `g` block in
the order of the program's architecture, proxy/arch; the auxiliary vector,
resume packets without their signals)."""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Literal

from rsp.errors import MalformedPacket
from rsp.framing import rle_expand, unescape_binary
from rsp.packets.breakpoints import BreakpointPacket
from rsp.packets.memory import memory_bytes
from rsp.packets.qsupported import Feature
from rsp.packets.resume import Resume, ResumeAction
from rsp.packets.stop import StopReply, parse_stop_reply
from rsp.threads import ThreadId

from proxy.arch import X86_64, Arch

from .breakpoints import BpKey

PC_REGNUM_AMD64 = X86_64.regnum(X86_64.pc)
RSP_REGNUM_AMD64 = X86_64.regnum(X86_64.sp)
SIGINT = 2
SIGSTOP = 0x13  # Linux SIGSTOP (19)
SIGTRAP = 5


def _g_data(reply: bytes) -> bytes | None:
    # gdbserver marks registers it cannot read as "xx": read them as zeros
    return memory_bytes(reply.replace(b"xx", b"00"))


def pc_from_g(reply: bytes, arch: Arch = X86_64) -> int | None:
    """The pc from a `g` block in ``arch``'s order (x86-64: rip after the 16 GPRs, byte 128;
    AArch64: pc after x0-x30 and sp, byte 256)."""
    data = _g_data(reply)
    return arch.read_g(data, arch.pc) if data is not None else None


def expedite_from_g(sr: StopReply, reply: bytes, arch: Arch = X86_64) -> StopReply:
    """``sr`` with pc and sp filled in from the thread's `g` block where the stop reply did not
    carry them: QEMU's gdbstub expedites no register (``T05thread:p01.5ef3;``), and the capture
    reads sp (a poll's frame) and pc from the stop. The reply's wire form is not changed."""
    data = _g_data(reply)
    if data is None or arch.read_g(data, arch.pc) is None:
        return sr
    regs = dict(sr.registers)
    for name in (arch.pc, arch.sp):
        at = arch.g_offset(name)
        regs.setdefault(arch.regnum(name), data[at:at + 8].hex().encode())
    return dataclasses.replace(sr, registers=regs)


def stopped_pc_from_g(reply: bytes, arch: Arch = X86_64) -> int | None:
    """The pc from a `g` block, or None when the stub marks it unavailable
    (`xx`: gdbserver's answer for a thread that runs, in non-stop mode)."""
    at = 2 * arch.g_offset(arch.pc)
    if reply[at:at + 16].count(b"x"):
        return None
    return pc_from_g(reply, arch)


def stop_or_none(body: bytes) -> StopReply | None:
    """A stop reply parsed, or None when it does not parse (the session then
    passes the stub's bytes on as they are)."""
    try:
        return parse_stop_reply(body)
    except MalformedPacket:
        return None


def tid_of(thread: ThreadId | None) -> int:
    return thread.tid if thread is not None else 0


def is_console_output(body: bytes) -> bool:
    return body[:1] == b"O" and body != b"OK" and len(body) > 1


def feature_on(feats: list[Feature], name: str) -> bool:
    return any(f.name == name and f.value != "-" for f in feats)


def strip_xml_registers(feats: list[Feature]) -> list[Feature]:
    out = []
    for f in feats:
        if f.name == "xmlRegisters":
            archs = [a for a in f.value.split(",") if a and a != "i386"]
            if archs:
                out.append(Feature("xmlRegisters", ",".join(archs)))
            continue
        out.append(f)
    return out


def is_trap_reason(sr: StopReply) -> bool:
    return sr.reason in ("swbreak", "breakpoint")


def z_packet(insert: bool, key: BpKey) -> bytes:
    return BreakpointPacket(insert, key[0], key[1], key[2]).build()


def step_packet(thread: ThreadId | None) -> bytes:
    if thread is None:
        # A stop reply without a thread: the legacy step of the stub's current
        # thread. `vCont;s` would step every thread (gdbserver), and a stub that
        # names no threads may have no vCont at all (gdbserver
        # --disable-packet=threads answers it empty).
        return b"s"
    return b"vCont;s:" + thread.format(thread.pid is not None)


def without_signals(resume: Resume) -> bytes:
    """Rule 3: the signal was delivered with the first resume; don't repeat it."""
    if resume.legacy is not None:
        op = resume.legacy[:1]
        if op == b"C":
            return b"c"
        if op == b"S":
            return b"s"
        return resume.legacy
    acts = tuple(
        ResumeAction({"C": "c", "S": "s"}.get(a.op, a.op), None, a.thread, a.range)
        for a in resume.actions
    )
    return Resume(acts, None).build()


def has_signal_for(resume: Resume, thread: ThreadId) -> bool:
    a = resume.action_for(thread)
    return a is not None and a.op in ("C", "S")


def unframe(raw: bytes) -> bytes:
    """The body of one framed packet `$...#cs` (RLE expanded)."""
    start, end = raw.find(b"$"), raw.rfind(b"#")
    body = raw[start + 1:end] if start >= 0 and end > start else raw
    if b"*" in body:
        try:
            return rle_expand(body)
        except MalformedPacket:
            return body  # a broken run from the stub: passed on as it came
    return body


def auxv_entry(reply: bytes) -> int | None:
    """AT_ENTRY (9) from a qXfer:auxv reply (binary, escaped, 64-bit LE)."""
    if reply[:1] not in (b"l", b"m"):
        return None
    data = unescape_binary(reply[1:])
    for i in range(0, len(data) - 15, 16):
        key = int.from_bytes(data[i:i + 8], "little")
        if key == 9:
            return int.from_bytes(data[i + 8:i + 16], "little")
        if key == 0:
            break
    return None



def stub_file(path: bytes, size: int = 0x1000) -> Generator[tuple[bytes, ...], list[bytes], bytes | None]:
    """The first `size` bytes of a file on the stub's host (vFile:open, pread,
    close), as steps: each yield is the packets to send at once, answered
    with their replies. None when it cannot be read. The session drives it
    with Exchanges (lifecycle.stub_file), the keeper on its own wire."""
    (opened,) = yield (b"vFile:open:" + path.hex().encode() + b",0,0",)
    got = vfile_reply(opened)
    if got is None:
        return None
    read, _ = yield (b"vFile:pread:%x,%x,0" % (got[0], size), b"vFile:close:%x" % got[0])
    data = vfile_reply(read)
    return data[1] if data is not None else None


def stub_file_whole(path: bytes, limit: int = 1 << 20
                    ) -> Generator[tuple[bytes, ...], list[bytes], bytes | Literal[False] | None]:
    """A whole file on the stub's host (a /proc file's size is 0: read until a read comes back
    empty), as ``stub_file``'s steps; None when it cannot be opened, False when the stub
    knows no vFile (an empty reply: QEMU), ``limit`` bytes at most."""
    (opened,) = yield (b"vFile:open:" + path.hex().encode() + b",0,0",)
    if opened == b"":
        return False
    got = vfile_reply(opened)
    if got is None:
        return None
    fd, out = got[0], bytearray()
    while len(out) < limit:
        (read,) = yield (b"vFile:pread:%x,%x,%x" % (fd, 0x3000, len(out)),)
        data = vfile_reply(read)
        if data is None or not data[1]:
            break
        out += data[1]
    yield (b"vFile:close:%x" % fd,)
    return bytes(out)


def vfile_reply(reply: bytes) -> tuple[int, bytes] | None:
    """A `vFile:` reply, `F<result>[,errno][;attachment]` (hex numbers, the
    attachment binary-escaped): (result, attachment); None for an error
    (`F-1,errno`), an empty reply (no vFile in the stub) or garbage."""
    if reply[:1] != b"F" or reply[1:2] == b"-":
        return None
    head, _, data = reply[1:].partition(b";")
    try:
        return int(head.split(b",")[0], 16), unescape_binary(data)
    except (ValueError, MalformedPacket):
        return None
