"""What the proxy answers itself: `monitor async ...` (run once as a procedure
that reads target memory and thread registers as the command asks), the proxy's
qXfer objects and `info os` tables, the target description a register-safe
gdbserver leaves out (rule 11), and the session's stats."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, TypeVar

from rsp.errors import MalformedPacket
from rsp.framing import unescape_binary
from rsp.packets.monitor import build_console_output, parse_qrcmd
from rsp.packets.qxfer import QXferRead, build_qxfer_reply, parse_qxfer
from rsp.threads import ThreadId

from proxy.procedure import Exchange, Procedure

from .actions import Notice
from .reader import Asker
from .wire import feature_on

if TYPE_CHECKING:
    from .state import SessionBase

# Objects the proxy answers itself through qXfer.
PROXY_QXFER_OBJECTS = ("asyncrsp.graph",)
# The most `m` packets one exchange sends back to back (a question reading many blocks at once:
# a runtime adapter's heap scan).
READS_AT_ONCE = 1024
T = TypeVar("T")


class Queries:
    """What the proxy answers itself, a part the session holds (`session.queries`): it owns
    what a question at a stop reads (the remote program's map, the stop's thread registers and
    known memory while a question runs, `info os`' merged table types) and asks the session
    (`s`) for the links, the procedure runner and the stop's facts."""

    def __init__(self, session: SessionBase) -> None:
        self.s = session
        # the program's /proc/PID/maps read through the stub (vFile) at this stop, for
        # reflection's runtime adapters (_read_remote_maps), or why not
        self.remote_maps: str | None = None
        self.remote_maps_why: str | None = None
        self.remote_maps_how: str | None = None  # where the map came from (stats)
        self.no_vfile = False  # the stub said so once: not asked again
        # the emulator's process holding the program (proxy/host/emulator.py), or why none:
        # found once per process (forget_process)
        self.emulator: object | None = None
        # while a question reads the stopped program (with_reads): every thread's `g` block,
        # and what is known without the stub (None outside a question)
        self.monitor_threads: Callable[[], dict[int, bytes]] | None = None
        self.monitor_peek: Callable[[int, int], bytes | None] | None = None
        self.osdata_types: bytes | None = None  # `info os`: the stub's table types and the proxy's

    def client_monitor(self, body: bytes, raw: bytes | None) -> None:
        text = parse_qrcmd(body)
        words = text.split()
        if words[:2] == ["async", "step"]:  # the step follower's switch (stepping.py)
            self.s.reply(build_console_output(self.s.stepping.command(words[2:])))
            self.s.reply(b"OK")
            return None
        if not words or words[0] != "async" or self.s.config.monitor is None:
            return self.s.forward(body, raw)
        self.s.start_proc(self._proc_monitor(text))
        return None

    def _proc_monitor(self, text: str) -> Procedure:
        """Run a command, reading the memory it asks for as it asks."""
        assert self.s.config.monitor is not None
        monitor = self.s.config.monitor
        try:
            out = yield from self.with_reads(lambda read: monitor(text, self.s, read))
        except Exception as err:  # a command must never take the session down
            out = f"asyncrsp: internal error in '{text}': {err!r}\n"
        if self.s.lifecycle.switch_request is not None:
            name, mode = self.s.lifecycle.switch_request
            self.s.lifecycle.switch_request = None
            try:
                yield from self.s.lifecycle.switch(name, mode)
            except ValueError as err:
                out += f"asyncrsp: {err}\n"
        self.s.proc = None
        if out and not out.endswith("\n"):
            out += "\n"
        for i in range(0, len(out), 400):
            self.s.reply(build_console_output(out[i:i + 400]))
        self.s.reply(b"OK")

    def _before_reflection(self) -> Generator[Exchange, list[bytes], None]:
        """What reading the program's state at a stop needs first: the capture's drain and
        the deferred reads, and (before the first resume) whether the stub's process is
        this host's, since reflection may then read the program here."""
        yield from self._resolve_pending_reads()
        if not self.s.planted and self.s.last_stop is not None:
            yield from self.s.lifecycle.find_program()  # the file, pid, AT_ENTRY (the load bias) and host
        if self.s.config.remote_maps and not self.s.identity.local and self.s.last_stop is not None and not self.s.running:
            yield from self._read_remote_maps()

    def forget_process(self) -> None:
        """Another process (vRun, vAttach): its map and its emulator are found anew."""
        self.remote_maps = self.remote_maps_why = self.remote_maps_how = None
        self.emulator = None

    def _read_remote_maps(self) -> Generator[Exchange, list[bytes], None]:
        """The program's /proc/PID/maps through the stub (vFile) at this stop, for a program of
        another host: the runtime adapters scan its writable anonymous mappings
        (``remote_maps``; ``remote_maps_why`` says why there are none). A stub with neither a
        pid nor vFile (QEMU's user mode): the emulator's process of this host
        (``_read_emulator_maps``)."""
        pid = self.s.main_pid or self.s.lifecycle.stop_pid()
        self.remote_maps = None
        if pid is None:
            self.remote_maps_why = "the stub reported no pid"
        elif self.no_vfile:
            self.remote_maps_why = "the stub has no vFile"
        else:
            text = yield from self.s.lifecycle.stub_file(b"/proc/%d/maps" % pid, whole=True)
            if text is False:
                self.no_vfile = True
                self.remote_maps_why = "the stub has no vFile"
            elif text:
                self.remote_maps, self.remote_maps_why = text.decode(errors="replace"), None
                self.remote_maps_how = f"/proc/{pid}/maps read through the stub (vFile)"
                return
            else:
                self.remote_maps_why = f"the stub could not read /proc/{pid}/maps"
                return
        if self.s.config.emulator is not None:
            yield from self._read_emulator_maps()

    def _read_emulator_maps(self) -> Generator[Exchange, list[bytes], None]:
        """The map of a program run by an emulator of this host (proxy/host/emulator.py): the
        emulator's process found and proven once (its memory holds the AT_RANDOM bytes the
        stub reads), then at each stop its anonymous mappings in the guest's addresses, less
        those the stub cannot read (QEMU's own: its gdbstub reads only the guest's pages; one
        read of a mapping's first byte each, sent at once)."""
        host = self.s.config.emulator
        if self.emulator is None:
            from proxy.host.identity import read_stub_random

            stub_random = yield from read_stub_random(self.s.lifecycle.auxv, Exchange)
            self.emulator = host.find(self.s.stub_socket, self.s.lifecycle.auxv, stub_random, self.s.exec_file)
            if not isinstance(self.emulator, str):
                self.s.emit(Notice(f"program's memory map: {self.emulator.how}"))
        if isinstance(self.emulator, str):
            self.remote_maps_how = None
            self.remote_maps_why = f"{self.remote_maps_why}; no emulator's process here: {self.emulator}"
            return
        maps = host.maps(self.emulator)
        if maps is None:
            self.remote_maps_how = None
            self.remote_maps_why = f"{self.remote_maps_why}; the emulator's process {self.emulator.pid} is gone"
            return
        probed = [m for m in maps if m.perms == "rw-p"]
        replies = (yield Exchange(tuple(b"m%x,1" % m.start for m in probed))) if probed else []
        unread = {m.start for m, r in zip(probed, replies) if _hex_bytes(r) is None}
        from proxy.host.emulator import maps_text

        self.remote_maps = maps_text(m for m in maps if m.start not in unread)
        self.remote_maps_why = None
        self.remote_maps_how = self.emulator.how

    def with_reads(self, answer: Callable[[Callable[[int, int], bytes | None]], T]) -> Generator[Exchange, list[bytes], T]:
        """``answer(read)``, run once (proxy/session/reader.py): each memory read it makes that
        nothing here holds is asked of the stub while it waits, and every thread's registers
        when it asks for them (``monitor_threads``). ``monitor_peek`` reads what is known
        without asking the stub (None: not known; nothing is asked for); ``read`` gives None
        only for memory the stub cannot read."""
        yield from self._before_reflection()
        cache: dict[tuple[int, int], bytes | None] = {}
        # a proven local program's data pages straight from /proc/PID/mem (proxy/reflect/
        # localmem.py): no `m`; an address no mapping holds is unreadable at once; code and
        # anything else it cannot read go to the stub
        local = self.s.config.local_memory(self.s) if self.s.config.local_memory is not None else None
        threads: list[dict[int, bytes]] = []  # LWP -> `g` reply, read when the question asks

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

        def askable(key: tuple[int, int]) -> bool:
            return key not in cache and 0 < key[1] <= 1 << 16 and key[0] >= 0

        def read(addr: int, size: int) -> bytes | None:
            data = peek(addr, size)
            if data is None and askable((addr, size)):
                data = cache[(addr, size)] = asker.ask(("m", [(addr, size)]))[0]
            return data

        def read_many(keys: list[tuple[int, int]]) -> list[bytes | None]:
            """Several reads, those nothing here holds asked of the stub at once."""
            known = [peek(*k) for k in keys]
            ask = list(dict.fromkeys(k for k, data in zip(keys, known) if data is None and askable(k)))
            if ask:
                cache.update(zip(ask, asker.ask(("m", ask))))
            return [data if data is not None else cache.get(k) for k, data in zip(keys, known)]

        read.many = read_many  # type: ignore[attr-defined]  # proxy.reflect.memory.read_many

        def thread_registers() -> dict[int, bytes]:
            if not threads:
                threads.append(asker.ask(("registers",)))
            return threads[0]

        asker: Asker[T] = Asker(lambda ask: answer(read))
        self.monitor_threads = thread_registers
        self.monitor_peek = peek
        try:
            while True:
                kind, value = asker.next()
                if kind == "done":
                    return value  # type: ignore[no-any-return]
                if kind == "raised":
                    raise value
                if value[0] == "registers":
                    got = yield from self._read_thread_registers()
                else:  # ("m", [(addr, size), ...]): READS_AT_ONCE at a time, in pieces the stub takes
                    got = []
                    for i in range(0, len(value[1]), READS_AT_ONCE):
                        got += yield from self.s.read_memory(value[1][i:i + READS_AT_ONCE])
                asker.answer(got)
        finally:
            asker.abandon()
            self.monitor_threads = None
            self.monitor_peek = None
            if local is not None:
                self.s.stats.local_read_bytes += local.bytes_read
                local.close()

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
        if feature_on(self.s.stub_features, "QThreadSuffixSupported"):
            bodies = [b"g;thread:%x;" % tid for tid in tids]
            replies = yield Exchange(tuple(bodies))
            regs = replies
        else:
            bodies = [p for t in ids for p in (b"Hg" + t, b"g")]
            if self.s.stub_g is not None:
                bodies.append(b"Hg" + self.s.stub_g)
            replies = yield Exchange(tuple(bodies))
            regs = replies[1:2 * len(ids):2]
        return {tid: r for tid, r in zip(tids, regs) if tid > 0 and not r.startswith(b"E") and r}

    def _resolve_pending_reads(self) -> Generator[Exchange, list[bytes], None]:
        """The capture's drain, then the engine's deferred __state reads, at
        the first question after a stop."""
        if self.s.running:
            return
        if self.s.capture is not None and self.s.capture_installed:
            proc = self.s.capture_call("sync")
            if proc is not None:
                yield from proc
        engine = self.s.engine
        if engine is None:
            return
        reads = engine.pending_reads()[:512]
        if not reads:
            return
        got = yield from self.s.read_memory([(r.addr, r.size) for r in reads])
        for r, data in zip(reads, got):
            engine.resolve_read(r, data)

    def client_qxfer(self, body: bytes, raw: bytes | None) -> None:
        try:
            req = parse_qxfer(body)
        except MalformedPacket:
            return self.s.forward(body, raw)
        if not isinstance(req, QXferRead):
            return self.s.forward(body, raw)
        if req.object == "features" and self.s.serve_own_tdesc and self.s.config.target_xml:
            doc = self.s.config.target_xml.get(req.annex)
            if doc is None:
                self.s.reply(b"E00")
            else:
                self.s.reply(build_qxfer_reply(doc.encode(), req.offset, req.length))
            return None
        if (req.object == "features" and self.s.config.target_xml and self.s.config.registers_safe
                and req.annex == "target.xml"):
            self.s.start_proc(self._proc_features(req, body))
            return None
        if req.object == "osdata" and req.annex == "" and self.s.config.merge_osdata_types is not None:
            self.s.start_proc(self._proc_osdata_types(req, body))
            return None
        if self._is_own_qxfer(req):
            self.s.start_proc(self._proc_own_qxfer(req))
            return None
        self.s.forward(body, raw)
        return None

    def _is_own_qxfer(self, req: QXferRead) -> bool:
        return self.s.config.qxfer is not None and (
            req.object in PROXY_QXFER_OBJECTS
            or (req.object == "osdata" and req.annex.startswith("async-"))
        )

    def _proc_own_qxfer(self, req: QXferRead) -> Procedure:
        """The JSON document and the osdata tables render the stop's snapshot, which reads
        memory: the same read loop as a monitor command (every chunk of a document comes
        from the one snapshot of this stop)."""
        doc = yield from self.with_reads(lambda read: self._own_qxfer(req, read))
        self.s.proc = None
        if doc is None:
            self.s.reply(b"E00")
        else:
            self.s.reply(build_qxfer_reply(doc, req.offset, req.length))

    def _proc_osdata_types(self, req: QXferRead, body: bytes) -> Procedure:
        """`info os`: the stub's table types followed by the proxy's own."""
        if req.offset == 0 or self.osdata_types is None:
            stub_doc = b""
            for _ in range(64):
                ask = b"qXfer:osdata:read::%x,%x" % (len(stub_doc), 0x3FFF)
                (reply,) = yield Exchange((ask,))
                if reply[:1] not in (b"m", b"l"):
                    break
                stub_doc += unescape_binary(reply[1:])
                if reply[:1] == b"l":
                    break
            assert self.s.config.merge_osdata_types is not None
            self.osdata_types = self.s.config.merge_osdata_types(stub_doc or None)
        self.s.proc = None
        self.s.reply(build_qxfer_reply(self.osdata_types, req.offset, req.length))

    def _proc_features(self, req: QXferRead, body: bytes) -> Procedure:
        """Rule 11: a gdbserver asked without xmlRegisters describes no
        registers; lldb then crashes and gdb falls back to a built-in layout.
        Serve the complete description of the block the stub now sends."""
        (reply,) = yield Exchange((body,))
        self.s.snoop_reply(reply)
        self.s.proc = None
        if self.s.serve_own_tdesc and self.s.config.target_xml:
            doc = self.s.config.target_xml["target.xml"].encode()
            self.s.reply(build_qxfer_reply(doc, req.offset, req.length))
        else:
            self.s.reply(reply)

    def _own_qxfer(self, req: QXferRead, read: Callable[[int, int], bytes | None] | None = None) -> bytes | None:
        assert self.s.config.qxfer is not None
        try:
            return self.s.config.qxfer(req.object, req.annex, self.s, read)
        except Exception as err:  # noqa: BLE001 - never take the session down
            self.s.emit(Notice(f"qXfer:{req.object}:{req.annex} failed: {err!r}"))
            return None

    def probes_line(self) -> str | None:
        """How the --probe functions are counted (`stats`, `monitor async capture`):
        by the capture without a stop (uprobes), or at hidden breakpoints."""
        addrs = {p.addr for p in self.s.lifecycle.count_probes}
        if not addrs:
            return None
        counted = len(addrs & set(self.s.lifecycle.capture_counts))
        kernel = f"counted by {self.s.capture.name} (no stop)" if counted and self.s.capture is not None else ""
        hidden = "hidden breakpoints (a stop per call)"
        if counted == len(addrs):
            return f"--probe functions: {len(addrs)}, all {kernel}"
        if not counted:
            return f"--probe functions: {len(addrs)}, all {hidden}"
        return f"--probe functions: {len(addrs)}: {counted} {kernel}, {len(addrs) - counted} {hidden}"

    def stats_lines(self) -> list[str]:
        s = self.s.stats
        per_probe, total = s.probe_stats.per_probe.copy(), s.probe_stats.total
        if self.s.lifecycle.capture_counts and self.s.capture is not None:  # counted by the capture (uprobes)
            for addr, n in (self.s.capture_call("probe_counts") or {}).items():
                if addr in self.s.lifecycle.capture_counts:
                    per_probe[self.s.lifecycle.capture_counts[addr].name] += n
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
            self.s.register_notice.removeprefix("asyncrsp: "),
            self.s.identity.line(),
        ]
        if s.local_read_bytes:
            lines.append(f"memory read at stops through /proc/PID/mem (data pages of the proven local program): "
                         f"{s.local_read_bytes} bytes")
        k = self.s.known.stats
        if k.registers or k.selections or k.thread_lists or k.memory or k.memory_left or k.breakpoints:
            lines.append(f"answered at stops without the stub: {k.registers} registers, {k.selections} thread "
                         f"selections, {k.thread_lists} thread lists, {k.memory} memory reads "
                         f"({k.memory_left} left to the stub), {k.breakpoints} breakpoints removed and put "
                         "back while stopped")
        if not self.s.pacer.no_ack:
            p = self.s.pacer
            lines.append(f"stub without no-ack mode: one packet at a time ({p.held_total} waited for a reply); "
                         f"other threads' stop reports while one was handled: {p.strays}; "
                         f"releases of parked threads sent while the program ran: {p.kicks} ({p.released} "
                         f"taken); reports and replies sent again for their bytes, dropped: {p.copies}; "
                         f"bytes outside any packet (two threads' packets in one): {p.garbles} times; "
                         f"traps at a hidden breakpoint reported after it was taken out, hidden: {s.late_traps}")
        if self.s.read_limit.learned:
            lines.append(f"memory reads: {self.s.read_limit.learned}")
        if s.shielded:
            lines.append(f"client packets answered E01, not forwarded (the stub could not take them): "
                         f"{s.shielded}; last: {self.s.shield_last}")
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
        if self.s.capture_notice:
            lines.append(self.s.capture_notice)
        if self.s.capture is not None:
            lines += self.s.capture_call("stats_lines") or []
        else:
            lines.append(f"capture: none (mode {self.s.mode})")
        if self.s.lifecycle.plant_failed:
            lines.append(f"probes not planted: {self.s.lifecycle.plant_failed}")
        for name, n in sorted(per_probe.items()):
            lines.append(f"  {name}: {n}")
        return lines


def _hex_bytes(reply: bytes) -> bytes | None:
    """An `m` reply's bytes; None for an error (`Exx`) or garbage."""
    if not reply or reply[:1] == b"E":
        return None
    try:
        return bytes.fromhex(reply.decode("ascii"))
    except (ValueError, UnicodeDecodeError):
        return None
