"""The session routes thread queries through the task-thread view; nothing naming a
task thread reaches the stub. The stub is played by hand (gdbserver 13.1's replies);
the tasks come from a stand-in for reflection (integration/test_task_threads.py runs
the real one on real programs)."""

from __future__ import annotations

from proxy.session.actions import ToClient, ToStub, ToStubRaw
from proxy.session.core import Session, SessionConfig
from proxy.threads.model import TID_BASE, TaskFrame, TaskThread
from proxy.threads.stack import FrameShape
from proxy.threads.view import STEP_REFUSED, TaskThreadView
from rsp.framing import frame

G = b"00" * (17 * 8 + 4 * 7)
SHAPE = FrameShape("rsp", 64, (("rip", -8),), (("rsp", 16),))


def tasks(session, read):  # type: ignore[no-untyped-def]
    session.queries.monitor_threads()  # the threads' registers: the session reads them as asked
    word = read(0x7000, 8)  # one memory read: asked of the stub while this waits
    if word is None:
        return [], None, 0, 0
    frames = (TaskFrame(0x5000, int.from_bytes(word, "little")),)
    return [TaskThread((0xA000, "t"), "task #1 app::f", "suspended at app.rs:3", frames)], lambda pc, o: SHAPE, 0, 0


class Driver:
    def __init__(self) -> None:
        self.s = Session(SessionConfig(elf_path="/bin/true", task_threads=tasks))
        self.s.task_threads.view = TaskThreadView()
        self.to_stub: list[bytes] = []
        self.client(b"?")  # the stop the client attaches at
        self.stub(b"T0006:00e0ffffff7f0000;07:b00eddf7ff7f0000;10:0010000000000000;thread:p10.10;core:0;")
        self.to_stub.clear()

    def client(self, body: bytes) -> list[bytes]:
        self.s.client_packet(body, frame(body))
        return self._take()

    def stub(self, body: bytes) -> list[bytes]:
        self.s.stub_packet(body, frame(body))
        return self._take()

    def _take(self) -> list[bytes]:
        out = []
        for a in self.s.take_actions():
            if isinstance(a, ToStub):
                self.to_stub.append(a.body)
            elif isinstance(a, ToStubRaw):
                self.to_stub.append(a.raw[1:-3])
            elif isinstance(a, ToClient):
                out.append(a.body)
        return out

    def play_stub(self, replies: dict[bytes, bytes]) -> list[bytes]:
        """Answer every request the proxy sends until it replies to the client."""
        got: list[bytes] = []
        while not got:
            assert self.to_stub, "the proxy waits for nothing"
            req = self.to_stub.pop(0)
            key = next((k for k in replies if req.startswith(k)), None)
            assert key is not None, f"unexpected request to the stub: {req!r}"
            got = self.stub(replies[key])
        return got


STUB = {b"qfThreadInfo": b"mp10.10", b"qsThreadInfo": b"l", b"Hg": b"OK", b"g": G,
        b"m7000,8": b"efbeadde00000000"}


def test_thread_list_registers_and_memory_of_a_task_thread() -> None:
    d = Driver()
    d.client(b"qfThreadInfo")
    (page,) = d.play_stub(STUB)
    tid = TID_BASE + 1
    assert page == b"mp10.10,p10.%x" % tid
    assert d.client(b"qsThreadInfo") == [b"l"]
    assert d.client(b"qThreadExtraInfo,p10.%x" % tid) == [b"suspended at app.rs:3".hex().encode()]
    assert d.client(b"Hgp10.%x" % tid) == [b"OK"]
    (g,) = d.client(b"g")
    rsp = int.from_bytes(bytes.fromhex(g.decode())[56:64], "little")
    (slot,) = d.client(b"m%x,8" % (rsp + 16))
    assert slot == b"efbeadde00000000"  # the coroutine's address, where its frame's DWARF looks
    assert d.to_stub == []  # none of these reached the stub


def test_continue_with_a_task_selected_resumes_the_program_and_step_is_refused() -> None:
    d = Driver()
    d.client(b"qfThreadInfo")
    d.play_stub(STUB)
    tid = TID_BASE + 1
    assert d.client(b"vCont;s:p10.%x;c" % tid) == [STEP_REFUSED]
    assert d.to_stub == []
    d.client(b"vCont;c:p10.%x" % tid)
    assert d.to_stub == [b"vCont;c"]


