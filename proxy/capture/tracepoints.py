"""Capture inside gdbserver with its own tracepoints: one ptrace stop per poll event.

Theory of operation (rules from research/gdbserver-tracepoints.md, cited as
"rule N"):

* `install` (program stopped, before it first runs): ``QTinit``, the
  proxy's trace state variables, exactly two ``QTDP`` per tracepoint
  (rule 3; the program comes from `trace_program.build_program`), a linear
  buffer of `buffer_size` bytes, ``QTStart`` - once: `_tracing` is tracked
  here and ``QTStart`` is never sent while it is set (rule 3).
* `sync` (at a stop, before any graph question) drains: ``qTStatus`` gives
  the bytes used, the ``qTBuffer`` reads go back to back, then
  ``QTStop; QTBuffer:size:N; QTStart`` clears the buffer and keeps the
  tracepoints (rule 4). Frames become engine events in buffer order; the
  threads' ``fs_base`` values are mapped to LWPs by reading the tid in
  each thread's control block (glibc: ``struct pthread`` at fs_base; the
  offset is found once by matching live LWPs, 0x2d0 with glibc 2.36).
* `wants_interrupt` asks for a hidden drain while the program runs long
  enough to fill half the buffer at an assumed 20,000 events/s (an upper
  bound: the cheapest ptrace stop costs over 100 µs here) and the mean
  frame size seen.
  A full buffer (``tfull``) stops recording in gdbserver: the loss is
  reported as `EventsLost` (at least the overflowing hits counted by
  ``qTP``), the graph says incomplete, and the next ``QTStart`` re-arms.
* `stop`: gdbserver's ``select_event_lwp`` can report a tracepoint hit of
  one thread as a client-visible ``swbreak`` stop while it reports another
  event, and records no frame for it (research §1). Such a stop at a
  tracepoint address where the client has no breakpoint is the proxy's:
  drain (keeping the order), read the thread's registers, record the hit
  as an event, and let the session resume hidden.
* `client_request` hides the experiment (rule 1, option A): ``qTStatus``
  says no trace ever ran, ``qTfP`` lists nothing, ``qTfV`` only gdbserver's
  ``trace_timestamp``; frame selection finds nothing. A client that starts
  its own experiment (``QTinit``/``QTDP``/``QTDV``/``QTStart``) gets it: the
  backend hands over (the session uninstalls it and switches to hidden
  breakpoints), and ``stats`` says so.
* `uninstall` (before detach, kill, hang-up or a switch): drain, then
  ``QTStop`` and ``QTinit`` - every tracepoint ``int3`` leaves the program
  (rule 7). After the program exited nothing is sent (rule 8: ``QTStop``
  after an exit crashes gdbserver); the session stops calling us then.

Fast tracepoints (``--inproc``): ``proxy.capture.fast_tracepoints``, the part
of this capture that switches to them and back.

Known gaps (documented in the README): a fork child inherits the
tracepoints' ``int3``s and dies of SIGTRAP (rule 9 needs catching fork
syscalls); in extended-remote mode a second ``run`` after the program
exited while tracing trips gdbserver's regcache assertion (rule 8).
"""

from __future__ import annotations

import re
import time
from collections.abc import Generator, Mapping
from typing import Any

from proxy.analysis.model import ResumeFn
from proxy.capture.base import CaptureBase, Handover, Reply, Verdict
from proxy.capture.breakpoints import BreakpointCapture
from proxy.capture.fast_tracepoints import FastTracepoints
from proxy.host.procmem import host_pid_of, restore_code
from proxy.capture.target import Target
from proxy.capture.trace_program import (
    REGNUM,
    FrameConverter,
    Program,
    ThreadMap,
    add_count_points,
    build_program,
)
from proxy.graph.events import EventsLost, PollEnter, PollExit
from proxy.probes import Probe
from proxy.procedure import Exchange, Procedure
from rsp.errors import MalformedPacket, StubError
from rsp.packets.breakpoints import parse_breakpoint
from rsp.packets.memory import memory_bytes
from rsp.packets.stop import StopReply
from rsp.packets.trace import (
    NOT_RUN_STATUS,
    QTBUFFER_CHUNK,
    QTINIT,
    QTSTART,
    QTSTATUS,
    QTSTOP,
    TIMESTAMP_TSV,
    build_qtbuffer_read,
    build_qtbuffer_size,
    is_trace_packet,
    parse_qtbuffer_reply,
    parse_qtstatus_reply,
    parse_qtv_reply,
)
from rsp.threads import ThreadId
from rsp.tracebuf import FrameDecoder, TraceFrame

