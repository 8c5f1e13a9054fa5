"""Shield the stub from client packets it cannot take.

gdbserver 13.1 dies of a bad hex digit in most packets it parses: its hex
reader calls error() outside any handler ("Invalid hex digit 122"), the
connection drops and the program it debugs is killed with it. A ``vCont;t``
in all-stop mode trips an assertion (``wait_1: Assertion 'target_options &
TARGET_WNOHANG' failed``), and ``Hcp-1.-1`` is "invalid remote ptid", also
fatal. (Found by sending one malformed packet of each family to a fresh
gdbserver: tests/proxy/session/test_shield.py lists them, and
integration/test_shield.py shows gdbserver dying straight and surviving
behind the proxy.)

`refuse(body, ...)` checks a client packet against the grammar of its
family; the session answers a refused one with ``E01`` itself and never
forwards it. Packets of families not listed here pass unchanged. The check
is syntax and mode only: a well-formed packet is the stub's to judge.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from rsp.errors import MalformedPacket
from rsp.framing import unescape_binary
from rsp.packets.breakpoints import parse_breakpoint
from rsp.packets.resume import parse_resume
from rsp.threads import ThreadId

ERROR_REPLY = b"E01"

_HEX = rb"[0-9a-fA-F]"
_NUM = _HEX + rb"{1,16}"  # a 64-bit number: more digits is not an address or a length
_BYTES = rb"(?:" + _HEX + _HEX + rb")*"
_THREAD_SUFFIX = rb"(?:;thread:" + _NUM + rb";?)?"  # lldb's QThreadSuffixSupported


def _full(pattern: bytes) -> Callable[[bytes], bool]:
    rx = re.compile(pattern, re.S)
    return lambda body: rx.fullmatch(body) is not None


# Families whose whole grammar is a regular expression (the packet's letters
# included). Each is a packet gdbserver parses with its fatal hex reader, or
# one whose wrong form gets a wrong answer rather than an error.
_GRAMMAR: list[tuple[bytes, Callable[[bytes], bool], str]] = [
    (b"m", _full(rb"m" + _NUM + rb"," + _NUM), "m addr,length"),
    (b"x", _full(rb"x" + _NUM + rb"," + _NUM), "x addr,length"),
    (b"M", _full(rb"M" + _NUM + rb"," + _NUM + rb":" + _BYTES), "M addr,length:hex"),
    (b"g", _full(rb"g" + _THREAD_SUFFIX), "g"),
    (b"G", _full(rb"G(?:[0-9a-fA-Fx]{2})*" + _THREAD_SUFFIX), "G hex"),
    (b"p", _full(rb"p" + _NUM + _THREAD_SUFFIX), "p regnum"),
    (b"P", _full(rb"P" + _NUM + rb"=(?:[0-9a-fA-Fx]{2})+" + _THREAD_SUFFIX), "P regnum=hex"),
    (b"qRcmd,", _full(rb"qRcmd," + _BYTES), "qRcmd,hex"),
    (b"QPassSignals:", _full(rb"QPassSignals:(?:" + _HEX + rb"{1,2}(?:;" + _HEX + rb"{1,2})*;?)?"),
     "QPassSignals:sig;..."),
    (b"QProgramSignals:", _full(rb"QProgramSignals:(?:" + _HEX + rb"{1,2}(?:;" + _HEX + rb"{1,2})*;?)?"),
     "QProgramSignals:sig;..."),
    (b"QCatchSyscalls:", _full(rb"QCatchSyscalls:(?:0|1(?:;" + _HEX + rb"{1,8})*)"), "QCatchSyscalls:0|1;sysno..."),
    (b"QEnvironmentHexEncoded:", _full(rb"QEnvironmentHexEncoded:" + _BYTES), "QEnvironmentHexEncoded:hex"),
    (b"QEnvironmentUnset:", _full(rb"QEnvironmentUnset:" + _BYTES), "QEnvironmentUnset:hex"),
    (b"QSetWorkingDir:", _full(rb"QSetWorkingDir:" + _BYTES), "QSetWorkingDir:hex"),
    (b"qSearch:memory:", _full(rb"qSearch:memory:" + _NUM + rb";" + _NUM + rb";.*"), "qSearch:memory:addr;length;pattern"),
    (b"qCRC:", _full(rb"qCRC:" + _NUM + rb"," + _NUM), "qCRC:addr,length"),
    (b"qThreadExtraInfo,", lambda body: _thread_ok(body[17:]), "qThreadExtraInfo,thread"),
    (b"qGetTLSAddr:", lambda body: _tls_ok(body), "qGetTLSAddr:thread,offset,lm"),
    (b"qGetTIBAddr:", lambda body: _thread_ok(body[12:]), "qGetTIBAddr:thread"),
    (b"QDisableRandomization:", _full(rb"QDisableRandomization:[01]"), "QDisableRandomization:0|1"),
    (b"QNonStop:", _full(rb"QNonStop:[01]"), "QNonStop:0|1"),
    (b"QThreadEvents:", _full(rb"QThreadEvents:[01]"), "QThreadEvents:0|1"),
    (b"QStartupWithShell:", _full(rb"QStartupWithShell:[01]"), "QStartupWithShell:0|1"),
    (b"QAgent:", _full(rb"QAgent:[01]"), "QAgent:0|1"),
    # trace experiment packets whose fields are numbers (gdbserver reads them with its hex reader)
    (b"QTDV:", _full(rb"QTDV:" + _NUM + rb":" + _NUM + rb":" + _NUM + rb":" + _BYTES), "QTDV:n:value:builtin:name"),
    (b"qTV:", _full(rb"qTV:" + _NUM), "qTV:n"),
    (b"qTP:", _full(rb"qTP:" + _NUM + rb":" + _NUM), "qTP:n:addr"),
    (b"QTFrame:", _full(rb"QTFrame:(?:-?" + _NUM + rb"|pc:" + _NUM + rb"|tdp:" + _NUM + rb"|(?:range|outside):"
                        + _NUM + rb":" + _NUM + rb")"), "QTFrame:..."),
    (b"qTBuffer:", _full(rb"qTBuffer:" + _NUM + rb"," + _NUM), "qTBuffer:offset,length"),
    (b"QTBuffer:size:", _full(rb"QTBuffer:size:-?" + _NUM), "QTBuffer:size:n"),
    (b"QTBuffer:circular:", _full(rb"QTBuffer:circular:[01]"), "QTBuffer:circular:0|1"),
    (b"QTro:", _full(rb"QTro(?::" + _NUM + rb"," + _NUM + rb")*"), "QTro:start,end..."),
    (b"QTDisconnected:", _full(rb"QTDisconnected:[01]"), "QTDisconnected:0|1"),
    (b"QTNotes:", _full(rb"QTNotes:(?:(?:user|notes|tstop):" + _BYTES + rb";?)*"), "QTNotes:..."),
    (b"QTDPsrc:", _full(rb"QTDPsrc:" + _NUM + rb":" + _NUM + rb":[a-z]+:" + _NUM + rb":" + _NUM + rb":" + _BYTES),
     "QTDPsrc:n:addr:type:start:slen:hex"),
    (b"QTSave:", _full(rb"QTSave:" + _BYTES), "QTSave:hex"),
    (b"vFile:", lambda body: _vfile(body), "vFile:operation:args"),
]


# The families by their first byte: a packet is checked against its own
# letter's few (in _GRAMMAR's order), not all 38 (the shield runs on every
# client packet; most are `m`, `g`, `p`).
_GRAMMAR_BY_HEAD: dict[int, list[tuple[bytes, Callable[[bytes], bool], str]]] = {}
for _entry in _GRAMMAR:
    _GRAMMAR_BY_HEAD.setdefault(_entry[0][0], []).append(_entry)


def _vfile(body: bytes) -> bool:
    """vFile:OP:args with hex numbers and hex-encoded file names (gdbserver's
    hostio: a bad digit there is fatal too). pwrite's data is binary."""
    op, _, args = body[6:].partition(b":")
    n = _NUM.decode()
    simple = {
        b"open": rf"{_BYTES.decode()},{n},{n}",
        b"close": n,
        b"pread": rf"{n},{n},{n}",
        b"fstat": n,
        b"unlink": _BYTES.decode(),
        b"readlink": _BYTES.decode(),
        b"setfs": n,
        b"stat": _BYTES.decode(),
        b"lstat": _BYTES.decode(),
    }
    if op == b"pwrite":
        return re.match(rf"{n},{n},".encode(), args) is not None
    rx = simple.get(op)
    return rx is None or re.fullmatch(rx.encode(), args, re.S) is not None


