"""integration/realworld's truth tables and checks (pure): a table names source lines by
their text, so it cannot drift from the program it was written from; the checks count
an item right only when every view shows it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from integration.realworld.truth import (
    CRATES,
    SHARED,
    TRUTH_DIR,
    Frame,
    Leaf,
    Place,
    State,
    TaskTruth,
    TruthError,
    load,
    place,
)
from integration.realworld.views import Stop, bt_frames, check_bt, check_ids, check_state, leaves, matches


def test_a_place_is_the_one_line_holding_its_text(tmp_path: Path) -> None:
    src = tmp_path / "main.rs"
    src.write_text("fn main() {\n    a().await;\n    b().await;\n    a().await;\n}\n")
    assert place(src, "b().await", None) == Place("b().await", 3)
    assert place(src, "a().await", 4) == Place("a().await", 4)
    with pytest.raises(TruthError, match="on 2 lines"):
        place(src, "a().await", None)
    with pytest.raises(TruthError, match="does not hold"):
        place(src, "b().await", 2)


@pytest.mark.skipif(not SHARED.is_dir(), reason="no ../shared/realworld beside the project")
def test_every_table_matches_its_source() -> None:
    paths = sorted(TRUTH_DIR.glob("*.toml"))
    assert paths
    for p in paths:
        if 'source = "crates:' in p.read_text() and not CRATES.is_dir():
            continue  # a crate's example: sid's crates not fetched here
        table = load(p)
        assert table.states, p.name


def test_a_source_in_the_crates_and_a_list_of_waits(tmp_path: Path) -> None:
    """``crates:P`` names an example shipped in a packaged crate; a task with two leaves says
    what each waits on (one item each); a missing source says where it should come from."""
    src = tmp_path / "crates" / "x-1.0" / "examples" / "server.rs"
    src.parent.mkdir(parents=True)
    src.write_text("async fn serve() {\n    select(a, b).await;\n}\n")
    toml = tmp_path / "x.toml"
    toml.write_text('program = "x"\nsource = "crates:x-1.0/examples/server.rs"\n[[state]]\nname = "s"\n'
                    '[[state.task]]\nname = "x::serve"\nat = "select(a, b).await;"\nwaits = ["READABLE", "mpsc"]\n')
    table = load(toml, shared=tmp_path / "none", crates=tmp_path / "crates")
    assert table.source == src and table.states[0].tasks[0].leaves[0].waits == ("READABLE", "mpsc")
    with pytest.raises(TruthError, match="fetch-crates realworld"):
        load(toml, shared=tmp_path, crates=tmp_path / "elsewhere")
    stop = _stop(2)
    stop.text["tree"] += "└╼ leaf (waits for READABLE)\n"  # drawn below the leaf's line
    items, _ = check_state(stop, State("s", (), (TaskTruth("app::main", (Leaf(Place("x", 2), ("READABLE", "mpsc")),)),)), SRC)
    assert (items.right, items.checked) == (6, 7), items.misses
    assert items.misses == ["tree: #1 of s: app::main at main.rs:2 (x): nothing below line 2 waits on 'mpsc'"]


def test_the_source_is_its_path_not_its_name(tmp_path: Path) -> None:
    """A crate's example shares its name with a file of the crate (h2's ``examples/server.rs``
    and its ``src/server.rs``): the program's source is named by its path from its root, so a
    coroutine of the library's file of that name is no leaf of the program's (its serve at 32
    is the leaf, not h2's accept below it at 421)."""
    src = tmp_path / "crates" / "h2-0.4.20" / "examples" / "server.rs"
    src.parent.mkdir(parents=True)
    src.write_text("async fn serve() {\n    connection.accept().await;\n}\n")
    toml = tmp_path / "x.toml"
    toml.write_text('program = "x"\nsource = "crates:h2-0.4.20/examples/server.rs"\n[[state]]\nname = "s"\n')
    table = load(toml, shared=tmp_path / "none", crates=tmp_path / "crates")
    assert table.where == "h2-0.4.20/examples/server.rs"
    lib = {"kind": "coroutine", "name": "h2::server::accept", "children": [],
           "state": {"kind": "suspended", "file": "/r/h2-0.4.20/src/server.rs", "line": 421}}
    own = {"kind": "coroutine", "name": "x::serve", "children": [lib],
           "state": {"kind": "suspended", "file": "/r/h2-0.4.20/examples/server.rs", "line": 2}}
    task = {"tree": own}
    assert [n["state"]["line"] for n in leaves(task, table.where)] == [2]
    assert [n["state"]["line"] for n in leaves(task, "server.rs")] == [421]  # by its name alone
    bt = ("logical async backtrace of thread 7 (task #2 x::serve):\n"
          "#0  x::serve (#2) at h2-0.4.20/examples/server.rs:2\n#1  <root: polled by the executor>\n")
    assert check_bt(bt, (Frame("x::serve", Place("", 2)), Frame("<root: polled by the executor>", None)),
                    table.where).misses == []


SRC = "main.rs"


def _doc(line: int, name: str = "app::main", tid: int = 1) -> dict:  # type: ignore[type-arg]
    node = {"kind": "coroutine", "name": name, "id": tid, "children": [],
            "state": {"kind": "suspended", "file": f"/x/{SRC}", "line": line}}
    return {"tasks": [{"id": tid, "label": f"#{tid}", "name": name, "state": node["state"], "tree": node}]}


def _stop(line: int, tid: int = 1, cycles: int = 0) -> Stop:
    text = {"tasks": f"#{tid}  0x1  suspended  /x/{SRC}:{line}  app::main",
            "tree": f"task #{tid} 0x1  app::main::{{async_fn_env#0}}  (root)\n╼ app::main at /x/{SRC}:{line}\n",
            "deadlocks": "cycle: #1 -> #2\n" * cycles or "no deadlock: every blocked task can be woken"}
    return Stop(text, _doc(line, tid=tid))


STATE = State("idle", (), (TaskTruth("app::main", (Leaf(Place("accept().await", 7)),)),))


def test_a_task_at_its_line_in_every_view_is_right() -> None:
    items, ids = check_state(_stop(7), STATE, SRC)
    assert (items.right, items.checked) == (5, 5) and ids == {"app::main@7": [1]}


def test_a_task_at_another_line_is_wrong_in_every_view() -> None:
    items, _ = check_state(_stop(8), STATE, SRC)
    assert items.right == 1 and items.checked == 5  # only `deadlocks` (none) is right
    assert items.misses[3] == "json: idle: tasks the source does not make: #1 app::main at main.rs:8"


def test_a_cycle_the_source_does_not_make_is_wrong() -> None:
    items, _ = check_state(_stop(7, cycles=1), STATE, SRC)
    assert items.misses == ["deadlocks: 1 cycles, the source makes 0"]


def test_ids_must_stay_from_one_stop_to_the_next() -> None:
    assert check_ids({"app::main@7": [1]}, _stop(7, tid=1), STATE, SRC).misses == []
    assert check_ids({"app::main@7": [1]}, _stop(7, tid=2), STATE, SRC).right == 0


def test_the_backtrace_frame_by_frame() -> None:
    text = ("logical async backtrace of thread 7 (task #1 app::run):\n"
            f"#0  app::c (#4) at /x/{SRC}:34\n#1  app::b (#3) awaiting at /x/{SRC}:29\n"
            "#2  <root: polled by the executor>\n")
    assert bt_frames(text)[1] == ("app::b", f"/x/{SRC}", 29)
    want = (Frame("app::c", Place("c", 34)), Frame("app::b", Place("b", 29)), Frame("<root: polled by the executor>", None))
    assert check_bt(text, want, SRC).right == 3
    assert check_bt(text, (Frame("app::b", Place("b", 29)),), SRC).right == 0


def test_a_stalled_upstream_takes_connections_and_never_answers(tmp_path: Path) -> None:
    """``[[stall]]``: a proxy's upstream that accepts (the kernel's backlog) and never
    answers, so the proxy's task waits on its upstream while the state is looked at."""
    import socket

    from integration.harness.stubs import free_port
    from integration.realworld.gauntlet import _helpers

    (tmp_path / "main.rs").write_text("fn main() {}\n")
    port = free_port()
    t = tmp_path / "t.toml"
    t.write_text(f'program = "p"\nsource = "main.rs"\n[[stall]]\nport = {port}\n')
    table = load(t, shared=tmp_path)
    assert table.stalls == (port,)
    with _helpers(table, "realworld-debug"):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(0.3)
            with pytest.raises(TimeoutError):
                s.recv(1)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


JOIN_SRC = """async fn main() {
    let a = async {
        loop { a.accept().await; }
    };
    let b = async {
        loop { b.accept().await; }
    };
    join(a, b).await;
}
"""


def _table(tmp_path: Path, task: str) -> Path:
    (tmp_path / SRC).write_text(JOIN_SRC)
    t = tmp_path / "t.toml"
    t.write_text(f'program = "p"\nsource = "{SRC}"\n[[state]]\nname = "s"\n[[state.task]]\nname = "app::main"\n{task}')
    return t


def test_a_task_of_several_leaves_names_each_by_its_line(tmp_path: Path) -> None:
    """A `join` of two loops: the task's tree holds two leaves; each is a line of the source
    (found there like any place) and says what it waits on."""
    t = _table(tmp_path, '[[state.task.leaf]]\nat = "a.accept().await"\nwaits = "READABLE"\n'
                         'name = "app::main::{async_block@2}"\n[[state.task.leaf]]\nat = "b.accept().await"\n')
    task = load(t, shared=tmp_path).states[0].tasks[0]
    assert task.leaves == (Leaf(Place("a.accept().await", 3), ("READABLE",), "app::main::{async_block@2}"),
                           Leaf(Place("b.accept().await", 6)))
    assert task.lines == (3, 6) and task.key == "app::main@3+6"


@pytest.mark.parametrize(("task", "error"), [
    ('at = "join(a, b).await"\n[[state.task.leaf]]\nat = "a.accept().await"\n', "not both"),
    ('count = 1\n', "not neither"),
    ('[[state.task.leaf]]\nat = "a.accept().await"\n', "give it as the task's `at`"),
    ('[[state.task.leaf]]\nat = "a.accept().await"\n[[state.task.leaf]]\nat = "c.accept().await"\n', "on 0 lines"),
])
def test_a_task_gives_one_at_or_several_leaves(tmp_path: Path, task: str, error: str) -> None:
    with pytest.raises(TruthError, match=re.escape(error)):
        load(_table(tmp_path, task), shared=tmp_path)


def _node(name: str, line: int | None, kids: list[dict], kind: str = "coroutine", state: str = "suspended",
          detail: str = "") -> dict:  # type: ignore[type-arg]
    st = {"kind": state, "file": f"/x/{SRC}", "line": line} if line is not None else None
    return {"kind": kind, "name": name, "state": st, "detail": detail, "children": kids}


def _join_stop(left_wait: str, right_wait: str, right_state: str = "suspended") -> Stop:
    """main at its join (line 8) of block@2 at line 3 and block@5 at line 6, each awaiting an
    accept whose Readiness says what it waits for."""
    def branch(name: str, line: int, wait: str, state: str) -> dict:  # type: ignore[type-arg]
        return _node(name, line, [_node("tokio::net::Accept", None, [_node("Readiness", None, [], "leaf", detail=wait)],
                                        "future")], state=state)

    tree = _node("app::main", 8, [_node("futures::Join", None, [
        branch("app::main::{async_block@2}", 3, left_wait, "suspended"),
        branch("app::main::{async_block@5}", 6, right_wait, right_state)], "combinator")])
    text = ("task #1 0x1  app::main::{async_fn_env#0}  (root)\n"
            f"╼ app::main at /x/{SRC}:8\n"
            "└╼ futures::Join\n"
            f"   ├╼ app::main::{{async_block@2}} at /x/{SRC}:3\n"
            "   │  └╼ tokio::net::Accept\n"
            f"   │     └╼ Readiness ({left_wait})\n"
            f"   └╼ app::main::{{async_block@5}} at /x/{SRC}:6\n"
            "      └╼ tokio::net::Accept\n"
            f"         └╼ Readiness ({right_wait})\n")
    doc = {"tasks": [{"id": 1, "label": "#1", "name": "app::main", "state": tree["state"], "tree": tree}]}
    return Stop({"tasks": f"#1  0x1  suspended  /x/{SRC}:8  app::main", "tree": text,
                 "deadlocks": "no deadlock"}, doc)


JOIN = TaskTruth("app::main", (Leaf(Place("a.accept().await", 3), ("waits for READABLE",), "app::main::{async_block@2}"),
                               Leaf(Place("b.accept().await", 6), ("waits for READABLE",))))


def test_each_leaf_of_a_join_is_checked_with_what_it_waits_on() -> None:
    items, ids = check_state(_join_stop("waits for READABLE", "waits for READABLE"), State("s", (), (JOIN,)), SRC)
    # json, row, 2 x (line, waits), no other task, deadlocks
    assert (items.right, items.checked, ids) == (8, 8, {"app::main@3+6": [1]})


def test_a_wait_is_the_one_below_its_leaf() -> None:
    """What one branch waits on does not stand for the other's."""
    items, _ = check_state(_join_stop("waits for READABLE", "no waker registered"), State("s", (), (JOIN,)), SRC)
    assert items.misses == ["tree: #1 of s: app::main at main.rs:3, 6: nothing below line 6 waits on 'waits for READABLE'"]


def test_a_task_is_matched_by_all_its_leaves_no_more_no_fewer() -> None:
    stop = _join_stop("waits for READABLE", "waits for READABLE")
    one = TaskTruth("app::main", (Leaf(Place("b.accept().await", 6)),))  # the deepest, last leaf alone
    assert matches(stop.doc, one, SRC) == []
    misnamed = TaskTruth("app::main", (Leaf(Place("a", 3), (), "app::main::{async_block@5}"), Leaf(Place("b", 6))))
    assert matches(stop.doc, misnamed, SRC) == []
    assert [t["id"] for t in matches(stop.doc, JOIN, SRC)] == [1]
    # a branch that finished is no leaf: the join waits on the other one only
    done = _join_stop("waits for READABLE", "", right_state="finished")
    assert [leaf["state"]["line"] for leaf in leaves(done.doc["tasks"][0], SRC)] == [3]
    assert matches(done.doc, TaskTruth("app::main", (Leaf(Place("a", 3)),)), SRC) != []


def test_a_leaf_line_is_not_a_prefix_of_another() -> None:
    """main.rs:3 is not main.rs:30: a tree line's place is matched whole."""
    stop = _join_stop("waits for READABLE", "waits for READABLE")
    stop.text["tree"] = stop.text["tree"].replace(f"{SRC}:3\n", f"{SRC}:30\n")
    items, _ = check_state(stop, State("s", (), (JOIN,)), SRC)
    assert "line 3 (app::main::{async_block@2}) not in #1's tree" in items.misses[0]


def test_a_task_the_source_does_not_make_is_wrong() -> None:
    """A live task with a coroutine of the program's source that no truth task is: a stale
    image taken for a future (hyper's single_threaded: a second `http1_server` at its `bind`),
    or more tasks than the truth's count. Tasks of the libraries alone are not the truth's."""
    stop = _stop(7)
    ghost = _doc(3, tid=2)["tasks"][0]
    lib = {"id": 3, "label": "#3", "name": "tokio::blocking", "state": {"kind": "running"},
           "tree": {"kind": "leaf", "name": "tokio::task::spawn_blocking", "state": None, "children": []}}
    done = dict(_doc(9, tid=4)["tasks"][0], state={"kind": "finished"})
    stop.doc["tasks"] += [ghost, lib, done]
    items, _ = check_state(stop, STATE, SRC)
    assert items.misses == ["json: idle: tasks the source does not make: #2 app::main at main.rs:3"]
    twice = State("idle", (), (TaskTruth("app::main", (Leaf(Place("accept().await", 7)),), count=1),))
    stop.doc["tasks"][1] = _doc(7, tid=2)["tasks"][0]  # a second task at the truth's line, count 1
    assert check_state(stop, twice, SRC)[0].misses == ["json: idle: tasks the source does not make: #2 app::main at main.rs:7"]
    # a task of the program's crate whose memory reads as no coroutine (dropped unfinished,
    # its slot reused): no line of the source in its tree, its name the program's
    gone = {"id": 5, "label": "#5", "name": "app::client::{async_block@9}", "state": {"kind": "unknown"},
            "tree": {"kind": "unreadable", "name": "<unreadable app::client: __state 115 is not a state>",
                     "state": None, "children": []}}
    stop.doc["tasks"][1:2] = [gone]
    assert check_state(stop, STATE, SRC)[0].misses == []
    assert check_state(stop, STATE, SRC, "app")[0].misses == [
        "json: idle: tasks the source does not make: #5 app::client::{async_block@9} at main.rs:"]


def _two_threads(threads: dict[int, tuple[int | None, int | None, str]]) -> Stop:
    """Tasks #1..#n at lines 7 (a server) and 9 (its connections): (state thread, last polled
    thread, heading) each."""
    tasks = []
    for tid, (running, last, header) in threads.items():
        t = _doc(7 if tid % 2 else 9, tid=tid)["tasks"][0]
        t["state"] = dict(t["state"], thread=running)
        t.update(last_thread=last, header=header)
        tasks.append(t)
    text = {"tasks": "\n".join(f"#{t['id']}  0x1  suspended  /x/{SRC}:{t['state']['line']}  app::main" for t in tasks),
            "tree": "".join(f"task #{t['id']} 0x1  app::main  ({t['header']})\n╼ app::main at /x/{SRC}:{t['state']['line']}\n"
                            for t in tasks), "deadlocks": "no deadlock"}
    return Stop(text, {"tasks": tasks})


THREADS = State("two runtimes", (), (
    TaskTruth("app::main", (Leaf(Place("a", 7)),), count=2, thread="one"),
    TaskTruth("app::main", (Leaf(Place("b", 9)),), count=2, thread="two")))


def test_tasks_of_one_thread_name_on_one_thread_of_two_on_two() -> None:
    """hyper's single_threaded: each server thread runs its own runtime and LocalSet; a
    server's fn and its connections' tasks live on its thread, the other server's on
    another. The thread a view gives: running there, polled there last, or its heading's
    (found on that thread's stack, local to it)."""
    stop = _two_threads({1: (None, None, "on the stack of thread 41, in block_on"), 2: (None, 42, "root, thread 42"),
                         3: (41, None, "spawned task"), 4: (None, None, "spawned task, header 0x9, local to thread 42")})
    items, _ = check_state(stop, THREADS, SRC)
    assert items.misses == [] and items.checked == 4 * 4 + 2
    # the second server's connection said nothing of its thread; the first's on the other's
    stop = _two_threads({1: (None, None, "on the stack of thread 41"), 2: (None, 42, ""),
                         3: (None, 42, ""), 4: (None, None, "spawned task, header 0x9")})
    misses = check_state(stop, THREADS, SRC)[0].misses
    assert [m.split(" (")[0] for m in misses] == ["thread: #1", "thread: #3", "thread: #2", "thread: #4"]


def test_the_h2_client_frames_and_header_block() -> None:
    """HTTP/2 over cleartext (hyper's http2 server, prior knowledge): frames cut at their
    9-byte heads (a partial one left for the next read), a request's header block of
    HPACK literals named by the static table (RFC 7541 appendix A)."""
    from integration.realworld.clients import H2_DATA, H2_SETTINGS, h2_frame, h2_frames, h2_request_headers

    raw = h2_frame(H2_SETTINGS, 0, 0, b"\x00\x03\x00\x00\x00\x64") + h2_frame(H2_DATA, 1, 1, b"Request #1")
    frames, rest = h2_frames(raw + raw[:5])
    assert frames == [(H2_SETTINGS, 0, 0, b"\x00\x03\x00\x00\x00\x64"), (H2_DATA, 1, 1, b"Request #1")]
    assert rest == raw[:5]
    assert h2_request_headers("GET", "/", "h:1") == b"\x02\x03GET\x06\x04http\x04\x01/\x01\x03h:1"
    with pytest.raises(TruthError, match="client kind 'h3'"):
        from integration.realworld.truth import _client
        _client({"kind": "h3"})


def test_the_h2_partial_body_client_leaves_its_stream_open() -> None:
    """An ``h2-partial-body`` request over a real socket: after the preface and SETTINGS, its
    HEADERS end the header block but not the stream, and one DATA frame of its body follows,
    without END_STREAM (a handler reading the body waits for the rest); a whole ``h2``
    request ends its stream with its HEADERS and sends no DATA."""
    import socket
    import threading

    from integration.realworld.clients import (
        H2_DATA,
        H2_END_HEADERS,
        H2_END_STREAM,
        H2_HEADERS,
        H2_PREFACE,
        H2_SETTINGS,
        close_all,
        drive,
        h2_frames,
    )
    from integration.realworld.truth import _client

    def received(kind: str) -> list[tuple[int, int, int, bytes]]:
        srv = socket.create_server(("127.0.0.1", 0))
        got: list[bytes] = []

        def take() -> None:
            conn, _ = srv.accept()
            conn.settimeout(5)
            with conn:
                while (chunk := conn.recv(65536)) and not got.append(chunk):
                    pass

        th = threading.Thread(target=take)
        th.start()
        conns = drive((_client({"kind": kind, "method": "POST", "body": "hello"}),), srv.getsockname()[1])
        close_all(conns)
        th.join(5)
        srv.close()
        raw = b"".join(got)
        assert raw.startswith(H2_PREFACE)
        frames, rest = h2_frames(raw[len(H2_PREFACE):])
        assert rest == b""
        return frames

    settings, headers, data = received("h2-partial-body")
    assert settings[0] == H2_SETTINGS
    assert headers[:3] == (H2_HEADERS, H2_END_HEADERS, 1) and headers[3].startswith(b"\x02\x04POST")
    assert data == (H2_DATA, 0, 1, b"hello")
    kinds = [(k, f) for k, f, _, _ in received("h2")]
    assert kinds == [(H2_SETTINGS, 0), (H2_HEADERS, H2_END_HEADERS | H2_END_STREAM)]
