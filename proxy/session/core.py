"""The session core: one client <-> stub session as a pure state machine.

Theory of operation
-------------------
The shell feeds packets from both sides (`client_packet`, `stub_packet`,
`client_interrupt`, ...) and collects `Action`s (`take_actions`). Nothing
here awaits, sleeps or touches a socket; time comes from an injected clock.

The link is all-stop RSP: the stub answers requests in order, and a resume
request is answered by a stop reply (possibly after `O` console packets).
So the stub side is a FIFO of *waiters*, one per request in flight: the
client (forward the reply), the client's resume (a stop reply that may be
the proxy's own hidden stop), or a proxy *procedure*.

A procedure is a generator that yields `Exchange`s (request bodies sent back
to back) and receives their replies. Procedures run when the proxy needs the
stub for itself: handling a hidden stop (DESIGN.md §3 rules 2-4, 8), planting
probes before the client's first resume, removing them before a detach.
While one runs, client packets are queued (a client never has more than one
request outstanding) and an interrupt is remembered (rule 8).

What the client believes is kept apart from what the stub does: the
breakpoint union (`BreakpointTable`), the thread the client selected with
`Hg` (restored after proxy traffic, rule 6), the client's pending resume
(re-issued after a hidden stop, rule 3), and the qSupported features each
side sees (rule 5).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from rsp.errors import MalformedPacket
from rsp.packets.memory import memory_bytes
from rsp.framing import frame, rle_expand, unescape_binary
from rsp.packets.breakpoints import BreakpointPacket, parse_breakpoint
from rsp.packets.monitor import build_console_output, parse_qrcmd
from rsp.packets.qsupported import (
    Feature,
    build_qsupported_reply,
    build_qsupported_request,
    parse_qsupported_reply,
    parse_qsupported_request,
)
from rsp.packets.qxfer import QXferRead, build_qxfer_reply, parse_qxfer
from rsp.packets.resume import Resume, ResumeAction, parse_resume
from rsp.packets.stop import StopReply, is_stop_reply, parse_stop_reply
from rsp.threads import ThreadId

from . import emulate
from .procedure import Exchange, Forward, Handover, Procedure, Reply
from .actions import Action, Close, Notice, SetNoAck, ToClient, ToClientRaw, ToStub, ToStubRaw
from .breakpoints import BpKey, BreakpointTable
from .probes import Probe, ProbeStats

# Features the client must not see (rule 5).
_HIDDEN_FROM_CLIENT = ("ConditionalBreakpoints", "BreakpointCommands", "QNonStop")
# Objects the proxy answers itself through qXfer.
PROXY_QXFER_OBJECTS = ("asyncrsp.graph",)
PC_REGNUM_AMD64 = 16
RSP_REGNUM_AMD64 = 7
SIGINT = 2
SIGSTOP = 0x13  # Linux SIGSTOP (19)
SIGTRAP = 5

# A monitor command runs again after each pass of memory reads; reflection
# (proxy.reflect) needs one pass per pointer hop of the deepest await tree.
MONITOR_PASSES = 32
MONITOR_READS_PER_PASS = 1024


@dataclass(slots=True)
class _Waiter:
    kind: str  # "client", "client-resume", "proc"
    resume: bool = False
    request: bytes | None = None  # kept when the capture rewrites replies


@dataclass(slots=True)
class SessionConfig:
    registers_safe: bool = True
    # Resolve probe patterns against the program: (elf path or None, runtime AT_ENTRY or None) -> probes.
    resolve_probes: Callable[[str | None, int | None], list[Probe]] | None = None
    elf_path: str | None = None
    # Answer `monitor async ...`: (command text, session, read_memory) -> output text.
    # read_memory(addr, size) returns None for bytes not read yet: the session
    # reads them from the stub and runs the command again (at most 4 passes).
    monitor: Callable[[str, "Session", Callable[[int, int], bytes | None]], str] | None = None
    # Serve proxy-owned qXfer objects: (object, annex, session) -> document bytes or None.
    qxfer: Callable[[str, str, "Session"], bytes | None] | None = None
    # Merge the stub's `info os` types listing with the proxy's own tables.
    merge_osdata_types: Callable[[bytes | None], bytes] | None = None
    # A complete target description for a stub that answers without registers.
    target_xml: dict[str, str] | None = None
    # The poll-capture backend (proxy.capture.base.CaptureBase), or None.
    capture: Any = None
    # Build a backend by name and mode at the first resume or a switch:
    # (name, mode, target) -> CaptureBase | None; raises ValueError with the
    # reason when the backend cannot run for that target.
    make_capture: Callable[[str, str, Any], Any] | None = None
    capture_name: str = "breakpoints"
    mode: str = "full"
    # Open the program (proxy.capture.target.open_target): (path, AT_ENTRY,
    # pid, stub feature names) -> Target.
    open_target: Callable[[str | None, int | None, int | None, frozenset[str]], Any] | None = None
    # The stub's kind is unknown (a TCP stub): ask it a plain qSupported first
    # and decide the register mode from what its reply shows:
    # (qSupported reply) -> (registers_safe, notice).
    classify_stub: Callable[[bytes], tuple[bool, str]] | None = None
    # The program's file from its pid when the stub cannot tell (local stubs).
    local_exe: Callable[[int], str | None] | None = None
    # Emulate probed instructions instead of stepping over them (emulate.py).
    emulate: bool = True
    clock: Callable[[], float] = time.perf_counter


@dataclass(slots=True)
class _Stopped:
    """What we know of the last stop the client saw."""

    thread: ThreadId | None
    pc: int | None
    counted: bool = False  # a probe hit at pc was already counted for this stop


@dataclass(slots=True)
class SessionStats:
    hidden_stops: int = 0
    shared_stops: int = 0  # probe hits at a client breakpoint too: processed and reported
    hidden_time: float = 0.0
    emulated: int = 0  # hidden stops resumed once, the probed instruction emulated
    hidden_interrupts: int = 0  # the proxy stopped the program for its capture (drains)
    capture_switches: int = 0
    forks_cleaned: int = 0  # fork children whose copies of the proxy's breakpoints were removed
    interrupts_during_hidden: int = 0
    capture_errors: int = 0
    client_packets: int = 0
    stub_packets: int = 0
    probe_stats: ProbeStats = field(default_factory=ProbeStats)


class Session:
    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.bps = BreakpointTable()
        self.stats = SessionStats()
        self.probes: dict[int, Probe] = {}  # runtime address -> probe
        self._actions: list[Action] = []
        self._waiters: deque[_Waiter] = deque()
        self._proc: Procedure | None = None
        self._proc_replies: list[bytes] = []
        self._proc_expect = 0
        self._client_queue: deque[bytes] = deque()
        self._closing = False
        # what the client believes / asked
        self.client_features: list[Feature] = []
        self.stub_features: list[Feature] = []
        self.client_g_thread: bytes | None = None  # raw thread id of the client's last Hg
        # the stub's selected thread as the client believes it: its last Hg, or the
        # thread of the last stop it saw (a stop reply moves it; rule 6)
        self._stub_g: bytes | None = None
        self.monitor_threads: Callable[[], dict[int, bytes] | None] | None = None
        self._resume: Resume | None = None  # the client's outstanding resume
        self._interrupt_pending = False
        self._interrupt_forwarded = False
        self._stopped: _Stopped | None = None
        self._last_stop: StopReply | None = None
        self._osdata_types: bytes | None = None
        self._stop_pc_override: int | None = None
        self._interrupted_for_leave = False
        self._planted = False
        self._plant_failed: str | None = None
        self._program_exited = False
        self._serve_own_tdesc = False
        self.pc_regnum = PC_REGNUM_AMD64
        self.exec_file: str | None = config.elf_path
        self.load_bias: int | None = None
        self.register_notice = "registers: " + ("safe" if config.registers_safe else "full")
        # capture
        self.capture: Any = config.capture
        self.capture_name = config.capture_name
        self.mode = config.mode
        self.target: Any = None
        self._capture_keys: list[BpKey] = []  # hidden breakpoints the capture planted
        self._count_probes: list[Probe] = []  # --probe: hidden breakpoints unless the capture counts them
        self._capture_counts: dict[int, Probe] = {}  # the count probes the capture counts itself
        self._capture_installed = False
        self._capture_interrupt = False  # our own 0x03 for the capture is in flight
        self._switch_request: tuple[str | None, str | None] | None = None
        self.capture_notice: str | None = None
        self._entry: int | None = None
        self._emulate = False  # decided from the stub's qSupported reply
        self._main_pid: int | None = None  # the program's process (fork children are others)

    # ------------------------------------------------------------------ output
    def take_actions(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    def _emit(self, action: Action) -> None:
        self._actions.append(action)

    def _to_stub(self, body: bytes, waiter: _Waiter) -> None:
        self._waiters.append(waiter)
        self._emit(ToStub(body))

    # ------------------------------------------------------------------ inputs
    @property
    def running(self) -> bool:
        """True while the client waits for a stop reply."""
        return self._resume is not None

    def client_packet(self, body: bytes, raw: bytes) -> None:
        self.stats.client_packets += 1
        if self._proc is not None or self._waiters_for_client():
            self._client_queue.append(body)
            return
        self._dispatch_client(body, raw)

    def client_interrupt(self) -> None:
        if self._proc is not None:
            # Rule 8: the hidden stop in progress ends in a SIGINT stop.
            self._interrupt_pending = True
            self.stats.interrupts_during_hidden += 1
            return
        if self.running and not self._interrupt_forwarded:
            self._interrupt_forwarded = True
            self._emit(ToStubRaw(b"\x03"))
        # An interrupt while stopped means nothing to an all-stop stub.

    def stub_packet(self, body: bytes, raw: bytes) -> None:
        self.stats.stub_packets += 1
        if not self._waiters:
            # Unsolicited: console output or a stray reply; the client sorts it out.
            self._emit(ToClientRaw(raw))
            return
        waiter = self._waiters[0]
        if waiter.resume and _is_console_output(body):
            if self.running:
                self._emit(ToClientRaw(raw))
            return
        self._waiters.popleft()
        if b"*" in body:  # gdbserver run-length encodes replies (rule 7)
            body = rle_expand(body)
        if waiter.kind == "drop":
            if body != b"OK":
                self._emit(Notice(f"the stub refused to re-insert a probe: {body[:40]!r}"))
        elif waiter.kind == "write":
            if body != b"OK" and self._emulate:
                # The thread stays at the breakpoint and traps again; from now
                # on every hit takes the step-over path.
                self._emulate = False
                self._emit(Notice(f"the stub refused an emulated instruction's write ({body[:40]!r}); "
                                  "stepping over probes from now on"))
        elif waiter.kind == "proc":
            self._proc_replies.append(body)
            if len(self._proc_replies) == self._proc_expect:
                replies, self._proc_replies = self._proc_replies, []
                self._step_proc(replies)
        elif waiter.kind == "client-resume":
            self._on_stop_reply(body, raw)
        else:
            if waiter.request is not None and self.capture is not None:
                new = self._capture_call("client_reply", waiter.request, body)
                if isinstance(new, bytes) and new != body:
                    body, raw = new, frame(new)
            self._on_client_reply(body, raw)
        self._drain_client_queue()

    def client_closed(self) -> None:
        """The client hung up: take the proxy's breakpoints out, then go."""
        self._closing = True
        self._client_queue.clear()
        if self._program_exited or not self._holds_program():
            self._emit(Close("client disconnected"))
            return
        if self._proc is not None:
            # A hidden stop is being handled: the program is stopped, and a
            # 0x03 now would make gdbserver queue a real SIGINT for it. The
            # procedure sees _closing and ends in a stop instead of a resume.
            return
        if self.running:
            if not self._interrupt_forwarded:
                self._interrupt_forwarded = True
                self._emit(ToStubRaw(b"\x03"))
                self._interrupted_for_leave = True
            return  # the stop reply arrives, then we clean up (see _on_stop_reply)
        if self._proc is None:
            self._start_proc(self._proc_leave())

    def stub_closed(self) -> None:
        self._emit(Notice("the stub closed the connection"))
        self._emit(Close("stub disconnected"))

    # ------------------------------------------------------------ client side
    def _waiters_for_client(self) -> bool:
        return any(w.kind != "proc" for w in self._waiters)

    def _drain_client_queue(self) -> None:
        while self._client_queue and self._proc is None and not self._waiters_for_client():
            body = self._client_queue.popleft()
            self._dispatch_client(body, None)

    def _forward(self, body: bytes, raw: bytes | None, resume: bool = False) -> None:
        keep = body if self.capture is not None and self.capture.filters_replies else None
        self._waiters.append(_Waiter("client-resume" if resume else "client", resume, keep))
        self._emit(ToStubRaw(raw) if raw is not None else ToStub(body))

    def _reply(self, body: bytes) -> None:
        self._emit(ToClient(body))

    def _dispatch_client(self, body: bytes, raw: bytes | None, *, handed_over: bool = False) -> None:
        if self._closing:
            return
        if self.capture is not None and not handed_over:
            verdict = self._capture_call("client_request", body)
            if isinstance(verdict, Reply):
                return self._reply(verdict.body)
            if isinstance(verdict, Forward):
                body, raw = verdict.body, None
            elif isinstance(verdict, Handover):
                self._emit(Notice(f"capture: {verdict.reason}; switching to breakpoints"))
                self._start_proc(self._proc_switch("breakpoints", None, then=body))
                return None
        head = body[:1]
        try:
            if body.startswith(b"qSupported"):
                return self._client_qsupported(body)
            if body == b"QStartNoAckMode":
                # Each side of the proxy negotiates no-ack on its own.
                self._reply(b"OK")
                self._emit(SetNoAck("client"))
                return None
            if head in (b"Z", b"z") and body[1:2] in (b"0", b"1"):
                return self._client_breakpoint(body, raw)
            if head == b"H" and body[1:2] == b"g":
                self.client_g_thread = self._stub_g = body[2:]
                return self._forward(body, raw)
            if body.startswith(b"qRcmd,"):
                return self._client_monitor(body, raw)
            if body.startswith(b"qXfer:"):
                return self._client_qxfer(body, raw)
            if head in (b"D", b"k") or body.startswith(b"vKill"):
                return self._client_leave(body, raw)
            if head in (b"G", b"P") and self._stopped is not None:
                self._stopped.pc = None  # the client may have moved the pc
            resume = parse_resume(body)
            if resume is not None:
                return self._client_resume(resume, body, raw)
        except MalformedPacket as err:
            self._emit(Notice(f"malformed packet from the client: {err}"))
        self._forward(body, raw)
        return None

    def _client_qsupported(self, body: bytes) -> None:
        feats = parse_qsupported_request(body)
        self.client_features = feats
        self._start_proc(self._proc_qsupported(feats))

    def _proc_qsupported(self, client: list[Feature]) -> Procedure:
        if self.config.classify_stub is not None and self.config.registers_safe:
            # Only gdbserver < 14 needs xmlRegisters left out (rule 11); QEMU
            # then sends a g block longer than its description. A plain
            # qSupported first tells which stub this is (gdbserver re-decides
            # its register mode at every qSupported, so this one is harmless).
            (probe,) = yield Exchange((b"qSupported:multiprocess+;swbreak+",))
            safe, notice = self.config.classify_stub(probe)
            self.config.registers_safe = safe
            self.register_notice = notice
            self._emit(Notice(notice.removeprefix("asyncrsp: ")))
        upstream = [f for f in client if f.name != "swbreak"]
        upstream.append(Feature("swbreak", "+"))  # rule 5: pc at the breakpoint, with a reason
        if self.config.registers_safe:
            upstream = _strip_xml_registers(upstream)  # rule 11
        (reply,) = yield Exchange((build_qsupported_request(upstream),))
        feats = parse_qsupported_reply(reply)
        self.stub_features = feats
        # Emulation writes gdb's amd64 `g` block back with `G`: only for
        # gdbserver asked without xmlRegisters (its layout is known and the
        # write touches no AVX-512 state, rule 11). QStartupWithShell is
        # gdbserver's own feature.
        self._emulate = (self.config.registers_safe and self.config.emulate
                         and _feature_on(feats, "QStartupWithShell"))
        if _feature_on(feats, "QStartNoAckMode"):
            (ok,) = yield Exchange((b"QStartNoAckMode",))
            if ok == b"OK":
                self._emit(SetNoAck("stub"))
        shown = [f for f in feats if f.name not in _HIDDEN_FROM_CLIENT]
        for obj in PROXY_QXFER_OBJECTS:
            shown.append(Feature(f"qXfer:{obj}:read", "+"))
        if not _feature_on(shown, "qXfer:osdata:read"):
            shown.append(Feature("qXfer:osdata:read", "+"))
        self._reply(build_qsupported_reply(shown))

    def _client_breakpoint(self, body: bytes, raw: bytes | None) -> None:
        if self._client_selects_other_process():
            # gdb taking its breakpoints out of a fork child (Hg child; z0):
            # that process is not the program, its table is not ours.
            return self._forward(body, raw)
        bp = parse_breakpoint(body)
        key: BpKey = (bp.type, bp.addr, bp.kind)
        if bp.insert:
            if self.bps.client_insert(key, bp.conditions):
                self._forward(body, raw)
            else:
                self._reply(b"OK")
        else:
            if self.bps.client_remove(key):
                self._forward(body, raw)
            else:
                self._reply(b"OK")

    def _client_monitor(self, body: bytes, raw: bytes | None) -> None:
        text = parse_qrcmd(body)
        words = text.split()
        if not words or words[0] != "async" or self.config.monitor is None:
            return self._forward(body, raw)
        self._start_proc(self._proc_monitor(text))
        return None

    def _proc_monitor(self, text: str) -> Procedure:
        """Run a command; read the memory it asks for; run it again."""
        assert self.config.monitor is not None
        yield from self._resolve_pending_reads()
        cache: dict[tuple[int, int], bytes | None] = {}
        out = ""
        threads: dict[int, bytes] | None = None  # LWP -> `g` reply, read when a command asks
        wants_threads = False

        def thread_registers() -> dict[int, bytes] | None:
            nonlocal wants_threads
            wants_threads = threads is None
            return threads

        self.monitor_threads = thread_registers
        for _ in range(MONITOR_PASSES):
            missing: list[tuple[int, int]] = []

            def read(addr: int, size: int) -> bytes | None:
                key = (addr, size)
                if key in cache:
                    return cache[key]
                if size <= 0 or size > 1 << 16 or addr < 0:
                    return None
                missing.append(key)
                return None

            try:
                out = self.config.monitor(text, self, read)
            except Exception as err:  # a command must never take the session down
                out = f"asyncrsp: internal error in '{text}': {err!r}\n"
                break
            if wants_threads and threads is None:
                threads = yield from self._read_thread_registers()
            elif not missing:
                break
            missing = list(dict.fromkeys(missing))[:MONITOR_READS_PER_PASS]
            if missing:
                replies = yield Exchange(tuple(b"m%x,%x" % k for k in missing))
                for key, rep in zip(missing, replies):
                    cache[key] = memory_bytes(rep)
        self.monitor_threads = None
        if self._switch_request is not None:
            name, mode = self._switch_request
            self._switch_request = None
            try:
                yield from self._switch(name, mode)
            except ValueError as err:
                out += f"asyncrsp: {err}\n"
        self._proc = None
        if out and not out.endswith("\n"):
            out += "\n"
        for i in range(0, len(out), 400):
            self._reply(build_console_output(out[i:i + 400]))
        self._reply(b"OK")

    def _note_stop_thread(self, sr: StopReply) -> None:
        if sr.thread is not None:
            self._stub_g = sr.thread.format(sr.thread.pid is not None)

    def _read_thread_registers(self) -> Generator[Exchange, list[bytes], dict[int, bytes]]:
        """Every thread's `g` block (qfThreadInfo/qsThreadInfo, then `Hg` + `g` per thread,
        back to back), then the stub's selected thread as the client believes it (rule 6).
        lldb-server with QThreadSuffixSupported takes `g;thread:TID;` and no Hg."""
        ids: list[bytes] = []
        ask = b"qfThreadInfo"
        for _ in range(256):
            (rep,) = yield Exchange((ask,))
            if not rep.startswith(b"m"):
                break
            ids += [t for t in rep[1:].split(b",") if t]
            ask = b"qsThreadInfo"
        tids: list[int] = []
        for t in ids:
            try:
                tids.append(ThreadId.parse(t).tid)
            except MalformedPacket:
                tids.append(-1)
        if _feature_on(self.stub_features, "QThreadSuffixSupported"):
            bodies = [b"g;thread:%x;" % tid for tid in tids]
            replies = yield Exchange(tuple(bodies))
            regs = replies
        else:
            bodies = [p for t in ids for p in (b"Hg" + t, b"g")]
            if self._stub_g is not None:
                bodies.append(b"Hg" + self._stub_g)
            replies = yield Exchange(tuple(bodies))
            regs = replies[1:2 * len(ids):2]
        return {tid: r for tid, r in zip(tids, regs) if tid > 0 and not r.startswith(b"E") and r}

    def _resolve_pending_reads(self) -> Generator[Exchange, list[bytes], None]:
        """The capture's drain, then the engine's deferred __state reads, at
        the first question after a stop."""
        if self.running:
            return
        if self.capture is not None and self._capture_installed:
            proc = self._capture_call("sync")
            if proc is not None:
                yield from proc
        engine = self.engine
        if engine is None:
            return
        reads = engine.pending_reads()[:512]
        if not reads:
            return
        replies = yield Exchange(tuple(b"m%x,%x" % (r.addr, r.size) for r in reads))
        for r, rep in zip(reads, replies):
            engine.resolve_read(r, memory_bytes(rep))

    def _client_qxfer(self, body: bytes, raw: bytes | None) -> None:
        try:
            req = parse_qxfer(body)
        except MalformedPacket:
            return self._forward(body, raw)
        if not isinstance(req, QXferRead):
            return self._forward(body, raw)
        if req.object == "features" and self._serve_own_tdesc and self.config.target_xml:
            doc = self.config.target_xml.get(req.annex)
            if doc is None:
                self._reply(b"E00")
            else:
                self._reply(build_qxfer_reply(doc.encode(), req.offset, req.length))
            return None
        if (req.object == "features" and self.config.target_xml and self.config.registers_safe
                and req.annex == "target.xml"):
            self._start_proc(self._proc_features(req, body))
            return None
        if req.object == "osdata" and req.annex == "" and self.config.merge_osdata_types is not None:
            self._start_proc(self._proc_osdata_types(req, body))
            return None
        if self._is_own_qxfer(req):
            self._start_proc(self._proc_own_qxfer(req))
            return None
        self._forward(body, raw)
        return None

    def _is_own_qxfer(self, req: QXferRead) -> bool:
        return self.config.qxfer is not None and (
            req.object in PROXY_QXFER_OBJECTS
            or (req.object == "osdata" and req.annex.startswith("async-"))
        )

    def _proc_own_qxfer(self, req: QXferRead) -> Procedure:
        yield from self._resolve_pending_reads()
        self._proc = None
        doc = self._own_qxfer(req)
        if doc is None:
            self._reply(b"E00")
        else:
            self._reply(build_qxfer_reply(doc, req.offset, req.length))

    def _proc_osdata_types(self, req: QXferRead, body: bytes) -> Procedure:
        """`info os`: the stub's table types followed by the proxy's own."""
        if req.offset == 0 or self._osdata_types is None:
            stub_doc = b""
            for _ in range(64):
                ask = b"qXfer:osdata:read::%x,%x" % (len(stub_doc), 0x3FFF)
                (reply,) = yield Exchange((ask,))
                if reply[:1] not in (b"m", b"l"):
                    break
                stub_doc += unescape_binary(reply[1:])
                if reply[:1] == b"l":
                    break
            assert self.config.merge_osdata_types is not None
            self._osdata_types = self.config.merge_osdata_types(stub_doc or None)
        self._proc = None
        self._reply(build_qxfer_reply(self._osdata_types, req.offset, req.length))

    def _proc_features(self, req: QXferRead, body: bytes) -> Procedure:
        """Rule 11: a gdbserver asked without xmlRegisters describes no
        registers; lldb then crashes and gdb falls back to a built-in layout.
        Serve the complete description of the block the stub now sends."""
        (reply,) = yield Exchange((body,))
        self._snoop_reply(reply)
        self._proc = None
        if self._serve_own_tdesc and self.config.target_xml:
            doc = self.config.target_xml["target.xml"].encode()
            self._reply(build_qxfer_reply(doc, req.offset, req.length))
        else:
            self._reply(reply)

    def _own_qxfer(self, req: QXferRead) -> bytes | None:
        assert self.config.qxfer is not None
        try:
            return self.config.qxfer(req.object, req.annex, self)
        except Exception as err:  # noqa: BLE001 - never take the session down
            self._emit(Notice(f"qXfer:{req.object}:{req.annex} failed: {err!r}"))
            return None

    def _client_leave(self, body: bytes, raw: bytes | None) -> None:
        """Rule 9: detach/kill: remove every proxy breakpoint first."""
        if self._other_process(body):
            # gdb detaching (or killing) a fork child it does not follow:
            # the program itself stays, and so do the probes.
            if self.capture is not None and self._capture_installed and body[:1] == b"D":
                self._start_proc(self._proc_detach_child(body))
                return None
            return self._forward(body, raw)
        if self._holds_program() and not self._program_exited:
            self._start_proc(self._proc_leave(then=(body, raw)))
        else:
            self._forward(body, raw)

    def _client_resume(self, resume: Resume, body: bytes, raw: bytes | None) -> None:
        self._interrupt_forwarded = False
        self._interrupt_pending = False
        if not self._planted and (self.config.resolve_probes is not None or self.capture is not None
                                  or self.config.make_capture is not None):
            self._start_proc(self._proc_plant_then_resume(resume, body, raw))
            return
        sitting = self._thread_on_proxy_bp(resume)
        if sitting is not None:
            self._start_proc(self._proc_step_off_then_resume(resume, body, raw, *sitting))
            return
        self._resume = resume
        self._stopped = None
        self._forward(body, raw, resume=True)

    def _thread_on_proxy_bp(self, resume: Resume) -> tuple[ThreadId, BpKey] | None:
        """The last-stopped thread sits on a proxy breakpoint it would re-execute."""
        st = self._stopped
        if st is None or st.thread is None or st.pc is None:
            return None
        key = self.bps.proxy_key_at(st.pc)
        if key is None or key[0] != 0:
            return None
        action = resume.action_for(st.thread)
        if action is None:
            return None
        return st.thread, key

    # --------------------------------------------------------------- stub side
    def _on_client_reply(self, body: bytes, raw: bytes) -> None:
        self._snoop_reply(body)
        if body[:1] in (b"T", b"S") and is_stop_reply(body):  # the answer to `?`
            try:
                sr = parse_stop_reply(body)
            except MalformedPacket:
                sr = None
            if sr is not None:
                self._last_stop = sr
                self._stopped = _Stopped(sr.thread, sr.pc(self.pc_regnum) if sr.kind == "T" else None)
                self._note_stop_thread(sr)
        if self._closing:
            return
        self._emit(ToClientRaw(raw))

    def _snoop_reply(self, body: bytes) -> None:
        # A gdbserver that got no xmlRegisters answers target.xml without
        # registers; a client such as lldb then knows no layout at all.
        # Serve the matching complete description ourselves (rule 11).
        if (
            self.config.target_xml
            and self.config.registers_safe
            and b"<architecture>i386:x86-64</architecture>" in body
            and b"<feature" not in body
            and b"include" not in body  # QEMU's describes its registers in xi:included files
            and b"<target" in body
        ):
            self._serve_own_tdesc = True

    def _on_stop_reply(self, body: bytes, raw: bytes) -> None:
        try:
            sr = parse_stop_reply(body)
        except MalformedPacket:
            self._report_stop(None, raw)
            return
        if sr.kind in ("W", "X"):
            self._program_exited = True
            self.bps.forget_all()
            installed, self._capture_installed = self._capture_installed, False  # nothing is left in a process that is gone
            proc = self._capture_call("exited", sr) if installed and self.capture is not None else None
            if proc is not None:
                self._start_proc(self._proc_capture_exited(proc, sr, raw))
                return
            self._report_stop(sr, raw)
            return
        if sr.kind == "T" and sr.reason == "fork" and sr.thread is not None and self._holds_program():
            try:
                child: ThreadId | None = ThreadId.parse(sr.reason_value)
            except MalformedPacket:
                child = None
            if child is not None:
                self._start_proc(self._proc_clean_fork_child(sr, raw, child))
                return
        if sr.kind == "T" and sr.reason == "exec" and self._holds_program():
            # A new image: the probes went with the old one (the stub forgets
            # the process's breakpoints at exec). Stop capturing, say so.
            # The capture first collects what it recorded in the old image.
            proc = self._capture_call("exited", sr) if self._capture_installed and self.capture is not None else None
            self.bps.proxy.clear()
            self.probes.clear()
            self._capture_keys = []
            self._capture_installed = False
            if self.capture is not None:
                try:
                    path: str | None = bytes.fromhex(sr.reason_value.decode()).decode(errors="replace")
                except ValueError:
                    path = None
                self._capture_call("exec_happened", path)
                self._fold_capture_counts()
            self.capture = None
            self.capture_notice = "the program called exec: capture stopped (its probes belonged to the old image)"
            self._emit(Notice(self.capture_notice))
            if proc is not None:
                self._start_proc(self._proc_capture_exited(proc, sr, raw))
                return
        if self._capture_interrupt and sr.signal == SIGINT and not self._interrupt_forwarded and not self._closing:
            # Our own interrupt (a drain the capture asked for): hidden.
            self._capture_interrupt = False
            self._start_proc(self._proc_capture_stop(None))
            return
        if self.capture is not None and sr.kind == "T":
            proc = self._capture_call("stop", sr)
            if proc is not None:
                self._start_proc(self._proc_capture_stop(proc))
                return
        pc = sr.pc(self.pc_regnum) if sr.kind == "T" else None
        if sr.kind == "T" and sr.signal == SIGTRAP and self.probes:
            if _is_trap_reason(sr) and pc is not None:
                if self._probe_hit(sr, raw, pc):
                    return
            elif sr.reason is None and not self._stepping(sr.thread):
                # A stub that gives no stop reason (QEMU's gdbstub): a SIGTRAP
                # of a thread that was not stepping is a breakpoint. QEMU
                # sends no registers either: read the pc first.
                if pc is None:
                    self._start_proc(self._proc_read_pc_then_classify(sr, raw))
                    return
                if self._probe_hit(sr, raw, pc):
                    return
        self._report_stop(sr, raw)

    def _interrupt_reply(self, step: StopReply) -> bytes:
        """The stop the client's interrupt would have given (rule 8): gdbserver
        stops with SIGINT, lldb-server with SIGSTOP; no stop reason."""
        sig = SIGSTOP if _feature_on(self.stub_features, "QThreadSuffixSupported") else SIGINT
        if step.thread is None:
            return b"S%02x" % sig
        return b"T%02xthread:%s;" % (sig, step.thread.format(step.thread.pid is not None))

    def _stepping(self, thread: ThreadId | None) -> bool:
        if self._resume is None or thread is None:
            return False
        action = self._resume.action_for(thread)
        return action is not None and action.op in ("s", "S", "r")

    def _probe_hit(self, sr: StopReply, raw: bytes, pc: int) -> bool:
        """A trap at `pc`: if it is a probe, count it and handle it (hidden or shared)."""
        probe = self.probes.get(pc)
        if probe is None:
            return False
        self.stats.probe_stats.hit(probe, sr.thread)
        self._stop_pc_override = pc
        if not self.bps.client_owns(pc) and not self._closing:
            self._start_proc(self._proc_hidden_stop(sr, pc, probe))
        else:
            self.stats.shared_stops += 1
            self._start_proc(self._proc_shared_stop(sr, raw, probe))
        return True

    def _proc_read_pc_then_classify(self, sr: StopReply, raw: bytes) -> Procedure:
        (regs,) = yield Exchange((b"g",))
        self._proc = None
        pc = _pc_from_g(regs)
        if pc is None or not self._probe_hit(sr, raw, pc):
            self._report_stop(sr, raw, pc=pc)

    def _report_stop(self, sr: StopReply | None, raw: bytes | None, body: bytes | None = None,
                     pc: int | None = None) -> None:
        """A stop the client sees. Ends the client's resume."""
        self._resume = None
        self._interrupt_forwarded = False
        self._interrupt_pending = False
        self._last_stop = sr
        if sr is not None and sr.kind in ("T", "S"):
            known = sr.pc(self.pc_regnum) if sr.kind == "T" else None
            self._stopped = _Stopped(sr.thread, known if known is not None else pc)
            self._note_stop_thread(sr)
        else:
            self._stopped = None
        if self._closing:
            if not self._program_exited and self._holds_program():
                self._start_proc(self._proc_leave())
            else:
                self._emit(Close("client disconnected"))
            return
        if self.capture is not None and self.capture.filters_replies and (body is not None or raw is not None):
            if body is None and raw is not None:
                body = _unframe(raw)
            new = self._capture_call("client_reply", b"vCont", body)
            if isinstance(new, bytes) and new != body:
                body, raw = new, None
        if raw is not None:
            self._emit(ToClientRaw(raw))
        elif body is not None:
            self._emit(ToClient(body))

    # -------------------------------------------------------------- procedures
    def _start_proc(self, proc: Procedure) -> None:
        assert self._proc is None, "one procedure at a time"
        self._proc = proc
        self._advance(proc, None)

    def _step_proc(self, replies: list[bytes]) -> None:
        assert self._proc is not None
        self._advance(self._proc, replies)

    def _advance(self, proc: Procedure, replies: list[bytes] | None) -> None:
        try:
            ex = proc.send(replies) if replies is not None else next(proc)
        except StopIteration:
            if self._proc is proc:
                self._proc = None
            self._drain_client_queue()
            return
        self._proc_expect = len(ex.bodies)
        for i, b in enumerate(ex.bodies):
            last = i == len(ex.bodies) - 1
            self._to_stub(b, _Waiter("proc", resume=ex.resume and last))

    def _proc_hidden_stop(self, sr: StopReply, pc: int, probe: Probe) -> Procedure:
        """Rules 2-4 and 8: step the thread over the proxy's breakpoint, resume."""
        t0 = self.config.clock()
        self.stats.hidden_stops += 1
        key = self.bps.proxy_key_at(pc)
        assert key is not None
        thread = sr.thread
        step = _step_packet(thread)
        reads = self._capture_reads(probe, sr)
        em = self._emulation_for(probe, thread)
        if em is not None:
            # One resume instead of two: read what the instruction needs with
            # the capture's reads, then write its effect and resume (emulate.py).
            extra = () if b"g" in reads else (b"g",)
            sp = sr.register_value(RSP_REGNUM_AMD64)
            if em.needs_stack_word and sp is not None:
                extra += (b"m%x,8" % sp,)
            replies = yield Exchange(reads + extra)
            self._capture_hit(probe, sr, replies[: len(reads)])
            regs = replies[reads.index(b"g")] if b"g" in reads else replies[len(reads)]
            word = memory_bytes(replies[-1]) if em.needs_stack_word and sp is not None else None
            effect = emulate.apply(em, regs, word)
            resume = self._resume
            if (effect is not None and resume is not None and not self._interrupt_pending
                    and not self._closing):
                self.stats.emulated += 1
                self.stats.hidden_time += self.config.clock() - t0
                self._proc = None
                for body in effect.packets:
                    self._to_stub(body, _Waiter("write"))
                self._waiters.append(_Waiter("client-resume", True))
                self._emit(ToStub(_without_signals(resume)))
                return
            reads = ()  # captured already: fall back to the step-over
        replies = yield Exchange(reads + (_z(False, key), step), resume=True)
        if em is None:
            self._capture_hit(probe, sr, replies[: len(reads)])
        step_reply = replies[-1]
        resume = self._resume
        assert resume is not None
        try:
            step_sr: StopReply | None = parse_stop_reply(step_reply)
        except MalformedPacket:
            step_sr = None
        if step_sr is None or step_sr.kind in ("W", "X") or step_sr.signal != SIGTRAP:
            # Something else happened during the step (rule 4): put the
            # breakpoint back if the process lives, and report it.
            if step_sr is not None and step_sr.kind not in ("W", "X"):
                yield Exchange((_z(True, key),))
            self.stats.hidden_time += self.config.clock() - t0
            self._on_stop_reply_after_proc(step_reply)
            return
        new_pc = step_sr.pc(self.pc_regnum)
        report: bytes | None = None
        action = resume.action_for(thread) if thread is not None else None
        if self._interrupt_pending or self._interrupt_forwarded or self._closing:
            report = self._interrupt_reply(step_sr)
        elif action is not None and action.op in ("s", "S"):
            report = step_reply  # the proxy's step is the client's step (rule 3)
        elif action is not None and action.op == "r" and action.range is not None:
            lo, hi = action.range
            if new_pc is None or not lo <= new_pc < hi:
                report = step_reply
        if report is not None:
            yield Exchange((_z(True, key),))
            self.stats.hidden_time += self.config.clock() - t0
            self._proc_done_report(report)
            return
        # Put the breakpoint back and re-issue the client's resume, back to back.
        self.stats.hidden_time += self.config.clock() - t0
        self._proc = None
        self._to_stub(_z(True, key), _Waiter("drop"))
        self._waiters.append(_Waiter("client-resume", True))
        self._emit(ToStub(_without_signals(resume)))

    def _proc_shared_stop(self, sr: StopReply, raw: bytes, probe: Probe) -> Procedure:
        """Rule 4: a probe at a client breakpoint is processed, then reported."""
        reads = self._capture_reads(probe, sr)
        replies: list[bytes] = (yield Exchange(reads)) if reads else []
        self._capture_hit(probe, sr, replies)
        self._proc = None
        self._report_stop(sr, raw, pc=self._stop_pc_override)
        if self._stopped is not None:
            self._stopped.counted = True

    def _emulation_for(self, probe: Probe, thread: ThreadId | None) -> emulate.Emulation | None:
        """Emulate the probed instruction when it is safe: a known instruction,
        gdbserver's `g` layout without xmlRegisters (rule 11), and a thread
        that simply continues (a step is the client's own: rule 3)."""
        if not self._emulate or not probe.code or thread is None or self._resume is None:
            return None
        if self._interrupt_pending or self._interrupt_forwarded or self._closing:
            return None
        action = self._resume.action_for(thread)
        if action is None or action.op not in ("c", "C"):
            return None
        return emulate.decode(probe.code)

    def _capture_reads(self, probe: Probe, sr: StopReply | None) -> tuple[bytes, ...]:
        cap = self.capture
        if cap is None or probe.kind == "count" or sr is None:
            return ()
        try:
            return tuple(cap.reads(probe, _tid(sr.thread), sr))
        except Exception as err:  # a capture bug must never take the session down
            self._capture_failed(err)
            return ()

    def _capture_hit(self, probe: Probe, sr: StopReply | None, replies: list[bytes]) -> None:
        cap = self.capture
        if cap is not None and probe.kind != "count" and sr is not None:
            try:
                cap.hit(probe, _tid(sr.thread), sr, replies)
            except Exception as err:  # noqa: BLE001 - counted and reported once
                self._capture_failed(err)

    def _capture_call(self, hook: str, *args: Any) -> Any:
        """Call a capture hook; a capture bug is counted, never fatal."""
        try:
            return getattr(self.capture, hook)(*args)
        except Exception as err:  # noqa: BLE001 - counted and reported once
            self._capture_failed(err)
            return None

    def _holds_program(self) -> bool:
        """The proxy has something in the program to take out before it goes."""
        return bool(self.bps.proxy_only()) or self._capture_installed or self._capture_interrupt

    def _proc_detach_child(self, body: bytes) -> Procedure:
        """The client detaches a fork child; then the capture syncs before the
        client hears back (gdbserver stops a trace experiment at any detach:
        the tracepoint backend restarts it here, while the program is stopped)."""
        (reply,) = yield Exchange((body,))
        proc = self._capture_call("sync")
        if proc is not None:
            yield from proc
        self._proc = None
        self._reply(reply)

    def _proc_capture_exited(self, proc: Procedure, sr: StopReply, raw: bytes) -> Procedure:
        """The program exited (or exec'd): the capture collects what it recorded
        since the last stop (a tracepoint buffer stays readable), then the
        client sees the exit (the exec)."""
        yield from proc
        self._proc = None
        self._report_stop(sr, raw)

    def _proc_clean_fork_child(self, sr: StopReply, raw: bytes, child: ThreadId) -> Procedure:
        """A fork child inherits the parent's memory, the proxy's int3s
        included: gdb detaches the child once it has taken *its* breakpoints
        out, and the child would die of SIGTRAP at the first probe it meets.
        Take the proxy's out of the child first (the stub applies z0 to the
        process selected with Hg), then put the stub's selection back on the
        thread that reported the fork (rule 6), then report the fork."""
        assert sr.thread is not None
        bodies = [b"Hg" + child.format(True)]
        bodies += [_z(False, k) for k in self.bps.proxy_only()]
        yield Exchange(tuple(bodies))
        if self.capture is not None:
            proc = self._capture_call("forked", child)
            if proc is not None:
                yield from proc
        yield Exchange((b"Hg" + sr.thread.format(True),))
        self.stats.forks_cleaned += 1
        self._proc = None
        self._report_stop(sr, raw)

    def _proc_capture_stop(self, proc: Procedure | None) -> Procedure:
        """A stop the capture caused: its own interrupt (drain), or a stop it
        records itself. Hidden: run the capture's procedure, resume as the
        client asked (rule 3: no signal repeated)."""
        t0 = self.config.clock()
        last = self._last_stop
        if proc is None:
            self.stats.hidden_interrupts += 1
            proc = self._capture_call("sync")
        if proc is not None:
            yield from proc
        self.stats.hidden_time += self.config.clock() - t0
        self._proc = None
        resume = self._resume
        if self._closing or resume is None:
            self._report_stop(last, None, b"S%02x" % SIGINT)
            return
        if self._interrupt_pending:
            # The client's Ctrl-C arrived meanwhile (rule 8).
            self._report_stop(None, None, b"S%02x" % SIGINT)
            return
        self._forward(_without_signals(resume), None, resume=True)

    def tick(self, now: float) -> None:
        """Called by the shell every few tens of ms: lets the capture ask for a
        hidden stop while the program runs (a drain before its buffer fills)."""
        if (self.capture is None or not self.running or self._proc is not None or self._closing
                or self._interrupt_forwarded or self._capture_interrupt or not self._capture_installed):
            return
        if self._capture_call("wants_interrupt", now):
            self._capture_interrupt = True
            self._emit(ToStubRaw(b"\x03"))

    @property
    def engine(self) -> Any:
        return self.target.engine if self.target is not None else None

    def _capture_failed(self, err: Exception) -> None:
        self.stats.capture_errors += 1
        if self.stats.capture_errors == 1:
            self._emit(Notice(f"capture error (counted in stats, the session goes on): {err!r}"))

    def _on_stop_reply_after_proc(self, body: bytes) -> None:
        self._proc = None
        self._on_stop_reply(body, _frame_for_client(body))

    def _proc_done_report(self, body: bytes) -> None:
        self._proc = None
        try:
            sr: StopReply | None = parse_stop_reply(body)
        except MalformedPacket:
            sr = None
        self._report_stop(sr, None, body)

    def _proc_step_off_then_resume(
        self, resume: Resume, body: bytes, raw: bytes | None, thread: ThreadId, key: BpKey
    ) -> Procedure:
        """Step a thread off a proxy breakpoint before the client's resume (rule 2).

        The thread was reported stopped at the probe without executing it
        (e.g. a step that entered the function): that is a hit too, unless
        it was a breakpoint stop already counted.
        """
        self._resume = resume
        st = self._stopped
        reads: tuple[bytes, ...] = ()
        probe = self.probes.get(key[1])
        fresh = st is not None and not st.counted and probe is not None
        if fresh and probe is not None:
            self.stats.probe_stats.hit(probe, thread)
            reads = self._capture_reads(probe, self._last_stop)
        replies = yield Exchange(reads + (_z(False, key), _step_packet(thread)), resume=True)
        if fresh and probe is not None:
            self._capture_hit(probe, self._last_stop, replies[: len(reads)])
        step_reply = replies[-1]
        yield Exchange((_z(True, key),))
        self._proc = None
        action = resume.action_for(thread)
        if action is not None and action.op in ("s", "S"):
            self._proc_done_report(step_reply)
            return
        try:
            sr = parse_stop_reply(step_reply)
        except MalformedPacket:
            sr = None
        if sr is None or sr.kind in ("W", "X") or sr.signal != SIGTRAP:
            self._on_stop_reply(step_reply, _frame_for_client(step_reply))
            return
        self._stopped = None
        self._forward(_without_signals(resume) if _has_signal_for(resume, thread) else body,
                      None, resume=True)

    def _proc_plant_then_resume(self, resume: Resume, body: bytes, raw: bytes | None) -> Procedure:
        yield from self._plant()
        self._proc = None
        self._client_resume(resume, body, raw)

    def _plant(self) -> Generator[Exchange, list[bytes], None]:
        """Find the program, plant the probes and install the capture (before it first runs)."""
        self._planted = True
        if self.exec_file is None and _feature_on(self.stub_features, "qXfer:exec-file:read"):
            (reply,) = yield Exchange((b"qXfer:exec-file:read::0,fff",))
            if reply[:1] in (b"l", b"m"):
                self.exec_file = unescape_binary(reply[1:]).decode(errors="replace")
        pid = self._stop_pid()
        self._main_pid = pid
        if self.exec_file is None and self.config.local_exe is not None and pid is not None:
            self.exec_file = self.config.local_exe(pid)
        entry: int | None = None
        if _feature_on(self.stub_features, "qXfer:auxv:read"):
            (reply,) = yield Exchange((b"qXfer:auxv:read::0,1000",))
            entry = _auxv_entry(reply)
        self._entry = entry
        probes: list[Probe] = []
        if self.config.resolve_probes is not None:
            try:
                probes += self.config.resolve_probes(self.exec_file, entry)
            except Exception as err:  # file problems come back as text
                self._plant_failed = str(err)
                self._emit(Notice(f"probes not planted: {err}"))
        if self.config.open_target is not None:
            feats = frozenset(f.name for f in self.stub_features if f.value != "-")
            self.target = self.config.open_target(self.exec_file, entry, pid, feats)
        if self.capture is None and self.config.make_capture is not None and self.mode != "off":
            try:
                self.capture = self.config.make_capture(self.capture_name, self.mode, self.target)
            except ValueError as err:
                self.capture_notice = f"capture {self.capture_name}: {err}; using breakpoints"
                self._emit(Notice(self.capture_notice))
                self.capture = self.config.make_capture("breakpoints", self.mode, self.target)
        self._count_probes = probes
        yield from self._plant_probes(probes)
        self._emit(Notice(f"planted {len(self.probes)} probe(s)"))
        yield from self._install_capture()

    def _plant_probes(self, probes: list[Probe]) -> Generator[Exchange, list[bytes], None]:
        bodies = []
        for p in probes:
            key: BpKey = (0, p.addr, 1)
            self.probes[p.addr] = p
            if self.bps.proxy_insert(key):
                bodies.append(_z(True, key))
        if bodies:
            replies = yield Exchange(tuple(bodies))
            bad = [b for b, r in zip(bodies, replies) if r != b"OK"]
            if bad:
                self._emit(Notice(f"{len(bad)} probe(s) could not be inserted: {bad[0]!r}"))

    def _install_capture(self) -> Generator[Exchange, list[bytes], None]:
        """Plan and install the capture backend on the target."""
        cap = self.capture
        if cap is None or self.target is None:
            return
        # The client's breakpoints so far: a backend that must change how the stub
        # holds some of them (uprobes: Z0 at a probe site -> Z1) keeps the table true.
        self.target.extra["client_breakpoints"] = self.bps
        planned = self._capture_call("plan", self.target) or []
        # A backend may count some --probe functions itself (uprobes): our hidden
        # breakpoints there go out first (a uprobe swallows a Z0 at its address).
        taken = set(self._capture_call("count_probes", list(self._count_probes)) or ())
        self._capture_counts = {p.addr: p for p in self._count_probes if p.addr in taken}
        keys = [(0, a, 1) for a in self._capture_counts if self.probes.pop(a, None) is not None]
        bodies = tuple(_z(False, k) for k in keys if self.bps.proxy_remove(k))
        if bodies:
            yield Exchange(bodies)
        self._capture_keys = [(0, p.addr, 1) for p in planned if p.addr not in self.probes]
        yield from self._plant_probes([p for p in planned if p.addr not in self.probes])
        proc = self._capture_call("install")
        if proc is not None:
            yield from proc
        self._capture_installed = True

    def _uninstall_capture(self, replant: bool = True) -> Generator[Exchange, list[bytes], None]:
        """Take the capture out of the program (its hidden breakpoints and its own state)."""
        cap = self.capture
        if cap is None:
            return
        if self._capture_installed:
            proc = self._capture_call("uninstall")
            if proc is not None:
                yield from proc
            self._capture_installed = False
        if self._capture_counts:
            # the capture's counts join ours; its probes become hidden breakpoints again
            # (after its uninstall: the uprobes are out before our Z0 goes in)
            counted = self._fold_capture_counts()
            if replant:
                yield from self._plant_probes(counted)
        bodies = []
        for key in self._capture_keys:
            self.probes.pop(key[1], None)
            if self.bps.proxy_remove(key):
                bodies.append(_z(False, key))
        self._capture_keys = []
        if bodies:
            yield Exchange(tuple(bodies))

    def _fold_capture_counts(self) -> list[Probe]:
        """The count probes the capture counted: their hits join ours; returns them."""
        for addr, n in (self._capture_call("probe_counts") or {}).items():
            if addr in self._capture_counts:
                self.stats.probe_stats.add(self._capture_counts[addr], n)
        counted, self._capture_counts = list(self._capture_counts.values()), {}
        return counted

    def request_switch(self, capture: str | None = None, mode: str | None = None) -> None:
        """Ask for another capture backend or mode; done after the command that asked."""
        self._switch_request = (capture, mode)

    def _proc_switch(self, name: str | None, mode: str | None, then: bytes | None = None) -> Procedure:
        yield from self._switch(name, mode)
        self._proc = None
        if then is not None:
            self._dispatch_after_switch(then)

    def _dispatch_after_switch(self, body: bytes) -> None:
        # The backend that handed over is gone: the packet takes the normal
        # path, and no backend sees it again (it would hand over forever).
        self._dispatch_client(body, None, handed_over=True)

    def _switch(self, name: str | None, mode: str | None) -> Generator[Exchange, list[bytes], None]:
        name = name or self.capture_name
        mode = mode or self.mode
        if self.capture is not None and self._planted:
            yield from self._uninstall_capture()
        self.capture_name, self.mode = name, mode
        self.stats.capture_switches += 1
        if self.config.make_capture is None:
            return
        self.capture = None
        if not self._planted:
            return  # the first resume plants and installs it
        if mode != "off":
            self.capture = self.config.make_capture(name, mode, self.target)
            yield from self._install_capture()

    def _client_selects_other_process(self) -> bool:
        g = self.client_g_thread
        if not g or self._main_pid is None or not g.startswith(b"p"):
            return False
        try:
            pid = ThreadId.parse(g).pid
        except MalformedPacket:
            return False
        return pid is not None and pid > 0 and pid != self._main_pid

    def _other_process(self, body: bytes) -> bool:
        """`D;pid` / `vKill;pid` naming a process other than the program's."""
        _, sep, arg = body.partition(b";")
        if not sep or self._main_pid is None:
            return False
        try:
            return int(arg, 16) != self._main_pid
        except ValueError:
            return False

    def _stop_pid(self) -> int | None:
        """The program's pid from the last stop (without multiprocess ids the
        first stop's thread is the main thread, whose tid is the pid)."""
        st = self._last_stop
        if st is None or st.thread is None:
            return None
        pid = st.thread.pid or st.thread.tid
        return pid if pid > 1 else None

    def _proc_leave(self, then: tuple[bytes, bytes | None] | None = None) -> Procedure:
        yield from self._uninstall_capture(replant=False)
        keys = self.bps.proxy_only()
        bodies = tuple(_z(False, k) for k in keys)
        stray = self._capture_interrupt
        if then is None and (self._interrupted_for_leave or stray):
            # The client hung up while the program ran: the proxy's own
            # interrupt stopped it with SIGINT. Tell the stub to pass no
            # signal, or an attached program dies of it once detached.
            bodies = (b"QProgramSignals:",) + bodies
        last = self._last_stop
        if then is not None and stray:
            # The capture's own interrupt crossed the stop the client saw: its
            # SIGINT is pending. Run until it arrives, passing no signal, or a
            # detached program dies of it.
            (ok,) = yield Exchange((b"QProgramSignals:",))
            yield Exchange(bodies + (b"vCont;c",), resume=True)
            self._capture_interrupt = False
            bodies = ()
        if then is None and (self._interrupted_for_leave or stray) and last is not None and last.signal != SIGINT:
            # Our 0x03 crossed a stop reply already on its way: gdbserver,
            # stopped, turned it into a SIGINT queued for the program, which
            # would kill it once detached. Let it run until that SIGINT stops
            # it (the passes list above keeps it from being delivered).
            yield Exchange(bodies + (b"vCont;c",), resume=True)
        elif bodies:
            yield Exchange(bodies)
        for k in keys:
            self.bps.proxy_remove(k)
        self._proc = None
        if then is not None:
            self._forward(then[0], then[1])
        else:
            # The client is gone: leave the program as gdbserver would
            # (detach / kill is the stub's call when the link closes).
            self._emit(Close("client disconnected"))

    # --------------------------------------------------------------- queries
    def current_thread(self) -> int | None:
        """The thread the client is looking at: its Hg, else the last stop's."""
        if self.client_g_thread:
            try:
                tid = ThreadId.parse(self.client_g_thread).tid
            except MalformedPacket:
                tid = 0
            if tid > 0:  # 0 (any) and -1 (all) name no thread
                return tid
        st = self._stopped
        return st.thread.tid if st is not None and st.thread is not None else None

    def stop_pcs(self) -> dict[int, int]:
        st = self._stopped
        if st is None or st.thread is None or st.pc is None:
            return {}
        return {st.thread.tid: st.pc}

    def stats_lines(self) -> list[str]:
        s = self.stats
        per_probe, total = s.probe_stats.per_probe.copy(), s.probe_stats.total
        if self._capture_counts and self.capture is not None:  # counted by the capture (uprobes)
            for addr, n in (self._capture_call("probe_counts") or {}).items():
                if addr in self._capture_counts:
                    per_probe[self._capture_counts[addr].name] += n
                    total += n
        lines = [
            f"probe hits: {total}",
            f"hidden stops: {s.hidden_stops}",
            f"shared stops (reported): {s.shared_stops}",
            f"time in hidden stops: {s.hidden_time * 1e3:.1f} ms"
            + (f" ({s.hidden_time / s.hidden_stops * 1e6:.0f} us each)" if s.hidden_stops else ""),
            f"interrupts during hidden stops: {s.interrupts_during_hidden}",
            f"hidden stops resumed once (probed instruction emulated): {s.emulated}",
            f"capture errors: {s.capture_errors}",
            self.register_notice.removeprefix("asyncrsp: "),
        ]
        if s.hidden_interrupts:
            lines.append(f"hidden interrupts (capture drains): {s.hidden_interrupts}")
        if s.forks_cleaned:
            lines.append(f"fork children cleaned of the proxy's breakpoints: {s.forks_cleaned}")
        if s.capture_switches:
            lines.append(f"capture switches: {s.capture_switches}")
        if self.capture_notice:
            lines.append(self.capture_notice)
        if self.capture is not None:
            lines += self._capture_call("stats_lines") or []
        else:
            lines.append(f"capture: none (mode {self.mode})")
        if self._plant_failed:
            lines.append(f"probes not planted: {self._plant_failed}")
        for name, n in sorted(per_probe.items()):
            lines.append(f"  {name}: {n}")
        return lines


