"""The session's state and the machinery every part of it shares.

`SessionBase` holds what the client believes and what the stub does (see
core.py's theory of operation), the FIFO of waiters for stub replies, and
the procedure runner: a procedure is a generator that yields `Exchange`s
(request bodies sent back to back) and receives their replies. The parts
are objects the session holds, each with its own state (`ns`: non-stop mode,
nonstop.py; `queries`: monitor commands, qXfer objects, stats; `hidden`:
hidden stops; `stepping`: steps across `.await`; `task_threads`; `lifecycle`:
the capture's life: plant, install, switch, fork, exec, exit, leave), but for
`core` (routing), the session itself.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Generator
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rsp.errors import ProtocolError
from rsp.packets.qsupported import Feature
from rsp.packets.resume import Resume
from rsp.packets.stop import StopReply
from rsp.threads import ThreadId

from proxy.arch import X86_64, Arch
from proxy.host.identity import UNDECIDED, Identity
from proxy.probes import Probe, ProbeStats
from proxy.procedure import Exchange, Procedure

from .actions import Action, AfterSend, Close, Notice, SignalProgram, ToClient, ToStub, ToStubRaw
from .breakpoints import BreakpointTable
from .known import StopKnowledge
from .lifecycle import CaptureLifecycle
from .nonstop import NonStopMode
from .queries import Queries
from .pacing import Pacer
from .reads import ReadLimit, read_memory
from .wire import SIGINT, is_console_output, stop_or_none, z_packet

if TYPE_CHECKING:
    from .core import Session
    from .hidden import HiddenStops
    from .stepping import AsyncStepping
    from proxy.capture.base import Residue


@dataclass(slots=True)
class Waiter:
    """One request in flight to the stub, and who takes its reply."""

    kind: str  # "client", "client-resume", "client-hg" (the selection is taken on OK), "client-vcont" (the stub's actions noted), "proc", "drop", "write", "reloc" (a relocated instruction's M)
    resume: bool = False
    request: bytes | None = None  # kept when the capture rewrites replies
    asks_stop: bool = False  # the request is `?`: its reply is a stop reply
    lane: bool = False  # forwarded by the fast lane (core.Session.lane_client): its reply may take it back


@dataclass(slots=True)
class SessionConfig:
    registers_safe: bool = True
    # Resolve probe patterns against the program: (elf path or None, runtime AT_ENTRY or None) -> probes.
    resolve_probes: Callable[[str | None, int | None], list[Probe]] | None = None
    elf_path: str | None = None
    # Answer `monitor async ...`: (command text, session, read_memory) -> output text.
    # It runs once (session/reader.py): read_memory(addr, size) asks the stub for what
    # nothing here holds while the command waits; None: memory the stub cannot read.
    monitor: Callable[[str, "Session", Callable[[int, int], bytes | None]], str] | None = None
    # Serve proxy-owned qXfer objects: (object, annex, session) -> document bytes or None.
    qxfer: Callable[..., bytes | None] | None = None  # (object, annex, session, read)
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
    # The stub's kind is unknown (a TCP stub): ask it a qSupported of our own first
    # and decide the register mode from what its reply shows:
    # (qSupported reply) -> (registers_safe, notice).
    classify_stub: Callable[[bytes], tuple[bool, str]] | None = None
    # The qSupported that asks it (proxy.host.regsafety.STUB_PROBE_QSUPPORTED).
    stub_probe: bytes = b"qSupported:multiprocess+;swbreak+"
    # The program's file from its pid when the stub cannot tell (local stubs).
    local_exe: Callable[[int], str | None] | None = None
    # A SIGINT waiting in the kernel for the local process with this host pid
    # (proxy.host.procmem.sigint_pending); None: never asked.
    sigint_pending: Callable[[int], bool] | None = None
    # Is the stub's process this host's? (stub pid, stub auxv, program path) ->
    # a procedure returning a proxy.host.identity.Identity (identity.prove). None: never local.
    identify: Callable[[int | None, bytes | None, str | None], Generator[Exchange, list[bytes], Any]] | None = None
    # Emulate probed instructions instead of stepping over them (emulate.py).
    emulate: bool = True
    # Tasks as threads (proxy.threads): (session, read_memory) -> (live tasks, frame shape
    # lookup, _start's return address), run like a monitor command (its registers through
    # monitor_threads); None: the feature is not composed in.
    task_threads: Callable[..., Any] | None = None
    # Reads of a proven local program's data memory for one read loop (proxy.host.localmem):
    # (session) -> an object with read(addr, size) -> bytes | None and close(), or None
    # (remote, unproven, not readable); None: every read goes through `m`.
    local_memory: Callable[[Any], Any] | None = None
    # The memory of a proven local program, as the stub's `m` shows it where that is sure
    # (proxy.host.localmem.open_live): (host pid) -> an object with read(addr, size) ->
    # bytes | None and close(), or None; None: every `m` goes to the stub (known.py).
    live_memory: Callable[[int], Any] | None = None
    # A program of another host: read its /proc/PID/maps through the stub (vFile) at each
    # reflection, for the runtime adapters (queries._read_remote_maps).
    remote_maps: bool = False
    # No map through the stub (QEMU's user mode: no pid, no vFile): the emulator's process of
    # this host at the stub's end of the connection, for its map (proxy.host.emulator.
    # EmulatorHost: find(socket, auxv, AT_RANDOM bytes, program path), maps(emulator));
    # None: not looked for (--remote, a core, a stub on a pipe).
    emulator: Any = None
    clock: Callable[[], float] = time.perf_counter
    # the clock every capture backend stamps polls with (CLOCK_MONOTONIC): the stops on the timeline
    stop_clock: Callable[[], int] = time.monotonic_ns


_STOP_SERIALS = itertools.count(1)


def next_stop_serial() -> int:
    """A new key for the program's state at a stop (a stop, or the client wrote memory or registers)."""
    return next(_STOP_SERIALS)


