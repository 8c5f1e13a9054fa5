"""The spawning line a record resolves to: the program's own frame, innermost first."""

from __future__ import annotations

from proxy.analysis.model import Frame, SourceLoc
from proxy.origins.records import SpawnRecord
from proxy.origins.resolve import Resolver

REG = "/usr/share/cargo/registry"


def _resolve(frames_by_pc: dict[int, list[Frame]]) -> Resolver:
    pcs = tuple(sorted(frames_by_pc))
    return Resolver(lambda rec: (pcs, True, ()), lambda pc: frames_by_pc.get(pc + 1 if pc + 1 in frames_by_pc else pc, []),
                    bias=0)


def _record() -> SpawnRecord:
    return SpawnRecord(ts=1, thread=7, task_id=3, task=0, spawner=0, chain=(), depth=0, regs={"rsp": 0}, stack=b"")


def test_a_library_frame_between_the_runtime_and_the_program_is_skipped() -> None:
    # smol's first spawn runs inside async-lock's OnceCell initialiser: not the program's line
    frames = {
        0x100: [Frame("async_executor::Executor::spawn", SourceLoc(f"{REG}/async-executor-1.13.1/src/lib.rs", 170))],
        0x200: [Frame("async_lock::once_cell::OnceCell<T>::get_or_init_blocking",
                      SourceLoc(f"{REG}/async-lock-3.4.2/src/once_cell.rs", 517))],
        0x300: [Frame("chat_server::main::{closure#0}", SourceLoc("/src/chat-server.rs", 88))],
    }
    o = _resolve(frames).origin(_record())
    assert (o.function, str(o.line)) == ("chat_server::main::{closure#0}", "/src/chat-server.rs:88")


def test_without_a_frame_of_the_program_the_first_outside_the_runtime_is_taken() -> None:
    frames = {
        0x100: [Frame("tokio::task::spawn::spawn", SourceLoc(f"{REG}/tokio-1.53.2/src/task/spawn.rs", 168))],
        0x200: [Frame("hyper_util::rt::TokioExecutor::execute", SourceLoc(f"{REG}/hyper-util-0.1.10/src/rt/tokio.rs", 40))],
    }
    o = _resolve(frames).origin(_record())
    assert o.function == "hyper_util::rt::TokioExecutor::execute"
