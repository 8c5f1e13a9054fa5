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

Where things are: this module routes packets (client requests, stub
replies, stop replies) and reports stops; `state.py` holds the state and the
procedure runner; `hidden.py` handles hidden stops; `lifecycle.py` the
capture's life in the program (plant, install, switch, drains, fork, exec,
exit, leave); `queries.py` what the proxy answers itself (monitor, qXfer,
stats); `wire.py` the small packet helpers.

The fast lane: most of what a debugger sends between two resumes is reads
(`m`, `g`, `p`, `Hg`, the thread list), and at a quiet moment (all-stop, nothing in flight or
queued, no procedure, no lingering breakpoint, no residue, no symbol look-up,
task threads not shown, the capture passing that read: `lane_reads`) none of
the usual path's steps changes them. `lane_client` then answers what is known
at this stop or has the shell forward the packet's bytes as they came, and
`lane_stub` has it pass the reply back the same way: no events, no actions,
no framing (proxy/shell/link.py). Anything else, or any doubt, returns None
or False before changing anything, and the usual path takes the packet.
"""

from __future__ import annotations

from operator import attrgetter

from rsp.errors import MalformedPacket
from rsp.framing import checksum, frame, is_hex, rle_expand
from rsp.packets.breakpoints import parse_breakpoint
from rsp.packets.qsupported import (
    Feature,
    build_qsupported_reply,
    build_qsupported_request,
    parse_qsupported_reply,
    parse_qsupported_request,
)
from rsp.packets.requests import Kind, kind_of
from rsp.packets.resume import Resume, parse_resume
from rsp.packets.stop import StopReply, is_stop_reply, parse_stop_reply
from rsp.threads import ThreadId

from proxy.procedure import Exchange, Forward, Handover, Procedure, Reply

from .actions import Close, Notice, SetNoAck, ToClient, ToClientRaw, ToStub, ToStubRaw
from .breakpoints import COMMANDS_LOST, BpKey
from .hidden import HiddenStops
from .known import keeps_stop
from .queries import PROXY_QXFER_OBJECTS
from .shield import ERROR_REPLY, refuse
from .state import SessionBase, SessionConfig, Stopped, Waiter, next_stop_serial
from .stepping import AsyncStepping
from .taskthreads import TaskThreads
from .wire import (
    SIGINT,
    SIGTRAP,
    feature_on,
    is_console_output,
    is_trap_reason,
    strip_xml_registers,
    unframe,
    without_signals,
)

def _checksum_ok(raw: bytes) -> bool:
    """A whole ``$body#cs`` frame whose two digits are its checksum."""
    return (len(raw) >= 4 and raw[-3:-2] == b"#" and is_hex(raw[-2:])
            and int(raw[-2:], 16) == checksum(raw[1:-3]))


# The reads the fast lane takes (Session.lane_client), by their first byte; of the `q`
# packets only the thread list (task threads, which answer it, close the lane).
_LANE_HEADS = frozenset(b"mgpHq")
_LANE_QUESTION = b"qXfer:threads:read:"


# Features the client must not see (rule 5). None now: target-side conditions and commands
# pass, and breakpoints.py keeps them out of the stub where the proxy has a breakpoint.
_HIDDEN_FROM_CLIENT: tuple[str, ...] = ()



# The client's requests the session routes itself: one table keyed by the request's kind
# (rsp.packets.requests, which names a packet's kind once, at the edge, building nothing), as
# rr's dispatch_debugger_request and gdbstub's command table. A row: the kind and its routes,
# tried in order; a route that returns False passes it on (a side effect only, or not its
# case after all: non-stop's routes in all-stop). A request no route takes is forwarded as
# it came. What comes before the table, at the edge: the shield, the capture's and its
# residues' verdicts, task threads and the answers known at this stop; reads of memory and
# registers (Kind.READ) have no row: forwarded as they are once those have seen them.
_CLIENT_ROUTES: dict[Kind, tuple[str, ...]] = {
    Kind.QSUPPORTED: ("_client_qsupported",),
    Kind.NON_STOP: ("ns.client_nonstop",),
    Kind.STOP_QUERY: ("_route_ns_query",),  # non-stop only
    Kind.VSTOPPED: ("_route_ns_query",),  # non-stop only
    Kind.RESUME: ("_route_ns_resume", "_route_resume"),  # non-stop's first
    Kind.EXTENDED: ("_route_extended",),
    Kind.NO_ACK: ("_route_no_ack",),
    Kind.BREAKPOINT: ("_client_breakpoint",),
    Kind.SELECT_G: ("_route_hg",),
    Kind.VCONT_QUERY: ("_route_vcont_query",),
    Kind.MONITOR: ("queries.client_monitor",),
    Kind.QXFER: ("queries.client_qxfer",),
    Kind.LEAVE: ("_client_leave",),
    Kind.NEW_PROCESS: ("lifecycle.client_new_process",),
    Kind.WRITE: ("_route_write",),
}