@dataclass(slots=True)
class Stopped:
    """What we know of the last stop the client saw."""

    thread: ThreadId | None
    pc: int | None
    counted: bool = False  # a probe hit at pc was already counted for this stop
    serial: int = field(default_factory=next_stop_serial)  # the snapshot's key (proxy.snapshot)


@dataclass(slots=True)
class SessionStats:
    hidden_stops: int = 0
    shared_stops: int = 0  # probe hits at a client breakpoint too: processed and reported
    hidden_time: float = 0.0
    emulated: int = 0  # hidden stops resumed once, the probed instruction emulated
    hidden_interrupts: int = 0  # the proxy stopped the program for its capture (drains)
    capture_switches: int = 0
    forks_cleaned: int = 0  # fork children whose copies of the proxy's breakpoints were removed
    hidden_forks: int = 0  # forks the client did not ask to hear of: child cleaned and detached
    interrupts_during_hidden: int = 0
    late_traps: int = 0  # traps at a proxy breakpoint reported after it was taken out: hidden (hidden.py)
    ns_waited: int = 0  # non-stop stops without a thread placed after waiting for the stub's next report
    ns_unplaced: int = 0  # ... given to the client as sent: their thread could not be told
    capture_errors: int = 0
    client_packets: int = 0
    shielded: int = 0  # client packets answered E01 by the proxy, never forwarded (shield.py)
    reconnects: int = 0  # clients after the first on a kept stub
    stub_packets: int = 0
    local_read_bytes: int = 0  # reflection's reads served from /proc/PID/mem, not `m` (host/localmem.py)
    probe_stats: ProbeStats = field(default_factory=ProbeStats)


