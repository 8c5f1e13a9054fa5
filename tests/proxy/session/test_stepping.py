"""The step follower (proxy/session/stepping.py) driven packet by packet.

The client and the stub are played by hand with the packets gdb 13.1 and
gdbserver 13.1 exchanged in integration/test_stepping.py's sessions (a range
step from c's `.await` line, c's resume function returning, the wait at its
entry). The program's facts (one resume function, its layout, the engine's
poll scope of the stepping thread) are given as the analysis and the engine
would give them; the real ones run end to end in integration/test_stepping.py.
"""

from __future__ import annotations

from types import SimpleNamespace

from proxy.analysis.model import CoroutineKind, Era, Inventory, Layout, ResumeFn, SourceLoc, State
from proxy.capture.base import CaptureBase
from proxy.graph.model import PollScope
from proxy.session.actions import ToClient, ToClientRaw, ToStub, ToStubRaw
from proxy.session.core import Session, SessionConfig
from proxy.session.state import Stopped
from proxy.session.stepping import foreign_stop, g_register
from rsp.packets.qsupported import parse_qsupported_request
from rsp.packets.stop import parse_stop_reply
from rsp.threads import ThreadId

from .test_core import Driver as CoreDriver

LOW, HIGH = 0x5000, 0x5300  # c's resume function
AWAIT_PC = 0x5104  # on c's .await line (33)
RESUMED_PC = 0x512F  # the same line, where the resumed coroutine polls its awaitee again
RET = 0x4A3  # in b, after the call of c's poll
ENTRY_SP = 0x7FF0_0000_6C78
SELF = 0x7FF0_0000_C180
STATE_OFF = 0x290
T1, T2 = b"p10.10", b"p10.11"
FILE = "/src/tokio_app.rs"
LINES = {AWAIT_PC: 33, RESUMED_PC: 33, LOW: 32, 0x5200: 34}


def stop(pc: int, sp: int = ENTRY_SP - 0x100, thread: bytes = T1, reason: bytes = b"") -> bytes:
    return (b"T05" + reason + b"07:" + sp.to_bytes(8, "little").hex().encode() + b";10:"
            + pc.to_bytes(8, "little").hex().encode() + b";thread:" + thread + b";core:0;")


def g_block(pc: int, rdi: int, sp: int) -> bytes:
    regs = [0] * 17
    regs[5], regs[7], regs[16] = rdi, sp, pc
    return b"".join(r.to_bytes(8, "little").hex().encode() for r in regs)


class Driver(CoreDriver):
    def __init__(self) -> None:  # noqa: D107 - not the base's: no probes, a program with c
        self.s = s = Session(SessionConfig())
        fn = ResumeFn(LOW, HIGH, "", "tokio_app::c::{async_fn#0}", "tokio_app::c", CoroutineKind.ASYNC_FN,
                      Era.MODERN, SourceLoc(FILE, 32), (0x52F0,), layout_name="c_env")
        states = (State(0, "Unresumed", SourceLoc(FILE, 32)), State(1, "Returned", SourceLoc(FILE, 35)),
                  State(3, "Suspend0", SourceLoc(FILE, 33)))
        inv = Inventory(None, "/prog", True, 0, [fn], {"c_env": Layout("c_env", 0x2A0, STATE_OFF, 1, states)})
        scope = PollScope(0x10, 4, LOW, ENTRY_SP, 1)
        engine = SimpleNamespace(current_scope=lambda tid: scope if tid == 0x10 else None,
                                 task=lambda ref: SimpleNamespace(self_ptr=SELF) if ref == 4 else None)
        s.target = SimpleNamespace(inventory=inv, bias=0, engine=engine, path="/prog")
        s.capture = CaptureBase()
        s.planted = True
        s.stepping._lines_path = "/prog"
        s.stepping._lines = lambda pc: SourceLoc(FILE, LINES[pc]) if pc in LINES else None
        s.stopped = Stopped(ThreadId.parse(T1), AWAIT_PC)
        s.last_stop = parse_stop_reply(stop(AWAIT_PC))


def parse_console_output(body: bytes) -> str:
    return bytes.fromhex(body[1:].decode()).decode()


def _bodies(actions: list[object], plain: type, raw: type) -> list[bytes]:
    out = []
    for a in actions:
        if isinstance(a, plain):
            out.append(a.body)  # type: ignore[attr-defined]
        elif isinstance(a, raw):
            out.append(a.raw[1:-3])  # type: ignore[attr-defined]
    return out