class Session(SessionBase):
    """One client <-> stub session (see the module docstring)."""

    def __init__(self, config: SessionConfig) -> None:
        super().__init__(config)
        self.hidden = HiddenStops(self)  # stops at the proxy's breakpoints (hidden.py)
        self.stepping = AsyncStepping()  # steps that follow a coroutine across .await (stepping.py)
        self.task_threads = TaskThreads(self)  # tasks as threads (taskthreads.py)
        # a route is a method of the session or of a part it holds ("queries.client_monitor")
        self._routes = {kind: tuple(attrgetter(name)(self) for name in names) for kind, names in _CLIENT_ROUTES.items()}

    # ---- what the shell asks of the session, answered by the capture's lifecycle --------------

    def tick(self, now: float) -> None:
        """Called by the shell every few tens of ms (lifecycle.tick)."""
        self.lifecycle.tick(now)

    def leave_plan(self) -> dict[str, object]:
        """What must leave the program if the proxy dies without leaving (lifecycle.leave_plan)."""
        return self.lifecycle.leave_plan()

    def leave_plan_key(self) -> tuple[object, ...]:
        return self.lifecycle.leave_plan_key()

    def request_switch(self, capture: str | None = None, mode: str | None = None) -> None:
        """`monitor async capture`/`mode` change the backend at the next stop (lifecycle)."""
        self.lifecycle.request_switch(capture, mode)

    def client_packet(self, body: bytes, raw: bytes) -> None:
        self.stats.client_packets += 1
        if raw is not None and not _checksum_ok(raw):
            # In no-ack mode the reader takes any checksum (gdb does not check them
            # either); gdbserver does, and a non-hex one kills it ("Invalid hex
            # digit 35"): such a frame goes out framed anew, never verbatim.
            raw = None  # type: ignore[assignment]
        if self.proc is not None or self._waiters_for_client():
            self._client_queue.append(body)
            return
        self.dispatch_client(body, raw)

    # -- the fast lane (the module docstring) ---------------------------------------------------

    def lane_client(self, body: bytes, raw: bytes) -> bytes | bool | None:
        """The client's packet `body` (framed as `raw`) on the fast lane: the answer known at
        this stop (bytes, for the shell to frame), True when `raw` goes to the stub as it came
        (its reply comes back through `lane_stub`), None when the usual path must take it
        (nothing changed then)."""
        if not body or body[0] not in _LANE_HEADS or not self._quiet():
            return None
        cap = self.capture
        forwards = cap is None or body[0] in cap.lane_reads  # else its reply takes the usual path
        if not forwards and body[0] not in cap.lane_answers:  # type: ignore[union-attr]
            return None
        head = body[:1]
        if head == b"g" and (body != b"g" or self._g_size is None):
            return None  # the usual path learns the stub's register block from the first reply
        if head == b"p" and self.known.p_supported is None:
            return None  # the usual path learns whether the stub has `p`
        if head == b"q" and not body.startswith(_LANE_QUESTION):
            return None
        if refuse(body, g_size=self._g_size, packet_size=self.packet_size) is not None:
            return None  # the usual path answers E01 and counts it
        known = self.known.answer(body) if self.known.enabled else None
        if known is None and (head == b"H" or not _checksum_ok(raw)):
            return None  # a selection the stub must make; a frame to send framed anew
        self.stats.client_packets += 1
        if known is not None:
            return known
        self.known.forwarding(body)
        self.known.sent(body)
        # a reply the capture rewrites comes back by the usual path (its request kept for it)
        keep = body if cap is not None and cap.filters_replies else None
        self.waiters.append(Waiter("client", request=keep, lane=forwards))
        return True

    def lane_stub(self, body: bytes) -> bool:
        """The stub's packet `body` on the fast lane: True when it is the reply to the read
        `lane_client` had forwarded and goes to the client as it came; False: the usual path."""
        w = self.waiters
        if len(w) != 1 or not w[0].lane or self.closing or self._actions or self._client_queue:
            return False
        w.popleft()
        self.stats.stub_packets += 1
        known = self.known
        if known.asked is not None or known.p_asked:  # a reply kept for the stop's repeats
            if b"*" in body:  # gdbserver run-length encodes replies; a kept one is framed anew
                try:
                    body = rle_expand(body)
                except MalformedPacket:
                    pass  # a broken run: the body as it came (its reader judges it)
            known.replied(body)
        return True

    def _quiet(self) -> bool:
        """Nothing under way that a client packet must wait for, be seen by or change."""
        return (self.proc is None and not self.waiters and not self._client_queue and not self._actions
                and self.pacer.no_ack and not self.closing and not self.non_stop and not self.bps.lingering and not self.residues
                and self.symbol_lookup is None and not self.task_threads.shown)

    def client_interrupt(self) -> None:
        if self.non_stop:
            self.emit(ToStubRaw(b"\x03"))  # gdb interrupts with vCont;t here; pass anything else on
            return
        if self.proc is not None and self.stepping.alone and not self.interrupt_forwarded:
            # A thread runs a call to its return for the step follower (stepping.py),
            # which may take long: the program is running, the stub takes the 0x03.
            self.interrupt_forwarded = True
            self.emit(ToStubRaw(b"\x03"))
            return
        if self.proc is not None and not self.preparing:
            # Rule 8: the hidden stop in progress ends in a SIGINT stop.
            self.interrupt_pending = True
            self.stats.interrupts_during_hidden += 1
            return
        if self.running and not self.interrupt_forwarded:
            self.interrupt_forwarded = True
            self.emit(ToStubRaw(b"\x03"))
        elif not self.running:
            # gdb sends its Ctrl-C even between a stop and the resume that
            # follows (a shared-library event it handles by itself), and
            # expects the next resume to stop at once (reconnect-ctrl-c.exp):
            # dropping it lost the stop. Not forwarded now: gdbserver turns a
            # 0x03 while stopped into a real SIGINT (a kill of the process
            # group) that waits in the kernel, and a detach then delivers it
            # - the program died without a word after a detach that answered
            # OK (fuzz-client seeds 200 and 300). Sent once the next continue
            # runs the program instead (state.forward); a detach drops it.
            self.interrupt_at_resume = True

    def stub_packet(self, body: bytes, raw: bytes) -> None:
        self.stats.stub_packets += 1
        if self._copied_stop(body) or self._copied_reply(body):
            return
        if not self.waiters:
            if self._stray_stop(None, body):
                return
            # Unsolicited: console output or a stray reply; the client sorts it out.
            self.emit(ToClientRaw(raw))
            return
        waiter = self.waiters[0]
        if waiter.resume and is_console_output(body):
            if self.running:
                self.emit(ToClientRaw(raw))
            return
        if b"*" in body:  # gdbserver run-length encodes replies (rule 7)
            try:
                body = rle_expand(body)
            except MalformedPacket:
                pass  # a broken run: the body as it came (its reader judges it)
        if self._stray_stop(waiter, body):
            return
        if waiter.kind == "proc" and body.startswith(b"qRelocInsn:"):
            self._stub_answered()  # it waits for the proxy's writes now
            self._relocation_request(body)  # not the reply: the stub asks, then replies
            return
        self.waiters.popleft()
        self._stub_answered()
        if waiter.kind == "reloc":
            if body != b"OK":
                self._reloc_failed = True
                self.emit(Notice(f"the stub refused a relocated instruction's write: {body[:40]!r}"))
            if waiter.request is not None:  # the last write: now the answer
                self.emit(ToStub(b"E01" if self._reloc_failed else waiter.request))
        elif waiter.kind == "drop":
            if body != b"OK":
                self.emit(Notice(f"the stub refused to re-insert a probe: {body[:40]!r}"))
        elif waiter.kind == "write":
            if body != b"OK" and self.emulate:
                # The thread stays at the breakpoint and traps again; from now
                # on every hit takes the step-over path.
                self.emulate = False
                self.emit(Notice(f"the stub refused an emulated instruction's write ({body[:40]!r}); "
                                  "stepping over probes from now on"))
        elif waiter.kind == "proc":
            self._proc_replies.append(body)
            if len(self._proc_replies) == self._proc_expect:
                replies, self._proc_replies = self._proc_replies, []
                self._step_proc(replies)
        elif waiter.kind == "client-resume":
            self.on_stop_reply(body, raw)
        elif waiter.kind == "client-vcont":
            # `vCont;c;C;s;S;r`: the actions the stub takes (`r`: range steps)
            self.stub_vcont_ops = frozenset(body[6:].split(b";")) if body.startswith(b"vCont;") else frozenset()
            self._on_client_reply(body, raw)
        elif waiter.kind == "client-hg":
            if body == b"OK":
                self.client_g_thread = self.stub_g = waiter.request
                self.known.selected_ok(waiter.request)
            self._on_client_reply(body, raw)
        else:
            if waiter.request is not None and self.capture is not None:
                new = self.capture_call("client_reply", waiter.request, body)
                if isinstance(new, bytes) and new != body:
                    body, raw = new, frame(new)
            self._on_client_reply(body, raw)
        self._drain_client_queue()

    def _relocation_request(self, body: bytes) -> None:
        """gdbserver's ``qRelocInsn:FROM;TO`` while it handles the proxy's
        ``QTStart`` with fast tracepoints: it waits for its client to write
        the moved instruction (``M``, answered ``OK``; gdbserver serves only
        m/M/X meanwhile) and answer ``qRelocInsn:<len>``, which gets no
        reply; then the QTStart reply (or the next request) comes. The
        capture writes the instruction; the writes' replies come first, so
        their waiters go in front of the procedure's. No other packet may
        reach the stub meanwhile: QTStart ends its exchange, and client
        packets wait while a procedure runs."""
        res = self.capture_call("relocate_request", body) if self.capture is not None else None
        writes, answer = res if res else ((), b"E01")
        if not writes:
            self.emit(ToStub(answer))
            return
        # The answer goes only after every write was acknowledged: a refused
        # write answers E01 (gdbserver then fails its QTStart, undoing it),
        # never a length for bytes that are not there.
        self._reloc_failed = False
        for i in reversed(range(len(writes))):
            self.waiters.appendleft(Waiter("reloc", request=answer if i == len(writes) - 1 else None))
        for w in writes:
            self.emit(ToStub(w))

    def client_closed(self, keep_stub: bool = False) -> None:
        """The client hung up: take the proxy's breakpoints out, then go.

        `keep_stub`: the stub keeps the program for another client (gdbserver
        without --once), so the proxy does as it does: the program stays as it
        is, probes and capture included, for the next client
        (`client_reconnected`). A running program is stopped first (the proxy
        cannot watch it without a client), as a hidden stop in progress is."""
        # After a detach or kill, or once the program exited, gdbserver without
        # --once quits when the client goes, unless in extended mode (`!`).
        keep_stub = keep_stub and (self._extended or not (self.left or self.program_exited))
        # In non-stop mode the threads run on with nobody to hear their stops:
        # the proxy takes its probes out and ends, as with --once.
        keep_stub = keep_stub and not self.non_stop
        if self.bps.lingering and self.proc is None and not self.running:
            # the client's removed breakpoints leave the stub first (breakpoints.py)
            self._client_queue.clear()
            self.start_proc(self._proc_then_closed(keep_stub))
            return
        self.closing = True
        self.keep_stub = keep_stub
        self._client_queue.clear()
        if keep_stub:
            if self.proc is not None:
                return  # the procedure ends in a stop (report_stop)
            if self.running:
                if not self.interrupt_forwarded:
                    self.interrupt_forwarded = True
                    self.interrupt_program()
                    self.interrupted_for_leave = True
                return
            self.emit(Close("client disconnected", keep_stub=True))
            return
        # A SIGINT that crossed a stop waits for the stub's detach at the
        # link's close: consumed first (_proc_leave), probes or not.
        if self.program_exited or not (self.lifecycle.holds_program() or (not self.running and self.lifecycle.sigint_waiting())):
            self.emit(Close("client disconnected"))
            return
        if self.proc is not None:
            # A hidden stop is being handled: the program is stopped, and a
            # 0x03 now would make gdbserver queue a real SIGINT for it. The
            # procedure sees closing and ends in a stop instead of a resume.
            return
        if self.running:
            if not self.interrupt_forwarded:
                self.interrupt_forwarded = True
                self.interrupt_program()
                self.interrupted_for_leave = True
            return  # the stop reply arrives, then we clean up (see on_stop_reply)
        if self.proc is None:
            self.start_proc(self.lifecycle.proc_leave())

    @property
    def lingering(self) -> bool:
        """The stub holds breakpoints the client removed (breakpoints.py)."""
        return bool(self.bps.lingering)

    def client_idle(self) -> bool:
        """The shell: the client has said nothing for a while at a stop. Its removed breakpoints
        leave the stub now (True: started), as the client believes them gone. A remove kept for
        the next resume met whatever happened to the program meanwhile: killed from outside,
        gdbserver 13.1 answered that remove E01 and then failed an assertion at the resume
        (linux-low.cc:3977, resume_one_lwp_throw; gdb.threads/killed-outside.exp), where gdb
        straight had removed it while the program lived."""
        if (not self.bps.lingering or self.proc is not None or self.waiters or self._client_queue
                or self.running or self.closing):
            return False
        self.start_proc(self._proc_idle())  # `start_proc` takes the lingering ones out first
        return True

    def _proc_idle(self) -> Procedure:
        self.proc = None
        if self.closing:
            # The client hung up while its removes went out: `client_closed` waited for this
            # procedure (as for one that ends in a stop); it goes on now. Seen: gdb's
            # `disconnect` right after a stop, the program kept for the next client.
            self.closing = False
            self.client_closed(self.keep_stub)
        return
        yield  # a procedure that asks nothing itself

    def _proc_then_closed(self, keep_stub: bool) -> Procedure:
        self.proc = None
        self.client_closed(keep_stub)
        return
        yield  # a procedure that asks nothing itself (`start_proc` takes the breakpoints out)

    def client_reconnected(self) -> None:
        """The next client of a kept stub (client_closed): it starts afresh
        (qSupported, `?`, its own no-ack mode); the program, the probes and
        the capture are as the last client left them."""
        self.closing = self.keep_stub = self.left = False
        self._qsymbol_asked, self.symbol_lookup = False, None  # the leave ended the stub's look-up
        self._client_queue.clear()
        self.ns.client_gone()
        self.client_features = []
        self.client_g_thread = None
        self.resume = None
        self.interrupt_forwarded = self.interrupt_pending = self.interrupt_at_resume = False
        self.interrupted_for_leave = False
        self.stats.reconnects += 1

    def stub_closed(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:  # nothing can answer it now (a question waiting for a read unwinds)
            proc.close()
        self.emit(Notice("the stub closed the connection"))
        self.emit(Close("stub disconnected"))

    def dispatch_client(self, body: bytes, raw: bytes | None, *, handed_over: bool = False) -> None:
        if self.closing:
            return
        if self.bps.lingering and (not keeps_stop(body) or self._selects_anew(body)):
            # anything but a read: the client's removed breakpoints leave the stub first; a
            # new selection too: gdbserver removes a breakpoint from the selected thread's
            # process (gdb's `detach-on-fork off` selects the fork child, then takes its own out)
            self.start_proc(self._proc_dispatch(body, raw))
            return
        if not handed_over and self._shielded(body):
            return None
        if body.startswith(b"qSymbol:") and len(self.client_symbols) < 256:
            value, _, name = body[8:].rpartition(b":")
            if value:
                self.client_symbols[name] = body
        if self.capture is not None and not handed_over:
            verdict = self.capture_call("client_request", body)
            if isinstance(verdict, Reply):
                return self.reply(verdict.body)
            if isinstance(verdict, Forward):
                body, raw = verdict.body, None
            elif isinstance(verdict, Handover):
                self.emit(Notice(f"capture: {verdict.reason}; switching to breakpoints"))
                self.start_proc(self.lifecycle.proc_switch("breakpoints", None, then=body))
                return None
        if self.residues and not handed_over:
            for residue in self.residues:
                verdict = residue.client_request(body)
                if isinstance(verdict, Reply):
                    return self.reply(verdict.body)
            self.residues = [r for r in self.residues if not r.done]
        if self.task_threads.request(body):  # tasks as threads (proxy.threads): answered here
            return None
        if self.known.enabled and not self.non_stop:
            known = self.known.answer(body)  # what the stub would answer at this stop (known.py)
            if known is not None:
                return self.reply(known)
        # Reads (most of what gdb sends while it steps and looks) and packets no row names: no route.
        try:
            for route in self._routes.get(kind_of(body), ()):  # type: ignore[arg-type]
                if route(body, raw) is not False:
                    return None
        except MalformedPacket as err:
            self.emit(Notice(f"malformed packet from the client: {err}"))
        self.forward(body, raw)
        return None

    # -- routes of _CLIENT_ROUTES that may pass a request down (False) -------------------------

    def current_thread(self) -> int | None:
        """The thread the client stopped in: the last stop's (gdb switches to it), else its Hg.
        Not its last Hg once there is a stop: gdb sends Hg for every thread whose registers
        it fetches (after a late attach it ends at another thread than the one it shows), and
        none when it switches to a thread whose registers it has (tokio's tinydb attached:
        `monitor async bt` described thread 2143, gdb's current thread was 2141)."""
        st = self.stopped
        if st is not None and st.thread is not None and st.thread.tid > 0:
            return st.thread.tid
        if self.client_g_thread:
            try:
                tid = ThreadId.parse(self.client_g_thread).tid
            except MalformedPacket:
                tid = 0
            if tid > 0:  # 0 (any) and -1 (all) name no thread
                return tid
        return None

    def stop_pcs(self) -> dict[int, int]:
        st = self.stopped
        if st is None or st.thread is None or st.pc is None:
            return {}
        return {st.thread.tid: st.pc}

    def _route_ns_query(self, body: bytes, raw: bytes | None) -> bool | None:
        if not self.non_stop:
            return False
        return self.ns.client_vstopped() if body == b"vStopped" else self.ns.client_status()

    def _route_ns_resume(self, body: bytes, raw: bytes | None) -> bool | None:
        resume = parse_resume(body) if self.non_stop else None
        return False if resume is None else self.ns.client_resume(resume, body, raw)

    def stub_notification(self, body: bytes, raw: bytes) -> None:
        """A notification from the stub (`%Stop` in non-stop mode: nonstop.py)."""
        self.ns.notification(body, raw)

    def _route_extended(self, body: bytes, raw: bytes | None) -> bool:
        self._extended = True
        return False  # and forwarded

    def _route_no_ack(self, body: bytes, raw: bytes | None) -> None:
        # Each side of the proxy negotiates no-ack on its own.
        self.reply(b"OK")
        self.emit(SetNoAck("client"))

    def _route_hg(self, body: bytes, raw: bytes | None) -> None:
        # The selection is the client's only once the stub takes it:
        # gdbserver answers E01 for a thread it does not know and keeps
        # the old one. Taken at once, a refused `Hgp8a72ff.73a9` made
        # the next Z0 look like one for a fork child (forwarded, not
        # recorded) and the z0 after `Hg0` one the client never set
        # (answered OK unforwarded): an int3 left behind (fuzz seed 201).
        self.waiters.append(Waiter("client-hg", request=body[2:]))
        self.emit(ToStubRaw(raw) if raw is not None else ToStub(body))

    def _route_vcont_query(self, body: bytes, raw: bytes | None) -> None:
        self.waiters.append(Waiter("client-vcont"))
        self.emit(ToStubRaw(raw) if raw is not None else ToStub(body))

    def _route_write(self, body: bytes, raw: bytes | None) -> bool:
        if self.stopped is not None:
            if body[:1] in (b"G", b"P"):
                self.stopped.pc = None  # the client may have moved the pc
            self.stopped.serial = next_stop_serial()  # the stop's snapshot is stale: build again
        return False  # and forwarded, or a resume (none starts with these)

    def _route_resume(self, body: bytes, raw: bytes | None) -> bool | None:
        resume = parse_resume(body)
        return False if resume is None else self.client_resume(resume, body, raw)

    def _client_qsupported(self, body: bytes, raw: bytes | None = None) -> None:
        feats = parse_qsupported_request(body)
        self.client_features = feats
        self.start_proc(self._proc_qsupported(feats))

    def _proc_qsupported(self, client: list[Feature]) -> Procedure:
        if self.config.classify_stub is not None and self.config.registers_safe:
            # Only gdbserver < 14 needs xmlRegisters left out (rule 11); QEMU
            # then sends a g block longer than its description. A qSupported
            # of our own first (its reply never reaches the client) tells which
            # stub this is, and a gdbserver >= 14 by its QThreadOptions= (regsafety);
            # gdbserver re-decides its register mode at every qSupported, so
            # this one leaves nothing behind - but for multiprocess+: gdbserver
            # turns that on at the qSupported that names it and off only at a
            # new connection, and a client without it (gdb's
            # multiprocess-feature-packet off) then got `W0;process:PID` and
            # ended in an internal error. It goes only to a client that asks.
            ask = self.config.stub_probe
            if not feature_on(client, "multiprocess"):
                ask = ask.replace(b"multiprocess+;", b"").replace(b";multiprocess+", b"")
            (probe,) = yield Exchange((ask,))
            safe, notice = self.config.classify_stub(probe)
            self.config.registers_safe = safe
            self.register_notice = notice
            self.emit(Notice(notice.removeprefix("asyncrsp: ")))
        upstream = [f for f in client if f.name != "swbreak"]
        upstream.append(Feature("swbreak", "+"))  # rule 5: pc at the breakpoint, with a reason
        self.hidden_forks = not feature_on(client, "fork-events") and feature_on(client, "multiprocess")
        if self.hidden_forks:
            # A client that does not follow forks (gdb with `set remote
            # fork-event-feature-packet off`, a raw client): gdbserver would let
            # the child go with the proxy's int3s in its copy of the code, and it
            # died of SIGTRAP at the first one (forker: "child=133"). Ask for the
            # reports ourselves; a fork is then handled hidden (the child cleaned
            # and detached, the client's resume re-issued: lifecycle.py).
            upstream.append(Feature("fork-events", "+"))
        if self.config.registers_safe:
            upstream = strip_xml_registers(upstream)  # rule 11
        (reply,) = yield Exchange((build_qsupported_request(upstream),))
        feats = parse_qsupported_reply(reply)
        self.stub_features = feats
        self.packet_size = self._stub_packet_size()
        # gdbserver's own feature: its rules are the ones known.py answers by
        self.known.enabled = feature_on(feats, "QStartupWithShell")
        self.read_limit.set_packet_size(self.packet_size)
        # Emulation writes gdb's amd64 `g` block back with `G`: only for
        # gdbserver asked without xmlRegisters (its layout is known and the
        # write touches no AVX-512 state, rule 11). QStartupWithShell is
        # gdbserver's own feature.
        self.emulate = (self.config.registers_safe and self.config.emulate and self.arch.emulates
                         and feature_on(feats, "QStartupWithShell"))
        no_ack = False
        if feature_on(feats, "QStartNoAckMode"):
            (ok,) = yield Exchange((b"QStartNoAckMode",))
            no_ack = ok == b"OK"
            if no_ack:
                self.emit(SetNoAck("stub"))
        self._actions.extend(self.pacer.stub_acks(not no_ack))  # pacing.py: QEMU's stub acks
        shown = [f for f in feats if f.name not in _HIDDEN_FROM_CLIENT]
        for obj in PROXY_QXFER_OBJECTS:
            shown.append(Feature(f"qXfer:{obj}:read", "+"))
        if not feature_on(shown, "qXfer:osdata:read"):
            shown.append(Feature("qXfer:osdata:read", "+"))
        self.reply(build_qsupported_reply(shown))

    def _client_breakpoint(self, body: bytes, raw: bytes | None) -> None:
        if self.lifecycle.client_selects_other_process():
            # gdb taking its breakpoints out of a fork child (Hg child; z0):
            # that process is not the program, its table is not ours.
            return self.forward(body, raw)
        bp = parse_breakpoint(body)
        key: BpKey = (bp.type, bp.addr, bp.kind)
        if key in self.bps.lingering and bp.insert and self.bps.back_in(key, bp.conditions):
            self.known.stats.breakpoints += 1
            return self.reply(b"OK")  # it never left the stub
        if any(k[1] == bp.addr for k in self.bps.lingering):
            # another packet at a lingering breakpoint's address (gdbserver keeps one
            # breakpoint an address): the lingering ones out first, then as asked
            return self.start_proc(self._proc_dispatch(body, raw, handed_over=True))
        if self._may_linger(bp.insert, key):
            self.bps.linger(key)
            return self.reply(b"OK")
        if bp.insert:
            if self.bps.client_insert(key, bp.conditions):
                if bp.conditions and self.bps.strip_conditions(key):
                    if self.bps.commands_lost(key):
                        self.emit(Notice(COMMANDS_LOST % bp.addr))
                    return self.forward(body.split(b";", 1)[0], None)
                self.forward(body, raw)
            else:
                self.reply(b"OK")
        else:
            if self.bps.client_remove(key):
                self.forward(body, raw)
            else:
                self.reply(b"OK")

    def _selects_anew(self, body: bytes) -> bool:
        """An `Hg` that may select another thread than the stub has (not known to be the same)."""
        return body[:2] == b"Hg" and (self.known.selected is None or body[2:] != self.known.selected)

    def _may_linger(self, insert: bool, key: BpKey) -> bool:
        """May the client's remove of a software breakpoint wait in the stub (breakpoints.py)?
        gdbserver in all-stop, the program stopped, the client's own breakpoint."""
        return (not insert and key[0] == 0 and key in self.bps.client and key not in self.bps.proxy
                and self.known.enabled and not self.non_stop and not self.running and self.proc is None
                and self.stopped is not None)

    def _client_leave(self, body: bytes, raw: bytes | None) -> None:
        """Rule 9: detach/kill: remove every proxy breakpoint first."""
        if self.lifecycle.other_process(body):
            # gdb detaching (or killing) a fork child it does not follow:
            # the program itself stays, and so do the probes.
            if self.capture is not None and self.capture_installed and body[:1] == b"D":
                self.start_proc(self.lifecycle.proc_detach_child(body))
                return None
            return self.forward(body, raw)
        self.left = True
        if (self.lifecycle.holds_program() or self.lifecycle.sigint_waiting()) and not self.program_exited:
            self.start_proc(self.lifecycle.proc_leave(then=(body, raw)))
        else:
            self.forward(body, raw)

    def client_resume(self, resume: Resume, body: bytes, raw: bytes | None) -> None:
        if self.stepping.task_step(self, resume):
            return  # a task thread's step: its task's next poll (stepping.py)
        verdict, new = self.task_threads.resume(resume)  # no task thread ever reaches the stub
        if verdict == "refuse":
            return self.reply(new)
        if verdict == "forward":
            resume, body, raw = parse_resume(new) or resume, new, None
        if self.stepping.wants(self, resume):
            self.start_proc(self.stepping.proc_note(self, resume, body, raw))
            return
        if resume is not self._resume_checked:
            named = self._named_threads(resume)
            if named is not None:
                self.start_proc(self._proc_named_then_resume(resume, body, raw, named))
                return
        self.interrupt_forwarded = False
        # A Ctrl-C that came while the program was stopped waits for a resume
        # that runs the program. gdb's own step over its breakpoint (at a
        # shared-library event it handles by itself: z0, vCont;s, Z0, vCont;c)
        # comes first: the Ctrl-C goes with the continue after it. Taken by
        # the step, it was dropped there, and the program ran on without the
        # stop the client waited for (reconnect-ctrl-c.exp under load, when
        # the Ctrl-C fell into that window).
        carry = self.interrupt_at_resume and not resume.is_step
        self.interrupt_pending = carry
        if carry:
            self.interrupt_at_resume = False
        if not self.planted and (self.config.resolve_probes is not None or self.capture is not None
                                  or self.config.make_capture is not None):
            self.start_proc(self.lifecycle.proc_plant_then_resume(resume, body, raw))
            return
        if self.capture is not None and self.capture_installed:
            change = self.capture_call("before_resume")
            if change is not None:
                self.start_proc(self.lifecycle.proc_then_resume(change, resume, body, raw))
                return
        sitting = self.hidden.thread_on_proxy_bp(resume)
        if sitting is not None:
            self.start_proc(self.hidden.proc_step_off_then_resume(resume, body, raw, *sitting))
            return
        self.resume = resume
        self.stopped = None
        self.forward(body, raw, resume=True)

    def _named_threads(self, resume: Resume) -> list[ThreadId] | None:
        """The threads a vCont names when it names no wildcard (then they must
        be asked for), or None. gdbserver 13.1 in all-stop, given a vCont
        that resumes no thread it has (`vCont;c:p1.1`, `vCont;c:1`,
        `vCont;s:p1.1;c:p1.2`, `vCont;c:p1.-1`: valid packets), waits with
        nothing resumed and aborts (`wait_1: Assertion 'target_options &
        TARGET_WNOHANG' failed`), killing the program it started. A process
        other than the program is asked for by its leader thread."""
        if self.non_stop or resume.legacy is not None or resume.reverse:
            return None
        named: list[ThreadId] = []
        for action in resume.actions:
            t = action.thread
            if t is None:
                return None  # the default action: every thread
            if t.tid in (ThreadId.ALL, ThreadId.ANY):
                if t.pid is None or t.pid in (ThreadId.ALL, ThreadId.ANY) or t.pid == self.main_pid:
                    return None  # all threads (of the program)
                if self.main_pid is None:
                    return None  # which process is the program's: not known here
                # Another process's threads: a fork child gdb follows or keeps
                # (`vCont;c:pCHILD.-1`), or a process the stub never had. `T`
                # takes no wildcard (gdbserver matches the id exactly), so its
                # leader, whose tid is the pid, is asked for.
                named.append(ThreadId(t.pid, t.pid))
                continue
            named.append(t)
        if self.stopped is None:
            return None  # no stop seen (a client that never asked `?`): not asked (known limit)
        stopped = self.stopped.thread
        if stopped is not None and any(t.matches(stopped) for t in named):
            return None  # the thread of the stop the client saw: there (gdb's `vCont;s:T`)
        return named

    def _proc_named_then_resume(self, resume: Resume, body: bytes, raw: bytes | None,
                                named: list[ThreadId]) -> Procedure:
        """Ask the stub whether each named thread is alive (`T`); forward the
        resume only when one is."""
        multi = feature_on(self.stub_features, "multiprocess")
        replies = (yield Exchange(tuple(b"T" + t.format(multi) for t in named))) if named else []
        self.proc = None
        if b"OK" not in replies:
            self._refuse("a vCont that resumes no thread the stub has (gdbserver 13.1 aborts on it)")
            return
        self._resume_checked = resume
        self.lifecycle.resume_after_proc(resume, body, raw)

    def _refuse(self, why: str) -> None:
        self.stats.shielded += 1
        if self.stats.shielded == 1:
            self.emit(Notice(f"a client packet was answered E01 and not forwarded ({why}); counted in stats"))
        self.shield_last = why
        self.reply(ERROR_REPLY)

    def _shielded(self, body: bytes) -> bool:
        """A packet the stub must not get (shield.py): answered E01 here."""
        why = refuse(body, non_stop=self.non_stop, g_size=self._g_size,
                     non_stop_offered="QNonStop" not in _HIDDEN_FROM_CLIENT, packet_size=self.packet_size,
                     symbol_lookup=self.symbol_lookup is not None)
        if why is None:
            self._g_asked = body[:1] == b"g"
            if body.startswith(b"qSymbol:"):
                self._qsymbol_asked = True
            return False
        self._refuse(why)
        return True

    def _stub_packet_size(self) -> int | None:
        for f in self.stub_features:
            if f.name == "PacketSize" and f.value:
                try:
                    return int(f.value, 16)
                except ValueError:
                    return None
        return None

    def _on_client_reply(self, body: bytes, raw: bytes) -> None:
        if self._g_asked:
            self._g_asked = False
            if body and len(body) % 2 == 0 and body[:1] != b"E" and not body.translate(None, b"0123456789abcdefABCDEFx"):
                self._g_size = len(body)  # the stub's register block: a G must match it
        if self._qsymbol_asked:
            # `qSymbol:NAME` (hex): the stub asks for a symbol and reads nothing but the
            # answer (and memory) until it gets one (shield.refuse's symbol_lookup)
            self._qsymbol_asked = False
            self.symbol_lookup = body[8:] if body.startswith(b"qSymbol:") and len(body) > 8 else None
        self.snoop_reply(body)
        self.ns.reply_seen(body)
        self.known.replied(body)
        sr = None
        if body[:1] in (b"T", b"S") and is_stop_reply(body):  # the answer to `?`
            try:
                sr = parse_stop_reply(body)
            except MalformedPacket:
                sr = None
            if sr is not None:
                self.last_stop = sr
                self.stopped = Stopped(sr.thread, sr.pc(self.pc_regnum) if sr.kind == "T" else None)
                self._note_stop_thread(sr)
                # the registers are the stop's; which thread `?` leaves selected is not sure
                self.known.stopped(sr, selects=False)
        if self.closing:
            return
        self.emit(ToClientRaw(raw))
        if sr is not None and self.lifecycle.prepares_early():
            # the capture's install starts here, ahead of the first resume (lifecycle.py)
            self.start_proc(self.lifecycle.proc_prepare())

    def snoop_reply(self, body: bytes) -> None:
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
            self.serve_own_tdesc = True

    def on_stop_reply(self, body: bytes, raw: bytes) -> None:
        try:
            sr = parse_stop_reply(body)
        except MalformedPacket:
            self.report_stop(None, raw)
            return
        if self.lifecycle.on_program_event(sr, raw):
            return
        if (self.orphan_steps and sr.thread is not None and sr.thread.tid in self.orphan_steps
                and sr.signal == SIGTRAP and self.resume is not None and not self.interrupt_pending):
            # the trap of a step of the proxy's that another thread's report answered (hidden.py)
            self.orphan_steps.discard(sr.thread.tid)
            self.forward(without_signals(self.resume), None, resume=True)
            return
        pc = sr.pc(self.pc_regnum) if sr.kind == "T" else None
        if self.stepping.wait is not None and self.stepping.intercepts(self, sr, pc):
            return
        # A stub without T stop replies (gdbserver --disable-packet=T) says
        # `S05`: no thread, no registers; the pc is read as for QEMU below.
        if sr.kind in ("T", "S") and sr.signal == SIGTRAP and (self.probes or self.bps.gone):
            if sr.thread is None and (is_trap_reason(sr) or not self.hidden.client_steps(None)):
                # No thread in the stop (gdbserver --disable-packet=T or Tthread):
                # find the thread at the probe first (hidden.py).
                self.start_proc(self.hidden.proc_read_pc_then_classify(sr, raw))
                return
            if is_trap_reason(sr) and pc is not None:
                if self.hidden.probe_hit(sr, raw, pc):
                    return
            elif sr.reason is None and not self.hidden.client_steps(sr.thread):
                # A stub that gives no stop reason (QEMU's gdbstub): a SIGTRAP
                # of a thread that was not stepping is a breakpoint. QEMU
                # sends no registers either: read the pc first.
                if pc is None:
                    self.start_proc(self.hidden.proc_read_pc_then_classify(sr, raw))
                    return
                if self.hidden.probe_hit(sr, raw, pc):
                    return
        self.report_stop(sr, raw)

    def _note_stop_thread(self, sr: StopReply) -> None:
        if sr.thread is not None:
            self.stub_g = sr.thread.format(sr.thread.pid is not None)
            if not self.non_stop:
                # In all-stop a stop report makes its thread gdbserver's general
                # thread, and gdb knows it (it sends no Hg before the next `z0`).
                # Kept as the client's selection, a fork child selected before
                # the stop made the parent's `z0`/`Z0` go untabled (or the
                # child's go into the program's table).
                self.client_g_thread = self.stub_g
        polls = getattr(self.engine, "polls", None)
        if polls is not None and self.stopped is not None:
            # the stop on the captures' clock, for the poll timeline (proxy.graph.polls)
            tid = sr.thread.tid if sr.thread is not None and sr.thread.tid > 0 else None
            polls.stop(self.stopped.serial, self.config.stop_clock(), tid)

    def report_stop(self, sr: StopReply | None, raw: bytes | None, body: bytes | None = None,
                     pc: int | None = None) -> None:
        """A stop the client sees. Ends the client's resume."""
        if self.stepping.on_report(self, sr):
            return  # the client's step goes on past an .await (stepping.py)
        if sr is not None and sr.kind in ("T", "S"):
            if sr.signal == SIGINT:
                self.sigint_crossed = False
            elif self.interrupt_forwarded:
                self.sigint_crossed = True
        self.resume = None
        self.interrupt_forwarded = False
        self.interrupt_pending = False
        self.bps.client_stopped()
        self.last_stop = sr
        if sr is not None and sr.kind in ("T", "S"):
            known = sr.pc(self.pc_regnum) if sr.kind == "T" else None
            self.stopped = Stopped(sr.thread, known if known is not None else pc)
            self._note_stop_thread(sr)
        else:
            self.stopped = None
        # gdbserver in all-stop makes the reporting thread its general thread (known.py)
        self.known.stopped(sr, selects=not self.non_stop)
        if self.closing:
            self.lifecycle.leave_for_hang_up()
            return
        if self.capture is not None and self.capture.filters_replies and (body is not None or raw is not None):
            if body is None and raw is not None:
                body = unframe(raw)
            new = self.capture_call("client_reply", b"vCont", body)
            if isinstance(new, bytes) and new != body:
                body, raw = new, None
        if raw is not None:
            self.emit(ToClientRaw(raw))
        elif body is not None:
            self.emit(ToClient(body))


__all__ = ["Session", "SessionConfig", "Exchange"]
