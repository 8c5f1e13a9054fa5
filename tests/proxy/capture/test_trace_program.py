"""The tracepoint collection program and frame conversion (pure code; the
real gdbserver runs in integration/test_tracepoints.py)."""

from __future__ import annotations

from proxy.analysis.model import CoroutineKind, Era, Inventory, Layout, ResumeFn
from proxy.capture.trace_program import (
    TSV_FS_BASE,
    TSV_RAX,
    TSV_SP,
    FrameConverter,
    ThreadMap,
    build_program,
    entry_expression,
    exit_expression,
)
from proxy.graph.events import PollEnter, PollExit
from rsp.agent import Op, Opcode, disassemble, parse_x_expression
from rsp.packets.trace import parse_qtdp
from rsp.tracebuf import MemoryBlock, TraceFrame, VariableBlock

BIAS = 0x555555554000


def _fn(low: int, rets: tuple[int, ...], self_in: str = "rdi",
        pending: tuple[int, int, int] | None = (0, 8, 1), unwind: tuple[int, ...] = ()) -> ResumeFn:
    return ResumeFn(low, low + 0x100, "", f"m::f{low:x}::{{async_fn#0}}", f"m::f{low:x}",
                    CoroutineKind.ASYNC_FN, Era.MODERN, None, rets, unwind, "L", self_in, pending)


def _inv(*fns: ResumeFn) -> Inventory:
    return Inventory(None, "x", True, 0x1000, list(fns), {"L": Layout("L", 64, 0x28, 1, ())})


def test_entry_expression_collects_self_state_sp_thread_time() -> None:
    ops = disassemble(entry_expression("rsi", 0x28, 1))
    assert ops[:5] == [Op(Opcode.reg, 4), Op(Opcode.const16, 0x28), Op(Opcode.add),
                       Op(Opcode.const8, 1), Op(Opcode.trace)]
    assert Op(Opcode.reg, 58) in ops and Op(Opcode.tracev, 1) in ops and ops[-1] == Op(Opcode.end)


def test_exit_expression_for_a_poll_in_memory_reads_the_return_slot() -> None:
    ops = disassemble(exit_expression((8, 8, 1), in_memory=True))
    i = ops.index(Op(Opcode.reg, 0))  # rax holds the return slot's address at ret
    assert ops[i:i + 5] == [Op(Opcode.reg, 0), Op(Opcode.const16, 8), Op(Opcode.add),
                            Op(Opcode.const8, 8), Op(Opcode.trace)]
    assert Op(Opcode.tracev, TSV_RAX) not in ops


def test_program_two_packets_each_numbers_from_one() -> None:
    inv = _inv(_fn(0x2000, (0x2050, 0x2090), unwind=(0x20a0,)), _fn(0x3000, (0x3010,)))
    prog = build_program(inv, BIAS)
    assert [p.number for p in prog.points] == [1, 2, 3, 4, 5, 6]
    assert [p.kind for p in prog.points] == ["entry", "exit", "exit", "unwind", "entry", "exit"]
    assert prog.points[1].addr == 0x2050 + BIAS and prog.points[1].site == 0x2000 + BIAS
    pk = prog.packets()
    qtdp = [p for p in pk if p.startswith(b"QTDP")]
    assert len(qtdp) == 2 * len(prog.points)
    for head, acts in zip(qtdp[::2], qtdp[1::2]):
        h, a = parse_qtdp(head), parse_qtdp(acts)
        assert h.more and not a.more and len(a.actions or ()) == 1  # one action packet, no '-'
        parse_x_expression(a.actions[0])  # type: ignore[index]
    assert len(build_program(inv, BIAS, entry_only=True).points) == 2


def _frames() -> list[TraceFrame]:
    self_ptr, sp, fsb = 0x7000, 0x7FF0, 0xAAAA0
    return [
        TraceFrame(1, (MemoryBlock(self_ptr + 0x28, b"\x03"), MemoryBlock(sp, (0x401234).to_bytes(8, "little")),
                       VariableBlock(TSV_FS_BASE, fsb), VariableBlock(1, 100))),
        TraceFrame(2, (VariableBlock(TSV_SP, sp), VariableBlock(TSV_RAX, 1), VariableBlock(TSV_FS_BASE, fsb),
                       VariableBlock(1, 130))),
        TraceFrame(2, (VariableBlock(TSV_SP, sp), VariableBlock(TSV_RAX, 0), VariableBlock(TSV_FS_BASE, 0xBBBB0),
                       VariableBlock(1, 140))),
        TraceFrame(1, (VariableBlock(TSV_FS_BASE, fsb),)),  # truncated by a full buffer
    ]