def up(actions: list[object]) -> list[bytes]:
    return _bodies(actions, ToStub, ToStubRaw)


def down(actions: list[object]) -> list[bytes]:
    return _bodies(actions, ToClient, ToClientRaw)


def _suspend(d: Driver) -> None:
    """The client's range step from the .await line; c returns Pending; the wait starts."""
    rng = b"vCont;r5104,5114:p10.10;c:p10.-1"
    assert up(d.client(rng)) == [b"m%x,8" % ENTRY_SP]  # the activation's return address
    assert up(d.stub(RET.to_bytes(8, "little").hex().encode())) == [rng]
    # c returned: the stop is in b, c's frame gone; the proxy reads c's __state
    acts = d.stub(stop(RET + 5, sp=ENTRY_SP + 8))
    assert up(acts) == [b"m%x,1" % (SELF + STATE_OFF)] and not down(acts)
    assert up(d.stub(b"03")) == [b"Z0,5000,1"]  # Suspend0: wait at c's entry
    assert up(d.stub(b"OK")) == [b"vCont;c"]


def test_next_over_a_suspending_await_ends_on_the_resumed_line_of_the_same_instance() -> None:
    d = Driver()
    _suspend(d)
    # another instance of c enters first, on thread 2: stepped over, the program goes on
    assert up(d.stub(stop(LOW, thread=T2, reason=b"swbreak:;"))) == [b"g"]
    acts = d.stub(g_block(LOW, SELF + 0x1000, 0x7FF0_1000_0000))
    assert up(acts) == [b"z0,5000,1", b"vCont;s:p10.11"] and not down(acts)
    d.stub(b"OK")
    assert up(d.stub(stop(LOW + 1, thread=T2))) == [b"Z0,5000,1"]
    assert up(d.stub(b"OK")) == [b"vCont;c"]
    # this instance is polled again on thread 1: the breakpoint goes, the thread is stepped
    assert up(d.stub(stop(LOW, reason=b"swbreak:;"))) == [b"g"]
    assert up(d.stub(g_block(LOW, SELF, ENTRY_SP))) == [b"z0,5000,1"]
    assert up(d.stub(b"OK")) == [b"m%x,1" % (SELF + STATE_OFF)]  # still suspended?
    assert up(d.stub(b"03")) == [b"g"]
    assert up(d.stub(g_block(LOW, SELF, ENTRY_SP))) == [b"vCont;s:p10.10"]
    assert up(d.stub(stop(0x5001))) == [b"g"]
    assert up(d.stub(g_block(0x5001, SELF, ENTRY_SP))) == [b"vCont;s:p10.10"]
    acts = d.stub(stop(RESUMED_PC))
    # the .await line again, on the client's own thread: gdb's next goes on from here
    assert down(acts) == [stop(RESUMED_PC)]
    assert d.s.stepping.taken == 1 and d.s.stepping.wait is None


def test_ready_return_is_the_clients() -> None:
    d = Driver()
    rng = b"vCont;r5104,5114:p10.10;c:p10.-1"
    d.client(rng)
    d.stub(RET.to_bytes(8, "little").hex().encode())
    d.stub(stop(RET + 5, sp=ENTRY_SP + 8))
    acts = d.stub(b"01")  # Returned: an ordinary return, gdb steps on in b
    assert down(acts) == [stop(RET + 5, sp=ENTRY_SP + 8)] and not up(acts)


def test_interrupt_while_waiting_is_the_clients_and_stated() -> None:
    d = Driver()
    _suspend(d)
    d.s.client_interrupt()
    assert d.s.take_actions() == [ToStubRaw(b"\x03")]
    acts = d.stub(b"T02thread:p10.11;")
    assert up(acts) == [b"z0,5000,1"]  # the proxy's breakpoint goes first
    said = [parse_console_output(b) for b in down(acts) if b.startswith(b"O")]
    assert said and "interrupt" in said[0]
    assert down(acts)[-1] == b"T02thread:p10.11;"


def test_exit_while_waiting_is_stated() -> None:
    d = Driver()
    _suspend(d)
    acts = d.stub(b"W00;process:10")
    assert not up(acts)  # nothing to remove from a process that is gone
    said = [parse_console_output(b) for b in down(acts) if b.startswith(b"O")]
    assert said and "exited" in said[0]
    assert down(acts)[-1] == b"W00;process:10"


