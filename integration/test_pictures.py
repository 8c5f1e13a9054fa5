"""Pictures of a stop (proxy.pictures), end to end: real gdb -> asyncrsp -> gdbserver.

* The report page of the corpus `deadlock` program, written by `monitor async report` at its
  `ready` breakpoint, opened in headless Chromium (integration/harness/browser.py, the
  DevTools protocol): no console error, no request but the page's own file, one table row
  per task the program's source spawns (read from the source, not from our output), the
  rows of the two tasks of the Mutex cycle in red and nothing else, their boxes red in the
  parallel stacks, and the timeline drawn with one bar per recorded poll. The screenshot is
  kept as a test artifact (its path printed).
* The timeline file (`monitor async timeline`) against the capture's raw events: with
  tracepoint capture, every poll is a pair of frames gdbserver wrote into its trace buffer
  (entry: the return address read at sp; exit: sp in V3; both: fs_base in V2 and the
  timestamp in V1, µs). The frames are read back from the proxy's packet log
  (`--log-packets`), paired here by thread and sp, and each pair must be one complete
  slice with that entry time and duration, on the thread's track and on the track of the
  task whose poll was the outermost on that thread at the time.
"""

from __future__ import annotations

import html
import http.client
import json
import re
import shutil
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from integration.harness import packetlog
from integration.harness.browser import chromium, open_page
from integration.corpus import markers
from integration.harness.monitor import corpus_binary, session
from integration.harness.serve import asyncrsp, serve_core
from integration.harness.stubs import free_port, port_listening
from integration.harness.stuck import gcore, start_stuck

ROOT = Path(__file__).resolve().parents[1]

RED = "rgb(214, 39, 40)"  # proxy.pictures.stacks.RED, as the browser computes it
SRC = ROOT / "integration" / "corpus" / "src" / "bin" / "deadlock.rs"
ARTIFACTS = ROOT / "integration" / "build" / "artifacts"


def spawned_by_source(src: Path, crate: str) -> set[str]:
    """The async fns the program's source runs as tasks: `tokio::spawn(f(..))` and
    `block_on(f())` (the truth the table is checked against)."""
    text = src.read_text()
    names = set(re.findall(r"tokio::spawn\((\w+)\(", text)) | set(re.findall(r"block_on\((\w+)\(\)\)", text))
    return {f"{crate}::{n}" for n in names}


def ready_session(extra: list[str], commands: list[str]) -> str:
    prog = corpus_binary("debug", "deadlock")
    line = markers.breakpoint_markers("deadlock")["ready"][1]
    return session(prog, ["mt"], [f"break deadlock.rs:{line}", "continue", *commands], extra=extra)


def needs_browser() -> None:
    if chromium() is None:
        pytest.skip("chromium is not installed (Debian: apt-get install chromium)")
    pytest.importorskip("websocket", reason="websocket-client (the test extras) is not installed")
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed (Debian: apt-get install graphviz)")


def check_page(page: object, *, expected: set[str], cycle: set[str], others: str,
               timeline: bool = True) -> dict[str, object]:
    """What every report must show in the browser; returns the facts read."""
    facts = page.evaluate("""(() => {
      const timelineData = () => {
        const d = document.getElementById('trace-data');
        return d ? JSON.parse(d.textContent) : null;
      };
      const rows = Array.from(document.querySelectorAll('#task-table tbody tr'));
      const red = e => getComputedStyle(e).color;
      const nodes = Array.from(document.querySelectorAll('#stacks-svg g.node'));
      return {
        rows: rows.map(r => r.querySelector('td.fn').textContent),
        redRows: rows.filter(r => red(r.querySelector('td.fn')) === '%s').map(r => r.querySelector('td.fn').textContent),
        cycleLines: Array.from(document.querySelectorAll('.findings .cycle')).map(e => [e.textContent, red(e)]),
        redBoxes: nodes.filter(n => Array.from(n.querySelectorAll('polygon')).some(p => p.getAttribute('stroke') === '#d62728'))
                       .map(n => n.textContent),
        bars: document.querySelectorAll('#timeline-svg rect.poll').length,
        tracks: Array.from(document.querySelectorAll('#timeline-svg text.track')).map(t => t.getAttribute('data-name')),
        trace: timelineData(),
        noTimeline: (document.querySelector('#timeline + p.missing') || {}).textContent,
        trees: document.querySelectorAll('details.tree').length,
      };
    })()""" % RED)  # type: ignore[attr-defined]
    assert page.errors == [], page.errors  # type: ignore[attr-defined]
    assert page.requests and all(u.startswith(("file:", "data:")) for u in page.requests), page.requests  # type: ignore[attr-defined]
    rows = Counter(facts["rows"])
    for name in expected:
        assert rows[name] == 1, (name, facts["rows"])
    assert all(n in expected or re.match(others, n) for n in rows), facts["rows"]
    assert set(facts["redRows"]) == cycle, facts["redRows"]
    if cycle:
        assert len(facts["cycleLines"]) == 1 and facts["cycleLines"][0][1] == RED
        assert all(n in facts["cycleLines"][0][0] for n in cycle), facts["cycleLines"]
        assert {m for box in facts["redBoxes"] for m in re.findall(r"\w+::\w+", box) if m in cycle} == cycle
    else:
        assert facts["cycleLines"] == [] and facts["redBoxes"] == []
    if timeline:
        polls = [e for e in facts["trace"]["traceEvents"] if e["ph"] == "X" and e["pid"] == 1]
        assert polls and facts["bars"] == len(polls)
    else:
        assert facts["trace"] is None and facts["noTimeline"].startswith("no polls recorded: a one-shot look")
    assert facts["trees"] == len(facts["rows"])
    return facts


