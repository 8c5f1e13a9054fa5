"""One self-contained HTML page of the stop (pure): nothing is fetched, no server.

Sections: the tasks (one row per live task), the deadlock findings (a cycle's
lines in red), the parallel stacks and the wait-for graph (inline SVG made by
``graphviz``, or the reason there is none), the timeline of the recorded polls
(the trace document of ``timeline`` embedded as JSON and drawn as SVG by a
small inline script), and each task's pending-future tree. Every name, state
and line is the monitor commands' own (the same snapshot and renderers).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any

from proxy.commands.tree import render_task
from proxy.commands.waits import render_deadlocks, render_waits
from proxy.pictures.stacks import cycles
from proxy.snapshot.model import Snapshot, Task

MAX_TREES = 500  # task trees written out in full; the rest are counted


@dataclass(slots=True)
class Figures:
    """What the pure page puts together: the SVGs (or why there are none) and the trace."""

    stacks_svg: str | None = None
    stacks_note: str | None = None
    waits_svg: str | None = None
    waits_note: str | None = None
    trace: dict[str, Any] | None = None
    trace_note: str | None = None


def page(snap: Snapshot, figures: Figures, *, title: str, subtitle: str = "") -> str:
    live = snap.live()
    parts = [_head(title), f"<h1>{_e(title)}</h1>"]
    if subtitle:
        parts.append(f'<p class="sub">{_e(subtitle)}</p>')
    parts += [f'<p class="note">{_e(n)}</p>' for n in snap.notes]
    parts.append('<nav><a href="#tasks">tasks</a> · <a href="#deadlocks">deadlocks</a> · '
                 '<a href="#stacks">parallel stacks</a> · <a href="#waits">wait-for graph</a> · '
                 '<a href="#timeline">timeline</a> · <a href="#trees">trees</a></nav>')
    parts += _tasks(snap, live)
    parts += _deadlocks(snap)
    parts += _figure("stacks", "Parallel stacks", figures.stacks_svg, figures.stacks_note)
    parts += _figure("waits", "Wait-for graph", figures.waits_svg, figures.waits_note)
    parts.append(f'<details><summary>as text</summary><pre>{_e(render_waits(snap))}</pre></details>')
    parts += _timeline(figures.trace, figures.trace_note)
    parts += _trees(live)
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _tasks(snap: Snapshot, live: list[Task]) -> list[str]:
    red = {t for c in cycles(snap) for t in c}
    out = [f'<h2 id="tasks">Tasks <span class="count">{len(live)} live</span></h2>',
           '<table id="task-table"><thead><tr><th>ID</th><th>STATE</th><th>AT</th><th>POLLS</th>'
           "<th>THREAD</th><th>FOUND BY</th><th>ASYNC FN</th><th>WAITS ON</th></tr></thead><tbody>"]
    for t in live:
        s = t.stats
        thread = t.state.thread if t.state.thread is not None else (s.last_thread if s is not None else None)
        waits = "; ".join(str(w.resource) for w in t.waits)
        cls = ' class="cycle"' if t.id in red else ""
        out.append(f'<tr{cls} data-task="{t.id}"><td>{t.label}</td><td>{_e(t.state.word)}</td>'
                   f"<td>{_e(str(t.location or '-'))}</td><td>{s.polls if s else '-'}</td>"
                   f"<td>{thread if thread is not None else '-'}</td><td>{_e(', '.join(t.found_by))}</td>"
                   f'<td class="fn">{_e(t.name)}</td><td>{_e(waits)}</td></tr>')
    out.append("</tbody></table>")
    if snap.finished:
        out.append(f'<p class="note">{snap.finished} finished since the start</p>')
    return out


def _deadlocks(snap: Snapshot) -> list[str]:
    out = ['<h2 id="deadlocks">Deadlocks</h2>', '<pre class="findings">']
    for line in render_deadlocks(snap).splitlines():
        cls = "cycle" if line.startswith("cycle:") else "finding" if not line.startswith(" ") else ""
        out.append(f'<span class="{cls}">{_e(line)}</span>' if cls else _e(line))
    out.append("</pre>")
    return out


def _figure(anchor: str, title: str, svg: str | None, note: str | None) -> list[str]:
    out = [f'<h2 id="{anchor}">{title}</h2>']
    if svg is not None:
        out.append(f'<div class="figure" id="{anchor}-svg">{svg}</div>')
    else:
        out.append(f'<p class="missing">not drawn: {_e(note or "no picture")}</p>')
    return out


def _timeline(trace: dict[str, Any] | None, note: str | None) -> list[str]:
    out = ['<h2 id="timeline">Timeline</h2>']
    if trace is None:
        out.append(f'<p class="missing">{_e(note or "no polls recorded")}</p>')
        return out
    if note:
        out.append(f'<p class="note">{_e(note)}</p>')
    # no "<" at all inside the script element: nothing a name holds can end it or open a comment
    data = json.dumps(trace, separators=(",", ":")).replace("<", "\\u003c")
    out += ['<p class="note">One row per task; each poll a bar (nested: the coroutines it polled), '
            "stops as red lines, wakes (where recorded) as orange ticks; hover a bar for its coroutine and duration. The same data as the "
            "Chrome trace (<code>monitor async timeline FILE.json</code>) that Perfetto's UI opens.</p>",
            '<div id="timeline-view"></div>',
            f'<script type="application/json" id="trace-data">{data}</script>',
            f"<script>{_TIMELINE_JS}</script>"]
    return out


def _trees(live: list[Task]) -> list[str]:
    out = ['<h2 id="trees">Each task\'s tree</h2>']
    for t in live[:MAX_TREES]:
        text = "\n".join(render_task(t))
        out.append(f'<details class="tree" data-task="{t.id}"><summary>{t.label} {_e(t.name)} '
                   f"— {_e(t.state.word)}</summary><pre>{_e(text)}</pre></details>")
    if len(live) > MAX_TREES:
        out.append(f'<p class="note">… {len(live) - MAX_TREES} more trees (monitor async tree)</p>')
    return out


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _head(title: str) -> str:
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{_e(title)}</title>
<style>{_CSS}</style></head><body>"""