def test_step_off_is_gdbs_own_next() -> None:
    d = Driver()
    acts = d.client(b"qRcmd," + b"async step off".hex().encode())
    assert any(b.startswith(b"O") for b in down(acts))
    rng = b"vCont;r5104,5114:p10.10;c:p10.-1"
    assert up(d.client(rng)) == [rng]
    assert down(d.stub(stop(RET + 5, sp=ENTRY_SP + 8))) == [stop(RET + 5, sp=ENTRY_SP + 8)]


def _negotiate(d: Driver, client_qsupported: bytes, stub_vcont: bytes) -> None:
    """The client's qSupported (its features noted) and its `vCont?`, answered by the stub."""
    d.s.client_features = parse_qsupported_request(client_qsupported)
    assert up(d.client(b"vCont?")) == [b"vCont?"]
    assert down(d.stub(stub_vcont)) == [stub_vcont]


GDB_QSUPPORTED = b"qSupported:multiprocess+;swbreak+;hwbreak+;vContSupported+;xmlRegisters=i386"
LLDB_QSUPPORTED = b"qSupported:xmlRegisters=i386,arm,mips,arc;multiprocess+;fork-events+;vfork-events+"


def test_gdbs_single_step_is_a_stepi_when_it_range_steps_its_lines() -> None:
    """gdb with a stub that takes `vCont;r` steps lines by ranges: its `s` is a `stepi` (over
    c's `ret` too), forwarded and reported as it came, never followed to the next poll."""
    d = Driver()
    _negotiate(d, GDB_QSUPPORTED, b"vCont;c;C;s;S;t;r")
    step = b"vCont;s:p10.10;c:p10.-1"
    assert up(d.client(step)) == [step]  # no return address read: nothing to follow
    acts = d.stub(stop(RET + 5, sp=ENTRY_SP + 8))
    assert down(acts) == [stop(RET + 5, sp=ENTRY_SP + 8)] and not up(acts)


def test_single_steps_follow_the_task_for_a_client_that_steps_lines_by_them() -> None:
    """lldb (no `vContSupported`), or a stub without `r`: a line step is single steps, so a
    single step leaving a suspended coroutine starts the wait, as a range step does."""
    for qsupported, vcont in ((LLDB_QSUPPORTED, b"vCont;c;C;s;S;t;r"), (GDB_QSUPPORTED, b"vCont;c;C;s;S")):
        d = Driver()
        _negotiate(d, qsupported, vcont)
        step = b"vCont;s:p10.10;c:p10.-1"
        assert up(d.client(step)) == [b"m%x,8" % ENTRY_SP]
        assert up(d.stub(RET.to_bytes(8, "little").hex().encode())) == [step]
        acts = d.stub(stop(RET + 5, sp=ENTRY_SP + 8))
        assert up(acts) == [b"m%x,1" % (SELF + STATE_OFF)] and not down(acts)


def test_foreign_stop_is_signal_zero_and_registers() -> None:
    assert foreign_stop(b"T0507:01;thread:p1.2;") == b"T0007:01;thread:p1.2;"
    assert g_register(g_block(0x5000, SELF, ENTRY_SP), "rdi") == SELF
    assert g_register(g_block(0x5000, SELF, ENTRY_SP), "rsp") == ENTRY_SP


def _arrive_on_thread_2_and_enter_a_call(d: Driver, body_sp: int) -> None:
    """The instance is polled again on thread 2; the proxy's own next runs a call to its return."""
    _suspend(d)
    assert up(d.stub(stop(LOW, thread=T2, reason=b"swbreak:;"))) == [b"g"]
    assert up(d.stub(g_block(LOW, SELF, 0x7FF0_1000_0000))) == [b"z0,5000,1"]  # this instance, thread 2
    assert up(d.stub(b"OK")) == [b"m%x,1" % (SELF + STATE_OFF)]
    assert up(d.stub(b"03")) == [b"g"]
    assert up(d.stub(g_block(LOW, SELF, 0x7FF0_1000_0000))) == [b"vCont;s:p10.11"]
    assert up(d.stub(stop(RESUMED_PC, sp=body_sp, thread=T2))) == [b"g"]  # the .await line: reached
    assert up(d.stub(g_block(RESUMED_PC, SELF, body_sp))) == [b"vCont;s:p10.11"]
    assert up(d.stub(stop(0x9000, sp=body_sp - 8, thread=T2))) == [b"m%x,8" % (body_sp - 8)]
    assert up(d.stub((0x5134).to_bytes(8, "little").hex().encode())) == [b"Z0,5134,1"]
    assert up(d.stub(b"OK")) == [b"vCont;c:p10.11"]