def test_frames_become_events_in_order() -> None:
    inv = _inv(_fn(0x2000, (0x2050,)))
    prog = build_program(inv, 0)
    threads = ThreadMap()
    threads.learn(0xAAAA0, 4242)
    conv = FrameConverter(prog, threads, {0x2000: 0x28}, {0x2000: (0, 8, 1)})
    seq = iter(range(10, 100))
    evs = conv.convert(_frames(), lambda: next(seq))
    assert evs[0] == PollEnter(10, 4242, 0x2000, 0x7000, 0x7FF0, 0x401234, 3, 100_000)
    assert evs[1] == PollExit(11, 4242, 0x2000, 0x7FF0, None, None, 1, time_ns=130_000)
    # a thread never mapped gets a stable negative id; rax 0 = Ready
    assert isinstance(evs[2], PollExit) and evs[2].thread == -1 and evs[2].poll_result == 0
    assert len(evs) == 3 and conv.stats.truncated == 1


def test_niche_poll_pending_is_the_niche_value() -> None:
    # Poll<&str>: Pending is a null pointer at offset 0 (rustc 1.63 nested)
    inv = _inv(_fn(0x2000, (0x2050,), pending=(0, 8, 0)))
    conv = FrameConverter(build_program(inv, 0), ThreadMap(), {}, {0x2000: (0, 8, 0)})
    f = TraceFrame(2, (VariableBlock(TSV_SP, 8), VariableBlock(TSV_RAX, 0x5555), VariableBlock(TSV_FS_BASE, 1),
                       VariableBlock(1, 1)))
    (ev,) = conv.convert([f], lambda: 1)
    assert isinstance(ev, PollExit) and ev.poll_result == 0


def test_tid_offset_found_from_live_threads() -> None:
    def tcb(base: int, tid: int) -> bytes:
        b = bytearray(0x400)
        b[0x10:0x18] = base.to_bytes(8, "little")
        b[0x2D0:0x2D4] = tid.to_bytes(4, "little")
        b[0x100:0x104] = (7).to_bytes(4, "little")  # noise
        return bytes(b)

    tm = ThreadMap()
    assert tm.find_tid_offset({0x1000: tcb(0x1000, 300), 0x2000: tcb(0x2000, 301)}, {300, 301}) == 0x2D0
    assert tm.find_tid_offset({0x1000: tcb(0x1000, 300)}, {999}) is None
    # a thread that exited reads -1 (tokio's workers after the runtime shut
    # down): still found, and -1 is no LWP
    gone = bytearray(tcb(0x3000, 0))
    gone[0x2D0:0x2D4] = b"\xff\xff\xff\xff"
    assert tm.find_tid_offset({0x1000: tcb(0x1000, 300), 0x3000: bytes(gone)}, {300}) == 0x2D0
    tm.learn(0x3000, int.from_bytes(b"\xff\xff\xff\xff", "little", signed=True))
    assert tm.thread(0x3000) == -1 and 0x3000 not in tm.lwp


def test_a_thread_keeps_the_identity_its_first_events_got() -> None:
    """Seen on tokio_bench mt before tids were read signed (an exited
    worker's -1 became LWP 4294967295): a later control-block read named
    another LWP for an fs_base whose events the engine already had under the
    first; splitting a thread's events over two ids made exits unmatched
    (the engine's scopes are per thread). Kept as a defence."""
    threads = ThreadMap()
    threads.learn(0xA000, 11)
    assert threads.thread(0xA000) == 11
    threads.learn(0xA000, 12)
    assert threads.thread(0xA000) == 11 and threads.relabelled == 1
    # a thread first seen unmapped keeps its synthetic id, and is counted as unmapped
    assert threads.thread(0xB000) == -1
    threads.learn(0xB000, 13)
    assert threads.thread(0xB000) == -1 and threads.unmapped == 1 and threads.relabelled == 2
    # one never used before it is mapped gets its LWP
    threads.learn(0xC000, 14)
    assert threads.thread(0xC000) == 14