def _tls_ok(body: bytes) -> bool:
    thread, _, rest = body[12:].partition(b",")
    return _thread_ok(thread) and re.fullmatch(_NUM + rb"," + _NUM, rest) is not None


def _thread_ok(text: bytes) -> bool:
    try:
        t = ThreadId.parse(text)
    except MalformedPacket:
        return False
    if max(abs(t.tid), abs(t.pid or 0)) >= 1 << 63:
        return False
    # gdbserver's read_ptid: "invalid remote ptid" (fatal) for a p form without its
    # ".tid" (Tp11, found by the fuzz client) and for a thread of every process (p-1.N)
    if text.startswith(b"p") and b"." not in text:
        return False
    return not (t.pid == -1 and b"." in text)


# What gdbserver's symbol look-up (remote-utils.cc, look_up_one_symbol) reads between
# its `qSymbol:NAME` request and the client's `qSymbol:VALUE:NAME` answer: `m` reads
# and `v` packets (for vFile). Any other packet is taken as a malformed answer
# ("Malformed response to qSymbol, ignoring: g"): it gets the next `qSymbol:NAME`
# for its reply, and every reply after it is one packet late. A `vCont;c` there is
# run inside the look-up: the program ran to its end while the client waited for a
# symbol's question (found by sending `qSymbol::` and then another packet).
_IN_SYMBOL_LOOKUP = (b"qSymbol:", b"m", b"vFile:")


