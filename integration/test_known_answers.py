"""What the proxy answers at a stop without the stub (proxy/session/known.py) is what the stub
answers: real gdbserver 13.1, a real program, a raw client through ``asyncrsp serve``.

At each stop the client asks its reads twice: first as they come (the proxy answers what it
knows: expedited registers, a repeated ``Hg``, a repeated thread list, memory of the proven
local program), then again after a ``vCont?``, which makes the proxy forget the stop,
so each read goes to gdbserver. Both answers must be equal. Outside truths too: the
registers against the stub's ``g`` block, code against the program's file (with the
client's and the proxy's breakpoints in it: gdbserver shows the original bytes). Stops come
from steps, from the client's breakpoint, from continues across the proxy's hidden probe;
reads follow the client's writes of memory and registers. The proxy's stats must show it
answered each kind, so the test cannot pass with the cache off.
"""

from __future__ import annotations

import re
import socket
import struct
import time

import pytest

from integration.harness.programs import build
from integration.harness.rawrsp import RawPeer
from integration.harness.stubs import start_proxy, start_stub
from integration.harness.tools import require_tool
from proxy.analysis.elf import open_elf, parse_auxv

SUPPORTED = (b"qSupported:multiprocess+;swbreak+;hwbreak+;fork-events+;vfork-events+;exec-events+;"
             b"vContSupported+;QThreadEvents+;no-resumed+;xmlRegisters=i386")
THREADS = b"qXfer:threads:read::0,1000"
AT_ENTRY = 9


class Client(RawPeer):
    def ask(self, body: bytes) -> bytes:
        reply = self.request(body)
        while reply[:1] == b"O" and reply != b"OK":
            reply = self.reply(body)
        return reply

    def interrupt_after(self, resume: bytes, seconds: float) -> bytes:
        """`resume`, then a Ctrl-C after `seconds` (no-ack mode): the stop reply."""
        self.send_packet(resume)
        time.sleep(seconds)
        self.send(b"\x03")
        return self.reply(resume)

    def monitor(self, command: str) -> str:
        self.send_packet(b"qRcmd," + command.encode().hex().encode())
        text = b""
        while True:
            reply, _ = self.read_packet()
            if not reply.startswith(b"O") or reply == b"OK":
                return text.decode()
            text += bytes.fromhex(reply[1:].decode())


def _le(hexbytes: bytes) -> int:
    return int.from_bytes(bytes.fromhex(hexbytes.decode()), "little")


def _reads(c: Client, thread: bytes, stop: bytes, extra: list[bytes]) -> list[tuple[bytes, bytes]]:
    regs = c.ask(b"g")
    rip, rsp = (_le(_expedited(stop, n, regs)) for n in (b"10", b"07"))
    asks = [b"p10", b"p7", b"p6", b"p0", b"Hg" + thread, b"m%x,10" % rip, b"m%x,40" % rsp, b"m%x,8" % (rsp + 8),
            THREADS, THREADS, *extra]
    return [(a, c.ask(a)) for a in asks]


def check_stop(c: Client, thread: bytes, stop: bytes, extra: list[bytes] = ()) -> dict[bytes, bytes]:  # type: ignore[assignment]
    """The stop's reads, as the proxy answers them and as the stub does; equal."""
    known = _reads(c, thread, stop, list(extra))
    assert c.ask(b"vCont?").startswith(b"vCont;")  # the proxy forgets the stop: every read to the stub
    stub = _reads(c, thread, stop, list(extra))
    assert known == stub, (known, stub)
    g = c.ask(b"g")  # the stub's whole register block (amd64: 8 bytes each, rip the 17th)
    got = dict(stub)
    # gdbserver 13.1 (x86-64) has no `p`: every one answered empty, by the proxy too
    assert got[b"p7"] in (b"", g[7 * 16:8 * 16]) and got[b"p10"] in (b"", g[16 * 16:17 * 16])
    assert got[b"Hg" + thread] == b"OK" and got[THREADS].startswith(b"l<threads>")
    return got


def _expedited(stop: bytes, regnum: bytes, regs: bytes) -> bytes:
    """A register from the stop reply, else from the `g` block (the proxy's SIGINT stop for a
    Ctrl-C during one of its hidden stops names the thread only)."""
    m = re.search(rb"[T;]%b:([0-9a-f]{16});" % regnum, stop)
    n = int(regnum, 16)
    return m.group(1) if m else regs[n * 16:(n + 1) * 16]


def _ret_of(c: Client) -> int:
    """The return address at the top of the stack (a stop at a function's first instruction)."""
    rsp = _le(c.ask(b"g")[7 * 16:8 * 16])
    return _le(c.ask(b"m%x,8" % rsp))


def _thread(stop: bytes) -> bytes:
    m = re.search(rb"thread:([0-9a-fp.]+);", stop)
    assert m, stop
    return m.group(1)