def test_deadlock_report_in_chromium(tmp_path: Path) -> None:
    """Under the default capture (uprobes where this host allows them); with uprobes the
    timeline has the wakes the kernel recorded: lock_ab and lock_ba meet at a Barrier, so the
    one that arrived first was woken by the other's poll (the source's `both.wait()`)."""
    needs_browser()
    html, trace = tmp_path / "deadlock.html", tmp_path / "deadlock.json"
    out = ready_session(["--capture", "auto", "--wakes"], [f"monitor async report {html}", f"monitor async timeline {trace}"])
    assert re.search(rf"^wrote {re.escape(str(html))}: \d+ live tasks, \d+ polls on the timeline$", out, re.M), out[-3000:]
    expected = spawned_by_source(SRC, "deadlock")
    assert len(expected) == 9, expected  # run and the eight tasks it spawns
    with open_page(html) as page:
        facts = check_page(page, expected=expected, cycle={"deadlock::lock_ab", "deadlock::lock_ba"},
                           others=r"tokio::")  # the runtime's own (spawn_blocking workers), found in memory
        # every task the source spawns was polled under capture: each has its track
        for name in expected:
            assert any(t.endswith(" " + name) for t in facts["tracks"]), (name, facts["tracks"])
        shot = page.screenshot(tmp_path / "deadlock-report.png")
    doc = json.loads(trace.read_text())
    names = {e["tid"]: e["args"]["name"].split()[-1] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["pid"] == 1 and e["name"] == "thread_name"}
    pair = {"deadlock::lock_ab", "deadlock::lock_ba"}
    # A lock task polled twice was woken in between, and by the source only the other one can
    # have woken it (its arrival at the Barrier; the second lock is never released). The
    # source does not promise that wake: tokio's Barrier waits on a watch channel, and when
    # the second task arrives before the first one polls `changed()` both pass in their first
    # poll (seen under load: one poll each, no wake at all).
    root_polls = Counter(names[e["tid"]] for e in doc["traceEvents"]
                         if e.get("cat") == "poll" and e["pid"] == 1 and e["args"]["coroutine"] == e["args"]["task"])
    if "wakes: the newest" not in doc["otherData"]["note"]:
        print(f"no wakes recorded by this capture: {doc['otherData']['note']}")
    elif max(root_polls[n] for n in pair) < 2:
        print(f"no wake to record: lock_ab and lock_ba passed the Barrier in their first polls ({root_polls})")
    else:
        woken = {(names[e["tid"]], e["args"]["by"]) for e in doc["traceEvents"] if e.get("cat") == "wake" and e["ph"] == "i"}
        by_name = {f"task #{tid}": name for tid, name in names.items()}
        assert any(w in pair and by_name.get(b) in pair - {w} for w, b in woken), (woken, root_polls)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    kept = ARTIFACTS / "deadlock-report.png"
    shutil.copyfile(shot, kept)
    print(f"screenshot: {kept}")


