"""A seeded fuzzing RSP client (scripts/fuzz-client, integration/test_fuzz_client.py).

It plays a client against the proxy in front of real gdbserver (or against
gdbserver straight, to show what the proxy shields it from), on the
multi-thread tokio benchmark, for N packets of every family except the ones
that end the session on purpose (k, D, vKill, R, !, vRun), then detaches and
checks that the program runs to its normal exit with its right result and
that no int3 is left in its code.

Each packet is a well-formed packet of its family, or a mutant of one
(a byte changed, inserted, deleted, truncated; a hex digit made 'z'). A
client that must keep its program alive never sends a packet that changes
the program unless it means it, so:
* reads (m, g, p, q..., most Q...) go as generated or mutated;
* writes go as neutral ones (M/X/G/P write back what was just read; Z/z at
  function starts and watchpoints, taken out again; resumes stop at a
  breakpoint the client keeps at `combine`, once per iteration; signals 0);
* a mutant of a family that changes the program (writes, resumes,
  breakpoints, trace points, files, modes) is sent only when the proxy's
  shield refuses it: the proxy must answer E01 without forwarding it.
  Straight against gdbserver the same stream goes to gdbserver, which is
  how it dies.
Framing faults come too: a frame with a bad (or non-hex) checksum, a frame
cut short, ack storms, a NAK of a reply (the reply comes again), junk bytes.

A `qSymbol::` is answered at once, or (half the time) left open: the stub's
symbol look-up then waits for the answer while other packets come (gdbserver
takes each as a malformed answer and replies one packet late; a `vCont;c`
runs the program inside the look-up); through the proxy every one of them but
`m` reads and `qSymbol:` answers must get E01, then the client answers.

Every wait is bounded: a reply that does not come in `timeout` seconds is
counted as a hang and the run stops.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from elftools.elf.elffile import ELFFile

from proxy.session.shield import refuse
from rsp.framing import escape_binary

SESSION_ENDING = (b"k", b"D", b"vKill", b"R", b"!", b"vRun")


# Seconds a resume may run before the client interrupts it (see _resume).
RESUME_PATIENCE = float(os.environ.get("FUZZ_RESUME_PATIENCE", "0.3"))


class Hang(Exception):
    pass


class Gone(Exception):
    """The peer closed the connection."""


@dataclass
class Figures:
    packets: int = 0
    mutants: int = 0
    refused_expected: int = 0  # dangerous mutants the proxy had to refuse
    refused_ok: int = 0  # ...and did (E01)
    unshielded: list[bytes] = field(default_factory=list)  # dangerous mutants that got another answer
    resumes: int = 0
    interrupts: int = 0
    framing_faults: int = 0
    lookups: int = 0  # stub symbol look-ups (qSymbol:NAME) the client left open for a while
    in_lookup: int = 0  # packets sent while a look-up was open
    families: Counter[str] = field(default_factory=Counter)
    hangs: int = 0
    crash: str | None = None  # why the run ended early (the stub or proxy gone, the program exited)
    elapsed: float = 0.0


class Link:
    """The client's end of the RSP link: acks, no-ack mode, bounded waits."""

    def __init__(self, address: str, timeout: float) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        # As gdb does (ser-tcp.c): without it, the ack after a reply and the
        # next packet are two small writes, and Nagle holds the second until
        # the peer's delayed ACK (about 40 ms a packet here).
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.settimeout(timeout)
        self.timeout = timeout
        self.buf = b""
        self.no_ack = False
        self.last: list[bytes] = []  # the last bytes sent (a failure report shows them)

    def _fill(self) -> None:
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise Hang("no bytes from the peer") from None
        except OSError as err:
            raise Gone(str(err)) from None
        if not chunk:
            raise Gone("the peer closed the connection")
        self.buf += chunk

    def send_raw(self, data: bytes) -> None:
        self.last.append(data[:120])
        del self.last[:-int(os.environ.get("FUZZ_LAST", "6"))]
        try:
            self.sock.sendall(data)
        except OSError as err:
            raise Gone(str(err)) from None

    def send(self, body: bytes) -> None:
        self.send_raw(b"$%b#%02x" % (body, sum(body) & 0xFF))

    def read_packet(self, patience: float | None = None, ack: bool = True, on_nak=None) -> bytes:  # type: ignore[no-untyped-def]
        """The next packet's body (acks and junk before it skipped); acked.
        `on_nak` is called for each NAK ('-') read before the packet: the peer
        wants the last frame again (RSP's retransmit rule)."""
        deadline = time.monotonic() + (patience or self.timeout)
        self.sock.settimeout(patience or self.timeout)
        while True:
            start = self.buf.find(b"$")
            prefix = self.buf if start < 0 else self.buf[:start]
            if on_nak is not None and b"-" in prefix:
                self.buf = self.buf[len(prefix):]
                for _ in range(prefix.count(b"-")):
                    on_nak()
                continue
            if start >= 0:
                end = self.buf.find(b"#", start)
                if end >= 0 and len(self.buf) >= end + 3:
                    body = self.buf[start + 1:end]
                    self.buf = self.buf[end + 3:]
                    if not self.no_ack and ack:
                        self.send_raw(b"+")
                    self.sock.settimeout(self.timeout)
                    return body
            else:
                self.buf = b""
            if time.monotonic() > deadline:
                raise Hang("no complete packet")
            self._fill()

    def request(self, body: bytes) -> bytes:
        """Send, read the reply (console `O` packets of a monitor command skipped)."""
        self.send(body)
        for _ in range(1 << 20):
            reply = self.read_packet()
            if body.startswith(b"qRcmd,") and reply[:1] == b"O" and reply != b"OK":
                continue
            if body.startswith(b"qSymbol") and reply.startswith(b"qSymbol:"):
                # the stub asks for a symbol's value: unknown to this client
                self.send(b"qSymbol::" + _rle(reply[8:]))
                continue
            return reply
        raise Hang("a reply that never ends")

    def drain_acks(self, wait: float = 0.05) -> bytes:
        self.sock.settimeout(wait)
        try:
            while True:
                self._fill()
        except (Hang, Gone):
            pass
        finally:
            self.sock.settimeout(self.timeout)
        out, self.buf = self.buf, b""
        return out

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _rle(body: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(body):
        c = body[i]
        if c == 0x2A and i > 0:  # '*': the previous byte, ord(n) - 29 more times
            out += bytes([out[-1]]) * (body[i + 1] - 29)
            i += 2
            continue
        out.append(c)
        i += 1
    return bytes(out)


def functions(path: Path) -> dict[str, tuple[int, int]]:
    """name -> (link-time address, size) of the program's functions."""
    out: dict[str, tuple[int, int]] = {}
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        sym = elf.get_section_by_name(".symtab")
        for s in sym.iter_symbols() if sym is not None else ():
            if s["st_info"]["type"] == "STT_FUNC" and s["st_size"] > 0 and s["st_value"]:
                out[s.name] = (s["st_value"], s["st_size"])
    return out


def text_segments(path: Path) -> list[tuple[int, bytes]]:
    """(link-time address, bytes) of every executable PT_LOAD: what must read back unchanged."""
    out = []
    with open(path, "rb") as fh:
        elf = ELFFile(fh)
        for seg in elf.iter_segments():
            if seg["p_type"] == "PT_LOAD" and seg["p_flags"] & 1:
                out.append((seg["p_vaddr"], seg.data()[:seg["p_filesz"]]))
    return out


def stray_int3(pid: int, path: Path, bias: int) -> list[int]:
    """Addresses where the running program's code differs from its file (an int3 left behind)."""
    diffs: list[int] = []
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        for vaddr, data in text_segments(path):
            mem = os.pread(fd, len(data), vaddr + bias)
            if mem != data:
                diffs += [vaddr + bias + i for i in range(min(len(mem), len(data))) if mem[i] != data[i]][:20]
    finally:
        os.close(fd)
    return diffs


# ----------------------------------------------------------------------------- the client

# What a mutant may not be unless the shield refuses it: it would write the
# program's memory or registers, resume it (perhaps with a signal), end the
# session, touch files, start a trace experiment at some address, or change
# the stub's mode. Reads, queries, thread selection and settings for a later
# run are sent whatever they became.
_DANGER_PREFIXES = (b"M", b"X", b"G", b"P", b"Z", b"z", b"c", b"s", b"C", b"S", b"D", b"k", b"R", b"!", b"A",
                    b"vCont;", b"vRun", b"vKill", b"vAttach", b"vFile:", b"QTDP", b"QTStart", b"QTinit",
                    b"QNonStop", b"QStartNoAckMode", b"bc", b"bs", b"i", b"I", b"r", b"d", b"t", b"b")


def dangerous(body: bytes) -> bool:
    """Could this packet change the program, the stub's mode or the session if it
    were obeyed? Then a mutant of it may be sent only when the shield refuses it."""
    if body.startswith((b"qXfer:",)) and b":write:" in body:
        return True
    if body.startswith(b"qRcmd,"):
        try:
            text = bytes.fromhex(body[6:].decode()).decode()
        except (ValueError, UnicodeDecodeError):
            return False
        return not text.startswith(("async stats", "async tasks", "async tree", "async bt", "async help",
                                    "help"))
    return body.startswith(_DANGER_PREFIXES)


def _refused(body: bytes, g_size: int | None = None) -> str | None:
    """The shield's answer as the proxy asks it: the proxy offers QNonStop
    (a mutant `QNonStop:0` -> `QNonStop:1` is a valid mode change, taken;
    seed 1000 sent it as one that must be refused)."""
    return refuse(body, g_size=g_size, non_stop_offered=True)


class Fuzzer:
    def __init__(self, link: Link, rng: random.Random, prog: Path, straight: bool) -> None:
        self.link = link
        self.rng = rng
        self.prog = prog
        self.straight = straight
        self.fig = Figures()
        self.funcs = functions(prog)
        combine = [n for n in self.funcs if "combine" in n and "tokio_bench" in n]
        if not combine:
            raise RuntimeError(f"no tokio_bench::combine in {prog}")
        self.combine_link = self.funcs[combine[0]][0]
        self.starts = sorted(a for a, _ in self.funcs.values())
        self.bias = 0
        self.pid = 0
        self.thread = b""
        self.threads: list[bytes] = []
        self.g_block: bytes | None = None
        self.rsp = 0
        self.breakpoints: set[bytes] = set()  # Z bodies in place (removed at the end)
        self.combine_bp = b""
        self.acked_noack = False
        self.lookup: bytes | None = None  # the symbol the stub asked for, left unanswered

    # -------------------------------------------------------------- setup
    def start(self) -> None:
        L = self.link
        L.request(b"qSupported:multiprocess+;swbreak+;hwbreak+;qRelocInsn+;fork-events+;vfork-events+;"
                  b"exec-events+;vContSupported+;QThreadEvents+;no-resumed+;memory-tagging+")
        stop = L.request(b"?")
        self._note_stop(stop)
        auxv = L.request(b"qXfer:auxv:read::0,1000")
        data = _unescape(_rle(auxv[1:]))
        entry = next((int.from_bytes(data[i + 8:i + 16], "little") for i in range(0, len(data) - 15, 16)
                      if int.from_bytes(data[i:i + 8], "little") == 9), None)
        with open(self.prog, "rb") as fh:
            link_entry = ELFFile(fh).header["e_entry"]
        self.bias = (entry - link_entry) if entry else 0
        self.combine_bp = b"Z0,%x,1" % (self.combine_link + self.bias)
        assert L.request(self.combine_bp) == b"OK"
        self.breakpoints.add(self.combine_bp)
        self._threads()

    def _note_stop(self, stop: bytes) -> None:
        m = re.search(rb"thread:p([0-9a-f]+)\.([0-9a-f]+);", stop)
        if m:
            self.pid = int(m.group(1), 16)
            self.thread = b"p%s.%s" % (m.group(1), m.group(2))

    def _threads(self) -> None:
        rep = self.link.request(b"qfThreadInfo")
        ids: list[bytes] = []
        for _ in range(64):
            if not rep.startswith(b"m"):
                break
            ids += [t for t in rep[1:].split(b",") if t]
            rep = self.link.request(b"qsThreadInfo")
        self.threads = ids or [self.thread]

    # -------------------------------------------------------------- one step
    def step(self) -> None:
        if self.lookup is not None:
            return self._in_lookup()
        r = self.rng.random()
        if r < 0.02:
            return self._framing_fault()
        if r < 0.07:
            return self._resume()
        if r < 0.12:
            return self._neutral_write()
        if r < 0.16:
            return self._breakpoints()
        body = self._packet()
        self.fig.families[_family(body)] += 1
        if self.rng.random() < 0.35:
            self._send_mutant(body)
        else:
            self._plain(body)

    def _plain(self, body: bytes) -> bytes:
        self.fig.packets += 1
        if body == b"QStartNoAckMode":
            rep = self.link.request(body)
            if rep == b"OK":
                self.link.no_ack = True
                self.link.drain_acks(0.005)
            return rep
        if body.startswith(b"qSymbol:") and self.rng.random() < 0.5:
            return self._ask_symbols(body)
        return self.link.request(body)

    def _ask_symbols(self, body: bytes) -> bytes:
        """A qSymbol: whose question from the stub (`qSymbol:NAME`) is left open."""
        self.link.send(body)
        rep = self.link.read_packet()
        if rep.startswith(b"qSymbol:") and len(rep) > 8:
            self.lookup = _rle(rep[8:])  # a run-length encoded reply: the name itself
            self.fig.lookups += 1
        return rep

    def _in_lookup(self) -> None:
        """A step while the stub waits for a symbol's answer: the answer, or another
        packet that the proxy must refuse unless the stub reads it there."""
        if self.rng.random() < 0.2:
            return self._end_lookup()
        body = _escape_body(self._packet())
        if body.startswith(SESSION_ENDING) or body in (b"QStartNoAckMode",) or b"\x03" in body:
            return None
        self.fig.packets += 1
        self.fig.in_lookup += 1
        self.fig.families[_family(body)] += 1
        if body.startswith(b"qSymbol:"):
            self.lookup = None
            self._ask_symbols(body)
            return None
        why = refuse(body, non_stop_offered=True, symbol_lookup=True)
        if why is None:  # an `m` read (or vFile): the stub answers it in its look-up
            self.link.request(body)
            return None
        self.fig.refused_expected += 1
        rep = self.link.request(body)
        if rep == b"E01":
            self.fig.refused_ok += 1
        elif not self.straight:
            self.fig.unshielded.append(body)
        return None

    def _end_lookup(self) -> None:
        assert self.lookup is not None
        self.fig.packets += 1
        name, self.lookup = self.lookup, None
        self.link.request(b"qSymbol::" + name)  # Link.request answers the stub's next questions

    def _send_mutant(self, body: bytes) -> None:
        for _ in range(8):
            m = self._mutate(body)
            if not m or m in (body, b"QStartNoAckMode") or m.startswith(SESSION_ENDING) or b"\x03" in m:
                continue
            m = _escape_body(m)  # what goes on the wire
            if dangerous(m):
                why = _refused(m, g_size=len(self.g_block) if self.g_block else None)
                if why is None:
                    continue  # the shield would let it through: it may do what it says; not sent
                self.fig.mutants += 1
                self.fig.refused_expected += 1
                self.fig.packets += 1
                rep = self.link.request(m)
                if rep == b"E01":
                    self.fig.refused_ok += 1
                elif not self.straight:
                    self.fig.unshielded.append(m)
                return
            self.fig.mutants += 1
            self._plain(m)
            return
        self._plain(body)

    def _mutate(self, body: bytes) -> bytes:
        rng = self.rng
        b = bytearray(body)
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            kind = rng.randrange(7)
            i = rng.randrange(len(b) + 1)
            if kind == 0 and b:
                b[min(i, len(b) - 1)] = rng.randrange(32, 127)
            elif kind == 1 and b:
                b[min(i, len(b) - 1)] = rng.randrange(256)
            elif kind == 2:
                b[i:i] = bytes(rng.randrange(32, 127) for _ in range(rng.randrange(1, 4)))
            elif kind == 3 and b:
                del b[min(i, len(b) - 1)]
            elif kind == 4:
                del b[i:]
            elif kind == 5:
                hexy = [j for j, c in enumerate(b) if chr(c) in "0123456789abcdef"]
                if hexy:
                    b[rng.choice(hexy)] = ord(rng.choice("zZgx-;,:"))
            else:
                b += bytes(rng.randrange(32, 127) for _ in range(rng.randrange(1, 12)))
        return bytes(b)

    # ---- families
    def _addr(self) -> int:
        rng = self.rng
        k = rng.randrange(6)
        if k == 0:
            return self.rng.choice(self.starts) + self.bias + rng.randrange(64)
        if k == 1 and self.rsp:
            return self.rsp + rng.randrange(-256, 4096)
        if k == 2:
            return rng.randrange(1 << 64)
        if k == 3:
            return rng.randrange(0x1000)
        if k == 4:
            return self.bias + rng.randrange(0x200000)
        return 0x7ffff7000000 + rng.randrange(1 << 24)

    def _packet(self) -> bytes:
        rng = self.rng
        t = rng.choice(self.threads) if self.threads else b"0"
        choices = [
            lambda: b"?",
            lambda: b"g",
            lambda: b"p%x" % rng.randrange(0x60),
            lambda: b"m%x,%x" % (self._addr(), rng.choice((0, 1, 8, 64, 512, 4096, 0x10000, 0xffffffff))),
            lambda: b"x%x,%x" % (self._addr(), rng.choice((0, 1, 64))),
            lambda: b"H%c%b" % (rng.choice(b"gc"), rng.choice((t, b"0", b"-1", b"p%x.-1" % self.pid))),
            lambda: b"T%b" % rng.choice((t, b"p1.1", b"0")),
            lambda: b"qC",
            lambda: b"qfThreadInfo",
            lambda: b"qsThreadInfo",
            lambda: b"qAttached:%x" % self.pid,
            lambda: b"qOffsets",
            lambda: b"qSymbol::",
            lambda: b"qTStatus",
            lambda: rng.choice((b"qTfV", b"qTsV", b"qTfP", b"qTsP", b"qTV:%x" % rng.randrange(4))),
            lambda: b"vCont?",
            lambda: b"vMustReplyEmpty",
            lambda: b"qThreadExtraInfo,%b" % t,
            lambda: b"qGetTLSAddr:%b,%x,%x" % (t, rng.randrange(64), self._addr()),
            lambda: b"qCRC:%x,%x" % (self._addr(), rng.choice((1, 64, 4096))),
            lambda: b"qSearch:memory:%x;%x;%b" % (self._addr(), rng.choice((16, 4096)), b"9090"),
            lambda: b"qXfer:%b:read:%b:%x,%x" % (rng.choice((
                (b"features", b"target.xml"), (b"features", b"64bit-avx.xml"), (b"features", b"nothing.xml"),
                (b"auxv", b""), (b"exec-file", b"%x" % self.pid), (b"threads", b""),
                (b"libraries-svr4", b""), (b"osdata", b""), (b"osdata", b"processes"), (b"osdata", b"async"),
                (b"asyncrsp.graph", b""), (b"nosuchobject", b""))) + (rng.randrange(0x800), rng.choice((1, 0x7ff, 0xfff)))),
            lambda: b"qRcmd," + rng.choice(("async stats", "async tasks", "async tree", "async bt", "async help",
                                            "async mode", "async capture", "help", "set debug 0",
                                            "async nosuch", "")).encode().hex().encode(),
            # signals passed straight to the program: only ones whose default action is
            # to ignore them (gdb's numbers: SIGURG, SIGCHLD, SIGWINCH); a passed SIGINT
            # would kill the program at the next interrupt
            lambda: b"QPassSignals:" + b";".join(rng.sample([b"10", b"14", b"1c"], rng.randrange(4))),
            lambda: b"QProgramSignals:" + b";".join(b"%x" % rng.randrange(1, 64) for _ in range(rng.randrange(4))),
            lambda: rng.choice((b"QCatchSyscalls:0", b"QCatchSyscalls:1;%x" % rng.randrange(300))),
            lambda: b"QDisableRandomization:%d" % rng.randrange(2),
            lambda: b"QEnvironmentHexEncoded:" + b"FUZZ=1".hex().encode(),
            lambda: b"QEnvironmentUnset:" + b"FUZZ".hex().encode(),
            lambda: b"QEnvironmentReset",
            lambda: b"QSetWorkingDir:" + b"/tmp".hex().encode(),
            lambda: b"QStartupWithShell:%d" % rng.randrange(2),
            lambda: b"QThreadEvents:0",
            lambda: b"QNonStop:0",
            lambda: b"QStartNoAckMode" if rng.random() < 0.1 else b"qC",
            lambda: b"vFile:setfs:0",
            lambda: b"vFile:open:%b,0,0" % b"/proc/self/maps".hex().encode(),
            lambda: b"vFile:pread:%x,%x,%x" % (rng.randrange(8), rng.randrange(4096), rng.randrange(4096)),
            lambda: b"vFile:close:%x" % rng.randrange(8),
            lambda: b"vFile:readlink:%b" % b"/proc/self/exe".hex().encode(),
            lambda: b"vFile:fstat:%x" % rng.randrange(8),
            lambda: b"qTMinFTPILen",
            lambda: b"qTBuffer:%x,%x" % (rng.randrange(64), rng.randrange(1, 64)),
            lambda: b"QTFrame:-1",
            lambda: b"QTinit" if rng.random() < 0.3 else b"QTStop",
            lambda: b"vStopped",
            lambda: b"qL1200000000000000000",
            lambda: b"qMemTags:%x,%x:1" % (self._addr(), 16),
            lambda: b"jThreadsInfo",
            lambda: b"nosuchpacket",
        ]
        return rng.choice(choices)()

    def _neutral_write(self) -> None:
        """Read, then write back the same: M, X, G, P."""
        rng, L = self.rng, self.link
        k = rng.randrange(4)
        if k < 2:
            addr = self.rsp - rng.randrange(0, 2048) if self.rsp and rng.random() < 0.7 else \
                rng.choice(self.starts) + self.bias
            n = rng.choice((1, 2, 8, 16, 64))
            rep = L.request(b"m%x,%x" % (addr, n))
            self.fig.packets += 1
            rep = _rle(rep)
            if rep[:1] == b"E" or len(rep) != 2 * n:
                return
            data = bytes.fromhex(rep.decode())
            body = b"M%x,%x:%b" % (addr, n, rep) if k == 0 else b"X%x,%x:%b" % (addr, n, escape_binary(data))
            self.fig.families["M" if k == 0 else "X"] += 1
            self.fig.packets += 1
            if self.rng.random() < 0.3:
                return self._send_mutant(body)
            L.request(body)
            return
        rep = _rle(L.request(b"g"))
        self.fig.packets += 1
        if rep[:1] == b"E" or len(rep) < 17 * 16:
            return
        self.g_block = rep
        try:
            self.rsp = int.from_bytes(bytes.fromhex(rep[7 * 16:8 * 16].decode()), "little")
        except ValueError:
            pass
        if k == 2:
            body = b"G" + rep
            self.fig.families["G"] += 1
        else:
            n = rng.randrange(17)
            body = b"P%x=%b" % (n, rep[n * 16:(n + 1) * 16])
            self.fig.families["P"] += 1
        self.fig.packets += 1
        if self.rng.random() < 0.3:
            return self._send_mutant(body)
        L.request(body)

    def _breakpoints(self) -> None:
        rng, L = self.rng, self.link
        if self.breakpoints - {self.combine_bp} and rng.random() < 0.5:
            z = rng.choice(sorted(self.breakpoints - {self.combine_bp}))
            body = b"z" + z[1:]
            self.fig.packets += 1
            self.fig.families["z"] += 1
            L.request(body)
            self.breakpoints.discard(z)
            return
        kind = rng.choice((0, 0, 1, 2, 3, 4))
        if kind <= 1:
            body = b"Z%d,%x,1" % (kind, rng.choice(self.starts) + self.bias)
        elif self.rsp:
            body = b"Z%d,%x,%x" % (kind, self.rsp - 8 * rng.randrange(64), rng.choice((1, 2, 4, 8)))
        else:
            return
        self.fig.families["Z"] += 1
        if rng.random() < 0.3:
            return self._send_mutant(body)
        self.fig.packets += 1
        if L.request(body) == b"OK":
            self.breakpoints.add(body)

    def _resume(self) -> None:
        rng, L = self.rng, self.link
        if self.combine_bp not in self.breakpoints:
            if L.request(self.combine_bp) != b"OK":
                return
            self.breakpoints.add(self.combine_bp)
            self.fig.packets += 1
        t = self.thread or b"-1"
        # a thread resumed alone (s, vCont;s:T) may wait on a stopped one forever:
        # the others continue (vCont;s:T;c), as gdb does; a stop that does not
        # come soon is interrupted, as a user would. A `c` or `C` after an
        # `Hc` of one thread resumes that thread alone (gdbserver's myresume):
        # a worker then parks and no stop comes. That is about one resume in
        # 40; waiting 5 s for each was most of a run's time (6 ms is a
        # resume's usual time to `combine` here), hence RESUME_PATIENCE.
        choices = [b"c", b"vCont;c", b"vCont;c:-1", b"C00", b"vCont;s:%b;c" % t, b"vCont;S00:%b;c" % t,
                   b"vCont;C00:%b;c" % t]
        if self.g_block:
            pc = int.from_bytes(bytes.fromhex(self.g_block[16 * 16:17 * 16].decode()), "little")
            choices.append(b"vCont;r%x,%x:%b;c" % (pc, pc + 1, t))
        body = rng.choice(choices)
        self.fig.families["resume"] += 1
        if rng.random() < 0.03:
            # valid, but resuming no thread the stub has: gdbserver 13.1 aborts
            # on it in all-stop; the proxy asks the stub and answers E01
            nobody = rng.choice((b"vCont;c:p1.1", b"vCont;s:p1.1;c:p1.2", b"vCont;c:p1.-1",
                                 b"vCont;C00:p%x.1" % self.pid))
            self.fig.refused_expected += 1
            self.fig.packets += 1
            if L.request(nobody) == b"E01":
                self.fig.refused_ok += 1
            elif not self.straight:
                self.fig.unshielded.append(nobody)
            return
        if rng.random() < 0.2:
            # a mutant of a resume: sent only when the shield refuses it
            m = _escape_body(self._mutate(body))
            if dangerous(m) and _refused(m) is not None and not m.startswith(SESSION_ENDING) and b"\x03" not in m:
                self.fig.mutants += 1
                self.fig.refused_expected += 1
                self.fig.packets += 1
                rep = L.request(m)
                if rep == b"E01":
                    self.fig.refused_ok += 1
                elif not self.straight:
                    self.fig.unshielded.append(m)
                if rep[:1] in (b"T", b"S"):
                    self._note_stop(rep)
                return
        self.fig.packets += 1
        self.fig.resumes += 1
        L.send(body)
        if rng.random() < 0.15:
            time.sleep(rng.random() * 0.002)
            L.send_raw(b"\x03")
            self.fig.interrupts += 1
        interrupted = False
        deadline = time.monotonic() + 3 * L.timeout
        while True:
            try:
                rep = L.read_packet(patience=RESUME_PATIENCE if not interrupted else None)
            except Hang:
                if interrupted or time.monotonic() > deadline:
                    raise
                L.send_raw(b"\x03")
                self.fig.interrupts += 1
                interrupted = True
                continue
            if rep[:1] == b"O" and rep != b"OK":
                continue
            break
        if rep[:1] in (b"W", b"X"):
            raise Gone(f"the program ended during the fuzz: {rep[:40]!r}")
        if rep[:1] in (b"T", b"S"):
            self._note_stop(rep)
            if rng.random() < 0.2:
                self._threads()
        self.g_block = None

    def _framing_fault(self) -> None:
        rng, L = self.rng, self.link
        self.fig.framing_faults += 1
        k = rng.randrange(5)
        if k == 0:  # a bad checksum (hex or not): NAKed, nothing else
            body = b"qC"
            cs = rng.choice((b"zz", b"00", b"g1", b"#0"))  # each a whole (bad) frame
            L.send_raw(b"$%b#%b" % (body, cs))
        elif k == 1:  # a frame cut short, then junk
            L.send_raw(b"$m%x,4" % self._addr())
        elif k == 2:  # an ack storm
            L.send_raw(b"+" * rng.randrange(1, 200))
        elif k == 3:  # junk between packets
            L.send_raw(bytes(rng.choice(b"abcxyz019+ \n\r#") for _ in range(rng.randrange(1, 40))))
        else:  # a NAK of a reply: the reply comes again
            if L.no_ack:
                return
            L.send(b"qC")
            L.read_packet(ack=False)
            L.send_raw(b"-")  # instead of the ack
            self._expect(lambda rep: rep.startswith(b"QC"))
            return
        self._resync()

    def _resync(self) -> None:
        """After framing faults: a qC until its reply comes whole, then a
        packet with a reply of its own kind (vMustReplyEmpty: empty) read up
        to: every reply the faults caused is then behind.

        In ack mode the stub (or proxy) NAKs a bad frame, and a frame cut
        short swallows the next one up to its '#': the qC is NAKed and sent
        again, as a real client does. A client that waited for a reply to a
        NAKed frame would wait out its whole timeout (this made the fuzz
        spend 30 s per cut frame in ack mode)."""
        L = self.link
        naks = 0

        def again() -> None:
            nonlocal naks
            naks += 1
            if naks > 8:
                raise Hang("every qC after a framing fault NAKed")
            L.send(b"qC")

        L.send(b"qC")
        for _ in range(16):
            if L.read_packet(on_nak=None if L.no_ack else again).startswith(b"QC"):
                break
            # the reply to a fault's frame (in no-ack mode a bad frame is
            # answered: the proxy frames it anew, the shield may refuse it)
            L.send(b"qC")
        else:
            raise Hang("no reply to qC after a framing fault")
        L.send(b"vMustReplyEmpty")
        for _ in range(16):
            if L.read_packet() == b"":
                return
        raise Hang("no empty reply to vMustReplyEmpty after a framing fault")

    def _expect(self, ok) -> None:  # type: ignore[no-untyped-def]
        for _ in range(4):
            rep = self.link.read_packet()
            if ok(rep):
                return
        raise Hang("the NAKed reply did not come again")

    # -------------------------------------------------------------- end
    def finish(self) -> bytes:
        """Take the client's breakpoints and trace experiment out, then detach."""
        L = self.link
        if self.lookup is not None:
            self._end_lookup()
        for bp in sorted(self.breakpoints):
            L.request(b"z" + bp[1:])
        for body in (b"QTStop", b"QTFrame:-1", b"QCatchSyscalls:0", b"QPassSignals:", b"QProgramSignals:"):
            L.request(body)
        return L.request(b"D;%x" % self.pid)


def _unescape(data: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(data):
        if data[i] == 0x7D and i + 1 < len(data):
            out.append(data[i + 1] ^ 0x20)
            i += 2
        else:
            out.append(data[i])
            i += 1
    return bytes(out)


def _escape_body(body: bytes) -> bytes:
    """Frame-safe: '$', '#', '}' and '*' escaped as binary data is."""
    return escape_binary(body)


def _family(body: bytes) -> str:
    m = re.match(rb"(q[A-Za-z]+|Q[A-Za-z]+|v[A-Za-z]+|j[A-Za-z]+|.)", body)
    return m.group(1).decode(errors="replace") if m else "?"


# ----------------------------------------------------------------------------- a run

@dataclass
class RunResult:
    figures: Figures
    detach_reply: bytes | None
    stray: list[int]
    program_output: str
    program_exit: int | None
    stub_alive_at_end: bool
    proxy_stderr: str = ""
    stub_exit: int | None = None

    @property
    def ok(self) -> bool:
        f = self.figures
        # tokio_bench prints check=ok only when its result is right, just before it
        # returns from main; its exit status is known when it became our orphan
        return (f.crash is None and f.hangs == 0 and not f.unshielded and not self.stray
                and self.program_exit in (0, None) and "check=ok" in self.program_output)


def run(packets: int, seed: int, *, straight: bool = False, capture: str = "auto", timeout: float = 30.0,
        iterations: int | None = None, progress=None) -> RunResult:  # type: ignore[no-untyped-def]
    """One fuzz run; returns its figures (never raises for what the peers do)."""
    from integration.harness.stubs import become_subreaper, spawn_proxy, start_stub, wait_orphan

    from integration.corpus import build

    prog = build.build(configs=["debug"], programs=["tokio_bench"])[("debug", "tokio_bench")]
    n = iterations or max(2000, packets // 8)
    become_subreaper()
    rng = random.Random(seed)
    with start_stub("gdbserver", prog, [str(n), "mt"]) as stub:
        log = ["--log-packets", os.environ["FUZZ_PROXY_LOG"].replace("{seed}", str(seed))] \
            if os.environ.get("FUZZ_PROXY_LOG") else []
        px = None if straight else spawn_proxy(stub.address, extra=["--capture", capture, *log])
        link = Link(px.address if px is not None else stub.address, timeout)
        fz = Fuzzer(link, rng, prog, straight)
        t0 = time.monotonic()
        detach = None
        try:
            fz.start()
            shown = 0
            while fz.fig.packets < packets:
                fz.step()
                if progress is not None and fz.fig.packets - shown >= 20000:
                    shown = fz.fig.packets
                    fz.fig.elapsed = time.monotonic() - t0
                    progress(fz.fig)
            detach = fz.finish()
        except Hang as err:
            fz.fig.hangs += 1
            fz.fig.crash = f"hang: {err}; last sent: {link.last!r}"
        except Gone as err:
            fz.fig.crash = f"gone: {err}; last sent: {link.last!r}"
        fz.fig.elapsed = time.monotonic() - t0
        pid = stub.find_inferior() or fz.pid
        stray: list[int] = []
        if detach == b"OK" and pid:
            try:
                stray = stray_int3(pid, prog, fz.bias)
            except OSError:
                pass
        link.close()
        err_text = ""
        if px is not None:
            try:
                px.wait(timeout=30)
            except subprocess.TimeoutExpired:
                fz.fig.crash = fz.fig.crash or "the proxy did not exit after the client left"
            px.close()
            err_text = px.stderr_text()
        try:
            stub.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        code = wait_orphan(pid, timeout=120) if pid else None
        stub.output.join(5)
        alive = stub.proc.poll() is None
        if code is None and pid:
            try:  # what the program was doing when it did not finish (for the report)
                state = next((ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                              if ln.startswith("State:")), "")
                fz.fig.crash = fz.fig.crash or f"the program did not exit after the detach ({state.strip()})"
            except OSError:
                pass
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        return RunResult(fz.fig, detach, stray, stub.output_text(), code, alive, err_text, stub.proc.poll())


def report(res: RunResult, seed: int, straight: bool) -> str:
    f = res.figures
    lines = [
        f"fuzz-client seed={seed} {'straight to gdbserver' if straight else 'through the proxy'}: "
        f"{f.packets} packets ({f.mutants} mutants, {f.resumes} resumes, {f.interrupts} interrupts, "
        f"{f.framing_faults} framing faults) in {f.elapsed:.1f} s",
        f"  symbol look-ups left open: {f.lookups} ({f.in_lookup} packets sent inside them)\n"
        f"  refused with E01 (dangerous mutants, packets inside a look-up): {f.refused_ok} of {f.refused_expected}"
        + (f"; NOT refused: {len(f.unshielded)} (first {f.unshielded[0]!r})" if f.unshielded else ""),
        f"  hangs: {f.hangs}; ended early: {f.crash or 'no'}; gdbserver exit status: {res.stub_exit}",
        f"  detach: {res.detach_reply!r}; stray int3 after detach: {len(res.stray)}"
        + (f" (first at 0x{res.stray[0]:x})" if res.stray else ""),
        f"  program exit: {res.program_exit}; result: "
        + (m.group(0) if (m := re.search(r"bench done .*", res.program_output)) else "none printed"),
        f"  families: {len(f.families)} ({', '.join(f'{k} {v}' for k, v in f.families.most_common(12))}, ...)",
        "  verdict: " + ("OK" if res.ok else "FAILED"),
    ]
    if "Traceback" in res.proxy_stderr or not res.ok:
        lines.append("  proxy stderr (end):\n" + res.proxy_stderr[-1500:])
    if not res.ok:
        notable = [ln for ln in res.program_output.splitlines()
                   if re.search(r"Assert|Invalid|internal|error|Error|fatal|Killing|invalid", ln)
                   and "qSymbol, ignoring" not in ln]
        lines.append("  stub and program output (notable lines):\n    " + "\n    ".join(notable[-12:]))
        if os.environ.get("FUZZ_DUMP"):
            Path(os.environ["FUZZ_DUMP"]).write_text(res.program_output)
    return "\n".join(lines)
