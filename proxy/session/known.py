"""What the proxy already knows at a stop: the client's reads answered without the stub.

Theory of operation
-------------------
While the program is stopped (all-stop), much of what a client asks between two
resumes the proxy has seen or can read itself, exactly as the stub would answer it:

* ``p N`` of a register the stop reply expedited, for the stop's thread, while the
  stub's general thread is that thread (gdbserver makes the reporting thread its
  general thread at a stop; a stop reply's ``NN:value`` pairs use ``p``'s register
  numbers and the same hex) - once the stub answered a ``p`` with a value. gdbserver
  13.1 on x86-64 has no ``p`` at all: it answers every one empty (an unsupported
  packet), and so does the proxy then, without asking again;
* ``Hg T`` again, when the stub already has T selected (its answer is ``OK``, and
  nothing else changes);
* ``qXfer:threads:read`` asked again at the same stop: the reply the client got;
* ``m ADDR,LEN`` of a proven local program's own process: read from /proc/PID/mem,
  the file gdbserver itself reads memory from. gdbserver shows its breakpoints'
  original bytes, and memory holds their ``int3`` (``0xcc``): a read that holds any
  ``0xcc`` byte is left to the stub, so is one that fails or comes short (the reader,
  proxy.host.livemem).

Everything else, and anything in doubt, goes to the stub. What the stub is sent
(`sent`, every packet from the client or the proxy) keeps this knowledge only when it
changes nothing the answers depend on: reads, thread questions, breakpoints (the
stub shows the original bytes, the reader never answers a ``0xcc``). Anything else
(a resume, a write of memory or registers, ``vFile``, a monitor command, a detach)
forgets the stop's knowledge; a selection (``Hg``) forgets which thread the stub has
until its ``OK``. A fast tracepoint's jump is shadowed by gdbserver like a
breakpoint but is no ``0xcc``: once a tracepoint was defined (``QTDP``), memory is
never answered here again in the session.

Only for gdbserver in all-stop mode (the session decides, `enabled`): the rules above
are gdbserver's, checked against it (integration/test_known_answers.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from rsp.errors import MalformedPacket
from rsp.packets.stop import StopReply
from rsp.threads import ThreadId

# What the stub may be sent while the stop's knowledge holds: reads and questions that
# change nothing, breakpoints (shadowed in the stub's reads), and `Hg` (handled apart).
_KEEPS_FIRST = frozenset(b"mxgpTZzH")
_KEEPS_PREFIXES = (b"qXfer:threads:read:", b"qXfer:features:read:", b"qXfer:auxv:read:",
                   b"qXfer:exec-file:read:", b"qXfer:libraries-svr4:read:", b"qfThreadInfo",
                   b"qsThreadInfo", b"qC", b"qAttached", b"qTStatus")
_THREADS = b"qXfer:threads:read:"
MAX_READ = 0x4000  # the largest `m` answered here (gdbserver's own buffer is larger)


class Memory(Protocol):
    def read(self, addr: int, size: int) -> bytes | None: ...


@dataclass(slots=True)
class KnownStats:
    registers: int = 0
    selections: int = 0
    thread_lists: int = 0
    memory: int = 0
    memory_left: int = 0  # `m` the reader left to the stub (a 0xcc, unmapped, short)
    breakpoints: int = 0  # the client's z0/Z0 pairs kept in the stub (session/breakpoints.py)


@dataclass(slots=True)
class StopKnowledge:
    """One session's knowledge of the current stop (see the module docstring)."""

    enabled: bool = False  # gdbserver, all-stop: decided by the session
    registers: dict[int, bytes] = field(default_factory=dict)  # expedited: number -> hex
    stop_thread: bytes | None = None  # the stop's thread, as the stub writes it
    selected: bytes | None = None  # the stub's general thread, when sure
    threads: dict[bytes, bytes] = field(default_factory=dict)  # qXfer:threads request -> reply
    asked: bytes | None = None  # the client's request in flight whose reply is kept
    # does the stub answer `p` (None: not seen yet)? learned from a reply of the client's
    p_supported: bool | None = None
    p_asked: bool = False
    # the process whose memory may be read here (its host pid and its id on the link),
    # and how to open its memory; None: memory goes to the stub
    memory_pid: int | None = None
    memory_link_pid: int | None = None
    open_memory: Callable[[int], Memory | None] | None = None
    # opened at the first read, kept for the process: a read of it is always of the live memory
    # (after an exec the old file reads nothing, and the reads go to the stub)
    memory: Memory | None = None
    memory_tried: bool = False
    tracepoints: bool = False  # a tracepoint was defined: memory never answered here
    stats: KnownStats = field(default_factory=KnownStats)

    # -- what happens -------------------------------------------------------------------
    def stopped(self, sr: StopReply | None, selects: bool) -> None:
        """A stop the client sees. `selects`: the stub made its thread the general one."""
        self.forget()
        if sr is not None and sr.reason == "exec":
            self.drop_memory()  # a new image: its memory opened anew
        if sr is None or sr.kind != "T" or sr.thread is None:
            return
        self.stop_thread = sr.thread.format(sr.thread.pid is not None)
        self.registers = dict(sr.registers)
        if selects:
            self.selected = self.stop_thread

    def forget(self) -> None:
        """The stop's knowledge is gone (a resume, a write, anything not known to keep it)."""
        self.registers = {}
        self.stop_thread = self.selected = self.asked = None
        self.threads = {}

    def drop_memory(self) -> None:
        """Another process, or a new image of this one: its memory is opened again."""
        mem, self.memory, self.memory_tried = self.memory, None, False
        close = getattr(mem, "close", None)
        if close is not None:
            close()

    def sent(self, body: bytes) -> None:
        """A packet goes to the stub (from the client or the proxy)."""
        if body[:2] == b"Hg":
            self.selected = None  # until the stub's OK (`selected_ok`)
            return
        if keeps_stop(body):
            return
        if body.startswith(b"QTDP"):
            self.tracepoints = True
        self.forget()

    def selected_ok(self, thread: bytes) -> None:
        """The stub answered OK to the client's `Hg thread`."""
        self.selected = thread

    def forwarding(self, body: bytes) -> None:
        """The client's request goes to the stub: its reply is kept when it is one to keep."""
        self.asked = body if self.enabled and self.stop_thread is not None and body.startswith(_THREADS) else None
        self.p_asked = body[:1] == b"p" and self.p_supported is None

    def replied(self, body: bytes) -> None:
        """The reply to the client's forwarded request (kept when it was one to keep)."""
        if self.asked is not None:
            self.threads[self.asked] = body
            self.asked = None
        if self.p_asked:
            self.p_asked = False
            if not body:
                self.p_supported = False  # an unsupported packet: empty from now on
            elif _is_hex(body.replace(b"x", b"0")):
                self.p_supported = True

    # -- answers --------------------------------------------------------------------------
    def answer(self, body: bytes) -> bytes | None:
        """The stub's answer to the client's request, when known; None: ask the stub."""
        if not self.enabled or self.stop_thread is None:
            return None
        c = body[:1]
        if c == b"p":
            return self._register(body)
        if c == b"m":
            return self._memory(body)
        if c == b"H":
            if body[1:2] == b"g" and self.selected is not None and body[2:] == self.selected:
                self.stats.selections += 1
                return b"OK"
            return None
        if body.startswith(_THREADS):
            got = self.threads.get(body)
            if got is not None:
                self.stats.thread_lists += 1
            return got
        return None

    def _register(self, body: bytes) -> bytes | None:
        if self.p_supported is False:
            self.stats.registers += 1
            return b""
        if not self.p_supported or self.selected != self.stop_thread or not _is_hex(body[1:]):
            return None  # not known to answer yet, another thread's, or `p N;thread:T;` (lldb)
        value = self.registers.get(int(body[1:], 16))
        if value is not None:
            self.stats.registers += 1
        return value

    def _memory(self, body: bytes) -> bytes | None:
        if self.tracepoints or self.memory_pid is None or self.selected is None:
            return None
        addr_text, comma, size_text = body[1:].partition(b",")
        if not comma or not _is_hex(addr_text) or not _is_hex(size_text):
            return None
        addr, size = int(addr_text, 16), int(size_text, 16)
        if not 0 < size <= MAX_READ or not self._selects_program():
            return None
        if not self.memory_tried:
            self.memory_tried = True
            self.memory = self.open_memory(self.memory_pid) if self.open_memory is not None else None
        got = self.memory.read(addr, size) if self.memory is not None else None
        if got is None:
            self.stats.memory_left += 1
            return None
        self.stats.memory += 1
        return got.hex().encode()

    def _selects_program(self) -> bool:
        """The stub's general thread is of the process whose memory is read here."""
        assert self.selected is not None
        try:
            pid = ThreadId.parse(self.selected).pid
        except MalformedPacket:
            return False
        return pid is None or pid == self.memory_link_pid


def keeps_stop(body: bytes) -> bool:
    """Does a packet leave the stopped program as the client sees it (reads, thread
    questions, breakpoints, a selection)?"""
    return bool(body) and body[0] in _KEEPS_FIRST or body.startswith(_KEEPS_PREFIXES)


def _is_hex(text: bytes) -> bool:
    return bool(text) and not text.translate(None, b"0123456789abcdefABCDEF")