def test_tree_html_of_a_process_and_of_its_core(tmp_path: Path) -> None:
    """`asyncrsp tree PID --html` and `tree --core CORE --html` of `stuck` (a one-shot look:
    no timeline), and `monitor async report` through `serve --core` of the same core; the
    program goes on."""
    needs_browser()
    prog = corpus_binary("debug", "stuck")
    p = start_stuck(prog, tmp_path)
    try:
        live = asyncrsp("tree", str(p.pid), "--html", str(tmp_path / "live.html"))
        core = gcore(p.pid, tmp_path / "g")
        assert p.poll() is None, "the program died"
    finally:
        p.kill()
        p.wait()
    from_core = asyncrsp("tree", "--core", str(core), "--html", str(tmp_path / "core.html"))
    served = serve_core(core, prog, [f"monitor async report {tmp_path / 'served.html'}"])
    assert f"wrote {tmp_path / 'served.html'}: " in served, served[-3000:]
    expected = spawned_by_source(SRC.with_name("stuck.rs"), "stuck")
    assert len(expected) == 6, expected
    with open_page(tmp_path / "served.html") as page:
        check_page(page, expected=expected, cycle={"stuck::lock_ab", "stuck::lock_ba"}, others=r"tokio::",
                   timeline=False)
    for done, page_file in ((live, "live.html"), (from_core, "core.html")):
        assert done.returncode == 0 and done.stdout == "", done.stderr
        assert re.fullmatch(rf"asyncrsp: wrote {re.escape(str(tmp_path / page_file))}: \d+ live tasks, 0 polls "
                            r"on the timeline\n", done.stderr), done.stderr
        with open_page(tmp_path / page_file) as page:
            check_page(page, expected=expected, cycle={"stuck::lock_ab", "stuck::lock_ba"}, others=r"tokio::",
                       timeline=False)


def test_ten_thousand_tasks_are_one_box(tmp_path: Path) -> None:
    """`many_tasks 10000`: 10,000 tasks in `waiter -> chain -> notified`, all waiting on one Notify
    (the program's own report says so); `tree PID --html` draws them as one box that counts them,
    its three frames at the source's await lines."""
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed (Debian: apt-get install graphviz)")
    prog = corpus_binary("debug", "many_tasks")
    p = subprocess.Popen([str(prog), "10000", "mt"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        assert p.stdout.readline().startswith("ready tasks=10000 ")
        done = asyncrsp("tree", str(p.pid), "--html", str(tmp_path / "many.html"))
    finally:
        p.kill()
        p.wait()
    assert done.returncode == 0, done.stderr
    svg = re.search(r'<div class="figure" id="stacks-svg">(.*?)</div>', (tmp_path / "many.html").read_text(), re.S)
    assert svg is not None
    texts = [html.unescape(t).strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg.group(1))]
    box = texts[texts.index("10000 tasks"):]
    lines = {m.parent: m.line for m in markers.await_markers("many_tasks")}
    assert box[3:10] == ["many_tasks::waiter", f"bin/many_tasks.rs:{lines['waiter']}",
                        "many_tasks::chain", f"bin/many_tasks.rs:{lines['chain']}",
                        "many_tasks::notified", f"bin/many_tasks.rs:{lines['notified']}",
                        "10000 × waits on Notify"], box
    assert svg.group(1).count('class="node"') <= 4, "the executor, the 10,000 and the runtime's own"


CONNECTIONS = 4


def _load(port: int, stop: threading.Event, served: list[int], barrier: threading.Barrier,
          path: str = "/", answer: bytes = b"ok ") -> None:
    """One keep-alive connection: opened with the others (the barrier), then GET `path` in a
    loop (`answer`: how a served reply starts)."""
    deadline = time.monotonic() + 120
    while not port_listening(port):
        if time.monotonic() > deadline or stop.is_set():
            return
        time.sleep(0.05)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        conn.connect()
        barrier.wait(timeout=120)
        while not stop.is_set():
            conn.request("GET", path)
            if conn.getresponse().read().startswith(answer):
                served.append(1)
    except (OSError, http.client.HTTPException, threading.BrokenBarrierError):
        pass  # the server was killed under the load: the end of the test's session
    finally:
        conn.close()


def test_server_under_load_report_in_chromium(tmp_path: Path) -> None:
    """The server benchmark's axum service (release) under load: 4 keep-alive connections from
    this test's client threads, stopped in a `backend` task after 12 requests; the report shows
    one connection task per open connection, the main task, the task axum's serve spawns for the
    graceful-shutdown future, and the backend tasks."""
    needs_browser()
    from bench.server import build_server

    if build_server.missing("bare"):
        pytest.skip(str(build_server.missing("bare")))
    prog = build_server.binary("bare")
    src = ROOT / "bench" / "server" / "src" / "bin" / "axum_server.rs"
    lines = src.read_text().splitlines()
    send = next(i for i, text in enumerate(lines, 1) if "reply.send(" in text)
    main_block = next(i for i, text in enumerate(lines, 1) if "rt.block_on(async {" in text)
    port = free_port()
    stop, served = threading.Event(), []  # type: ignore[var-annotated]
    barrier = threading.Barrier(CONNECTIONS)
    clients = [threading.Thread(target=_load, args=(port, stop, served, barrier), daemon=True)
               for _ in range(CONNECTIONS)]
    for c in clients:
        c.start()
    html, trace = tmp_path / "server.html", tmp_path / "server.json"
    try:
        out = session(prog, [str(port)], [f"break axum_server.rs:{send}", "ignore 1 12", "continue",
                                          f"monitor async report {html}", f"monitor async timeline {trace}",
                                          "monitor async stats --all"],
                      extra=["--capture", "auto"])
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=30)
    assert re.search(rf"^wrote {re.escape(str(html))}: \d+ live tasks, \d+ polls on the timeline$", out, re.M), out[-3000:]
    assert len(served) >= 8, len(served)  # (the last few answers may still be on their way at the stop)
    capture = "\n".join(line for line in out.splitlines() if line.startswith("capture"))
    assert json.loads(trace.read_text())["otherData"]["polls"] > 0, f"no poll recorded:\n{capture}"
    with open_page(html) as page:
        facts = check_page(page, expected={f"axum_server::main::{{async_block@{main_block}}}"}, cycle=set(),
                           others=r"tokio::|axum_server::backend$|axum::serve::handle_connection|axum::serve::.*::run::")
        rows = facts["rows"]
        conns = [r for r in rows if "handle_connection" in r]  # type: ignore[union-attr]
        assert len(conns) == CONNECTIONS, rows
        # `with_graceful_shutdown(async move { .. })`: axum's serve runs the signal future in a task of its own
        assert len([r for r in rows if re.match(r"axum::serve::.*::run::", r)]) == 1, rows  # type: ignore[arg-type]
        assert 1 <= rows.count("axum_server::backend") <= CONNECTIONS, rows  # type: ignore[union-attr]
        shot = page.screenshot(tmp_path / "server-report.png")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    kept = ARTIFACTS / "server-report.png"
    shutil.copyfile(shot, kept)
    print(f"screenshot: {kept}")


