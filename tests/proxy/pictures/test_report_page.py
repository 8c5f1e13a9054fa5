"""The HTML report (proxy.pictures.report) and the commands that write pictures, pure parts.

A page must carry everything it shows (no URL it would fetch), survive any text the
program's names hold, and name every live task once."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from proxy.commands.monitor import MonitorContext, run_monitor
from proxy.pictures import files, report
from proxy.snapshot.model import Snapshot
from tests.proxy.graph.graphfix import Script, engine
from tests.proxy.pictures.server import server, task


def _page(snap: Snapshot, trace: dict | None = None, svg: str | None = "<svg></svg>") -> str:  # type: ignore[type-arg]
    figs = report.Figures(svg, None if svg else "dot missing", svg, None if svg else "dot missing", trace,
                          None if trace else "no polls recorded")
    return report.page(snap, figs, title="t", subtitle="s")


def test_every_live_task_once_and_the_cycle_rows_marked() -> None:
    snap = server(30)
    html = _page(snap)
    rows = re.findall(r'<tr(?: class="cycle")? data-task="(\d+)">', html)
    assert sorted(map(int, rows)) == sorted(t.id for t in snap.live())
    assert sorted(re.findall(r'<tr class="cycle" data-task="(\d+)">', html)) == ["1", "2"]
    assert html.count('<details class="tree"') == len(snap.live())
    assert '<span class="cycle">cycle: #1' in html


def test_nothing_is_fetched_and_names_cannot_break_out() -> None:
    evil = "app::f</script><script>alert(1)</script>"
    snap = Snapshot(1, (task(1, [(evil, 3)]),))
    s = Script()
    s.enter("a", 0xA0); s.exit(3)
    e = engine()
    e.feed_many(s.events)
    trace = files.trace_of(e, snap)
    assert trace is not None
    trace["traceEvents"][-1]["name"] = evil  # the worst a name could hold, inside the embedded JSON
    html = _page(snap, trace)
    assert "<script>alert(1)" not in html
    assert not re.search(r'(?:src|href)="(?!#)', html), "a URL the page would load"
    assert "@import" not in html and "url(" not in html
    data = re.search(r'<script type="application/json" id="trace-data">(.*?)</script>', html, re.S)
    assert data is not None and json.loads(data.group(1))["traceEvents"][-1]["name"] == evil


def test_without_dot_or_polls_the_page_says_why() -> None:
    html = _page(server(3), trace=None, svg=None)
    assert html.count('<p class="missing">not drawn: dot missing</p>') == 2
    assert '<p class="missing">no polls recorded</p>' in html and "trace-data" not in html


def test_monitor_commands_write_through_the_sessions_callable(tmp_path: Path) -> None:
    snap = server(3)
    calls: list[tuple[str, str]] = []

    def pictures(name: str, path: str, s: Snapshot) -> str:
        assert s is snap
        calls.append((name, path))
        return f"wrote {path}"

    ctx = MonitorContext(None, snapshot=lambda: snap, pictures=pictures)
    assert run_monitor("async report r.html", ctx) == "wrote r.html"
    assert run_monitor("timeline t.json", ctx) == "wrote t.json"
    assert run_monitor("stacks s.svg", ctx) == "wrote s.svg"
    assert calls == [("report", "r.html"), ("timeline", "t.json"), ("stacks", "s.svg")]
    assert run_monitor("report", ctx) == "asyncrsp: usage: report FILE.html"
    assert run_monitor("report a b", ctx) == "asyncrsp: usage: report FILE.html"
    no = MonitorContext(None, snapshot=lambda: snap)
    assert run_monitor("timeline t.json", no) == "asyncrsp: 'timeline' is not available in this session"


def test_files_write_whole_files_or_say_why(tmp_path: Path) -> None:
    snap = server(3)
    line = files.write_stacks(str(tmp_path / "s.dot"), snap)
    assert line == f"wrote {tmp_path / 's.dot'}: the parallel stacks of 7 live tasks"
    assert (tmp_path / "s.dot").read_text().startswith("digraph parallel_stacks {")
    with pytest.raises(files.PictureError, match=r"^cannot write .*/nope/s\.dot: No such file or directory$"):
        files.write_stacks(str(tmp_path / "nope" / "s.dot"), snap)
    with pytest.raises(files.PictureError, match="^no polls recorded"):
        files.write_timeline(str(tmp_path / "t.json"), None, snap)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.dot"], "no temporary file left behind"