DEFAULT_BUFFER = 2 << 20
MIN_BUFFER = 4096
ASSUMED_RATE = 20_000.0  # events/s before one is measured
ASSUMED_FRAME = 64  # bytes per frame before one is measured
TCB_SCAN = 0x400  # bytes of a thread control block searched for the tid
# Features a stub must offer (gdbserver's qSupported).
NEEDED_FEATURES = ("TraceStateVariables", "QTBuffer:size", "InstallInTrace")
SIGTRAP = 5
_TIMESTAMP_ONLY_TSV = b"1:0:1:74726163655f74696d657374616d70"  # trace_timestamp, as gdbserver lists it
# Client packets that start an experiment: the client wants tracing itself.
_CLIENT_STARTS = (b"QTinit", b"QTDP", b"QTDV", b"QTStart")


def available(target: Target) -> str | None:
    """None when tracepoint capture can run for `target`, else why not."""
    if target.arch.name != "x86-64":  # agent expressions name x86-64's registers (trace_program.py)
        return target.arch.unsupported("tracepoint capture")
    missing = [f for f in NEEDED_FEATURES if f not in target.stub_features]
    if missing:
        return "the stub offers no tracepoints (no " + ", ".join(missing) + " in its qSupported)"
    if target.inventory is None or target.engine is None:
        return target.note or "no program analysis"
    return None


def make(*, mode: str, only: str | None = None, exclude: str | None = None,
         options: Mapping[str, Any] | None = None) -> TracepointCapture:
    opts = dict(options or {})
    size = opts.get("trace_buffer") or DEFAULT_BUFFER
    return TracepointCapture(only=only, exclude=exclude, entry_only=mode == "entry", buffer_size=int(size),
                             count_patterns=tuple(opts.get("trace_probe") or ()), inproc=bool(opts.get("inproc")))


