"""Spawn backtraces and wake statistics under uprobe capture, on a real corpus program.

Outside truth: the program's source. Every task `deadlock`'s `run` spawns is a
`tokio::spawn(` call at a line of `run`; the spawn records, resolved, must name
exactly those lines, and nothing is symbolised before a record is asked for.
Needs root and uprobe_multi links (skips saying why otherwise).
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from proxy.analysis.inventory import build_inventory
from proxy.capture.uprobes.capture import UprobeCapture
from proxy.graph.catalog import Catalog
from proxy.graph.engine import Engine
from proxy.origins.resolve import Origin, crate_of

from integration.harness.monitor import corpus_binary
from integration.harness.uprobes import spawn_stopped, stopped_under_wakes

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "integration" / "corpus" / "src" / "bin" / "deadlock.rs"
_OK, _WHY = UprobeCapture.available(SimpleNamespace(local=True))
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)


def _spawn_lines() -> set[int]:
    """The lines of `run` that call tokio::spawn, from the source."""
    lines = SOURCE.read_text().splitlines()
    start = next(i for i, t in enumerate(lines) if t.startswith("async fn run()"))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("}"))
    return {i + 1 for i in range(start, end) if "tokio::spawn(" in lines[i]}


def _capture(prog: Path, args: list[str], run_s: float, **kw: bool) -> tuple[UprobeCapture, int]:
    """`prog` under uprobe capture for `run_s` seconds, then stopped (SIGSTOP) and synced."""
    inv = build_inventory(str(prog))
    bias = 0x555555554000 if inv.pie else 0
    eng = Engine(Catalog(inv, bias), keep_log=False)
    pid = spawn_stopped([str(prog), *args])
    target = SimpleNamespace(path=str(prog), pid=pid, local=True, inventory=inv, bias=bias, engine=eng,
                             note=None, extra={})
    cap = UprobeCapture(spawns=True, **kw)
    cap.plan(target)  # type: ignore[arg-type]
    assert cap.install() is None
    assert cap.attached, cap.note
    os.kill(pid, signal.SIGCONT)
    t0 = time.monotonic()
    while time.monotonic() - t0 < run_s:
        cap.poll()
        time.sleep(0.01)
    os.kill(pid, signal.SIGSTOP)
    cap.sync()
    return cap, pid


@pytest.mark.parametrize("config", ["old-debug", "debug"])
def test_spawning_lines_are_the_sources_spawn_calls_and_resolved_only_when_asked(config: str) -> None:
    prog = corpus_binary(config, "deadlock")
    cap, pid = _capture(prog, ["ct"], 1.5)
    try:
        sw = cap.origins
        assert sw is not None and sw.resolver is not None and sw.plan is not None
        assert sw.plan.spawns, sw.plan.notes
        assert sw.log.seen >= 8, sw.lines()
        # rustc 1.95's tasks' polls are seen at their futures' root entries (task_roots.py), with
        # no task-poll site; 1.63's futures are GenFuture wrappers: their task-poll sites stay
        assert bool(sw.plan.roots) == (config == "debug"), sw.lines()
        assert sw.resolver.symbolised == 0  # collected raw: nothing resolved until shown
        want = _spawn_lines()
        got: dict[int, int] = {}
        for task_id, rec in sw.log.by_id.items():
            o = sw.resolver.origin(rec)
            if o.line is not None and o.line.file.endswith("deadlock.rs") and "run" in o.function:
                got[task_id] = o.line.line
                assert rec.chain, "spawned inside run's poll: its coroutine is on the thread"
        assert sw.resolver.symbolised == len(sw.log.by_id)
        assert set(got.values()) == want, (sorted(got.values()), sorted(want))
        assert sorted(got) == sorted(got, key=got.get)  # tokio's ids in the source's order
        # wakes: lock_ab was woken (by lock_ba's barrier wait) and polled again
        ws = sw.wakes()
        assert any(w.wakes and w.sched_n for w in ws.values()), ws
        assert all(w.polls >= 1 for w in ws.values() if w.future)
    finally:
        cap.uninstall()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _planned(**kw: bool) -> list[str]:
    """The names of the sites uprobe capture plans on the corpus `deadlock` (rustc 1.63 debug)."""
    prog = corpus_binary("old-debug", "deadlock")
    inv = build_inventory(str(prog))
    cap = UprobeCapture(**kw)
    eng = Engine(Catalog(inv, 0x555555554000), keep_log=False)
    cap.plan(SimpleNamespace(path=str(prog), pid=os.getpid(), local=True, inventory=inv, bias=0x555555554000,
                             engine=eng, note=None, extra={}))  # type: ignore[arg-type]
    assert cap.plan_ is not None
    return [s.name for s in cap.plan_.sites if s.spec.kind in (6, 7)]


def test_no_wakes_plants_neither() -> None:
    assert _planned(spawns=False) == []


def test_waker_clones_and_drops_only_for_the_lost_waker_warning() -> None:
    """`--wakes` plants the wake and task-poll sites but not tokio's clone_waker and drop_waker
    (the most hit: they feed only the lost-waker warning); `--lost-wakers` plants them too."""
    plain, lost = _planned(spawns=True), _planned(spawns=True, wakers=True)
    assert any("wake_by_val" in n for n in plain) and any("task poll" in n for n in plain), plain
    assert not any(re.search(r"clone_waker|drop_waker", n) for n in plain), plain
    assert {n for n in lost if re.search(r"clone_waker|drop_waker", n)} and set(plain) < set(lost), lost


@pytest.mark.parametrize("config", ["old-debug", "debug"])
def test_the_lost_waker_built_on_purpose_is_the_one_found(config: str) -> None:
    """`lost_waker`'s `forgetful` drops the only clone of its waker and stays Pending: the one
    task with no waker alive; its siblings keep theirs (a timer, a Notify)."""
    from proxy.origins.view import Origins, WakeWords

    prog = corpus_binary(config, "lost_waker")
    cap, pid = _capture(prog, ["ct"], 1.5, wakers=True)
    try:
        sw = cap.origins
        assert sw is not None
        eng = cap.engine
        assert eng is not None
        paths = {t.self_ptr: t.path for t in eng.tasks()}
        org = Origins(sw, cap.inventory, eng.catalog.load_bias, None)
        snap_tasks = [SimpleNamespace(addr=w.future, live=True, state=SimpleNamespace(thread=None), label="",
                                      name=paths.get(w.future, "?")) for w in sw.wakes().values() if w.future]
        words = WakeWords(org, SimpleNamespace(tasks=snap_tasks), time.monotonic_ns(), org.place)
        lost = sorted(t.name for t in snap_tasks if words.lost(t))
        named = sorted(t.name for t in snap_tasks)
        assert any("sleeper" in n for n in named) and any("waiter" in n for n in named), named
        assert len(lost) == 1 and "forgetful" in lost[0], (lost, named)
        assert "lost waker" in (words.evidence(next(t for t in snap_tasks if t.name == lost[0])) or "")
    finally:
        cap.uninstall()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


REALWORLD = ["tokio_echo_tcp", "tokio_chat", "axum_chat", "smol_chat_server"]


def _source_line(file: str, line: int) -> str | None:
    """The text of `file`'s line, where the file is on this machine (the program's source under
    ../shared/realworld, a crate's under the packaged registry)."""
    from integration.realworld.truth import SHARED

    for cand in (Path(file), *(SHARED / d / Path(file).name for d in ("tokio-examples", "smol-examples"))):
        if cand.is_file():
            lines = cand.read_text(errors="replace").splitlines()
            return lines[line - 1] if 0 < line <= len(lines) else None
    return None