def test_realworld_server_under_load_report_in_chromium(tmp_path: Path) -> None:
    """tokio's tinyhttp (../shared/realworld: tokio's own example, built against Debian sid's
    crates) under load: CONNECTIONS keep-alive clients send requests back to back, and gdb stops
    it in `respond` after 12 requests. The report's table has main's block once and one
    connection task per open connection: their names are the truth table's (written from the
    program's source: integration/realworld/truth/tokio_tinyhttp.toml), the counts the test's."""
    needs_browser()
    from integration.corpus import build
    from integration.realworld.truth import SHARED, TRUTH_DIR, load

    if not SHARED.is_dir():
        pytest.skip(f"no {SHARED}: the real programs live beside the project (../shared/realworld)")
    if build.skip_reason("realworld-debug") is not None:
        pytest.skip(str(build.skip_reason("realworld-debug")))
    table = load(TRUTH_DIR / "tokio_tinyhttp.toml")
    main_task, conn_task = (t.name for t in table.states[0].tasks)
    prog = build.pinned(build.binary("realworld-debug", "tokio_tinyhttp"))
    lines = table.source.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if '"Hello, World!".to_string()' in text)
    port = free_port()
    stop, served = threading.Event(), []  # type: ignore[var-annotated]
    barrier = threading.Barrier(CONNECTIONS)
    clients = [threading.Thread(target=_load, args=(port, stop, served, barrier, "/plaintext", b"Hello, World!"),
                                daemon=True) for _ in range(CONNECTIONS)]
    for c in clients:
        c.start()
    html_path, stacks = tmp_path / "tinyhttp.html", tmp_path / "tinyhttp-stacks.png"
    try:
        out = session(prog, [f"127.0.0.1:{port}"], [f"break {table.source.name}:{line}", "ignore 1 12", "continue",
                                                    f"monitor async report {html_path}", f"monitor async stacks {stacks}"],
                      extra=["--capture", "auto"])
    finally:
        stop.set()
        for c in clients:
            c.join(timeout=30)
    assert re.search(rf"^wrote {re.escape(str(html_path))}: \d+ live tasks, \d+ polls on the timeline$", out, re.M), \
        out[-3000:]
    assert len(served) >= 8, len(served)
    assert f"wrote {stacks}: the parallel stacks of" in out and stacks.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", out[-2000:]
    with open_page(html_path) as page:
        # the runtime's own rows (its workers run as blocking tasks: `tokio::task::spawn_blocking(runtime worker)`)
        facts = check_page(page, expected={main_task}, cycle=set(), others=re.escape(conn_task) + "$|tokio::")
        assert Counter(facts["rows"])[conn_task] == CONNECTIONS, facts["rows"]  # type: ignore[arg-type]
        shot = page.screenshot(tmp_path / "tinyhttp-report.png")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    kept = ARTIFACTS / "tinyhttp-report.png"
    shutil.copyfile(shot, kept)
    shutil.copyfile(stacks, ARTIFACTS / "tinyhttp-stacks.png")
    print(f"screenshot: {kept}")


