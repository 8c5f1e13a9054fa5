"""Parallel stacks (proxy.pictures.stacks): a hand-built snapshot -> DOT text.

The snapshot models a server: N connection tasks in `serve -> handle -> read` (most
waiting on their socket, a few at `write`), two tasks in a Mutex cycle, one blocked
on the JoinHandle of one of them. What the picture must say is known from the model."""

from __future__ import annotations

import re
import shutil

import pytest

from proxy.pictures import graphviz, stacks
from proxy.snapshot.model import FutureNode, Snapshot
from tests.proxy.pictures.server import server, task

def boxes(dot: str) -> dict[str, str]:
    return dict(re.findall(r"^  (s\d+) \[label=<(.*)>\];$", dot, re.M))


def test_shared_frames_once_with_the_number_of_tasks_through_them() -> None:
    dot = stacks.to_dot(server(50))
    got = boxes(dot)
    serve = [b for b in got.values() if "app::serve" in b]
    assert len(serve) == 1, "the shared frames are one box"
    assert "<b>50 tasks</b>" in serve[0] and "app::handle" in serve[0], "serve and handle: one run, 50 tasks"
    read = next(b for b in got.values() if "app::read" in b)
    write = next(b for b in got.values() if "app::write" in b)
    assert "<b>45 tasks</b>" in read and "<b>5 tasks</b>" in write
    assert "45 × waits on socket" in read and "5 × waits on socket" in write
    assert "executor [" in dot and "54 live tasks" in dot


def test_cycle_in_red_with_an_edge_each_way_and_the_blocked_task_behind_it() -> None:
    dot = stacks.to_dot(server(5))
    got = boxes(dot)
    red = {k for k, v in got.items() if f'color="{stacks.RED}"' in v}
    names = {k: re.search(r"app::\w+", v).group(0) for k, v in got.items()}  # type: ignore[union-attr]
    assert {names[k] for k in red} == {"app::lock_ab", "app::lock_ba"}
    cyc = re.findall(rf"^  (s\d+) -> (s\d+) \[color=\"{stacks.RED}\".*taillabel=\"#(\d) waits: (Mutex 0x\w+)\"", dot, re.M)
    assert {(names[a], names[b], t, r) for a, b, t, r in cyc} == {
        ("app::lock_ab", "app::lock_ba", "1", "Mutex 0x2000"), ("app::lock_ba", "app::lock_ab", "2", "Mutex 0x1000")}
    blocked = re.findall(r"^  (s\d+) -> (s\d+) \[color=\"#e07000\".*blocked behind", dot, re.M)
    assert [(names[a], names[b]) for a, b in blocked] == [("app::joiner", "app::lock_ab")]
    assert "running on thread 7" in got[next(k for k, n in names.items() if n == "app::main")]


def test_ten_thousand_tasks_stay_readable() -> None:
    """10,000 tasks at 10,000 different lines: the least shared stacks are folded, the picture
    keeps MAX_STACKS leaves and counts the rest."""
    dot = stacks.to_dot(server(10_000, distinct=10_000))
    got = boxes(dot)
    leaves = [v for v in got.values() if "waits on" in v or "running" in v or "more stacks" in v]
    assert len(leaves) <= stacks.MAX_STACKS + 1
    folded = [v for v in got.values() if "more stacks" in v]
    assert len(folded) == 1
    leaf_counts = [int(re.search(r"<b>(\d+) tasks?</b>", v).group(1)) for v in leaves]  # type: ignore[union-attr]
    assert sum(leaf_counts) == 10_004, "every task is counted once in a leaf"
    assert "<b>1000 tasks</b>" in next(v for v in leaves if "app::write" in v), "the most shared stack is kept"
    assert len(dot) < 200_000


def test_names_are_escaped_for_graphviz() -> None:
    snap = Snapshot(1, (task(1, [("app::run<T>", 3), ("app::f<&\"x\">", 4)]),))
    dot = stacks.to_dot(snap, title='a "quoted" title')
    assert "app::run&lt;T&gt;" in dot and "app::f&lt;&amp;&quot;x&quot;&gt;" in dot
    assert 'label="a \\"quoted\\" title"' in dot


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (apt-get install graphviz)")
def test_dot_renders_the_text_as_svg() -> None:
    svg, note = graphviz.svg_or_note(stacks.to_dot(server(20)))
    assert note is None and svg is not None and svg.startswith("<svg")
    assert svg.count('class="node"') == len(boxes(stacks.to_dot(server(20)))) + 1  # + the executor
    assert stacks.RED in svg


def test_missing_dot_is_said_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(graphviz, "find_dot", lambda: None)
    svg, note = graphviz.svg_or_note("digraph {}")
    assert svg is None and note == "Graphviz's dot is not on PATH: install Graphviz (Debian: apt-get install graphviz)"


def test_a_task_waiting_on_no_resource_says_its_innermost_leaf() -> None:
    t = task(5, [("app::sleeper", 59)])
    sleep = FutureNode("leaf", "tokio::time::Sleep", 0x77, "tokio::time::Sleep", detail="60.0 min left")
    t = t.replace(tree=FutureNode("coroutine", "app::sleeper", t.addr, t.type_name, t.tree.state, children=(sleep,)))
    dot = stacks.to_dot(Snapshot(1, (t, t.replace(id=6))))
    assert "2 × awaits tokio::time::Sleep" in dot