def _library_spawns_for_it(o: Origin) -> bool:
    """The program's line calls a library that spawns for it (axum's `ws.on_upgrade(...)`):
    a frame between it and the runtime's own (the innermost frame's crate) is another
    crate's line that calls a spawn."""
    inner = [f for f in o.frames if f.loc is not None]
    at = next((i for i, f in enumerate(inner) if f.loc == o.line), None)
    if at is None or at == 0:
        return False
    runtime = crate_of(inner[0].function)
    return any(crate_of(f.function) != runtime and "spawn" in (_source_line(f.loc.file, f.loc.line) or "")
               for f in inner[1:at])


@pytest.mark.timeout(600)  # a debug build's first analysis on a loaded machine
@pytest.mark.parametrize("config", ["realworld-debug", "realworld-release"])
@pytest.mark.parametrize("program", REALWORLD)
def test_realworld_spawning_lines_are_spawn_calls(program: str, config: str) -> None:
    """Real programs driven by real clients into their truth table's first state: every spawn
    recorded resolves to a line of the program that calls a spawn, or calls a library that
    spawns for it (its frame inside the line's is a spawn call: axum's `ws.on_upgrade`), and the connections' tasks to the program's
    or its library's `spawn` line; nothing resolved before asked. (The runtime's own worker
    threads, spawn_blocking tasks made by its start, resolve to the runtime's construction in
    `main`, sync code: `#[tokio::main]`'s line; they are not checked.)"""
    from integration.realworld import clients, truth

    prog = _realworld_binary(program, config)
    table = truth.tables([program])[0]
    from integration.realworld.gauntlet import fixed_ports_taken

    taken = fixed_ports_taken(table, wait=60)  # axum's chat binds 3000 itself: a run of it elsewhere holds it
    if taken is not None:
        pytest.skip(taken)
    port = table.port or _free_port()
    args = [a.replace("{port}", str(port)) for a in table.args]
    inv = build_inventory(str(prog))
    if not inv.resume_fns:
        pytest.skip(f"{program} ({config}): the analysis finds no async resume function in this build "
                    f"(its coroutines inlined away): the uprobe capture has nothing to plant")
    bias = 0x555555554000 if inv.pie else 0
    eng = Engine(Catalog(inv, bias), keep_log=False)
    pid = spawn_stopped([str(prog), *args])
    cap = UprobeCapture(spawns=True)
    cap.plan(SimpleNamespace(path=str(prog), pid=pid, local=True, inventory=inv, bias=bias, engine=eng,  # type: ignore[arg-type]
                             note=None, extra={}))
    conns = []
    try:
        assert cap.install() is None and cap.attached, cap.note
        os.kill(pid, signal.SIGCONT)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 30 and not _listening(port):
            cap.poll()
            time.sleep(0.02)
        conns = clients.drive(table.states[0].clients, port)
        for _ in range(50):
            cap.poll()
            time.sleep(0.01)
        os.kill(pid, signal.SIGSTOP)
        cap.sync()
        sw = cap.origins
        assert sw is not None and sw.resolver is not None
        recs = [*sw.log.keyed(), *sw.log.unkeyed]
        assert len(recs) >= len(table.states[0].clients), (sw.lines(), sw.plan.notes if sw.plan else None)
        assert sw.resolver.symbolised == 0
        bad, spawn_lines = [], 0
        for rec in recs:
            o = sw.resolver.origin(rec)
            if o.line is None or not re.search(r"\{\{closure\}\}|\{async_(fn|block)", o.function):
                continue  # spawned by sync code: the runtime's start (its worker threads), not a task
            text = _source_line(o.line.file, o.line.line)
            if text is None:
                continue
            if "spawn" in text or _library_spawns_for_it(o):
                spawn_lines += 1
            elif "block_on" not in text and "#[tokio::main]" not in text and "fn main" not in text:
                bad.append((str(o.line), text.strip(), o.function, [(f.function[:50], str(f.loc)) for f in o.frames]))
        assert not bad, bad
        assert spawn_lines >= len(table.states[0].clients), [str(sw.resolver.origin(r).line) for r in recs]
    finally:
        clients.close_all(conns)
        cap.uninstall()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