@pytest.mark.parametrize("capture", ["breakpoints", "uprobes"])
def test_answers_at_stops_are_the_stubs(capture: str) -> None:
    require_tool("gdbserver")
    prog = build("spin")
    elf = open_elf(prog)
    (probed,) = [s.addr for s in elf.symbols_named("probed")]
    (calls,) = [s.addr for s in elf.symbols_named("calls")]
    with start_stub("gdbserver", prog, ["60"]) as stub, \
            start_proxy(stub.address, probes=["^probed$"], extra=["--capture", capture]) as px:
        host, port = px.address.rsplit(":", 1)
        c = Client(socket.create_connection((host, int(port)), timeout=30), timeout=30)
        try:
            c.ask(SUPPORTED)
            if c.ask(b"QStartNoAckMode") == b"OK":
                c.noack = True
            c.ask(b"Hgp0.0")
            thread = _thread(c.ask(b"?"))
            auxv = c.ask(b"qXfer:auxv:read::0,1000")
            bias = parse_auxv(auxv[1:].replace(b"}\x03", b"#").replace(b"}\x04", b"$")
                              .replace(b"}]", b"}").replace(b"}\n", b"*"))[AT_ENTRY] - elf.entry
            probed_at, calls_at = probed + bias, calls + bias
            code = elf.read(probed, 16)
            assert code is not None and b"\xcc" not in code
            code_read = b"m%x,10" % probed_at
            # steps from the program's first instruction (the dynamic loader's)
            for _ in range(3):
                stop = c.ask(b"vCont;s:" + thread)
                check_stop(c, thread, stop, [code_read])
            # the client's breakpoint where the proxy has its probe; continue to it
            assert c.ask(b"Z0,%x,1" % probed_at) == b"OK"
            for _ in range(2):
                stop = c.ask(b"vCont;c")
                assert stop[:3] == b"T05", stop
                thread = _thread(stop)
                got = check_stop(c, thread, stop, [code_read, b"m%x,8" % calls_at])
                assert bytes.fromhex(got[code_read].decode()) == code  # the original bytes, not int3
            # a write of memory, then of a register (the same value: the program runs on)
            counter = _le(got[b"m%x,8" % calls_at])
            new = struct.pack("<Q", counter + 1000).hex().encode()
            assert c.ask(b"M%x,8:%b" % (calls_at, new)) == b"OK"
            assert c.ask(b"m%x,8" % calls_at) == new
            regs = c.ask(b"g")  # (gdbserver 13.1 has no `P` either)
            assert c.ask(b"G" + regs) == b"OK"
            assert c.ask(b"g") == regs
            assert c.ask(b"z0,%x,1" % probed_at) == b"OK"
            for _ in range(4):  # steps across the probe's call, the proxy's hidden stops
                stop = c.ask(b"vCont;s:" + thread)
                got = check_stop(c, thread, stop, [code_read, b"m%x,8" % calls_at])
                assert bytes.fromhex(got[code_read].decode()) == code
                assert _le(got[b"m%x,8" % calls_at]) >= counter + 1000  # the write is seen
            # gdb's way at each stop: its breakpoints out, reads, back in, resume; the proxy
            # keeps the breakpoint in the stub meanwhile (session/breakpoints.py). Where the
            # loop returns from probed (not the probe's own address: a breakpoint there is the
            # proxy's too, or a hardware one under uprobes)
            assert c.ask(b"Z0,%x,1" % probed_at) == b"OK"
            stop = c.ask(b"vCont;c")
            assert stop[:3] == b"T05", stop
            ret_at = _ret_of(c)
            assert c.ask(b"z0,%x,1" % probed_at) == b"OK"
            ret_code = elf.read(ret_at - bias, 8)
            ret_read = b"m%x,8" % ret_at
            assert c.ask(b"Z0,%x,1" % ret_at) == b"OK"
            for _ in range(2):
                stop = c.ask(b"vCont;c")
                assert stop[:3] == b"T05" and b"swbreak" in stop, stop
                thread = _thread(stop)
                assert c.ask(b"z0,%x,1" % ret_at) == b"OK"  # kept in the stub
                known = _reads(c, thread, stop, [code_read, ret_read])
                assert c.ask(b"Z0,%x,1" % ret_at) == b"OK"  # never left it
                assert c.ask(b"z0,%x,1" % ret_at) == b"OK"
                assert c.ask(b"vCont?").startswith(b"vCont;")  # out of the stub now; the stop forgotten
                stub = _reads(c, thread, stop, [code_read, ret_read])
                assert known == stub, (known, stub)
                got = dict(stub)
                assert bytes.fromhex(got[code_read].decode()) == code
                assert bytes.fromhex(got[ret_read].decode()) == ret_code
                assert c.ask(b"Z0,%x,1" % ret_at) == b"OK"
            assert c.ask(b"z0,%x,1" % ret_at) == b"OK"
            # removed for good: the program runs past it until the client's Ctrl-C
            stop = c.interrupt_after(b"vCont;c", 0.3)
            assert stop[:3] == b"T02", stop
            check_stop(c, _thread(stop), stop, [code_read, ret_read])
            # gdbserver 13.1 leaves no thread selected after a vFile: its `p` then answers
            # empty until the next Hg (why a vFile makes the proxy forget the stop)
            assert c.ask(b"vFile:setfs:0")[:1] == b"F"
            assert c.ask(b"p10") == b""
            stats = c.monitor("async stats --all")
            m = re.search(r"answered at stops without the stub: (\d+) registers, (\d+) thread selections, "
                          r"(\d+) thread lists, (\d+) memory reads \(\d+ left to the stub\), (\d+) breakpoints", stats)
            assert m, stats
            assert all(int(n) > 0 for n in m.groups()), stats
        finally:
            c.close()