def parse_size(text: str) -> int:
    """``64K``, ``2M``, ``1048576`` -> bytes (for ``--trace-buffer``)."""
    m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)i?[bB]?\s*", text)
    if not m:
        raise ValueError(f"not a size: {text!r} (e.g. 64K, 2M)")
    n = int(m.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[m.group(2).lower()]
    if not MIN_BUFFER <= n <= 0x7FFFFFFF:
        raise ValueError(f"trace buffer size {n} outside {MIN_BUFFER}..2 GiB (gdbserver 13.1 limit)")
    return n


class TracepointCapture(FastTracepoints, CaptureBase):
    name = "tracepoints"
    TRAP_RATE = ASSUMED_RATE

    def __init__(self, *, only: str | None = None, exclude: str | None = None, entry_only: bool = False,
                 buffer_size: int = DEFAULT_BUFFER, count_patterns: tuple[str, ...] = (),
                 inproc: bool = False) -> None:
        super().__init__()
        # fast tracepoints (in-process agent)
        self.inproc = inproc
        self._trap_program: Program | None = None
        self._fast_program: Program | None = None  # waiting for the agent, or in use
        self.fast_state = "off" if not inproc else "planned"
        self.fast_note: str | None = None  # why there are no fast tracepoints
        self._ipa_seen = False  # the client resolved the agent's symbols (qSymbol)
        self._upgrade = False  # the next sync puts the fast program in
        self.relocations: list[str] = []  # qRelocInsn answered (or refused) - for stats
        self._code_reader: Any = None
        self.pad_exit_stops = 0  # gdbserver's SIGTRAPs at a jump pad's return, hidden
        self._client_steps = False  # the client's last resume steps a thread
        self._pad_symbol: int | None = None  # &gdb_jump_pad_buffer in the agent (from the client's qSymbol)
        self._entry_bp: int | None = None  # the proxy's Z0 at the program's entry (fast switch point)
        # While fast tracepoints are in: the proxy's Z0s where the program
        # starts a thread (pthread_create, its PLT stub) and where it ends
        # (libc's _exit); see `_leave_fast`.
        self._thread_sites: set[int] = set()
        self._guards: dict[int, str] = {}  # address -> "thread" | "exit"
        self._leave_due: str | None = None  # a guard the client also stops at: leave at its resume
        self.fast_left: str | None = None  # why the fast tracepoints went out again
        self.exit_guard: str | None = None  # the exit guard stopped the experiment (why)
        self._guard_bytes: dict[int, bytes] = {}  # a guard's original byte (fork children get it back)
        self.count_patterns = count_patterns
        self._only = re.compile(only) if only else None
        self._exclude = re.compile(exclude) if exclude else None
        self.entry_only = entry_only
        self.buffer_size = buffer_size
        self.program = Program()
        self._by_addr: dict[int, Any] = {}
        self.threads = ThreadMap()
        self._converter: FrameConverter | None = None
        self._state_offsets: dict[int, int] = {}
        self._seq = 0
        self._read_off = 0  # buffer offset up to which frames were drained (0 after a restart)
        self._ran = False  # an experiment of ours ever ran: gdbserver remembers it (`residue`)
        self._tracing = False  # gdbserver's experiment runs (never QTStart twice)
        self._installed = False
        self.handed_over: str | None = None
        self._client_bps: set[int] = set()
        # drains and loss
        self.drains = 0
        self.frames = 0
        self.bytes = 0
        self.lost = 0
        self.drain_seconds = 0.0  # in sync procedures (drain, restart, fold), wall time
        self.full = 0
        self.spurious = 0
        self.exit_drains = 0  # drains after the program exited
        self.children_cleaned = 0  # fork children whose copies of the int3s were written back
        self.fork_notes: list[str] = []
        self.fork_restarts = 0  # experiments restarted after gdbserver stopped it at a child's detach
        self._restart_pending = False  # gdbserver stopped the experiment (a fork child's D)
        self._gap = False  # tracing was off for a while: say so after the next fold
        self._ran_untraced = False  # the program ran while the experiment was stopped
        self._vfork_pending = False  # a vfork child shares the memory: no int3 until vforkdone
        self._originals: list[tuple[int, bytes]] | None = None  # (tracepoint address, the file's byte)
        self.tcb_reads = 0
        self.install_error: str | None = None
        self._run_start: float | None = None
        self._armed = False  # a sync ran since the last tick: the next tick starts the clock
        self._rate = ASSUMED_RATE
        self._frame_bytes = float(ASSUMED_FRAME)

    # ------------------------------------------------------------ planning
    def _wanted(self, fn: ResumeFn) -> bool:
        """--only / --exclude work as for breakpoints (the same _only/_exclude attributes)."""
        return BreakpointCapture._wanted(self, fn)  # type: ignore[arg-type]

    def plan(self, target: Target) -> list[Probe]:
        self.target = target
        self.note = target.note
        inv = target.inventory
        if inv is None or target.engine is None:
            return []
        self._seq = target.engine.cursor_seq or 0
        self.program = build_program(inv, target.bias, self._wanted, entry_only=self.entry_only)
        if self.count_patterns:
            add_count_points(self.program, self._count_functions(target))
        self._trap_program = self.program
        self._fast_program = self._plan_fast(target) if self.inproc else None
        self._by_addr = self.program.by_addr()
        self._state_offsets = {}
        for fn in inv.resume_fns:
            layout = inv.layouts.get(fn.layout_name) if fn.layout_name else None
            if fn.low_pc and layout is not None and layout.state_offset < 1 << 16:
                self._state_offsets[fn.low_pc + target.bias] = layout.state_offset
        pending = {fn.low_pc + target.bias: fn.poll_pending for fn in inv.resume_fns
                   if fn.low_pc and fn.poll_pending is not None}
        self._converter = FrameConverter(self.program, self.threads, self._state_offsets, pending)
        if self.program.skipped:
            self.note = f"{len(self.program.skipped)} resume function(s) not traced: {self.program.skipped[0]}"
        return []  # no hidden breakpoints: gdbserver plants the tracepoints

    def _count_functions(self, target: Target) -> list[tuple[str, int, tuple[int, ...]]]:
        """``--trace-probe`` functions with their rets (runtime addresses)."""
        from proxy.analysis.elf import open_elf
        from proxy.analysis.exits import ExitFinder
        from proxy.symbols import resolve_probes

        inv = target.inventory
        if target.path is None or inv is None:
            return []
        entry = inv.entry + target.bias
        elf = open_elf(target.path)
        finder = ExitFinder(elf, [])
        out = []
        for probe in resolve_probes(target.path, entry, self.count_patterns):
            sym = elf.symbol_at(probe.addr - target.bias)
            if sym is None or not sym.size:
                continue
            rets, _ = finder.exits(sym.addr, sym.addr + sym.size)
            out.append((probe.name, probe.addr, tuple(r + target.bias for r in rets)))
        return out

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    # ---------------------------------------------------------- lifecycle
    def install(self) -> Procedure | None:
        if not self.program.points or self.handed_over:
            return None
        return self._install()

    def _install(self) -> Procedure:
        self._read_off = 0
        bodies = [QTINIT, *self.program.packets(), build_qtbuffer_size(self.buffer_size), QTSTART]
        entry = self._fast_switch_point()
        if entry is not None and (yield from self._pads_allocated()):
            # Attached to a program past its entry: the Z0 there would never
            # be hit (the fast tracepoints never came, with an attached
            # program that had the agent preloaded). The switch comes at the
            # client's next stop (before_resume).
            entry = None
        if entry is not None:
            (ok,) = yield Exchange((b"Z0,%x,1" % entry,))
            self._entry_bp = entry if ok == b"OK" else None
        replies = yield Exchange(tuple(bodies))
        bad = [(b, r) for b, r in zip(bodies, replies) if r != b"OK"]
        if replies and replies[-1] == b"OK":
            self._tracing = True
            self._installed = True
            self._armed = True
        if bad:
            body, reply = bad[0]
            self.install_error = f"{len(bad)} trace packet(s) refused, first {body[:40]!r} -> {reply[:20]!r}"
            if not self._tracing:
                # QTStart failed: nothing is inserted; clear the definitions.
                yield Exchange((QTINIT,))

    def sync(self) -> Procedure | None:
        if not self._installed:
            return None
        return self._sync()

    def _sync(self, restart: bool = True, map_threads: bool = True) -> Generator[Exchange, list[bytes], None]:
        t0 = time.perf_counter()
        try:
            yield from self._sync_steps(restart, map_threads)
        finally:  # wall time, the stub's replies included: what the client waits for
            self.drain_seconds += time.perf_counter() - t0

    def _sync_steps(self, restart: bool, map_threads: bool) -> Generator[Exchange, list[bytes], None]:
        frames, status_full, used = yield from self._drain()
        lost_hint = 0
        if status_full:
            lost_hint = yield from self._overflow_hits(len(frames))
        upgrade = restart and self._upgrade and self._fast_program is not None and not self._restart_pending
        if upgrade:
            self._upgrade = False
        elif restart:
            yield from self._restart()
        if map_threads:
            yield from self._map_threads(frames)
        self._fold(frames, status_full, lost_hint)
        if upgrade:
            yield from self._go_fast()

    def _nothing(self) -> Procedure:
        return
        yield


    def _drain(self) -> Generator[Exchange, list[bytes], tuple[list[TraceFrame], bool, int]]:
        (reply,) = yield Exchange((QTSTATUS,))
        try:
            st = parse_qtstatus_reply(reply)
        except (MalformedPacket, StubError):
            return [], False, 0
        used = (st.size - st.free) if st.size is not None and st.free is not None else QTBUFFER_CHUNK
        dec = FrameDecoder()
        frames: list[TraceFrame] = []
        start = off = self._read_off  # frames before it were drained already (no restart since)
        # Everything used plus the 6-byte end marker, back to back.
        reads = tuple(build_qtbuffer_read(o) for o in range(start, max(used, start) + 6, QTBUFFER_CHUNK))
        todo: tuple[bytes, ...] = reads
        for _ in range(64):
            replies = yield Exchange(todo)
            done = False
            for rep in replies:
                try:
                    data = parse_qtbuffer_reply(rep)
                except (MalformedPacket, StubError):
                    data = None
                if data is None:
                    done = True
                    break
                off += len(data)
                frames += dec.feed(data)
                if dec.ended:
                    done = True
                    break
            if done:
                break
            todo = (build_qtbuffer_read(off),)
        self.drains += 1
        self.bytes += off - start
        self.frames += len(frames)
        self._read_off = start + dec.consumed
        if frames:
            self._frame_bytes = max(8.0, dec.consumed / len(frames))
        return frames, st.stop_reason == "tfull", used

    def _overflow_hits(self, frames: int) -> Generator[Exchange, list[bytes], int]:
        """After ``tfull``: hits gdbserver counted (``qTP``, decimal) minus the
        frames it kept - a lower bound, as later hits are not counted at all."""
        pts = self.program.points
        replies = yield Exchange(tuple(b"qTP:%x:%x" % (p.number, p.addr) for p in pts))
        hits = 0
        for rep in replies:
            if rep.startswith(b"V"):
                try:
                    hits += int(rep[1:].partition(b":")[0].decode(), 10)
                except ValueError:
                    pass
        return max(hits - frames, 1)

    def _restart(self) -> Generator[Exchange, list[bytes], None]:
        """Clear the buffer and keep the tracepoints (rule 4): never QTStart while tracing."""
        if self._restart_pending and self._vfork_pending:
            # A vfork child still shares the memory: no QTStart (its int3s
            # would be the child's too), but clear what was just drained
            # (the experiment is stopped, so the size can be set).
            yield Exchange((build_qtbuffer_size(self.buffer_size),))
            self._read_off = 0
            return
        replies = yield Exchange((QTSTOP, build_qtbuffer_size(self.buffer_size), QTSTART))
        self._tracing = replies[-1] == b"OK"
        self._armed = True
        self._read_off = 0
        if self._restart_pending:
            self._restart_pending = False
            self.fork_restarts += 1
            # said after the frames recorded before the detach (`_fold`); none
            # lost when the session synced right at the detach (the program stopped)
            self._gap, self._ran_untraced = self._ran_untraced, False

    def _map_threads(self, frames: list[TraceFrame]) -> Generator[Exchange, list[bytes], None]:
        if self._converter is None:
            return
        bases = sorted(self._converter.fs_bases(frames))
        if not bases:
            return
        if self.threads.tid_offset is None:
            lwps = yield from self._live_lwps()
            replies = yield Exchange(tuple(b"m%x,%x" % (b, TCB_SCAN) for b in bases))
            tcbs = {b: d for b, r in zip(bases, replies) if (d := memory_bytes(r)) and len(d) >= 0x20
                    and int.from_bytes(d[0x10:0x18], "little") == b}  # tcbhead_t.self == fs_base
            self.threads.tid_offset = self.threads.find_tid_offset(tcbs, lwps)
            if self.threads.tid_offset is None:
                return
        off = self.threads.tid_offset
        replies = yield Exchange(tuple(b"m%x,4" % (b + off) for b in bases))
        self.tcb_reads += len(bases)
        for b, r in zip(bases, replies):
            d = memory_bytes(r)
            if d is not None and len(d) == 4:
                # signed: a thread that exited reads -1 (seen for tokio's
                # workers after the runtime shut down) or 0; learn() keeps
                # only LWPs > 0.
                # Read unsigned, -1 became LWP 4294967295 and relabelled the
                # thread's last frames at the drain after the runtime shut down.
                self.threads.learn(b, int.from_bytes(d, "little", signed=True))

    def _live_lwps(self) -> Generator[Exchange, list[bytes], set[int]]:
        out: set[int] = set()
        ask = b"qfThreadInfo"
        for _ in range(256):
            (rep,) = yield Exchange((ask,))
            if not rep.startswith(b"m"):
                break
            for item in rep[1:].split(b","):
                try:
                    out.add(ThreadId.parse(item).tid)
                except MalformedPacket:
                    pass
            ask = b"qsThreadInfo"
        return out

    def _fold(self, frames: list[TraceFrame], full: bool, lost: int) -> None:
        engine = self.engine
        if engine is None or self._converter is None:
            return
        events = self._converter.convert(frames, self._next_seq)
        self.events += len(events)
        engine.feed_many(events)
        if self._gap:
            self._gap = False
            engine.feed(EventsLost(self._next_seq(), 0, "tracing was off from a fork child's detach to the next hidden stop"))
        if full:
            self.full += 1
            self.lost += lost
            engine.feed(EventsLost(self._next_seq(), lost, "trace buffer full"))

    def uninstall(self) -> Procedure | None:
        if not self._installed:
            return None
        return self._uninstall()

    def _uninstall(self) -> Procedure:
        if self._entry_bp is not None:
            yield Exchange((b"z0,%x,1" % self._entry_bp,))
            self._entry_bp = None
        yield from self._sync(restart=False)
        # QTStop takes every tracepoint int3 out; QTinit forgets them.
        yield Exchange((QTSTOP, QTINIT))
        self._tracing = False
        self._installed = False

    # ------------------------------------------------------- fork / vfork
    # Research §9: a fork child gets copies of the tracepoints' int3s, and
    # gdbserver never takes them out (its cloned breakpoints stay in the
    # child; ``M`` writes go under them); the child dies of SIGTRAP at its
    # first poll. When gdb detaches the child (``D;child``) gdbserver stops
    # the whole experiment (``stop_tracing`` is global), and the parent's
    # tracepoints go with it. So:
    # * at the fork report (the child is stopped): the file's byte goes back
    #   at every tracepoint address in the child through /proc/CHILD/mem
    #   (the proxy runs on the program's host; elsewhere the note says so);
    # * at the client's ``D;child``: the experiment is marked stopped; the
    #   session syncs right after the detach (the program is still stopped):
    #   that drain restarts it (``QTStart`` only when not tracing, rule 3);
    #   nothing is lost. Should the program run before (a vfork child), the
    #   next tick asks for a hidden stop that restarts it, and an
    #   `EventsLost` (count unknown) says events went unrecorded;
    # * vfork: the child shares the memory: nothing to write back; the
    #   restart waits for ``vforkdone`` (an int3 back in shared memory
    #   before the child execs would kill it).
    def forked(self, child: object) -> Procedure | None:
        if not self._installed or not isinstance(child, ThreadId):
            return None
        pid = child.pid or child.tid
        target = self.target
        host = host_pid_of(target, pid) if target is not None and getattr(target, "local", False) else None
        if host is None:
            self.fork_notes.append(f"fork child {pid} keeps the tracepoints' int3s (the program is not on this host)")
            return None
        err = self._clean_child(host)
        if err:
            self.fork_notes.append(f"fork child {pid}: {err}")
        else:
            self.children_cleaned += 1
        return None

    def _clean_child(self, pid: int) -> str | None:
        originals = self._file_bytes()
        if originals is None:
            return "the program's file is unreadable: the child keeps the int3s"
        guards = ((a, self._guard_bytes.get(a, b"")) for a in self._guards)
        try:
            failed = restore_code(pid, [*originals, *guards])
        except OSError as err:
            return f"keeps the int3s ({err})"
        return f"{failed} tracepoint address(es) could not be restored" if failed else None

    def _file_bytes(self) -> list[tuple[int, bytes]] | None:
        if self._originals is None:
            target = self.target
            if target is None or target.path is None:
                return None
            try:
                from proxy.analysis.elf import open_elf

                elf = open_elf(target.path)
                self._originals = [(p.addr, elf.read(p.addr - target.bias, p.tracepoint.fast or 1) or b"")
                                   for p in self.program.points]
            except Exception:  # noqa: BLE001 - an unreadable file: said in the note
                return None
            self._originals = [(a, b) for a, b in self._originals if b]
        return self._originals

    def _child_detached(self, body: bytes) -> None:
        """The client's ``D;pid`` of a process that is not the program: gdbserver
        will stop the experiment (all of it) before detaching."""
        pid_text = body[2:].split(b";")[0]
        try:
            pid = int(pid_text, 16)
        except ValueError:
            return
        main = getattr(self.target, "pid", None)
        if main is None or pid == main or not self._tracing:
            return
        self._tracing = False
        self._restart_pending = True

    def exited(self, sr: StopReply) -> Procedure | None:
        """The program exited: gdbserver keeps the trace buffer readable after
        the process is gone, so the frames recorded since the last stop are
        drained and folded here (before the client sees the exit). Nothing
        else is sent: ``QTStop`` after an exit crashes gdbserver 13.1 (rule 8).
        At an exec the same drain, then ``QTStop; QTinit``."""
        if not self._installed:
            return None
        if self._ipa_seen:
            # gdbserver 13.1 with its agent dies on any trace packet now:
            # nothing is asked, the frames since the last stop are lost.
            self._installed = self._tracing = False
            self._guards.clear()
            self.fast_left = "the program ended without passing the exit guard"
            if self.engine is not None:
                self.engine.feed(EventsLost(self._next_seq(), 0, "the program ended with gdbserver's agent loaded "
                                            "and no exit guard: frames since the last stop are lost"))
            return None
        return self._drain_after_exit(sr)

    def _drain_after_exit(self, sr: StopReply) -> Procedure:
        self._tracing = False
        self._installed = False
        # No thread mapping: the thread control blocks are gone (or belong
        # to the new image).
        yield from self._sync(restart=False, map_threads=False)
        self.exit_drains += 1
        if sr.kind == "T":  # exec: the process lives on; gdbserver freed the
            # tracepoints' breakpoints but still runs the experiment (research
            # §9): stop it and forget the definitions, so the client sees none.
            yield Exchange((QTSTOP, QTINIT))

    # ------------------------------------------------------- while running
    def wants_interrupt(self, now: float) -> bool:
        if self._restart_pending and self._installed:
            self._ran_untraced = True  # the program runs while the experiment is stopped
            return not self._vfork_pending  # the drain of that stop restarts the experiment
        if not self._tracing:
            return False
        if self._armed or self._run_start is None:
            self._armed = False
            self._run_start = now
            return False
        expected = (now - self._run_start) * self._rate * self._frame_bytes
        if expected >= self.buffer_size / 2:
            self._run_start = None
            return True
        return False

    # ------------------------------------------------ spurious stops (§1)
    def stop(self, sr: StopReply) -> Procedure | None:
        if sr.kind == "T" and sr.reason in ("vfork", "vforkdone"):
            self._vfork_pending = sr.reason == "vfork"
            return None
        if (self._installed and sr.kind == "T" and sr.signal == SIGTRAP and sr.reason is None
                and not self._client_steps and self.program.fast_points):
            pc = sr.pc(16)
            if pc is not None and pc in self._pad_returns:
                # gdbserver 13.1 moves a thread that a stop-all caught inside
                # a jump pad out of it with an internal breakpoint where the
                # pad jumps back, and then reports that breakpoint's SIGTRAP
                # to the client (probe_count, 4 threads: at probed+5, the
                # collection done). Not the client's: hidden.
                self.pad_exit_stops += 1
                return self._nothing()
        if not self._installed or sr.kind != "T" or sr.signal != SIGTRAP or sr.reason != "swbreak":
            return None
        pc = sr.pc(16)
        if pc is not None and pc in self._guards:
            kind = self._guards[pc]
            if pc in self._client_bps:  # the client's own breakpoint: reported; leave at its resume
                self._leave_due = kind
                return None
            return self._leave_fast(kind, self._GUARD_WHY[kind])
        if pc is not None and pc == self._entry_bp:
            if pc in self._client_bps:
                self._entry_bp = None  # the client's own breakpoint there: reported, switch at the resume
                return None
            return self._switch_fast(take_out=pc)
        if pc is None or pc not in self._by_addr or pc in self._client_bps:
            return None
        return self._record_live(sr, self._by_addr[pc])

    def _record_live(self, sr: StopReply, point: Any) -> Procedure:
        """gdbserver reported this thread's hit as a stop and recorded no frame:
        drain first (order), then record the hit from the live thread."""
        self.spurious += 1
        # Drain (order) but do not restart: QTStop/QTStart while threads sit
        # at tracepoint addresses, some with their trap still pending in
        # gdbserver, replaces the breakpoints under them. The next drain
        # reads on from where this one stopped.
        yield from self._sync(restart=False)
        if point.kind.startswith("count-"):
            if self._converter is not None:
                c = self._converter.counts
                c[point.name] = c.get(point.name, 0) + 1
            return
        thread = sr.thread
        sel = b"Hg" + thread.format(thread.pid is not None) if thread is not None else b"Hg0"
        replies = yield Exchange((sel, b"g", b"qTV:%x" % TIMESTAMP_TSV))
        regs = memory_bytes(replies[1].replace(b"xx", b"00"))
        if regs is None or len(regs) < 552 or self.engine is None:
            return
        def reg(n: int) -> int:
            return int.from_bytes(regs[8 * n:8 * n + 8], "little")
        sp = reg(REGNUM["rsp"])
        fsb = int.from_bytes(regs[544:552], "little")  # fs_base: register 58 at 544
        tid = thread.tid if thread is not None else 0
        self.threads.learn(fsb, tid)
        try:
            ts = parse_qtv_reply(replies[2])
        except (MalformedPacket, StubError):
            ts = None
        time_ns = ts * 1000 if ts is not None else None
        lwp = self.threads.thread(fsb) if fsb else tid
        if point.kind == "entry":
            fn = self.engine.catalog.resume_fn(point.site)
            self_ptr = reg(REGNUM[fn.self_in if fn is not None else "rdi"])
            off = self._state_offsets.get(point.site)
            layout = self.engine.catalog.layout_for(point.site)
            reads = [b"m%x,8" % sp]
            if off is not None and layout is not None:
                reads.append(b"m%x,%x" % (self_ptr + off, layout.state_size))
            mem = yield Exchange(tuple(reads))
            ret_b = memory_bytes(mem[0])
            ret = int.from_bytes(ret_b, "little") if ret_b and len(ret_b) == 8 else None
            state = None
            if len(mem) > 1 and (sb := memory_bytes(mem[1])):
                state = int.from_bytes(sb, "little")
            self.engine.feed(PollEnter(self._next_seq(), lwp, point.site, self_ptr, sp, ret, state, time_ns))
        else:
            self.engine.feed(PollExit(self._next_seq(), lwp, point.site, sp, None, None, None,
                                      panicked=point.kind == "unwind", time_ns=time_ns))
        self.events += 1

    # ------------------------------------------------- the client's traffic
    def client_request(self, body: bytes) -> Verdict | None:
        if body.startswith(b"qSymbol:") and not self._ipa_seen:  # kept before the plan too (a replay)
            value, _, name = body[len(b"qSymbol:"):].rpartition(b":")
            try:
                resolved = bool(value) and bytes.fromhex(name.decode()).startswith(b"gdb_agent_")
            except ValueError:
                resolved = False
            if resolved:  # gdbserver is looking the agent up: it has loaded
                if bytes.fromhex(name.decode()) == b"gdb_agent_gdb_jump_pad_buffer":
                    self._pad_symbol = int(value, 16)
                    self._ipa_seen = True
            return None
        if body[:1] in (b"c", b"s", b"C", b"S") or body.startswith(b"vCont;"):
            self._client_steps = body[:1] in (b"s", b"S") or b";s" in body or b";S" in body or b";r" in body
        if body.startswith(b"D;") and self._installed:
            self._child_detached(body)
            return None
        if body[:2] in (b"Z0", b"z0"):
            try:
                bp = parse_breakpoint(body)
            except MalformedPacket:
                return None
            (self._client_bps.add if bp.insert else self._client_bps.discard)(bp.addr)
            if not bp.insert and bp.addr in self._guards:
                return Reply(b"OK")  # gdbserver has one breakpoint there: the proxy's guard stays
            return None
        if not self._installed or not is_trace_packet(body):
            return None
        if body.startswith(_CLIENT_STARTS):
            self.handed_over = f"the client started its own trace experiment ({body[:12].decode(errors='replace')})"
            return Handover(self.handed_over)
        return _hide(body)

    @property
    def _tracing(self) -> bool:
        return self._tracing_now

    @_tracing.setter
    def _tracing(self, on: bool) -> None:
        self._tracing_now = on
        self._ran = self._ran or on

    def residue(self) -> TraceVeil | None:
        return TraceVeil() if self._ran and not self.handed_over else None

    def stats_lines(self) -> list[str]:
        lines = super().stats_lines()
        n = len(self.program.points)
        lines.append(f"tracepoints: {n} ({'tracing' if self._tracing else 'not tracing'}), "
                     f"buffer {self.buffer_size} bytes")
        if self.inproc:
            fast = self.program.fast_points
            fb = (self._fast_program or self.program).fallbacks
            lines.append(f"fast tracepoints: {fast} ({self.fast_state})"
                         + (f"; {len(fb)} site(s) kept a trap" if fast and fb else ""))
            if self.fast_left:
                lines.append(f"fast tracepoints taken out: {self.fast_left}")
            if self.exit_guard:
                lines.append(f"exit guard: {self.exit_guard}")
            if self.fast_note:
                lines.append(f"fast tracepoints: not used: {self.fast_note}")
            lines += [f"  trap: {why}" for why in fb[:5]]
            if len(fb) > 5:
                lines.append(f"  ... {len(fb) - 5} more")
            if self.relocations:
                lines.append(f"instructions relocated for gdbserver (qRelocInsn): {len(self.relocations)}")
            if self.pad_exit_stops:
                lines.append(f"gdbserver's stops at a jump pad's return (hidden): {self.pad_exit_stops}")
        lines.append(f"trace drains: {self.drains} ({self.frames} frames, {self.bytes} bytes, "
                     f"{self.drain_seconds * 1e3:.0f} ms)")
        lines.append(f"events lost: {self.lost}" + (f" (buffer full {self.full}x: graph incomplete)" if self.full else ""))
        if self._converter is not None and self._converter.stats.truncated:
            lines.append(f"truncated frames dropped: {self._converter.stats.truncated}")
        lines.append(f"spurious stops recorded by the proxy: {self.spurious}")
        if self.children_cleaned or self.fork_restarts:
            lines.append(f"fork children cleaned of the tracepoints' int3s: {self.children_cleaned}; "
                         f"experiment restarted after a child's detach: {self.fork_restarts}")
        lines += [f"fork: {n}" for n in self.fork_notes[-3:]]
        if self.exit_drains:
            lines.append(f"trace drains after the program exited: {self.exit_drains}")
        if self.count_patterns and self._converter is not None:
            counts = self._converter.counts
            lines.append(f"traced probe hits: {sum(counts.values())}")
            names = sorted({p.name for p in self.program.points if p.kind.startswith("count-")} | set(counts))
            lines += [f"  {name}: {counts.get(name, 0)}" for name in names]
        if self.threads.relabelled:
            lines.append(f"thread reads naming another LWP than the one an fs_base was given (kept): {self.threads.relabelled}")
        if self.threads.unmapped:
            lines.append(f"threads never mapped to an LWP: {self.threads.unmapped}")
        if self.install_error:
            lines.append(f"tracepoint install: {self.install_error}")
        if self.handed_over:
            lines.append(f"tracing handed over: {self.handed_over}")
        return lines


def _hide(body: bytes) -> Reply | None:
    if body == b"qTV:%x" % TIMESTAMP_TSV:
        return None  # gdbserver's clock, live outside tfind mode: harmless
    return Reply(_hidden_reply(body))


class TraceVeil:
    """The capture's `residue`: once the session dropped tracepoint capture (the
    program exec'd, a switch to another backend), gdbserver still reports the
    proxy's stopped experiment (`qTStatus` "T0;tstop:0": gdb's `tstatus` said
    "Trace stopped by a tstop command"). Keep answering as if none ever ran,
    until the client starts its own (then everything is the client's)."""

    def __init__(self) -> None:
        self.done = False

    def client_request(self, body: bytes) -> Verdict | None:
        if self.done or not is_trace_packet(body):
            return None
        if body.startswith(_CLIENT_STARTS):
            self.done = True
            return None
        return _hide(body)


def _hidden_reply(body: bytes) -> bytes:
    """What gdbserver answers when no experiment ever ran (research §8, option A)."""
    if body.startswith(b"qTStatus"):
        return NOT_RUN_STATUS
    if body.startswith((b"qTfP", b"qTsP", b"qTsV", b"qTfSTM", b"qTsSTM")):
        return b"l"
    if body.startswith(b"qTfV"):
        return _TIMESTAMP_ONLY_TSV
    if body.startswith(b"qTV:"):
        return b"U"  # the proxy's own variables (and any other) are unknown to the client
    if body.startswith(b"QTFrame"):
        return b"F-1"
    if body.startswith((b"qTBuffer", b"qTP")):
        return b"l"
    if body.startswith(b"qXfer:"):
        return b"E01"
    if body.startswith(b"qTMinFTPILen"):
        return b""
    return b"OK"  # QTStop, QTro, QTBuffer:*, QTDisconnected, QTNotes, QTEnable, QTDisable