def test_ctrl_c_while_the_proxy_runs_a_call_alone_reaches_the_stub() -> None:
    d = Driver()
    _arrive_on_thread_2_and_enter_a_call(d, 0x7FF0_0FFF_FF00)
    d.s.client_interrupt()
    assert d.s.take_actions() == [ToStubRaw(b"\x03")]
    acts = d.stub(b"T02thread:p10.11;")
    assert up(acts) == [b"z0,5134,1"]  # the return's breakpoint goes
    assert down(d.stub(b"OK")) == [b"T02thread:p10.11;"]  # the client's interrupt, as it came


def _resumed_on_thread_2_at_line_34(d: Driver) -> list[object]:
    """The wait ends on thread 2; the proxy's own `next` there runs a call to its return,
    then reaches line 34: the actions of that last stop."""
    body_sp = 0x7FF0_0FFF_FF00
    _arrive_on_thread_2_and_enter_a_call(d, body_sp)
    assert up(d.stub(stop(0x5134, sp=body_sp, thread=T2, reason=b"swbreak:;"))) == [b"z0,5134,1"]
    assert up(d.stub(b"OK")) == [b"g"]
    assert up(d.stub(g_block(0x5134, SELF, body_sp))) == [b"vCont;s:p10.11"]
    return d.stub(stop(0x5200, sp=body_sp, thread=T2))


def test_lldb_hears_of_the_other_thread_from_a_stop_of_its_own() -> None:
    """lldb (no `vContSupported`) ignores any stop of a thread its step keeps suspended and
    goes on stepping its own thread alone: the end is a stop of the thread lldb steps, its
    reason (lldb's `reason:exception`, a hex description) naming the task's new thread."""
    d = Driver()
    d.s.client_features = parse_qsupported_request(LLDB_QSUPPORTED)
    (reply,) = down(_resumed_on_thread_2_at_line_34(d))
    assert reply.startswith(b"T00thread:p10.10;reason:exception;description:"), reply
    said = bytes.fromhex(reply.split(b"description:")[1].rstrip(b";").decode()).decode()
    assert "tokio_app::c" in said and "tid 17" in said, said  # p10.11: tid 0x11
    assert d.s.stepping.switched == 1


def test_resumed_on_another_thread_the_proxy_steps_to_the_next_line_and_reports_signal_0() -> None:
    d = Driver()
    d.s.client_features = parse_qsupported_request(GDB_QSUPPORTED)
    acts = _resumed_on_thread_2_at_line_34(d)
    # line 34 on thread 2: the client was stepping thread 1, so it hears of a plain stop
    # (signal 0: "Thread 2 stopped."), never a SIGTRAP it did not ask for
    assert down(acts) == [foreign_stop(stop(0x5200, sp=0x7FF0_0FFF_FF00, thread=T2))]
    assert down(acts)[0].startswith(b"T00") and d.s.stepping.switched == 1


def test_a_coroutine_dropped_while_the_step_waits_is_stated() -> None:
    """The address is polled again but its __state says Unresumed: the coroutine the step
    waited for was dropped and a new one took its memory. Said, and shown where it is."""
    d = Driver()
    _suspend(d)
    assert up(d.stub(stop(LOW, thread=T2, reason=b"swbreak:;"))) == [b"g"]
    assert up(d.stub(g_block(LOW, SELF, 0x7FF0_1000_0000))) == [b"z0,5000,1"]
    assert up(d.stub(b"OK")) == [b"m%x,1" % (SELF + STATE_OFF)]
    acts = d.stub(b"00")
    said = [parse_console_output(b) for b in down(acts) if b.startswith(b"O")]
    assert said and "was dropped while the step waited" in said[0] and "Unresumed" in said[0], said
    assert down(acts)[-1] == foreign_stop(stop(LOW, thread=T2, reason=b"swbreak:;"))
    assert d.s.stepping.wait is None and d.s.stepping.origin is None