def test_no_tasks_before_the_first_stop() -> None:
    """lldb lists threads before it asks `?`: nothing is known of the program yet."""
    s = Session(SessionConfig(elf_path="/bin/true", task_threads=tasks))
    s.task_threads.view = TaskThreadView()
    s.client_packet(b"qfThreadInfo", frame(b"qfThreadInfo"))
    (fwd,) = [a for a in s.take_actions() if isinstance(a, ToStubRaw)]
    assert fwd.raw == frame(b"qfThreadInfo")
    assert not s.task_threads.view.fresh


def test_off_by_default_everything_goes_to_the_stub() -> None:
    d = Driver()
    assert d.s.task_threads.view is not None
    d.s.task_threads.view.enabled = False
    d.client(b"qfThreadInfo")
    assert d.to_stub == [b"qfThreadInfo"]


def test_monitor_async_threads_command() -> None:
    from types import SimpleNamespace

    from proxy.app import _threads_command

    view = TaskThreadView(enabled=False)
    part = SimpleNamespace(view=view, doc=b"old", refused=lambda: None)  # an x86-64 program
    session = SimpleNamespace(task_threads=part)
    assert _threads_command(session, ()).startswith("task threads: off, cap 1024")  # type: ignore[arg-type]
    assert _threads_command(session, ("on",)).startswith("task threads: on")  # type: ignore[arg-type]
    assert _threads_command(session, ("off",)).startswith("task threads: on (off from the next resume)")  # type: ignore[arg-type]
    view.stale()
    assert not view.enabled
    assert _threads_command(session, ("on",)).startswith("task threads: on,")  # type: ignore[arg-type]
    assert "cap 50" in _threads_command(session, ("50",))  # type: ignore[arg-type]
    assert "filter 'lock'" in _threads_command(session, ("filter", "lock"))  # type: ignore[arg-type]
    assert view.enabled and view.cap == 50 and view.pattern == "lock" and part.doc is None
    assert _threads_command(session, ("many",)).startswith("asyncrsp: usage:")  # type: ignore[arg-type]
    assert _threads_command(session, ("filter", "(")).startswith("asyncrsp: bad filter '('")  # type: ignore[arg-type]
    assert view.pattern == "lock"


def test_tasks_from_a_snapshot() -> None:
    """The snapshot's live tasks (proxy.snapshot's documented model, built here by hand):
    names, states, waits with their holder, and frames at each coroutine's suspend point."""
    from types import SimpleNamespace as NS

    from proxy.analysis.model import CoroutineKind, Era, Inventory, ResumeFn, SourceLoc
    from proxy.threads.adapter import SuspendPoints, from_snapshot

    fn = ResumeFn(0x1000, 0x1100, "", "app::f::{async_fn#0}", "app::f", CoroutineKind.ASYNC_FN, Era.MODERN,
                  None, (), layout_name="app::f::{async_fn_env#0}")
    inv = Inventory(None, "/x", True, 0, resume_fns=[fn])
    points = SuspendPoints(inv, lambda f, l, near: [], lambda a, n: None)
    points._memo[("app::f::{async_fn_env#0}", 3)] = (0x1040, 0x1041)
    res = type("R", (), {"addr": 0x77, "__str__": lambda self: "Mutex 0x77"})()
    frame = NS(type_name="app::f::{async_fn_env#0}", state_value=3, addr=0xA0, name="app::f")
    waiting = NS(id=3, label="#3", name="app::f", addr=0xA0, type_name="app::f::{async_fn_env#0}",
                 state=NS(kind=NS(value="suspended"), thread=None, loc=SourceLoc("/src/app.rs", 9)),
                 waits=(NS(resource=res),), stack=(frame,), tree=None)
    running = NS(id=4, label="#4", name="app::g", addr=0xB0, type_name="g", state=NS(kind=NS(value="running"),
                 thread=17, loc=None), waits=(), stack=(),
                 tree=NS(iter=lambda: iter([NS(kind="leaf", name="tokio::time::Sleep", detail="5 s left")])))
    snap = NS(live=lambda: [waiting, running], waits=NS(holds=(NS(task=4, resource=res),)))
    got = from_snapshot(snap, points, bias=0x5000)
    assert got[0].name == "task #3 app::f" and got[0].extra == "suspended at app.rs:9, waits on Mutex 0x77 held by #4"
    assert got[0].frames == (TaskFrame(0x6040, 0xA0, "app::f"),)
    assert got[1].running_on == 17 and got[1].frames == () and got[1].extra == "running on thread 17, tokio::time::Sleep: 5 s left"


def test_non_stop_sessions_list_no_task_threads() -> None:
    d = Driver()
    d.s.non_stop = True
    d.client(b"qfThreadInfo")
    assert d.to_stub == [b"qfThreadInfo"]
