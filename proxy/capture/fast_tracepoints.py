"""Fast tracepoints: the part of the tracepoint capture that puts them in and takes them out.

Fast tracepoints (``--inproc``: the program runs with gdbserver's
in-process agent, libinproctrace, preloaded): `plan` also builds the
program with fast tracepoints where `fast_sites` finds a site (entries;
rets whose epilogue has an instruction of 5+ bytes), the rest traps. The
agent is not loaded at the first resume (the loader has not run), and
gdbserver refuses fast tracepoints until its client resolved the agent's
``gdb_agent_*`` symbols through ``qSymbol``: `client_request` watches the
client's ``qSymbol`` answers (gdb resolves them at the stop where the
loader reports the libraries, before ``main``), and at the client's next
resume `before_resume` drains the trap experiment and replaces it (``QTStop;
QTinit``; the definitions with ``:F<len>``; ``QTStart``). During that
``QTStart`` gdbserver asks ``qRelocInsn:FROM;TO`` once per fast tracepoint;
the session hands each to `relocate_request`, which answers with the ``M``
write of the moved instruction (`relocate`) and ``qRelocInsn:<len>``. If
``QTStart`` fails, the trap program goes back in and `stats` says why. A
position-independent program gets no fast tracepoints (`stats` says why:
the jump pads are below 2 GiB, out of a jump's reach).

A mixin of ``proxy.capture.tracepoints.TracepointCapture``: its state is that capture's
(``__init__`` there); the drains and restarts (``_sync``, ``_uninstall``, ``_live_lwps``) too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from proxy.capture.trace_program import Program, add_count_points, build_program
from proxy.procedure import Exchange, Procedure
from rsp.packets.memory import memory_bytes
from rsp.packets.trace import QTINIT, QTSTART, QTSTOP, build_qtbuffer_size

if TYPE_CHECKING:
    from proxy.capture.target import Target

FAST_ASSUMED_RATE = 150_000.0  # a fast tracepoint hit costs ~7-12 µs


class FastTracepoints:
    """``--inproc``: the switch from trap to fast tracepoints, the guards that switch back."""

    # set by TracepointCapture
    TRAP_RATE: float
    target: Any
    program: Program
    _fast_program: Program | None
    _trap_program: Program | None

    def _plan_fast(self, target: Target) -> Program | None:
        """The program with fast tracepoints, or None (`fast_note` says why)."""
        from proxy.analysis.elf import open_elf

        inv = target.inventory
        if inv is None or target.path is None:
            self.fast_note = "no program file"
            return None
        try:
            elf = open_elf(target.path)
        except Exception as err:  # noqa: BLE001 - said in stats
            self.fast_note = f"the program's file is unreadable ({err})"
            return None
        if elf.pie or target.bias:
            self.fast_note = ("the program is position-independent (PIE, loaded far above 4 GiB): the in-process "
                              "agent's jump pads are mapped below 2 GiB (MAP_32BIT), out of reach of the 5-byte "
                              "jmp rel32 a fast tracepoint writes; build with -C relocation-model=static (gcc -no-pie)")
            self.fast_state = "unavailable"
            return None
        self._code_reader = elf.read
        prog = build_program(inv, target.bias, self._wanted, entry_only=self.entry_only, fast_code=elf.read)
        if self.count_patterns:
            funcs = self._count_functions(target)
            sizes = {}
            for _name, addr, _rets in funcs:
                sym = elf.symbol_at(addr - target.bias)
                sizes[addr] = sym.size if sym is not None else 0
            add_count_points(prog, funcs, bias=target.bias, fast_code=elf.read, sizes=sizes)
        from proxy.analysis.exits import import_sites

        warnings: list[str] = []
        self._thread_sites = {a + target.bias for a in import_sites(elf, "pthread_create", warnings)[0]}
        if warnings:
            self.fast_note = f"where the program starts threads is unknown ({warnings[0]})"
            self.fast_state = "unavailable"
            return None
        if not prog.fast_points:
            self.fast_note = "no site of 5+ bytes: " + (prog.fallbacks[0] if prog.fallbacks else "none")
            self.fast_state = "unavailable"
            return None
        self.fast_state = "waiting for the in-process agent (the client's qSymbol lookup of gdb_agent_*)"
        return prog

    def _go_fast(self) -> Generator[Exchange, list[bytes], None]:
        """Replace the trap experiment by the fast one (the buffer was just
        drained): the tracepoints are redefined, so ``QTinit`` first."""
        fast = self._fast_program
        assert fast is not None
        self.relocations.clear()
        bodies = (QTSTOP, QTINIT, *fast.packets(), build_qtbuffer_size(self.buffer_size), QTSTART)
        replies = yield Exchange(bodies)
        self._read_off = 0
        self._armed = True
        if replies[-1] == b"OK":
            self._use(fast)
            self._rate = FAST_ASSUMED_RATE
            self.fast_state = "in use"
            self._tracing = True
            yield from self._place_guards()
            return
        # gdbserver undid every tracepoint of the failed QTStart: the traps go back in.
        refused = [r for r in self.relocations if "refused" in r]
        self.fast_note = f"QTStart with fast tracepoints failed ({replies[-1][:60]!r})" + (
            f": {refused[0]}" if refused else "")
        self.fast_state = "failed"
        trap = self._trap_program or self.program
        replies = yield Exchange((QTINIT, *trap.packets(), build_qtbuffer_size(self.buffer_size), QTSTART))
        self._use(trap)
        self._tracing = replies[-1] == b"OK"

    def _use(self, program: Program) -> None:
        self.program = program
        self._by_addr = program.by_addr()
        self._originals = None
        if self._converter is not None:
            self._converter.use(program)

    def _fast_switch_point(self) -> int | None:
        """The program's entry (AT_ENTRY): the loader has run the agent's
        constructor (it allocates the jump pads) and no program code has run.
        Not earlier: at the loader's library report, where gdb resolves the
        agent's symbols, the pads are not allocated yet (gdbserver asked to
        relocate into address 0xa7). Not at a hidden interrupt later: a
        thread stopped by it can hold a trap-tracepoint hit gdbserver has
        collected but not reported; with the int3 replaced by the jump,
        gdbserver 13.1 reports it again and again as a plain SIGTRAP just
        after the jump (seen with probe_count 4 threads)."""
        t = self.target
        if self._fast_program is None or t is None or t.inventory is None or not t.inventory.entry:
            return None
        return t.inventory.entry + t.bias

    def _pads_allocated(self) -> Generator[Exchange, list[bytes], bool]:
        """The agent's jump pads exist (its constructor has run)."""
        if not self._ipa_seen or self._pad_symbol is None:
            return False
        (rep,) = yield Exchange((b"m%x,8" % self._pad_symbol,))
        pad = memory_bytes(rep)
        return bool(pad and int.from_bytes(pad, "little"))

    def before_resume(self) -> Procedure | None:
        """A client that stops after the agent is ready (attached to a running
        program): switch at its stop, when the pads exist. A guard the
        client stopped at too: leave the fast tracepoints now."""
        if self._leave_due is not None and self._installed:
            kind = self._leave_due
            return self._leave_fast(kind, self._GUARD_WHY[kind])
        if not (self._ipa_seen and self._installed and self._fast_program is not None
                and self.fast_state.startswith("waiting") and self._entry_bp is None):
            return None
        return self._switch_fast()

    def _switch_fast(self, take_out: int | None = None) -> Procedure:
        if take_out is not None:
            yield Exchange((b"z0,%x,1" % take_out,))
            self._entry_bp = None
        if not self._ipa_seen or self._pad_symbol is None:
            self.fast_note = ("the client did not resolve the in-process agent's symbols (qSymbol): "
                              "gdbserver cannot use it")
            return
        if not (yield from self._pads_allocated()):
            self.fast_note = "the in-process agent's jump pads are not allocated (its constructor has not run)"
            return
        lwps = yield from self._live_lwps()
        if len(lwps) > 2:  # the program's thread and the agent's helper thread
            self.fast_note = (f"the program runs {len(lwps) - 1} threads: gdbserver 13.1 asserts with fast "
                              "tracepoints and several threads (lwp->suspended == 0)")
            self.fast_state = "unavailable"
            return
        self.fast_state = "switching"
        self._upgrade = True
        yield from self._sync()

    # ------------------------------------------- fast tracepoints' guards
    # gdbserver 13.1 asserts (``handle_tracepoints: Assertion
    # `lwp->suspended == 0'``) when, at a stop it reports in all-stop (a
    # client breakpoint, the proxy's hidden interrupt), one thread is inside
    # a jump pad and another has a SIGTRAP pending (a trap tracepoint's or a
    # breakpoint's hit collected while stopping all threads): the stop
    # stabilises the threads (linux-low.cc stabilize_threads: every thread
    # but the one in the pad is suspended, the pad's thread resumed to its
    # exit) and its wait loop takes the suspended thread's pending SIGTRAP
    # (status_pending_p_callback does not look at `suspended`). Seen with
    # probe_count 4 threads at the first hidden drain (gdbserver --debug:
    # "Got an event from pending child", "tracepoint_handler: tracepoint at
    # <ret> hit", then the assertion). With one program thread (plus the
    # agent's helper thread, which only waits in syscalls) nothing else can
    # have a SIGTRAP pending. So fast tracepoints are only kept while the
    # program has one thread: a hidden Z0 on pthread_create (its PLT stub)
    # puts the trap tracepoints back before a second thread exists.
    #
    # At the program's end, gdbserver 13.1 with its agent loaded dies on the
    # first trace packet after the exit (cmd_qtstatus uploads the agent's
    # frames from a process that is gone): the client never got its W.
    # A hidden Z0 on libc's _exit stops the experiment while the process lives
    # (research rule 8) and drains the agent's frames first.
    def _place_guards(self) -> Generator[Exchange, list[bytes], None]:
        sites = {a: "thread" for a in self._thread_sites}
        bias = self.target.bias if self.target is not None else 0
        for a in self._thread_sites:
            byte = self._code_reader(a - bias, 1) if self._code_reader is not None else None
            if byte:
                self._guard_bytes[a] = byte
        exit_at = yield from self._libc_exit()
        if exit_at is not None:
            sites[exit_at] = "exit"
        else:
            self.fast_left = ("libc's _exit not found: the frames from the last stop to the program's exit "
                              "will be lost (gdbserver 13.1 cannot be asked after the exit)")
        addrs = sorted(sites)
        if not addrs:
            return
        replies = yield Exchange(tuple(b"Z0,%x,1" % a for a in addrs))
        refused = None
        for a, r in zip(addrs, replies):
            if r == b"OK":
                self._guards[a] = sites[a]
            elif sites[a] == "thread":
                refused = f"the stub refused the proxy's breakpoint where the program starts threads ({a:#x}: {r[:20]!r})"
        if refused:
            yield from self._leave_fast("thread", refused)

    def held_breakpoints(self) -> tuple[bytes, ...]:
        # A guard at a client breakpoint's address is one breakpoint in
        # gdbserver: the client's `z` in the plan takes it out (the same packet).
        return tuple(b"z0,%x,1" % a for a in sorted(self._guards))

    def _libc_exit(self) -> Generator[Exchange, list[bytes], int | None]:
        """libc's ``_exit`` at run time (from gdbserver's library list), or None."""
        from proxy.analysis.elf import open_elf

        text = b""
        for _ in range(64):
            (rep,) = yield Exchange((b"qXfer:libraries-svr4:read::%x,fff" % len(text),))
            if rep[:1] not in (b"m", b"l"):
                return None
            text += rep[1:]
            if rep[:1] == b"l":
                break
        for m in re.finditer(rb'<library name="([^"]+)"[^>]*?l_addr="0x([0-9a-fA-F]+)"', text):
            path = m.group(1).decode(errors="replace")
            if not os.path.basename(path).startswith("libc.so"):
                continue
            try:
                elf = open_elf(path)
            except Exception:  # noqa: BLE001 - not readable here: no exit guard (said in stats)
                return None
            funcs = [sym for sym in elf.symbols_named("_exit") if sym.is_func]
            if not funcs:
                return None
            addr = int(m.group(2), 16) + funcs[0].addr
            byte = elf.read(funcs[0].addr, 1)
            if byte:
                self._guard_bytes[addr] = byte
            return addr
        return None

    def _leave_fast(self, kind: str, why: str) -> Procedure:
        """Take the guards out; at a thread start put the trap tracepoints
        back (drained first: exact counts), at the exit stop the experiment."""
        # The exit guard stays after a thread start: with the agent loaded any
        # trace packet after the exit kills gdbserver, trap tracepoints or not.
        gone = [a for a, k in self._guards.items() if k == kind or kind == "exit"]
        mine = [a for a in gone if a not in self._client_bps]
        for a in gone:
            del self._guards[a]
        self._leave_due = None
        if mine:
            yield Exchange(tuple(b"z0,%x,1" % a for a in mine))
        if kind == "exit":
            self.exit_guard = why
            yield from self._uninstall()
            return
        self.fast_left = why
        yield from self._sync(restart=False)
        trap = self._trap_program or self.program
        replies = yield Exchange((QTSTOP, QTINIT, *trap.packets(), build_qtbuffer_size(self.buffer_size), QTSTART))
        self._read_off = 0
        self._armed = True
        self._use(trap)
        self._rate = self.TRAP_RATE
        self._tracing = replies[-1] == b"OK"
        self.fast_state = "replaced by trap tracepoints"

    _GUARD_WHY = {
        "thread": ("the program starts a second thread (pthread_create): gdbserver 13.1 asserts "
                   "(lwp->suspended == 0) when a reported stop finds one thread in a jump pad and another "
                   "with a trap pending"),
        "exit": "the program ends (_exit): the experiment was stopped while the process lived",
    }

    @property
    def _pad_returns(self) -> set[int]:
        return {p.addr + (p.tracepoint.fast or 0) for p in self.program.points if p.tracepoint.fast}


    def relocate_request(self, body: bytes) -> tuple[tuple[bytes, ...], bytes]:
        """gdbserver's ``qRelocInsn:FROM;TO`` in the middle of ``QTStart``:
        the writes that put the moved instruction at TO (each answered
        ``OK`` by gdbserver), then the answer (no reply follows it)."""
        from proxy.capture.relocate import answer

        try:
            frm_text, _, to_text = body[len(b"qRelocInsn:"):].partition(b";")
            frm, to = int(frm_text, 16), int(to_text, 16)
        except ValueError:
            self.relocations.append(f"refused a malformed {body[:40]!r}")
            return (), b"E01"
        if to < 0x10000:
            self.relocations.append(f"refused {frm:#x}: jump pad at {to:#x} (the agent has not allocated its pads)")
            return (), b"E01"
        bias = self.target.bias if self.target is not None else 0
        code = self._code_reader(frm - bias, 16) if self._code_reader is not None else None
        res = answer(code, frm, to) if code else f"no code bytes at {frm:#x}"
        if isinstance(res, str):
            self.relocations.append(f"refused {frm:#x}: {res}")
            return (), b"E01"
        out, n = res
        self.relocations.append(f"{frm:#x} -> {to:#x} ({n} bytes)")
        return (b"M%x,%x:%b" % (to, n, out.hex().encode()),), b"qRelocInsn:%x" % n