# ---------------------------------------------------------------------- helpers
def _pc_from_g(reply: bytes) -> int | None:
    """rip from an x86-64 `g` block in gdb's order (16 GPRs, then rip)."""
    data = memory_bytes(reply.replace(b"xx", b"00"))
    if data is None or len(data) < 136:
        return None
    return int.from_bytes(data[128:136], "little")


def _tid(thread: ThreadId | None) -> int:
    return thread.tid if thread is not None else 0


def _is_console_output(body: bytes) -> bool:
    return body[:1] == b"O" and body != b"OK" and len(body) > 1


def _feature_on(feats: list[Feature], name: str) -> bool:
    return any(f.name == name and f.value != "-" for f in feats)


def _strip_xml_registers(feats: list[Feature]) -> list[Feature]:
    out = []
    for f in feats:
        if f.name == "xmlRegisters":
            archs = [a for a in f.value.split(",") if a and a != "i386"]
            if archs:
                out.append(Feature("xmlRegisters", ",".join(archs)))
            continue
        out.append(f)
    return out


def _is_trap_reason(sr: StopReply) -> bool:
    return sr.reason in ("swbreak", "breakpoint")


def _z(insert: bool, key: BpKey) -> bytes:
    return BreakpointPacket(insert, key[0], key[1], key[2]).build()


def _step_packet(thread: ThreadId | None) -> bytes:
    if thread is None:
        return b"vCont;s"
    return b"vCont;s:" + thread.format(thread.pid is not None)


def _without_signals(resume: Resume) -> bytes:
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


def _has_signal_for(resume: Resume, thread: ThreadId) -> bool:
    a = resume.action_for(thread)
    return a is not None and a.op in ("C", "S")




def _frame_for_client(body: bytes) -> bytes:
    return frame(body)


def _unframe(raw: bytes) -> bytes:
    """The body of one framed packet `$...#cs` (RLE expanded)."""
    start, end = raw.find(b"$"), raw.rfind(b"#")
    body = raw[start + 1:end] if start >= 0 and end > start else raw
    return rle_expand(body) if b"*" in body else body


def _auxv_entry(reply: bytes) -> int | None:
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


__all__ = ["Session", "SessionConfig", "Exchange"]
