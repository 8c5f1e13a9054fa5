"""integration/realworld's truth tables and checks (pure): a table names source lines by
their text, so it cannot drift from the program it was written from; the checks count
an item right only when every view shows it."""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.realworld.truth import (
    CRATES,
    SHARED,
    TRUTH_DIR,
    Frame,
    Place,
    State,
    TaskTruth,
    TruthError,
    load,
    place,
)
from integration.realworld.views import Stop, bt_frames, check_bt, check_ids, check_state


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
    assert table.source == src and table.states[0].tasks[0].waits == ("READABLE", "mpsc")
    with pytest.raises(TruthError, match="fetch-crates realworld"):
        load(toml, shared=tmp_path, crates=tmp_path / "elsewhere")
    stop = _stop(2)
    stop.text["tree"] += "  leaf waits for READABLE\n"
    items, _ = check_state(stop, State("s", (), (TaskTruth("app::main", Place("x", 2), waits=("READABLE", "mpsc")),)), SRC)
    assert (items.right, items.checked) == (5, 6) and items.misses == ["tree: #1 of s: app::main at main.rs:2 (x) waits on no 'mpsc'"]


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


STATE = State("idle", (), (TaskTruth("app::main", Place("accept().await", 7)),))


def test_a_task_at_its_line_in_every_view_is_right() -> None:
    items, ids = check_state(_stop(7), STATE, SRC)
    assert (items.right, items.checked) == (4, 4) and ids == {"app::main@7": [1]}


def test_a_task_at_another_line_is_wrong_in_every_view() -> None:
    items, _ = check_state(_stop(8), STATE, SRC)
    assert items.right == 1 and items.checked == 4  # only `deadlocks` (none) is right


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