_CSS = """
body { font: 13px/1.4 "DejaVu Sans", sans-serif; margin: 16px 24px; color: #222; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 8px;
  border-bottom: 1px solid #ccd; } .count { color: #777; font-weight: normal; font-size: 13px; }
.sub, .note { color: #555; margin: 2px 0; } .missing { color: #a05000; }
nav { margin: 8px 0; } a { color: #2a5a9a; }
table { border-collapse: collapse; } th, td { padding: 2px 8px; text-align: left; vertical-align: top; }
th { background: #e8eef5; position: sticky; top: 0; } tr:nth-child(even) td { background: #f6f8fa; }
td.fn { font-family: "DejaVu Sans Mono", monospace; }
tr.cycle td { color: #d62728; font-weight: bold; }
pre { font: 12px/1.35 "DejaVu Sans Mono", monospace; background: #f6f8fa; padding: 6px 8px; overflow-x: auto; }
.findings .cycle { color: #d62728; font-weight: bold; } .findings .finding { color: #a05000; }
.figure { overflow: auto; border: 1px solid #dde; padding: 4px; }
.figure svg { max-width: 100%; height: auto; }
details.tree summary { cursor: pointer; font-family: "DejaVu Sans Mono", monospace; }
#timeline-view { overflow-x: auto; border: 1px solid #dde; }
#timeline-view text { font: 10px "DejaVu Sans", sans-serif; }
"""