def _realworld_binary(program: str, config: str) -> Path:
    """The gauntlet's build of `program`, or the test skipped saying why there is none."""
    from integration.corpus import build

    skip = build.skip_reason(config)
    if skip is not None:
        pytest.skip(f"{config}: {skip}")
    try:
        return Path(build.pinned(build.binary(config, program)))
    except Exception as err:  # noqa: BLE001 - not built here: say why
        pytest.skip(f"{program} ({config}) not built: {err}")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


# async-task's spawns (smol, async-std), matched to their tasks by the new task's address. From
# reading each program's source: (the spawned task's name ends with, the text of the line that
# spawns it, the spawning task's name holds). smol's chat-server: main's block (under
# smol::block_on) spawns the dispatcher and one block per client. async-std's a-chat:
# accept_loop (under task::block_on) spawns the broker and, through spawn_and_log_error's
# `task::spawn(async move {`, each connection_loop; the broker spawns each peer's writer block
# (line 158) through the same helper.
ASYNC_TASK_SPAWNS = {
    "smol_chat_server": [
        ("smol_chat_server::dispatch", "smol::spawn(dispatch(receiver)).detach();", "main::{async_block@79}"),
        ("main::{async_block@79}::{async_block@98}", "smol::spawn(async move {", "main::{async_block@79}")],
    "async_std_a_chat": [
        ("server::broker_loop", "let broker = task::spawn(broker_loop(broker_receiver));", "accept_loop"),
        ("{async_block@180}<async_std_a_chat::server::connection_loop>", "task::spawn(async move {", "accept_loop"),
        ("{async_block@180}<async_std_a_chat::server::broker_loop::{async_block@158}>", "task::spawn(async move {",
         "server::broker_loop")],
}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", ["realworld-debug", "realworld-release"])
@pytest.mark.parametrize("program", sorted(ASYNC_TASK_SPAWNS))
def test_realworld_async_task_spawns_are_matched_to_their_tasks(program: str, config: str) -> None:
    """gdb, gdbserver and the proxy with `--capture uprobes --wakes` on a real smol / async-std
    program driven by its truth table's clients: every task the source spawns shows, in
    `tasks` (SPAWNED AT), `where` and the JSON document, the line of its spawn call (the
    source's text) and the task that spawned it. A release build's spawner is the task polled
    on the spawning thread only where the capture sees that poll in progress (its coroutine
    has a resume function); where it does not, `by` stays empty, never wrong. A build with no
    resume function at all (smol's chat-server in release: every coroutine inlined into the
    runtime's task functions) still has its spawns probed: the lines are matched all the same."""
    from integration.realworld import clients, gauntlet, truth

    prog = _realworld_binary(program, config)
    table = truth.tables([program])[0]
    taken = gauntlet.fixed_ports_taken(table, wait=60)
    if taken is not None:
        pytest.skip(taken)
    want = [(name, truth.place(table.source, text, None).line, by) for name, text, by in ASYNC_TASK_SPAWNS[program]]
    port = gauntlet._port(table)
    conns: list = []  # type: ignore[type-arg]

    def driven(_stub: object) -> None:
        gauntlet._wait_port(port)
        conns.extend(clients.drive(table.states[0].clients, port))
        time.sleep(1.0)

    try:
        with stopped_under_wakes(prog, gauntlet._args(table, port), driven) as (mi, stop):
            tasks_text, doc = stop.text["tasks"], stop.doc  # the views' text and the JSON document
            checked = 0
            for name, line, by in want:
                mine = [t for t in doc["tasks"] if t["name"].endswith(name)]
                assert mine, (name, [t["name"] for t in doc["tasks"]])
                for t in mine:
                    sp = t.get("spawn")
                    assert sp is not None and sp["line"] == line and Path(sp["file"]).name == table.source.name, \
                        (t["name"], sp and {k: sp[k] for k in ("file", "line", "by")}, line)
                    if config == "realworld-debug" or sp["by"] is not None:
                        assert sp["by"] is not None and by in sp["by"], (t["name"], sp["by"], by)
                    row = next(r for r in tasks_text.splitlines() if r.startswith(f"#{t['id']} "))
                    assert row.rstrip().endswith(f"{table.source.name}:{line}"), row
                    where = gauntlet._console(mi, f"monitor async where {t['id']}")
                    assert "spawned at " in where and f"{table.source.name}:{line}" in where, where
                    checked += 1
            assert checked >= len(want) + 1, checked  # the clients' tasks: two of one kind at least
    finally:
        clients.close_all(conns)