def _polls_from_frames(log: Path) -> tuple[Counter[tuple[int, int, int, int]], int]:
    """(fs_base, entry µs, exit µs, the outermost entry µs on that thread) of every poll the
    drained frames hold, and the number of tracepoint hits gdbserver reported as stops."""
    with log.open(encoding="latin-1") as fh:
        packets = list(packetlog.read_log(fh))
    hits = packetlog.TraceHits()
    open_: dict[int, list[tuple[int, int]]] = {}  # fs_base -> [(sp, entry µs)]
    polls: Counter[tuple[int, int, int, int]] = Counter()
    for fr in packetlog.drained_frames(packets, hits):
        v = fr.variables()
        fs, ts = v.get(2), v.get(1)  # proxy/capture/trace_program.py: TSV_FS_BASE, TIMESTAMP_TSV
        if fs is None or ts is None:
            continue
        stack = open_.setdefault(fs, [])
        if 3 in v:  # an exit: sp in V3
            sp = v[3] & 0xFFFFFFFFFFFFFFFF
            at = [i for i, (s, _) in enumerate(stack) if s == sp]
            if at:
                i = at[-1]
                entry = stack[i][1]
                del stack[i:]
                polls[(fs, entry, ts, stack[0][1] if stack else entry)] += 1
        else:  # an entry: the return address read at sp (its second memory block)
            mem = fr.memory()
            if len(mem) >= 2:
                stack.append((mem[1].addr, ts))
    stops = sum(packetlog.trace_hits(packets).stops.values())
    return polls, stops


def test_timeline_slices_are_the_polls_the_capture_recorded(tmp_path: Path) -> None:
    log, trace = tmp_path / "packets.log", tmp_path / "timeline.json"
    out = ready_session(["--capture", "tracepoints", "--log-packets", str(log)], [f"monitor async timeline {trace}"])
    assert f"wrote {trace}: " in out, out[-3000:]
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    assert all(e["ph"] in ("M", "X", "s", "f", "i") for e in events)
    slices = [e for e in events if e["ph"] == "X"]
    on_tasks = [e for e in slices if e["pid"] == 1]
    on_threads = [e for e in slices if e["pid"] == 2]
    assert all(set(e) >= {"name", "ts", "dur", "pid", "tid", "args"} and e["dur"] >= 0 for e in slices)
    want, stopped = _polls_from_frames(log)
    assert sum(want.values()) > 20, want
    # every poll once on each side; a hit gdbserver reported as a stop is recorded by the proxy
    # from the live thread (not in a frame): at most that many polls more
    assert len(on_tasks) == len(on_threads) == doc["otherData"]["polls"]
    assert 0 <= len(on_threads) - sum(want.values()) <= 2 * stopped
    threads: dict[int, int] = {}  # fs_base -> the LWP of its track
    for (fs, enter, exit_, outer), n in want.items():
        got = [e for e in on_threads if round(e["ts"]) == enter and round(e["ts"] + e["dur"]) == exit_]
        assert len(got) == n, ((fs, enter, exit_), got)
        for e in got:
            assert threads.setdefault(fs, e["tid"]) == e["tid"], "a thread's polls on one track"
            assert e["ts"] == enter and e["dur"] == exit_ - enter  # µs, exactly as recorded
            root = [r for r in on_threads if r["tid"] == e["tid"] and r["ts"] == outer]
            assert len(root) == 1
            mate = [t for t in on_tasks if t["args"] == e["args"]]
            assert len(mate) == 1 and mate[0]["ts"] == e["ts"] and mate[0]["dur"] == e["dur"]
            assert mate[0]["tid"] == root[0]["args"]["coroutine"], (e, root[0])  # the task's track
    assert len(set(threads.values())) == len(threads), "one track per thread"