def refuse(body: bytes, *, non_stop: bool = False, g_size: int | None = None,
           non_stop_offered: bool = False, packet_size: int | None = None,
           symbol_lookup: bool = False) -> str | None:
    """Why the stub must not get this client packet (one line), or None.

    `non_stop`: the stub is in non-stop mode (``vCont;t`` is valid then).
    `g_size`: the length in hex characters of the stub's ``g`` reply, when
    seen: a ``G`` of another size is refused. `non_stop_offered`: the client
    was shown QNonStop; otherwise ``QNonStop:1`` would turn the stub to a
    mode the session does not run. `symbol_lookup`: the stub asked the client
    for a symbol (`qSymbol:NAME`) and waits for the answer."""
    if symbol_lookup and not body.startswith(_IN_SYMBOL_LOOKUP):
        return "the stub waits for the answer to its qSymbol question (it takes only qSymbol:, m and vFile: then)"
    if not body:
        return None
    if b"*" in body:
        # run-length encoding is for replies; binary data escapes '*' (}\x0a)
        return "a raw '*' in a client packet"
    if body == b"QNonStop:1" and not non_stop_offered:
        return "QNonStop:1: the proxy did not offer non-stop mode"
    head = body[:1]
    for prefix, ok, grammar in _GRAMMAR_BY_HEAD.get(body[0], ()):
        if body.startswith(prefix):
            if not ok(body):
                return f"malformed {grammar.split(' ', 1)[0].rstrip(':,')} packet (expected {grammar})"
            break
    if head in (b"m", b"x") and packet_size is not None:
        # gdbserver 13.1 reads `m` into a buffer of its packet size: a longer read
        # across one of its breakpoints writes past it and trips an assertion in
        # check_mem_read (mem-break.cc:1868), killing the program (the fuzz client,
        # seed 1: m7ffff734d2ad,10000). gdb never asks more than the packet holds.
        length = int(body[1:].split(b",")[1], 16)
        if length > packet_size // 2:
            return f"{head.decode()} of {length} bytes: more than the stub's packet size ({packet_size}) holds"
    if head == b"G" and g_size is not None:
        data = body[1:].split(b";", 1)[0]
        if len(data) != g_size:
            return f"G of {len(data) // 2} bytes; the stub's registers are {g_size // 2} bytes"
    if head == b"X":
        return _check_x(body)
    if head in (b"Z", b"z"):
        try:
            bp = parse_breakpoint(body)
        except MalformedPacket as err:
            return f"malformed {head.decode()} packet: {err.why}"
        if bp.type > 4 or bp.addr >= 1 << 64 or bp.kind >= 1 << 16:
            return f"malformed {head.decode()} packet: type, address or kind out of range"
        return None
    if head == b"H":
        if body[1:2] not in (b"g", b"c", b"s") or not _thread_ok(body[2:]):
            return "malformed H packet (expected Hg|Hc thread-id)"
        return None
    if head == b"T":
        return None if _thread_ok(body[1:]) else "malformed T packet (expected T thread-id)"
    if body.startswith(b"qXfer:"):
        return _check_qxfer(body)
    if head in (b"c", b"s", b"C", b"S") or body.startswith(b"vCont;"):
        return _check_resume(body, non_stop)
    if head == b"D" and body[1:2] == b";":
        return None if re.fullmatch(_NUM, body[2:]) else "malformed D packet (expected D;pid)"
    if body.startswith(b"vKill;"):
        return None if re.fullmatch(_NUM, body[6:]) else "malformed vKill packet (expected vKill;pid)"
    return None