# Draws the trace's task tracks (pid 1) as SVG: rows per task, a poll's nesting
# depth from the slices' times, stops as lines. No library, nothing fetched.
_TIMELINE_JS = """
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var trace = JSON.parse(document.getElementById("trace-data").textContent);
  var view = document.getElementById("timeline-view");
  var tracks = {}, names = {}, stops = [], wakes = [], rows = {}, t0 = Infinity, t1 = -Infinity;
  trace.traceEvents.forEach(function (e) {
    if (e.ph === "M" && e.pid === 1 && e.name === "thread_name") { names[e.tid] = e.args.name; }
    if (e.ph === "X" && e.pid === 1) {
      (tracks[e.tid] = tracks[e.tid] || []).push(e);
      t0 = Math.min(t0, e.ts); t1 = Math.max(t1, e.ts + e.dur);
    }
    if (e.ph === "i" && e.cat === "stop") { stops.push(e); }
    if (e.ph === "i" && e.cat === "wake") { wakes.push(e); }
  });
  var ids = Object.keys(tracks);
  if (ids.length === 0) { view.textContent = "no polls recorded"; return; }
  var early = stops.filter(function (s) { return s.ts < t0; }).length;
  stops = stops.filter(function (s) { return s.ts >= t0; });  // the axis starts at the first poll kept
  stops.forEach(function (s) { t1 = Math.max(t1, s.ts); });
  var LABEL = 260, WIDTH = Math.max(view.clientWidth - 4, 900), ROW = 9, GAP = 6, span = Math.max(t1 - t0, 1);
  var x = function (ts) { return LABEL + (ts - t0) / span * (WIDTH - LABEL - 10); };
  var svg = document.createElementNS(NS, "svg"), y = 26;
  function el(tag, attrs, parent) {
    var n = document.createElementNS(NS, tag);
    Object.keys(attrs).forEach(function (k) { n.setAttribute(k, attrs[k]); });
    (parent || svg).appendChild(n); return n;
  }
  var axis = el("text", {x: LABEL, y: 12});
  axis.textContent = "0 to " + (span / 1000).toFixed(3) + " ms (" + trace.otherData.polls + " polls" +
    (early ? "; " + early + " earlier stops not drawn" : "") + ")";
  var palette = ["#4e79a7", "#59a14f", "#9c755f", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#bab0ac"];
  ids.sort(function (a, b) { return a - b; }).forEach(function (tid) {
    var slices = tracks[tid].sort(function (a, b) { return a.ts - b.ts || b.dur - a.dur; });
    var open = [], depth = 0;
    slices.forEach(function (s) {
      while (open.length && open[open.length - 1] <= s.ts) { open.pop(); }
      s.depth = open.length; open.push(s.ts + s.dur); depth = Math.max(depth, open.length);
    });
    var h = depth * ROW;
    rows[tid] = y;
    var label = el("text", {x: 4, y: y + 9, "class": "track", "data-name": names[tid] || ("task #" + tid)});
    var name = names[tid] || ("task #" + tid);
    label.textContent = name.length > 44 ? name.slice(0, 43) + "…" : name;
    el("title", {}, label).textContent = name;
    var g = el("g", {"class": "track", "data-task": tid});
    slices.forEach(function (s) {
      var r = el("rect", {x: x(s.ts), y: y + s.depth * ROW, width: Math.max(x(s.ts + s.dur) - x(s.ts), 1),
                          height: ROW - 1, fill: palette[s.depth % palette.length], "class": "poll"}, g);
      var t = el("title", {}, r);
      t.textContent = s.name + "  " + s.dur.toFixed(3) + " µs  (thread " + s.args.thread + ")";
    });
    y += h + GAP;
  });
  wakes.forEach(function (w) {  // a tick above the woken task's row
    if (rows[w.tid] === undefined || w.ts < t0) { return; }
    var m = el("line", {x1: x(w.ts), x2: x(w.ts), y1: rows[w.tid] - 3, y2: rows[w.tid] + 2, stroke: "#e07000",
                        "stroke-width": 2, "class": "wake"});
    el("title", {}, m).textContent = "woken by " + w.args.by + " (thread " + w.args.thread + ")";
  });
  var lastLabel = -Infinity;
  stops.forEach(function (s) {
    el("line", {x1: x(s.ts), x2: x(s.ts), y1: 16, y2: y, stroke: "#d62728", "stroke-dasharray": "3,2",
                "class": "stop"});
    if (x(s.ts) - lastLabel < 60) { return; }  // dense stops: a label where there is room
    lastLabel = x(s.ts);
    var right = x(s.ts) > WIDTH - 80;
    var t = el("text", {x: x(s.ts) + (right ? -2 : 2), y: 22, fill: "#d62728",
                        "text-anchor": right ? "end" : "start"});
    t.textContent = s.name;
  });
  svg.setAttribute("width", WIDTH); svg.setAttribute("height", y + 4);
  svg.setAttribute("id", "timeline-svg");
  view.appendChild(svg);
})();
"""
