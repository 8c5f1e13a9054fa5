"""The capture's life in the program: find the program and plant the probes at
the first resume, install the backend, switch backend or mode at a stop,
hidden stops the backend asks for (drains), fork children cleaned of the
proxy's breakpoints, exec and exit, and leaving (DESIGN.md §3 rule 9: every
proxy breakpoint out before a detach, a kill or a client hang-up)."""

from __future__ import annotations

from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from rsp.errors import MalformedPacket
from rsp.framing import unescape_binary
from rsp.packets.stop import StopReply
from rsp.packets.resume import Resume
from rsp.threads import ThreadId

from proxy.arch import X86_64, Arch, for_machine, machine_of
from proxy.host.identity import UNDECIDED, Identity
from proxy.host.procmem import sigint_in_status
from proxy.probes import Probe
from proxy.procedure import Exchange, Procedure

from .actions import Close, Notice, ToStub, ToStubRaw
from .breakpoints import COMMANDS_LOST, BpKey
from .wire import SIGINT, auxv_entry, feature_on, stub_file, stub_file_whole, without_signals, z_packet

if TYPE_CHECKING:
    from .state import SessionBase


class CaptureLifecycle:
    """The capture's life in the program, a part the session holds (`session.lifecycle`; the
    module's docstring). It owns what only the capture's life needs (the probes it planted
    and counts, a switch asked for, the target kept for the first resume); the rest it reads
    and changes on the session (`s`): its breakpoint table, stop, capture and procedure runner."""

    def __init__(self, session: SessionBase) -> None:
        self.s = session
        self.capture_name = session.config.capture_name
        self._capture_keys: list[BpKey] = []  # hidden breakpoints the capture planted
        self.count_probes: list[Probe] = []  # --probe: hidden breakpoints unless the capture counts them
        self.capture_counts: dict[int, Probe] = {}  # the count probes the capture counts itself
        self._capture_interrupt = False  # our own 0x03 for the capture is in flight
        self.switch_request: tuple[str | None, str | None] | None = None  # asked by `monitor async capture`
        self._fallbacks_said: set[str] = set()  # capture.fallback lines said (each once a session)
        self.entry: int | None = None  # the program's AT_ENTRY, from the stub's auxv (the load bias)
        self.auxv: bytes | None = None  # the stub's auxv (qXfer:auxv:read), once per process
        self.plant_failed: str | None = None
        # the capture was installed at the client's first stop, ahead of the first
        # resume, which finishes it (proc_prepare)
        self.early = False
        # the target and --probe list opened at the client's first stop when the
        # capture could not start early: the first resume plans on them (_prepare)
        self.kept: tuple[Any, list[Probe]] | None = None

    def leave_plan_key(self) -> tuple[object, ...]:
        """Changes whenever `leave_plan` may (cheap: asked after every packet)."""
        return (self.s.bps.version, self.s.capture_installed, self.s.main_pid, self.s.left, self.s.program_exited,
                self.s.identity.host_pid, self.s.planted, id(self.s.capture),
                self.s.capture.held_breakpoints() if self.s.capture is not None else ())

    def leave_plan(self) -> dict[str, object]:
        """What must leave the program if the proxy dies without leaving
        (proxy/shell/keeper.py): every breakpoint in the stub (the client's
        too: its connection goes with the proxy), the trace experiment, the
        detach packet, the program's host pid (its pending SIGINT is read in
        /proc). Empty once the program is left or gone."""
        if self.s.left or self.s.program_exited or not self.s.planted:
            return {}
        keys = sorted(set(self.s.bps.client) | self.s.bps.proxy | set(self.s.bps.lingering))
        pid = self.s.main_pid
        multi = feature_on(self.s.stub_features, "multiprocess")
        zs = [z_packet(False, k) for k in keys]
        # The capture's own (fast tracepoints' guards on pthread_create and
        # libc's _exit): gdbserver's QTStop leaves them in, and the program
        # left with one dies of SIGTRAP at its exit.
        held = self.s.capture.held_breakpoints() if self.s.capture is not None else ()
        zs += [z for z in held if z not in zs]
        return {
            "z": [z.decode() for z in zs],
            # From the plant on, not from the end of the install: a proxy killed
            # while QTStart was on its way left the tracepoints in (fault
            # campaign, tracepoints, the proxy killed 0.41 s in: SIGTRAP).
            "trace": getattr(self.s.capture, "name", "") == "tracepoints",
            "detach": f"D;{pid:x}" if multi and pid else "D",
            "host_pid": self.s.identity.host_pid if self.s.identity.local else None,
            "stub_pid": pid,  # its /proc read through the stub (keeper._sigint_waiting) when not this host's
        }

    def sigint_waiting(self) -> bool:
        """A SIGINT may wait in the kernel for the program (asked only after a
        0x03 may have crossed a stop). This host's program: its /proc says.
        Any other (a container, another host; `--remote`): True after a
        crossing - `_sigint_waiting_now` asks the stub's own /proc."""
        ident, ask = self.s.identity, self.s.config.sigint_pending
        if not self.s.sigint_crossed or ask is None:
            return False
        if not (ident.local and ident.host_pid):
            return bool(self.s.main_pid or self.stop_pid())
        try:
            return ask(ident.host_pid)
        except OSError:
            return False

    def sigint_waiting_now(self) -> Generator[Exchange, list[bytes], bool]:
        """`_sigint_waiting`, a program of another host asked through the stub:
        its /proc/PID/status read with vFile (gdbserver opens files in its own
        namespaces, where the pid it reports is the program's). Unreadable (a
        stub without vFile): False, as before. Without it, a client killed
        after its Ctrl-C crossed a hidden stop left the SIGINT to the detach
        (`scripts/fault-campaign --victims client --backends breakpoints
        --proxy-arg=--remote`: 4 of 20 programs dead of SIGINT)."""
        ident = self.s.identity
        if ident.local and ident.host_pid:
            return self.sigint_waiting()
        if not self.sigint_waiting():
            return False
        pid = self.s.main_pid or self.stop_pid()
        text = yield from self.stub_file(b"/proc/%d/status" % pid)
        return text is not None and sigint_in_status(text.decode(errors="replace"))

    def stub_file(self, path: bytes, size: int = 0x1000,
                   whole: bool = False) -> Generator[Exchange, list[bytes], Any]:
        """The first `size` bytes of a file on the stub's host (wire.stub_file), or all of it
        (`whole`: wire.stub_file_whole; False: the stub has no vFile); None when it cannot be
        read."""
        steps = stub_file_whole(path) if whole else stub_file(path, size)
        try:
            bodies = next(steps)
            while True:
                bodies = steps.send((yield Exchange(bodies)))
        except StopIteration as done:
            return done.value

    def holds_program(self) -> bool:
        """The proxy has something in the program to take out before it goes."""
        return bool(self.s.bps.proxy_only()) or self.s.capture_installed or self._capture_interrupt

    def client_new_process(self, body: bytes, raw: bytes | None) -> None:
        """vRun, vAttach, R: another process. If the one the proxy follows
        still holds its things (a client that runs or attaches without a kill
        first: gdbserver's vRun and vAttach start the new process beside the
        old one, which runs on; gdb does so for a second inferior), they come
        out of it first: the capture uninstalled (uprobes: the links closed,
        waiting, as at a detach), the hidden breakpoints removed. Dropped, an
        int3 left in the old process was a SIGTRAP nobody expected. Not at
        `R`: gdbserver kills every process before it restarts."""
        if body[:1] != b"R" and (self.s.planted or self.s.capture_installed) \
                and not (self.s.left or self.s.program_exited):  # _capture_installed: an early install
            self.s.start_proc(self._proc_new_process(body, raw))
            return
        self._new_process_then(body, raw)

    def _proc_new_process(self, body: bytes, raw: bytes | None) -> Procedure:
        yield from self._uninstall_capture(replant=False)
        keys = self.s.bps.proxy_only()
        if keys:
            yield Exchange(tuple(z_packet(False, k) for k in keys))
        self.s.proc = None
        self._new_process_then(body, raw)

    def _new_process_then(self, body: bytes, raw: bytes | None) -> None:
        self.new_process()
        if body[:1] == b"R":
            # Extended-remote restart: gdbserver answers nothing (it restarts
            # the program and waits for the next request).
            self.s.emit(ToStubRaw(raw) if raw is not None else ToStub(body))
        else:
            self.s.forward(body, raw)  # its stop reply is snooped as `?`'s (_on_client_reply)

    def new_process(self) -> None:
        """Extended-remote: the client starts or attaches another process (vRun,
        vAttach, R). Nothing of the proxy's is in it: the capture is planned
        again for it at its first resume, and its graph starts fresh (a new
        target). The old process is gone (gdb kills it first, `R` makes
        gdbserver kill it, or it exited), or its things were taken out first
        (_client_new_process): nothing is taken out of it here."""
        if self.capture_counts:
            self._fold_capture_counts()
        if self.s.capture is not None and self.s.capture_installed:
            self.s.capture_call("dropped")  # uprobes: the old process's links closed
            self._keep_residue()
        self.s.bps.forget_all()
        self.s.probes.clear()
        self._capture_keys = []
        self.s.capture_installed = False
        self._capture_interrupt = False
        if self.s.config.make_capture is not None:
            self.s.capture = None
        self.s.target = None
        self.kept = None
        self.s.planted = self.s.found = self.early = False
        self.s.program_exited = False
        self.s.left = False
        self.s.main_pid = None
        self.s.client_symbols = {}  # the new process's libraries are looked up anew
        self.s.identity = UNDECIDED  # another process: proven again before any host-side action
        self.s.known.forget()
        self.s.known.drop_memory()
        self.s.known.memory_pid = self.s.known.memory_link_pid = None
        self.entry = self.auxv = None
        self.s.queries.forget_process()
        self.s.load_bias = None
        self.s.exec_file = self.s.config.elf_path  # asked again: vRun may name another program
        self.s.stopped = None
        self.s.last_stop = None
        self.s.resume = None
        self.s.interrupt_forwarded = self.s.interrupt_pending = self.s.interrupt_at_resume = False
        self.s.interrupted_for_leave = False
        self.s.ns.held.clear()
        self.s.processes += 1

    def proc_plant_then_resume(self, resume: Resume, body: bytes, raw: bytes | None) -> Procedure:
        yield from self.plant()
        self.s.proc = None
        self.resume_after_proc(resume, body, raw)

    def proc_then_resume(self, change: Procedure, resume: Resume, body: bytes, raw: bytes | None) -> Procedure:
        """The capture's `before_resume` procedure, then the client's resume."""
        yield from change
        self.s.proc = None
        self.resume_after_proc(resume, body, raw)

    def leave_for_hang_up(self) -> None:
        """The client is gone and the program stopped: keep it for the next
        client, or take the proxy's things out and end."""
        if self.s.keep_stub:
            self.s.emit(Close("client disconnected", keep_stub=True))
        elif not self.s.program_exited and (self.holds_program() or self.sigint_waiting()):
            self.s.start_proc(self.proc_leave())
        else:
            self.s.emit(Close("client disconnected"))

    def resume_after_proc(self, resume: Resume, body: bytes, raw: bytes | None) -> None:
        """The client's resume once the procedure that delayed it ended; a
        Ctrl-C that came meanwhile (`client_resume` starts afresh) goes to the
        stub once the program runs (state.forward)."""
        if self.s.closing:
            # The client hung up while the probes were planted (or the capture
            # changed): nobody waits for this resume. Resumed, the program ran
            # with the proxy's breakpoints and trace points and nobody took
            # them out (fault campaign: a client killed 0.08 s in, the program
            # dead of SIGTRAP).
            self.leave_for_hang_up()
            return
        pending = self.s.interrupt_pending
        self.s.client_resume(resume, body, raw)
        if pending and self.s.resume is not None and not self.s.resume.is_step:
            if self.s.proc is not None:
                self.s.interrupt_pending = True  # another procedure first (a step off a probe)
            elif not self.s.interrupt_forwarded:
                self.s.interrupt_forwarded = True
                self.s.emit(ToStubRaw(b"\x03"))

    def plant(self) -> Generator[Exchange, list[bytes], None]:
        """Find the program, plant the probes and install the capture (before it first runs)."""
        self.s.planted = True
        if self.early:
            # installed at the client's first stop (_proc_prepare): finish it
            self.early = False
            proc = self.s.capture_call("install")  # uprobes: the attach's thread joined
            if proc is not None:
                yield from proc
            yield from self._uncounted_as_breakpoints()
            self._planted_notice()
            return
        ident = yield from self.find_program()
        kept, self.kept = self.kept, None
        probes: list[Probe] = []
        if kept is not None:  # opened at the client's first stop (_prepare), for this process
            self.s.target, probes = kept[0], list(kept[1])
        else:
            if self.s.config.resolve_probes is not None:
                try:
                    probes += self.s.config.resolve_probes(self.s.exec_file, self.entry)
                except Exception as err:  # file problems come back as text
                    self.plant_failed = str(err)
                    self.s.emit(Notice(f"probes not planted: {err}"))
            if self.s.config.open_target is not None:
                self.s.target = self._open_target(ident)
        arch, refused = _program_arch(self.s.exec_file)
        if arch is not None:
            self.s.set_arch(arch)
        if refused is not None and self.s.mode != "off":
            # hidden breakpoints at rets the analysis cannot find, a breakpoint kind and pc
            # offset of another CPU: the program would trap at the proxy's own breakpoints
            self.s.mode, probes = "off", []
            self.s.capture_notice = f"{refused}: capture off (mode off), tasks are read from memory at stops"
            self.s.emit(Notice(self.s.capture_notice))
        if self.s.capture is None and self.s.config.make_capture is not None and self.s.mode != "off":
            name = self.capture_name
            inv = getattr(self.s.target, "inventory", None)
            if name == "auto" and not probes and inv is not None and not inv.resume_fns:
                # Nothing to capture or count: the backend that loads fastest
                # (choosing among the others imported uprobes' modules, ~0.7 s of
                # each session's start on a plain C program).
                name = "breakpoints"
            try:
                self._new_capture(name, self.s.mode)
            except ValueError as err:
                self.s.capture_notice = f"capture {self.capture_name}: {err}; using breakpoints"
                self.s.emit(Notice(self.s.capture_notice))
                self._new_capture("breakpoints", self.s.mode)
        self.count_probes = probes
        # the probes the capture does not count itself become hidden breakpoints
        yield from self._install_capture(unplanted=probes)
        self._planted_notice()

    def _planted_notice(self) -> None:
        self.s.emit(Notice(f"planted {len(self.s.probes)} probe(s)"
                          + (f"; {len(self.capture_counts)} counted by {self.s.capture.name} without a stop"
                             if self.capture_counts and self.s.capture is not None else "")))

    def find_program(self) -> Generator[Exchange, list[bytes], Identity]:
        """The program's file, pid, AT_ENTRY and host (the stub's exec-file and
        auxv, then the identity proof): once per process, at the client's first
        stop (_proc_prepare) or at the first resume."""
        if self.s.found:
            return self.s.identity
        if self.s.exec_file is None and feature_on(self.s.stub_features, "qXfer:exec-file:read"):
            (reply,) = yield Exchange((b"qXfer:exec-file:read::0,fff",))
            if reply[:1] in (b"l", b"m"):
                self.s.exec_file = unescape_binary(reply[1:]).decode(errors="replace")
        pid = self.stop_pid()
        self.s.main_pid = pid
        entry: int | None = None
        auxv: bytes | None = None
        if feature_on(self.s.stub_features, "qXfer:auxv:read"):
            (reply,) = yield Exchange((b"qXfer:auxv:read::0,1000",))
            entry = auxv_entry(reply)
            auxv = unescape_binary(reply[1:]) if reply[:1] in (b"l", b"m") else None
        self.entry, self.auxv = entry, auxv
        ident = yield from self.identify(pid, auxv)
        # gdbserver answers qXfer:exec-file with the /proc/PID/exe link, which reads
        # "PATH (deleted)" once the file was replaced under the running program (a
        # rebuild renames a new binary over it): a name that opens nothing. On the
        # program's host the running file still opens through /proc/PID/exe; a remote
        # one keeps the name, and the analysis says it cannot read it.
        replaced = self.s.exec_file is not None and self.s.exec_file.endswith(" (deleted)")
        if (self.s.exec_file is None or replaced) and self.s.config.local_exe is not None and ident.local:
            self.s.exec_file = self.s.config.local_exe(ident.host_pid) or self.s.exec_file
        elif ident.exe is not None and self.s.config.elf_path is None:
            self.s.exec_file = ident.exe  # the stub's path is not this host's (a mount namespace)
        self.s.found = True
        # memory read here, as the stub's `m` shows it (known.py): a proven local program of
        # a CPU whose breakpoint is the 0xcc the reader looks for
        self.s.known.drop_memory()
        x86 = _program_arch(self.s.exec_file)[0] is X86_64
        self.s.known.memory_pid = ident.host_pid if ident.local and x86 else None
        self.s.known.memory_link_pid = pid
        return ident

    def _open_target(self, ident: Identity) -> object:
        assert self.s.config.open_target is not None
        feats = frozenset(f.name for f in self.s.stub_features if f.value != "-")
        target = self.s.config.open_target(self.s.exec_file, self.entry,
                                         ident.host_pid if ident.local else self.s.main_pid, feats)
        target.identity, target.local = ident, ident.local
        return target

    def prepares_early(self) -> bool:
        """At a stop the client asked for (`?`, vRun, vAttach): may the capture
        be installed now, ahead of the first resume (_proc_prepare)? Only for
        --probe under a backend chosen by the session, in all-stop mode, with a
        pid to prove."""
        cfg = self.s.config
        return (cfg.resolve_probes is not None and cfg.make_capture is not None and cfg.open_target is not None
                and cfg.identify is not None and self.s.capture is None and self.s.mode != "off"
                and not (self.s.planted or self.s.capture_installed or self.s.found or self.s.non_stop
                         or self.s.closing or self.s.bps.client)
                and self.s.proc is None and self.stop_pid() is not None)

    def proc_prepare(self) -> Procedure:
        """The client's first stop of a process: the capture installed now when
        it can start without the stub and without a stop (uprobes that only
        count: `install_early`, the link attached in a thread), while the client
        goes on with its own start; the first resume finishes it (_plant). The
        program's identity is proven here for that: a host-side action needs it
        first. Anything else (a remote program, a backend that plants hidden
        breakpoints or leaves a --probe uncounted, a failure) is dropped
        silently and done at the first resume as before. Client packets wait
        meanwhile (three reads of the stub, the plan's few ms of CPU: what the
        first resume paid for them before); a Ctrl-C meanwhile waits for the
        next continue, as any while the program is stopped (core.client_interrupt)."""
        self.s.preparing = True
        try:
            yield from self._prepare()
        finally:
            self.s.preparing = False
        self.s.proc = None
        if self.s.closing:
            # the client hung up meanwhile: client_closed left it to this procedure's end
            self.leave_for_hang_up()

    def _prepare(self) -> Generator[Exchange, list[bytes], None]:
        ident = yield from self.find_program()
        if not ident.local or self.s.closing or self.s.bps.client:
            return
        assert self.s.config.resolve_probes is not None and self.s.config.make_capture is not None
        try:
            probes = self.s.config.resolve_probes(self.s.exec_file, self.entry)
            target = self._open_target(ident)
            cap = self.s.config.make_capture(self.capture_name, self.s.mode, target)
        except Exception:  # noqa: BLE001 - said at the first resume, where it is tried again
            return
        if not probes or cap is None or not cap.may_install_early(target):
            # not early (a Rust program's plan has poll sites): the first resume
            # plans it, on the target and probes found now (no second inventory
            # load and resolve); `_new_process` drops them with the process
            self.kept = (target, probes)
            return
        self.s.target, self.s.capture = target, cap
        self._say_fallback()
        target.extra["client_breakpoints"] = self.s.bps
        planned = self.s.capture_call("plan", target)
        taken = self.s.capture_call("count_probes", list(probes))
        if planned or set(taken or ()) != {p.addr for p in probes} or not self.s.capture_call("install_early"):
            self.s.target = self.s.capture = None  # nothing started: all again at the first resume
            return
        self.count_probes = probes
        self.capture_counts = {p.addr: p for p in probes}
        self.s.capture_installed = True
        self.early = True

    def identify(self, pid: int | None, auxv: bytes | None) -> Generator[Exchange, list[bytes], Identity]:
        """Is the stub's process this host's, and which pid (proxy/host/identity.py)?
        Decided once, before any host-side action; said at connect and in stats."""
        if self.s.identity is UNDECIDED:
            if self.s.config.identify is not None and auxv is None and pid is not None \
                    and feature_on(self.s.stub_features, "qXfer:auxv:read"):
                (reply,) = yield Exchange((b"qXfer:auxv:read::0,1000",))
                auxv = unescape_binary(reply[1:]) if reply[:1] in (b"l", b"m") else None
            if self.s.config.identify is None:
                self.s.identity = Identity(False, None, pid, "remote: not checked")
            else:
                self.s.identity = yield from self.s.config.identify(pid, auxv, self.s.exec_file)
                self.s.emit(Notice(self.s.identity.line()))
        return self.s.identity

    def _plant_probes(self, probes: list[Probe]) -> Generator[Exchange, list[bytes], None]:
        bodies = []
        for p in probes:
            key: BpKey = (0, p.addr, self.s.arch.bp_kind)
            self.s.probes[p.addr] = p
            if self.s.bps.commands_lost(key):
                self.s.emit(Notice(COMMANDS_LOST % p.addr))
            if self.s.bps.proxy_insert(key):
                bodies.append(z_packet(True, key))
        if bodies:
            replies = yield Exchange(tuple(bodies))
            bad = [b for b, r in zip(bodies, replies) if r != b"OK"]
            if bad:
                self.s.emit(Notice(f"{len(bad)} probe(s) could not be inserted: {bad[0]!r}"))

    def _install_capture(self, unplanted: list[Probe] | None = None) -> Generator[Exchange, list[bytes], None]:
        """Plan and install the capture backend on the target. `unplanted`: count
        probes not planted yet (at the first plant): those the capture does not
        count itself are planted here, before the capture's own."""
        cap = self.s.capture
        if cap is None or self.s.target is None:
            yield from self._plant_probes(unplanted or [])
            return
        # The client's breakpoints so far: a backend that must change how the stub
        # holds some of them (uprobes: Z0 at a probe site -> Z1) keeps the table true.
        self.s.target.extra["client_breakpoints"] = self.s.bps
        planned = self.s.capture_call("plan", self.s.target) or []
        # A backend may count some --probe functions itself (uprobes): our hidden
        # breakpoints there go out first (a uprobe swallows a Z0 at its address).
        taken = set(self.s.capture_call("count_probes", list(self.count_probes)) or ())
        self.capture_counts = {p.addr: p for p in self.count_probes if p.addr in taken}
        keys = [(0, a, self.s.arch.bp_kind) for a in self.capture_counts if self.s.probes.pop(a, None) is not None]
        bodies = tuple(z_packet(False, k) for k in keys if self.s.bps.proxy_remove(k))
        if bodies:
            yield Exchange(bodies)
        yield from self._plant_probes([p for p in unplanted or [] if p.addr not in self.capture_counts])
        self._capture_keys = [(0, p.addr, self.s.arch.bp_kind) for p in planned if p.addr not in self.s.probes]
        yield from self._plant_probes([p for p in planned if p.addr not in self.s.probes])
        proc = self.s.capture_call("install")
        if proc is not None:
            yield from proc
        self.s.capture_installed = True
        yield from self._uncounted_as_breakpoints()

    def _uncounted_as_breakpoints(self) -> Generator[Exchange, list[bytes], None]:
        if self.capture_counts and not self.s.capture_call("counting"):
            # the backend could not put its probes in (uprobes: the attach failed):
            # they are hidden breakpoints again, as under a backend that counts none
            yield from self._plant_probes(self._fold_capture_counts())

    def _uninstall_capture(self, replant: bool = True) -> Generator[Exchange, list[bytes], None]:
        """Take the capture out of the program (its hidden breakpoints and its own state)."""
        cap = self.s.capture
        if cap is None:
            return
        if self.s.capture_installed:
            proc = self.s.capture_call("uninstall")
            if proc is not None:
                yield from proc
            self.s.capture_installed = False
        if self.capture_counts:
            # the capture's counts join ours; its probes become hidden breakpoints again
            # (after its uninstall: the uprobes are out before our Z0 goes in)
            counted = self._fold_capture_counts()
            if replant:
                yield from self._plant_probes(counted)
        bodies = []
        for key in self._capture_keys:
            self.s.probes.pop(key[1], None)
            if self.s.bps.proxy_remove(key):
                bodies.append(z_packet(False, key))
        self._capture_keys = []
        if bodies:
            yield Exchange(tuple(bodies))

    def _fold_capture_counts(self) -> list[Probe]:
        """The count probes the capture counted: their hits join ours; returns them."""
        for addr, n in (self.s.capture_call("probe_counts") or {}).items():
            if addr in self.capture_counts:
                self.s.stats.probe_stats.add(self.capture_counts[addr], n)
        counted, self.capture_counts = list(self.capture_counts.values()), {}
        return counted

    def request_switch(self, capture: str | None = None, mode: str | None = None) -> None:
        """Ask for another capture backend or mode; done after the command that asked."""
        self.switch_request = (capture, mode)

    def proc_switch(self, name: str | None, mode: str | None, then: bytes | None = None) -> Procedure:
        yield from self.switch(name, mode)
        self.s.proc = None
        if then is not None:
            self._dispatch_after_switch(then)

    def _dispatch_after_switch(self, body: bytes) -> None:
        # The backend that handed over is gone: the packet takes the normal
        # path, and no backend sees it again (it would hand over forever).
        self.s.dispatch_client(body, None, handed_over=True)

    def switch(self, name: str | None, mode: str | None) -> Generator[Exchange, list[bytes], None]:
        name = name or self.capture_name
        mode = mode or self.s.mode
        if self.s.capture is not None and (self.s.planted or self.s.capture_installed):
            # before the first resume only an early install (_proc_prepare): its
            # probes are planted with the new backend at the first resume
            yield from self._uninstall_capture(replant=self.s.planted)
        self.early = False
        self.capture_name, self.s.mode = name, mode
        self.s.stats.capture_switches += 1
        if self.s.config.make_capture is None:
            return
        self._keep_residue()
        self.s.capture = None
        if not self.s.planted:
            return  # the first resume plants and installs it
        if mode != "off":
            self._new_capture(name, mode)
            yield from self._install_capture()

    def _new_capture(self, name: str, mode: str) -> None:
        """Make the backend and hand it the client's symbol answers so far
        (tracepoints: the agent's, for fast tracepoints in a program gdb
        attached to; they came before the first resume made the backend)."""
        self.s.capture = self.s.config.make_capture(name, mode, self.s.target)
        self._say_fallback()
        for body in self.s.client_symbols.values():
            self.s.capture_call("client_request", body)

    def _say_fallback(self) -> None:
        """`--capture auto` passed over a cheaper capture: one line on the proxy's
        stderr saying which it took and why (the doctor's words), once a session."""
        line = getattr(self.s.capture, "fallback", None)
        if line and line not in self._fallbacks_said:
            self._fallbacks_said.add(line)
            self.s.emit(Notice(line))

    def _keep_residue(self) -> None:
        """The backend is being dropped: what it left in the stub stays hidden."""
        residue = self.s.capture_call("residue") if self.s.capture is not None else None
        if residue is not None:
            self.s.residues.append(residue)

    def tick(self, now: float) -> None:
        """Called by the shell every few tens of ms: lets the capture ask for a
        hidden stop while the program runs (a drain before its buffer fills)."""
        if (self.s.capture is None or not self.s.running or self.s.proc is not None or self.s.closing or self.s.non_stop
                or self.s.interrupt_forwarded or self._capture_interrupt or not self.s.capture_installed):
            return
        if self.s.capture_call("wants_interrupt", now):
            self._capture_interrupt = True
            self.s.interrupt_program()

    def _proc_capture_stop(self, proc: Procedure | None) -> Procedure:
        """A stop the capture caused: its own interrupt (drain), or a stop it
        records itself. Hidden: run the capture's procedure, resume as the
        client asked (rule 3: no signal repeated)."""
        t0 = self.s.config.clock()
        last = self.s.last_stop
        if proc is None:
            self.s.stats.hidden_interrupts += 1
            proc = self.s.capture_call("sync")
        if proc is not None:
            yield from proc
        self.s.stats.hidden_time += self.s.config.clock() - t0
        self.s.proc = None
        resume = self.s.resume
        if self.s.closing or resume is None:
            self.s.report_stop(last, None, b"S%02x" % SIGINT)
            return
        if self.s.interrupt_pending:
            # The client's Ctrl-C arrived meanwhile (rule 8).
            self.s.report_stop(None, None, b"S%02x" % SIGINT)
            return
        self.s.forward(without_signals(resume), None, resume=True)

    def _proc_capture_exited(self, proc: Procedure, sr: StopReply, raw: bytes) -> Procedure:
        """The program exited (or exec'd): the capture collects what it recorded
        since the last stop (a tracepoint buffer stays readable), then the
        client sees the exit (the exec)."""
        yield from proc
        self.s.proc = None
        self.s.report_stop(sr, raw)

    def _proc_clean_fork_child(self, sr: StopReply, raw: bytes, child: ThreadId) -> Procedure:
        """A fork child inherits the parent's memory, the proxy's int3s
        included: gdb detaches the child once it has taken *its* breakpoints
        out, and the child would die of SIGTRAP at the first probe it meets.
        Take the proxy's out of the child first (the stub applies z0 to the
        process selected with Hg), then put the stub's selection back on the
        thread that reported the fork (rule 6), then report the fork."""
        yield from self._clean_fork_child(sr, child)
        self.s.proc = None
        self.s.report_stop(sr, raw)

    def _clean_fork_child(self, sr: StopReply, child: ThreadId) -> Procedure:
        assert sr.thread is not None
        bodies = [b"Hg" + child.format(True)]
        bodies += [z_packet(False, k) for k in self.s.bps.proxy_only()]
        yield Exchange(tuple(bodies))
        if self.s.capture is not None:
            proc = self.s.capture_call("forked", child)
            if proc is not None:
                yield from proc
        yield Exchange((b"Hg" + sr.thread.format(True),))
        self.s.stats.forks_cleaned += 1

    def _proc_hidden_fork(self, sr: StopReply, child: ThreadId, pid: int) -> Procedure:
        """A fork the client did not ask to hear of (the proxy asked the stub for
        it, core._proc_qsupported): clean the child as for a reported fork, then
        let it go as gdbserver would have (``D;pid``). Run inside
        ``_proc_capture_stop``, which re-issues the client's resume."""
        yield from self._clean_fork_child(sr, child)
        (reply,) = yield Exchange((b"D;%x" % pid,))
        self.s.stats.hidden_forks += 1
        if reply != b"OK":
            self.s.emit(Notice(f"could not detach the forked child {child.pid}: {reply.decode(errors='replace')}"))

    def proc_detach_child(self, body: bytes) -> Procedure:
        """The client detaches a fork child; then the capture syncs before the
        client hears back (gdbserver stops a trace experiment at any detach:
        the tracepoint backend restarts it here, while the program is stopped)."""
        (reply,) = yield Exchange((body,))
        proc = self.s.capture_call("sync")
        if proc is not None:
            yield from proc
        self.s.proc = None
        self.s.reply(reply)

    def client_selects_other_process(self) -> bool:
        g = self.s.client_g_thread
        if not g or self.s.main_pid is None or not g.startswith(b"p"):
            return False
        try:
            pid = ThreadId.parse(g).pid
        except MalformedPacket:
            return False
        return pid is not None and pid > 0 and pid != self.s.main_pid

    def other_process(self, body: bytes) -> bool:
        """`D;pid` / `vKill;pid` naming a process other than the program's."""
        _, sep, arg = body.partition(b";")
        if not sep or self.s.main_pid is None:
            return False
        try:
            return int(arg, 16) != self.s.main_pid
        except ValueError:
            return False

    def _stop_of_other_process(self, sr: StopReply) -> bool:
        """A stop of a process other than the program's (a fork child gdb keeps)."""
        pid = sr.thread.pid if sr.thread is not None else None
        return pid is not None and pid > 0 and self.s.main_pid is not None and pid != self.s.main_pid

    def stop_pid(self) -> int | None:
        """The program's pid from the last stop (without multiprocess ids the
        first stop's thread is the main thread, whose tid is the pid)."""
        st = self.s.last_stop
        if st is None or st.thread is None:
            return None
        pid = st.thread.pid or st.thread.tid
        return pid if pid > 1 else None

    def _end_symbol_lookup(self) -> Procedure:
        """The client left in the middle of the stub's symbol look-up (it asked
        `qSymbol:NAME` and got no answer): every packet of the leave would be taken as a
        malformed answer, so each question is answered "unknown" until the stub is done."""
        for _ in range(256):
            if self.s.symbol_lookup is None:
                return
            (reply,) = yield Exchange((b"qSymbol::" + self.s.symbol_lookup,))
            self.s.symbol_lookup = reply[8:] if reply.startswith(b"qSymbol:") and len(reply) > 8 else None
        self.s.symbol_lookup = None

    def proc_leave(self, then: tuple[bytes, bytes | None] | None = None) -> Procedure:
        yield from self._end_symbol_lookup()
        if self.s.capture is not None and then is not None and (then[0][:1] == b"k" or then[0].startswith(b"vKill")):
            # a kill: nothing is planted again, the capture need not wait for its
            # things to be out. Not a hang-up: gdbserver detaches an attached
            # program, which runs on; a CI run then read a uprobe's int3 in its
            # code after the proxy had exited (test_faults'
            # test_client_disconnect_leaves_no_breakpoint[uprobes]), so the
            # links are closed waiting, as at a detach.
            self.s.capture_call("leaving")
        yield from self._uninstall_capture(replant=False)
        keys = self.s.bps.proxy_only()
        bodies = tuple(z_packet(False, k) for k in keys)
        # A 0x03 of ours or the client's that crossed a stop: gdbserver, stopped,
        # made it a real SIGINT that waits in the kernel, and a detach delivers
        # it (the program died after a detach that answered OK: fuzz-client
        # seeds 200/300). Consumed below like the capture's own stray interrupt.
        # Also at a hang-up: the client's own Ctrl-C that crossed a hidden stop
        # left its SIGINT waiting, and the program died of it once gdbserver
        # detached (fault campaign, breakpoints, the client killed: 2 of 12
        # programs dead of SIGINT).
        stray = self._capture_interrupt or (yield from self.sigint_waiting_now())
        if then is None and (self.s.interrupted_for_leave or stray):
            # The client hung up while the program ran: the proxy's own
            # interrupt stopped it with SIGINT. Tell the stub to pass no
            # signal, or an attached program dies of it once detached.
            bodies = (b"QProgramSignals:",) + bodies
        last = self.s.last_stop
        consumed = False
        if stray:
            # The capture's own interrupt crossed the stop the client saw: its
            # SIGINT is pending. Run until it arrives, passing no signal, or a
            # detached program dies of it.
            (ok,) = yield Exchange((b"QProgramSignals:",))
            for _ in range(4):  # another thread's stop may come first (a client breakpoint)
                replies = yield Exchange(bodies + (b"vCont;c",), resume=True)
                stop, bodies = replies[-1], ()
                if stop[:3] in (b"T02", b"S02") or stop[:1] in (b"W", b"X") \
                        or not (yield from self.sigint_waiting_now()):
                    break
            self._capture_interrupt = False
            self.s.sigint_crossed = False
            bodies = ()
            consumed = True
        if not consumed and then is None and self.s.interrupted_for_leave and last is not None \
                and last.signal != SIGINT:
            # Our 0x03 crossed a stop reply already on its way: gdbserver,
            # stopped, turned it into a SIGINT queued for the program, which
            # would kill it once detached. Let it run until that SIGINT stops
            # it (the passes list above keeps it from being delivered).
            yield Exchange(bodies + (b"vCont;c",), resume=True)
        elif bodies:
            yield Exchange(bodies)
        for k in keys:
            self.s.bps.proxy_remove(k)
        self.s.proc = None
        if then is not None:
            self.s.forward(then[0], then[1])
        else:
            # The client is gone: leave the program as gdbserver would
            # (detach / kill is the stub's call when the link closes). The
            # program is stopped and the proxy's things are out: nothing for
            # the keeper (shell/keeper.py) to do - it took several seconds
            # over the client's breakpoints, which gdbserver's own detach of
            # a stopped program takes out.
            self.s.left = True
            self.s.emit(Close("client disconnected"))

    def exec_forgets_breakpoints(self, sr: StopReply) -> None:
        """gdbserver forgets every breakpoint of a process that calls exec (the int3s went
        with the old image), and gdb, knowing it, inserts again without removing. Kept here,
        the table answered gdb's `Z0` at the same address of the new image OK without a
        breakpoint: in all-stop (on_program_event) and in non-stop (nonstop.py; a thread's
        exec looped forever, gdb.threads/thread-execl.exp in non-stop mode)."""
        if sr.kind == "T" and sr.reason == "exec" and not self._stop_of_other_process(sr):
            self.s.bps.forget_all()

    def on_program_event(self, sr: StopReply, raw: bytes) -> bool:
        """A stop reply during the client's resume that concerns the program's
        life or the capture: exit, fork, exec, the capture's own interrupt, a
        stop the capture caused. True when handled (a procedure runs)."""
        if sr.kind in ("W", "X"):
            self.s.program_exited = True
            self.s.bps.forget_all()
            installed, self.s.capture_installed = self.s.capture_installed, False  # nothing is left in a process that is gone
            proc = self.s.capture_call("exited", sr) if installed and self.s.capture is not None else None
            if proc is not None:
                self.s.start_proc(self._proc_capture_exited(proc, sr, raw))
                return True
            self.s.report_stop(sr, raw)
            return True
        if sr.kind == "T" and sr.reason == "fork" and sr.thread is not None and self.s.hidden_forks:
            try:
                hidden: ThreadId | None = ThreadId.parse(sr.reason_value)
            except MalformedPacket:
                hidden = None
            if hidden is not None and hidden.pid:
                self.s.start_proc(self._proc_capture_stop(self._proc_hidden_fork(sr, hidden, hidden.pid)))
                return True
        if sr.kind == "T" and sr.reason == "fork" and sr.thread is not None and self.holds_program():
            try:
                child: ThreadId | None = ThreadId.parse(sr.reason_value)
            except MalformedPacket:
                child = None
            if child is not None:
                self.s.start_proc(self._proc_clean_fork_child(sr, raw, child))
                return True
        self.exec_forgets_breakpoints(sr)
        if sr.kind == "T" and sr.reason == "exec" and self.holds_program():
            # A new image: the probes went with the old one (the stub forgets
            # the process's breakpoints at exec). Stop capturing, say so.
            # The capture first collects what it recorded in the old image.
            proc = self.s.capture_call("exited", sr) if self.s.capture_installed and self.s.capture is not None else None
            self.s.bps.proxy.clear()
            self.s.bps.version += 1
            self.s.probes.clear()
            self._capture_keys = []
            self.s.capture_installed = False
            if self.s.capture is not None:
                try:
                    path: str | None = bytes.fromhex(sr.reason_value.decode()).decode(errors="replace")
                except ValueError:
                    path = None
                self.s.capture_call("exec_happened", path)
                self._fold_capture_counts()
                self._keep_residue()
            self.s.capture = None
            self.s.capture_notice = "the program called exec: capture stopped (its probes belonged to the old image)"
            self.s.emit(Notice(self.s.capture_notice))
            if proc is not None:
                self.s.start_proc(self._proc_capture_exited(proc, sr, raw))
                return True
        if self._capture_interrupt and sr.signal == SIGINT and not self.s.interrupt_forwarded and not self.s.closing:
            # Our own interrupt (a drain the capture asked for): hidden.
            self._capture_interrupt = False
            self.s.start_proc(self._proc_capture_stop(None))
            return True
        if self.s.capture is not None and sr.kind == "T":
            proc = self.s.capture_call("stop", sr)
            if proc is not None:
                self.s.start_proc(self._proc_capture_stop(proc))
                return True
        return False


def _program_arch(path: str | None) -> tuple[Arch | None, str | None]:
    """The CPU of the program at ``path`` (proxy/arch), and why poll capture cannot run on it
    (its code is not analysed), or None."""
    machine = machine_of(path) if path else None
    arch = for_machine(machine)
    if machine is None or (arch is not None and arch.code_analysis):
        return arch, None
    if arch is None:
        return None, f"hidden breakpoints and probes: x86-64 only so far; this program is {machine}"
    return arch, arch.unsupported("hidden breakpoints and probes")