def _check_x(body: bytes) -> str | None:
    head, colon, payload = body[1:].partition(b":")
    m = re.fullmatch(_NUM + rb"," + _NUM, head)
    if not colon or m is None:
        return "malformed X packet (expected X addr,length:binary)"
    try:
        data = unescape_binary(payload)
    except MalformedPacket:
        return "malformed X packet: bad escape"
    if len(data) != int(head.split(b",")[1], 16):
        return f"malformed X packet: length {int(head.split(b',')[1], 16)} but {len(data)} bytes"
    return None


def _check_qxfer(body: bytes) -> str | None:
    parts = body[6:].split(b":", 4)
    if len(parts) < 4 or parts[1] not in (b"read", b"write"):
        return "malformed qXfer packet (expected qXfer:object:read:annex:offset,length)"
    if parts[1] == b"read":
        if len(parts) != 4 or re.fullmatch(_NUM + rb"," + _NUM, parts[3]) is None:
            return "malformed qXfer read (expected offset,length in hex)"
        return None
    if len(parts) != 5 or re.fullmatch(_NUM, parts[3]) is None:
        return "malformed qXfer write (expected offset:data)"
    return None


def _check_resume(body: bytes, non_stop: bool) -> str | None:
    head = body[:1]
    if head in (b"c", b"s"):
        if len(body) > 1 and re.fullmatch(_NUM, body[1:]) is None:
            return f"malformed {head.decode()} packet (expected {head.decode()}[addr])"
        return None
    try:
        resume = parse_resume(body)
    except MalformedPacket as err:
        return f"malformed resume packet: {err.why}"
    if resume is None:
        return None
    for item, a in zip(body[6:].split(b";") if body.startswith(b"vCont;") else [b""], resume.actions):
        if a.op == "t" and not non_stop:
            return "vCont;t is a non-stop request: the stub is in all-stop mode"
        _, colon, thread = item.partition(b":")
        if colon and not _thread_ok(thread):
            return "malformed resume packet: thread id"
        if a.range is not None and max(a.range) >= 1 << 64:
            return "malformed resume packet: range"
    return None