class SessionBase:
    """State and procedure runner; see the module docstring.

    Its parts (nonstop.py, lifecycle.py, hidden.py, stepping.py, queries.py, taskthreads.py)
    hold the session and use its public names only: the procedure runner (`start_proc`,
    `end_proc`, `proc`), the client's and the stub's sides (`reply`, `forward`, `emit`,
    `report_stop`, `to_stub`), the capture (`capture_call`, `capture_installed`) and the
    state of the program as the session knows it (`stopped`, `last_stop`, `resume`,
    `planted`, `main_pid`, `program_exited`, ...). Underscored names are the session's own
    (tests/proxy/session/test_core.py checks it from the sources)."""

    def __init__(self, config: SessionConfig) -> None:
        self.config = config
        self.bps = BreakpointTable()
        self.stats = SessionStats()
        self.probes: dict[int, Probe] = {}  # runtime address -> probe
        self._actions: list[Action] = []
        self.pacer = Pacer()  # one packet in flight until the stub agrees to no-ack (pacing.py)
        self.read_limit = ReadLimit()  # the largest `m` the stub takes (reads.py)
        # threads a proxy step went to that another thread's report answered (hidden.py): their
        # step's trap, when it comes, is the proxy's, resumed hidden (pacing.py)
        self.orphan_steps: set[int] = set()
        self._read_limit_said: str | None = None
        # work a procedure's answer does not wait for (proxy.app: the inventory's cache
        # write), sent after its replies as AfterSend when it ends
        self.after_answer: list[Callable[[], object]] = []
        self.waiters: deque[Waiter] = deque()
        self.proc: Procedure | None = None
        self._proc_replies: list[bytes] = []
        self._proc_expect = 0
        self._client_queue: deque[bytes] = deque()
        self.closing = False
        self.keep_stub = False  # the client hung up and the stub stays for the next one
        self.left = False  # the client detached from or killed the program
        self._extended = False  # extended-remote (`!`): the stub outlives its processes
        # what the client believes / asked
        self.client_features: list[Feature] = []
        self.stub_features: list[Feature] = []
        self.stub_vcont_ops: frozenset[bytes] = frozenset()  # the stub's `vCont?` reply, as the client asked it
        self.packet_size: int | None = None  # the stub's PacketSize (qSupported), for the shield
        self.client_g_thread: bytes | None = None  # raw thread id of the client's last Hg
        # the stub's selected thread as the client believes it: its last Hg, or the
        # thread of the last stop it saw (a stop reply moves it; rule 6)
        self.stub_g: bytes | None = None
        self.resume: Resume | None = None  # the client's outstanding resume
        self.interrupt_pending = False
        self.interrupt_forwarded = False
        # the client's Ctrl-C while the program was stopped: sent after its next continue
        self.interrupt_at_resume = False
        # a 0x03 went to the stub and the stop that came was not its SIGINT: it
        # may have crossed that stop, and gdbserver then queued a real SIGINT
        self.sigint_crossed = False
        self.stopped: Stopped | None = None
        self.last_stop: StopReply | None = None
        self.stop_pc_override: int | None = None
        self.interrupted_for_leave = False
        self.planted = False
        # the program's file, pid, entry and host were found (lifecycle.find_program)
        self.found = False
        self.preparing = False  # _proc_prepare runs: the program stopped, no resume outstanding
        self.residues: list[Residue] = []  # dropped backends that still hide something (tracepoints)
        # The client's resolved qSymbol answers, by symbol: a backend made after
        # them gets them too (`_new_capture`). gdb resolves gdbserver's lookups at
        # connect, before any backend exists, for a program it attaches to.
        self.client_symbols: dict[bytes, bytes] = {}
        self._reloc_failed = False  # a write of a relocated instruction was refused (qRelocInsn)
        self.program_exited = False
        self.serve_own_tdesc = False
        # the program's CPU (proxy/arch): x86-64 until its ELF says otherwise (set_arch)
        self.arch: Arch = X86_64
        self.pc_regnum = X86_64.regnum(X86_64.pc)
        self.sp_regnum = X86_64.regnum(X86_64.sp)
        self.exec_file: str | None = config.elf_path
        self.load_bias: int | None = None
        self.register_notice = "registers: " + ("safe" if config.registers_safe else "full")
        # capture
        self.capture: Any = config.capture
        self.mode = config.mode
        self.target: Any = None
        self.capture_installed = False
        self.capture_notice: str | None = None
        self.stub_socket: Any = None  # the connection to the stub, when a socket (serve.py)
        self.emulate = False  # decided from the stub's qSupported reply
        self.no_emulation = False  # this hit's thread is not the stub's selected one (hidden.py)
        self.main_pid: int | None = None  # the program's process (fork children are others)
        self._resume_checked: object = None  # the resume whose named threads the stub has (core._named_threads)
        self.processes = 1  # extended-remote: each vRun / vAttach / R starts another
        self.ns = NonStopMode(self)  # non-stop mode: its state and cycles (nonstop.py)
        self.queries = Queries(self)  # what the proxy answers itself (queries.py)
        self.lifecycle = CaptureLifecycle(self)  # the capture's life in the program (lifecycle.py)
        self.hidden_forks = False  # fork-events asked of the stub for a client that did not ask
        self._g_asked = False  # the client's `g` is out: its reply gives the stub's register block size
        self._g_size: int | None = None
        self._qsymbol_asked = False  # the client's qSymbol: is out: its reply may open the stub's symbol look-up
        self.symbol_lookup: bytes | None = None  # the symbol (hex) the stub asked the client for and waits on
        self.shield_last: str | None = None  # why the last refused client packet was refused
        self.identity: Identity = UNDECIDED  # the program's host (proxy/host/identity.py), decided at the first resume
        # what is known of the process: its binary, its snapshot at this stop (proxy.program.Program,
        # composed in by proxy.app; None: a session answering nothing about tasks)
        self.program: Any = None
        # what the stub would answer at this stop, answered here (known.py)
        self.known = StopKnowledge(open_memory=config.live_memory)

    def take_actions(self) -> list[Action]:
        out, self._actions = self._actions, []
        return out

    def emit(self, action: Action) -> None:
        kind = type(action)
        if kind is ToStub:
            self.known.sent(action.body)  # type: ignore[union-attr]
        elif kind is ToStubRaw:
            raw = action.raw  # type: ignore[union-attr]
            self.known.sent(raw[1:-3] if raw[:1] == b"$" else raw)
        if self.pacer.no_ack:
            self._actions.append(action)
        else:
            self._actions.extend(self.pacer.offer(action))

    def stub_stale(self, body: bytes) -> None:
        """A packet the link dropped as stale (rsp/connection.py, drop_before_ack): when it is
        another thread's stop report, that thread is parked in the stub's loop (pacing.py)."""
        if not self.pacer.no_ack and body[:1] in (b"T", b"S") and self.pacer.report(body, False):
            self.pacer.stray()

    def stub_ack(self) -> None:
        """The stub acknowledged a packet nothing of ours waited for (rsp/connection.py,
        bare_acks): a thread parked in its loop took a release (pacing.py)."""
        self.pacer.bare_ack()

    def stub_garbled(self) -> None:
        """The stub sent bytes outside any packet (rsp/reader.py, junk_bytes): under a stub
        that acknowledges, a packet two of its threads wrote at once (pacing.py)."""
        if not self.pacer.no_ack:
            self.pacer.garbled()

    def kick_parked(self, acked: bool, quiet: float = 0.0) -> None:
        """The shell's watch: release a thread parked in the stub's loop (pacing.py) when the
        only request in flight resumes the program (the client's, or a hidden stop's step) and
        the stub acknowledged everything sent (``acked``); ``quiet``: seconds since the stub
        last sent anything."""
        w = self.waiters
        if acked and len(w) == 1 and w[0].resume:
            self._actions.extend(self.pacer.kick(quiet))

    def _copied_stop(self, body: bytes) -> bool:
        """A stop report that is a copy of one since the last resume (a thread that read a
        release's bytes as the ack of its report, pacing.py): dropped. The reply to ``?``
        says the same stop again and is always a reply."""
        if self.pacer.no_ack or body[:1] not in (b"T", b"S", b"W", b"X"):
            return False
        if self.waiters and self.waiters[0].asks_stop:
            return False
        waited = bool(self.waiters) and self.waiters[0].resume
        return stop_or_none(body) is not None and not self.pacer.report(body, waited)

    def _copied_reply(self, body: bytes) -> bool:
        """A packet that is no stop report while the program runs (the proxy waits for a stop,
        or for nothing): a reply a thread sent again for bytes it took for its ack (pacing.py).
        A resume is answered by a stop, console output, an error or an empty reply, never
        by anything else."""
        if self.pacer.no_ack or (self.waiters and not self.waiters[0].resume):
            return False
        if is_console_output(body) or stop_or_none(body) is not None:
            return False
        certain = bool(self.waiters) and body != b"" and body[:1] != b"E"
        return self.pacer.reply_copy(certain)

    def _stray_stop(self, waiter: Waiter | None, body: bytes) -> bool:
        """A stop report where the reply to another request was due, or none (the client
        stopped: QEMU's user mode stops only the thread that trapped): a stub that lets every
        trapping thread report (QEMU 7.2 user mode, pacing.py). Counted as parked, not a reply."""
        if self.pacer.no_ack or body[:1] not in (b"T", b"S"):
            return False
        if waiter is not None and (waiter.resume or waiter.asks_stop):
            return False
        if stop_or_none(body) is None:
            return False
        self.pacer.stray()
        return True

    def _stub_answered(self) -> None:
        """The stub replied: the packets held for it (pacing.py) may go."""
        if not self.pacer.no_ack:
            self._actions.extend(self.pacer.answered())

    def to_stub(self, body: bytes, waiter: Waiter) -> None:
        waiter.asks_stop = body == b"?"
        self.waiters.append(waiter)
        self.emit(ToStub(body))

    @property
    def running(self) -> bool:
        """True while the client waits for a stop reply."""
        return self.resume is not None

    def _waiters_for_client(self) -> bool:
        return any(w.kind != "proc" for w in self.waiters)

    def _drain_client_queue(self) -> None:
        while self._client_queue and self.proc is None and not self._waiters_for_client():
            body = self._client_queue.popleft()
            self.dispatch_client(body, None)

    def forward(self, body: bytes, raw: bytes | None, resume: bool = False) -> None:
        keep = body if self.capture is not None and self.capture.filters_replies else None
        self.known.forwarding(body)
        self.waiters.append(Waiter("client-resume" if resume else "client", resume, keep, body == b"?"))
        self.emit(ToStubRaw(raw) if raw is not None else ToStub(body))
        if resume and self.interrupt_pending:
            # The client's Ctrl-C came while a procedure prepared this resume
            # (planting the probes at the first resume, stepping a thread off
            # a probe), or while the program was stopped: the program runs
            # now, so the stub gets it (rule 8). Dropped, the client waited
            # for a stop that never came (seen: a raw client's 0x03 during
            # the plant, 10 s without a stop). A step ends by itself: its
            # stop is the answer, and a 0x03 after it would cross that stop.
            self.interrupt_pending = False
            if self.resume is not None and self.resume.is_step:
                return
            self.interrupt_forwarded = True
            self.emit(ToStubRaw(b"\x03"))

    def interrupt_program(self) -> None:
        """The proxy's own interrupt (a capture's drain, a hang-up's clean-up): for a program
        proven to run on this host, a SIGINT to its process only (SignalProgram); else the
        0x03 (the stub's own interrupt, which may reach the program's process group)."""
        ident = self.identity
        if ident.local and ident.host_pid and not self.non_stop:
            self.emit(SignalProgram(ident.host_pid, SIGINT))
        else:
            self.emit(ToStubRaw(b"\x03"))

    def reply(self, body: bytes) -> None:
        self.emit(ToClient(body))

    def set_arch(self, arch: Arch) -> None:
        """The program's CPU: where pc and sp are in its `g` block and stop replies, its
        breakpoint kind; emulated prologues and the step follower only where they decode it."""
        self.arch = arch
        self.pc_regnum = arch.regnum(arch.pc)
        self.sp_regnum = arch.regnum(arch.sp)
        if not arch.emulates:
            self.emulate = False
            self.stepping.enabled = False
            self.stepping.refused = arch.unsupported("the step follower")

    def start_proc(self, proc: Procedure) -> None:
        assert self.proc is None, "one procedure at a time"
        if self.bps.lingering:
            proc = self._after_lingering(proc)  # the proxy's own traffic: the stub as the client believes it
        self.proc = proc
        self._advance(proc, None)

    def _after_lingering(self, proc: Procedure) -> Procedure:
        """The client's lingering breakpoints out of the stub (breakpoints.py), then `proc`."""
        keys = self.bps.take_lingering()
        replies = yield Exchange(tuple(z_packet(False, k) for k in keys))
        if any(r != b"OK" for r in replies):
            self.emit(Notice(f"the stub refused to remove a breakpoint the client removed: {replies!r}"[:200]))
        return (yield from proc)

    def _proc_dispatch(self, body: bytes, raw: bytes | None, handed_over: bool = False) -> Procedure:
        """A client request dispatched once the lingering breakpoints are out (`start_proc`);
        `handed_over`: the edge (shield, capture, residues) has seen it already."""
        self.proc = None
        self.dispatch_client(body, raw, handed_over=handed_over)
        return
        yield  # a procedure that asks nothing itself

    def end_proc(self) -> None:
        """The running procedure answers now: its replies are the client's, not its own."""
        self.proc = None

    def _step_proc(self, replies: list[bytes]) -> None:
        assert self.proc is not None
        self._advance(self.proc, replies)

    def _advance(self, proc: Procedure, replies: list[bytes] | None) -> None:
        try:
            ex = proc.send(replies) if replies is not None else next(proc)
        except StopIteration:
            if self.proc is proc:
                self.proc = None
            self._after_answer()
            self._drain_client_queue()
            self.ns.kick()
            return
        except ProtocolError as err:
            # A stub reply the proxy's own exchange cannot read (a qSupported
            # reply with a non-ASCII feature, found by tests/proxy/session/
            # test_fuzz_session.py): the session ends with that reason.
            if self.proc is proc:
                self.proc = None
            self._after_answer()
            self.emit(Notice(f"the stub's reply could not be read: {err}"))
            self.emit(Close("the stub sent a reply the proxy cannot read"))
            return
        self._proc_expect = len(ex.bodies)
        for i, b in enumerate(ex.bodies):
            last = i == len(ex.bodies) - 1
            self.to_stub(b, Waiter("proc", resume=ex.resume and last))

    def read_memory(self, ranges: list[tuple[int, int]]) -> Generator[Exchange, list[bytes], list[bytes | None]]:
        """The bytes of each range (None: unreadable), read in pieces the stub takes (reads.py)."""
        out = yield from read_memory(self.read_limit, ranges)
        learned = self.read_limit.learned
        if learned is not None and learned != self._read_limit_said:
            self._read_limit_said = learned
            self.emit(Notice(learned))
        return out

    def _after_answer(self) -> None:
        for work in self.after_answer:
            self.emit(AfterSend(work))
        self.after_answer.clear()

    def capture_call(self, hook: str, *args: Any) -> Any:
        """Call a capture hook; a capture bug is counted, never fatal."""
        try:
            return getattr(self.capture, hook)(*args)
        except Exception as err:  # noqa: BLE001 - counted and reported once
            self.capture_failed(err)
            return None

    def capture_failed(self, err: Exception) -> None:
        self.stats.capture_errors += 1
        if self.stats.capture_errors == 1:
            self.emit(Notice(f"capture error (counted in stats, the session goes on): {err!r}"))

    @property
    def non_stop(self) -> bool:
        """The stub is in non-stop mode (nonstop.py)."""
        return self.ns.on

    @non_stop.setter
    def non_stop(self, on: bool) -> None:
        self.ns.on = on

    @property
    def engine(self) -> Any:
        return self.target.engine if self.target is not None else None

    if TYPE_CHECKING:  # provided by core.Session
        stepping: AsyncStepping
        def dispatch_client(self, body: bytes, raw: bytes | None, *, handed_over: bool = False) -> None: ...
        def report_stop(self, sr: StopReply | None, raw: bytes | None, body: bytes | None = None,
                         pc: int | None = None) -> None: ...
        def on_stop_reply(self, body: bytes, raw: bytes) -> None: ...
        def client_resume(self, resume: Resume, body: bytes, raw: bytes | None) -> None: ...
        def snoop_reply(self, body: bytes) -> None: ...
        hidden: HiddenStops