# tokio >= 1.46 built with `--cfg tokio_unstable` keeps each task's spawn location in the task
# (`Core.spawned_at`, `#[track_caller]` on the spawn functions): the runtime's own word, against
# which the capture's line is checked, and what a task spawned before the capture began shows.


def _deadlock_tasks(doc: dict) -> list[dict]:  # type: ignore[type-arg]
    """The document's tasks `deadlock`'s `run` spawns (every task but run itself)."""
    return [t for t in doc["tasks"] if t["name"].startswith("deadlock::") and t["name"] != "deadlock::run"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", ["sid-unstable-debug", "sid-unstable-release"])
def test_spawning_lines_agree_with_tokios_own_spawn_locations(config: str) -> None:
    """gdb, gdbserver and the proxy with `--capture uprobes --wakes` on `deadlock` built against
    tokio 1.53 with tokio_unstable: every task `run` spawns shows its `tokio::spawn(` line (the
    source's) in the document, `tasks` and `where`, and that line is the one tokio itself
    recorded (the task's `spawned_at`: the document's `spawn.runtime`, "the runtime says" in
    `where`), for all seven lines of the source."""
    from integration.harness.monitor import modern_binary
    from integration.realworld import gauntlet

    prog = modern_binary(config, "deadlock")
    want = _spawn_lines()

    def ready(stub: Any) -> None:
        assert stub.output.wait_for(re.compile(rb"deadlock ready"), 120), stub.output_text()[-2000:]

    with stopped_under_wakes(prog, ["ct"], ready) as (mi, stop):
        tasks_text, doc = stop.text["tasks"], stop.doc
        mine = _deadlock_tasks(doc)
        assert len(mine) == len(want), [t["name"] for t in doc["tasks"]]
        lines = set()
        for t in mine:
            sp = t.get("spawn")
            assert sp is not None and sp["line"] in want and Path(sp["file"]).name == SOURCE.name, \
                (t["name"], sp and {k: sp[k] for k in ("file", "line")}, sorted(want))
            rt = re.fullmatch(r"(\S+):(\d+):(\d+)", sp.get("runtime") or "")
            assert rt is not None, (t["name"], sp.get("runtime"))  # tokio_unstable: the runtime's own word
            assert Path(rt.group(1)).name == SOURCE.name and int(rt.group(2)) == sp["line"], \
                (t["name"], sp["runtime"], sp["line"])
            row = next(r for r in tasks_text.splitlines() if r.startswith(f"#{t['id']} "))
            assert row.rstrip().endswith(f"{SOURCE.name}:{sp['line']}"), row
            where = gauntlet._console(mi, f"monitor async where {t['id']}")
            assert f"spawned at {sp['file']}:{sp['line']}" in where and \
                f"the runtime says: spawned at {sp['runtime']}" in where, where
            lines.add(sp["line"])
        assert lines == want, (sorted(lines), sorted(want))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("config", ["sid-unstable-debug", "sid-unstable-release"])
def test_a_task_spawned_before_the_capture_shows_tokios_own_location(config: str) -> None:
    """`deadlock` run alone until its tasks are stuck, then attached (gdbserver --attach, the
    proxy with `--capture uprobes --wakes`), resumed and stopped: no spawn was recorded, so
    every task `run` spawned shows the runtime's location (`runtime@file:line:col` in `tasks`,
    "the runtime says" in `where`), the source's `tokio::spawn(` line."""
    import subprocess

    from integration.harness.monitor import modern_binary
    from integration.harness.stubs import kill_tree, spawn_proxy, start_stub
    from integration.realworld import gauntlet

    prog = modern_binary(config, "deadlock")
    want = _spawn_lines()
    p = subprocess.Popen([str(prog), "ct"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        assert p.stdout is not None and b"deadlock ready" in p.stdout.readline()
        with start_stub("gdbserver", prog, attach=p.pid) as stub:
            px = spawn_proxy(stub.address, extra=["--capture", "uprobes", "--wakes"])
            try:
                mi = gauntlet._mi(prog, px.address)
                try:
                    mi.cmd("-exec-continue")  # the capture begins with the first resume
                    time.sleep(1.0)
                    gauntlet._interrupt(mi, p.pid)
                    tasks_text = gauntlet._console(mi, "monitor async tasks")
                    assert "SPAWNED AT" in tasks_text, tasks_text  # the capture runs, with --wakes
                    lines = set()
                    for row in tasks_text.splitlines():
                        m = re.match(r"#(\d+) .*\bdeadlock::(\w+)\s+(\S+)\s*$", row)
                        if m is None or m.group(2) == "run":
                            continue
                        at = re.fullmatch(r"runtime@(\S+):(\d+):(\d+)", m.group(3))
                        assert at is not None and Path(at.group(1)).name == SOURCE.name, row
                        lines.add(int(at.group(2)))
                        where = gauntlet._console(mi, f"monitor async where {m.group(1)}")
                        assert "its spawn was not recorded" in where and \
                            f"the runtime says: spawned at {at.group(1)}:{at.group(2)}:" in where, where
                    assert lines == want, (sorted(lines), sorted(want), tasks_text)
                    mi.cmd("-target-detach")
                finally:
                    mi.close()
            finally:
                px.close()
    finally:
        kill_tree(p)  # type: ignore[arg-type]
