"""What the proxy answers itself: `monitor async ...` (run as a procedure
that reads target memory and thread registers between passes), the proxy's
qXfer objects and `info os` tables, the target description a register-safe
gdbserver leaves out (rule 11), and the session's stats."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, TypeVar, cast

from rsp.errors import MalformedPacket
from rsp.framing import unescape_binary
from rsp.packets.memory import memory_bytes
from rsp.packets.monitor import build_console_output, parse_qrcmd
from rsp.packets.qxfer import QXferRead, build_qxfer_reply, parse_qxfer
from rsp.threads import ThreadId

from .actions import Notice
from .procedure import Exchange, Procedure
from .state import SessionBase
from .wire import feature_on

if TYPE_CHECKING:
    from .core import Session

# Objects the proxy answers itself through qXfer.
PROXY_QXFER_OBJECTS = ("asyncrsp.graph",)
# A monitor command runs again after each pass of memory reads; reflection
# (proxy.reflect) needs one pass per pointer hop of the deepest await tree.
MONITOR_PASSES = 32
MONITOR_READS_PER_PASS = 1024
T = TypeVar("T")


class Queries(SessionBase):
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
        monitor = self.config.monitor
        try:
            out = yield from self._with_reads(lambda read: monitor(text, cast("Session", self), read))
        except Exception as err:  # a command must never take the session down
            out = f"asyncrsp: internal error in '{text}': {err!r}\n"
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

    def _before_reflection(self) -> Generator[Exchange, list[bytes], None]:
        """What reading the program's state at a stop needs first: the capture's drain and
        the deferred reads, and (before the first resume) whether the stub's process is
        this host's, since reflection may then read the program here."""
        yield from self._resolve_pending_reads()
        if not self._planted and self._last_stop is not None:
            yield from self._identify(self._stop_pid(), None)

    def _with_reads(self, answer: Callable[[Callable[[int, int], bytes | None]], T]) -> Generator[Exchange, list[bytes], T]:
        """Call ``answer(read)`` until it asked for no memory it did not have (at most
        MONITOR_PASSES times): between passes, read what it missed, and every thread's
        registers when it asked for them (``monitor_threads``). ``monitor_missed()`` says,
        during a pass, whether a read of this pass was not answered yet; ``monitor_peek`` reads
        what is known without asking the stub (None: not known; nothing is asked for)."""
        yield from self._before_reflection()
        cache: dict[tuple[int, int], bytes | None] = {}
        # a proven local program's data pages straight from /proc/PID/mem (proxy/reflect/
        # localmem.py): one pass, no `m`; an address no mapping holds is unreadable at once;
        # code and anything else it cannot read go to the stub
        local = self.config.local_memory(self) if self.config.local_memory is not None else None
        threads: dict[int, bytes] | None = None  # LWP -> `g` reply, read when a command asks
        wants_threads = False
        missing: list[tuple[int, int]] = []

        def thread_registers() -> dict[int, bytes] | None:
            nonlocal wants_threads
            wants_threads = threads is None
            return threads

        self.monitor_threads = thread_registers
        self.monitor_missed = lambda: bool(missing) or (wants_threads and threads is None)
        try:
            for _ in range(MONITOR_PASSES):
                missing = []

                def peek(addr: int, size: int) -> bytes | None:
                    """What is known without the stub (read, or local); None: not known."""
                    key = (addr, size)
                    if key in cache:
                        return cache[key]
                    if size <= 0 or size > 1 << 16 or addr < 0:
                        return None
                    if local is not None:
                        data = local.read(addr, size)
                        if data is not None or local.unmapped(addr):
                            cache[key] = data
                            return data
                    return None

                def read(addr: int, size: int) -> bytes | None:
                    data = peek(addr, size)
                    if data is None and (addr, size) not in cache and 0 < size <= 1 << 16 and addr >= 0:
                        missing.append((addr, size))
                    return data

                self.monitor_peek = peek

                out = answer(read)
                if wants_threads and threads is None:
                    threads = yield from self._read_thread_registers()
                elif not missing:
                    break
                missing = list(dict.fromkeys(missing))[:MONITOR_READS_PER_PASS]
                if missing:
                    replies = yield Exchange(tuple(b"m%x,%x" % k for k in missing))
                    for key, rep in zip(missing, replies):
                        cache[key] = memory_bytes(rep)
        finally:
            self.monitor_threads = None
            self.monitor_missed = None
            self.monitor_peek = None
            if local is not None:
                self.stats.local_read_bytes += local.bytes_read
                local.close()
        return out

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
        if feature_on(self.stub_features, "QThreadSuffixSupported"):
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
        """The JSON document and the osdata tables render the stop's snapshot, which reads
        memory: the same read loop as a monitor command (every chunk of a document comes
        from the one snapshot of this stop)."""
        doc = yield from self._with_reads(lambda read: self._own_qxfer(req, read))
        self._proc = None
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

    def _own_qxfer(self, req: QXferRead, read: Callable[[int, int], bytes | None] | None = None) -> bytes | None:
        assert self.config.qxfer is not None
        try:
            return self.config.qxfer(req.object, req.annex, cast("Session", self), read)
        except Exception as err:  # noqa: BLE001 - never take the session down
            self._emit(Notice(f"qXfer:{req.object}:{req.annex} failed: {err!r}"))
            return None

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

    def probes_line(self) -> str | None:
        """How the --probe functions are counted (`stats`, `monitor async capture`):
        by the capture without a stop (uprobes), or at hidden breakpoints."""
        addrs = {p.addr for p in self._count_probes}
        if not addrs:
            return None
        counted = len(addrs & set(self._capture_counts))
        kernel = f"counted by {self.capture.name} (no stop)" if counted and self.capture is not None else ""
        hidden = "hidden breakpoints (a stop per call)"
        if counted == len(addrs):
            return f"--probe functions: {len(addrs)}, all {kernel}"
        if not counted:
            return f"--probe functions: {len(addrs)}, all {hidden}"
        return f"--probe functions: {len(addrs)}: {counted} {kernel}, {len(addrs) - counted} {hidden}"

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
            *([line] if (line := self.probes_line()) else []),
            f"hidden stops: {s.hidden_stops}",
            f"shared stops (reported): {s.shared_stops}",
            f"time in hidden stops: {s.hidden_time * 1e3:.1f} ms"
            + (f" ({s.hidden_time / s.hidden_stops * 1e6:.0f} us each)" if s.hidden_stops else ""),
            f"interrupts during hidden stops: {s.interrupts_during_hidden}",
            f"hidden stops resumed once (probed instruction emulated): {s.emulated}",
            f"capture errors: {s.capture_errors}",
            self.register_notice.removeprefix("asyncrsp: "),
            self.identity.line(),
        ]
        if s.local_read_bytes:
            lines.append(f"memory read at stops through /proc/PID/mem (data pages of the proven local program): "
                         f"{s.local_read_bytes} bytes")
        if s.shielded:
            lines.append(f"client packets answered E01, not forwarded (the stub could not take them): "
                         f"{s.shielded}; last: {self.shield_last}")
        if s.ns_waited or s.ns_unplaced:
            lines.append(f"non-stop stops without a thread: {s.ns_waited} placed after waiting for the stub's "
                         f"next report, {s.ns_unplaced} given to the client unplaced")
        if s.hidden_interrupts:
            lines.append(f"hidden interrupts (capture drains): {s.hidden_interrupts}")
        if s.forks_cleaned:
            lines.append(f"fork children cleaned of the proxy's breakpoints: {s.forks_cleaned}")
        if s.hidden_forks:
            lines.append(f"forks hidden from the client (children cleaned and detached): {s.hidden_forks}")
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

