"""The program's async state as one JSON document (``qXfer:asyncrsp.graph:read``).

Schema ``asyncrsp.graph``, version 2: rendered from the stop's snapshot
(proxy.snapshot), so every name, state and line is the one the monitor
commands print. Addresses are hex strings ("0x...") because JSON numbers lose
precision past 2**53. Fields may be added without a version bump; a field is
removed or changes meaning only with a new ``version``.

    {
      "schema": "asyncrsp.graph", "version": 2,
      "complete": true,               // false after lost events or unread memory
      "last_seq": 1234,               // seq of the last poll event folded (null: none)
      "binary": {"path": "...", "build_id": "...", "load_bias": "0x..."},
      "notes": ["..."],
      "tasks": [{                     // live tasks first, then finished ones still retained
        "id": 1, "label": "#1", "address": "0x7ffff7c0a010",
        "type": "rt::a::{async_fn_env#0}", "name": "rt::a",
        "state": {"kind": "suspended",         // running|suspended|not yet polled|finished|panicked|unknown
                  "thread": null, "file": "src/main.rs", "line": 9, "suspend_index": 0},
        "found_by": ["observed"], "header": "root, thread 7",
        "polls": 2, "busy_ns": 0, "idle_ns": 0, "last_thread": 7,   // null when not observed
        "stack": [{"level": 0, "name": "rt::c", "address": "0x...", "file": "...", "line": 2,
                   "executing": true, "resume_fn": "0x...", "inlined": false, "id": 4}],
        "tree": {"kind": "coroutine", "name": "rt::a", "address": "0x...", "state": {...},
                 "detail": "", "branch": null, "waits": null, "holds": [], "id": 1, "children": [...]},
        "holds": [{"resource": {"kind": "Mutex", "address": "0x..."}, "evidence": "..."}],
        "waits": [{"resource": {...}, "evidence": "...", "wakers": [4], "external": false}],
        // uprobe capture with its spawn and wake probes (docs/wakes.md), else absent:
        "spawn": {"file": "src/main.rs", "line": 88, "by": "#1 app::main", "thread": 7,
                  "logical": ["app::main at src/main.rs:88"], "frames": [{"name": "...", "file": "...",
                  "line": 3, "inlined": false}],
                  "runtime": "src/main.rs:88:5"},          // null: its spawn was not recorded
                  // runtime: the runtime's own location (tokio_unstable), else null
        "wakes": {"wakes": 3, "self_wakes": 0, "sched_ns": 1200, "sched_max_ns": 900, "clones": 2,
                  "drops": 1, "polls": 4, "last": [{"ns": 123, "waker": 1, "thread": 7}]}
      }],
      "finished": 412,                // finished coroutine instances since the start
      "waits": {"holds": [...], "waits": [...],       // as in each task, with "task": id
                "findings": [{"kind": "cycle", "tasks": [3, 4], "text": "cycle: ...", "evidence": [...]}]},
      "coroutines": [{"id": 4, "task": 1, "name": "rt::c", "address": "0x..."}],
      "edges": [{"parent": 1, "child": 2, "parent_name": "rt::a", "child_name": "rt::b",
                 "await": {"file": "src/main.rs", "line": 9},
                 "status": "pending", "first_seq": 2, "last_seq": 39}],   // observed edges
      "threads": [{"thread": 4242, "task": 1}],                              // task running on it
      "stats": {"events": 40, "...": "every EngineStats field"},
      "proxy": {"...": "counters the proxy adds (probe hits, hidden stops, ...)"}
    }
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping

from proxy.analysis.model import SourceLoc
from proxy.graph.engine import Engine
from proxy.snapshot.model import Frame, FutureNode, Hold, Resource, Snapshot, Task, TaskState, Wait

SCHEMA = "asyncrsp.graph"
VERSION = 2


def graph_document(snap: Snapshot, engine: Engine | None = None,
                   proxy_stats: Mapping[str, object] | None = None,
                   extra: Callable[[Task], Mapping[str, object]] | None = None) -> bytes:
    return json.dumps(graph_dict(snap, engine, proxy_stats, extra), separators=(",", ":")).encode()


def graph_dict(snap: Snapshot, engine: Engine | None = None,
               proxy_stats: Mapping[str, object] | None = None,
               extra: Callable[[Task], Mapping[str, object]] | None = None) -> dict[str, object]:
    """``extra``: more fields of each task (its spawn and wakes: ``proxy.origins.view``)."""
    stats: dict[str, object] = {}
    binary = None
    if engine is not None:
        stats = dataclasses.asdict(engine.stats())
        stats["rejected_reasons"] = dict(engine.stats().rejected_reasons)
        cat = engine.catalog
        binary = {"path": cat.inventory.path, "build_id": cat.inventory.build_id, "load_bias": _hex(cat.load_bias)}
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "complete": snap.complete,
        "last_seq": engine.cursor_seq if engine is not None else None,
        "binary": binary,
        "notes": list(snap.notes),
        "tasks": [{**_task(t), **(extra(t) if extra is not None else {})} for t in snap.tasks],
        "finished": snap.finished,
        "waits": {
            "holds": [{"task": h.task, **_hold(h)} for h in snap.waits.holds],
            "waits": [{"task": w.task, **_wait(w)} for w in snap.waits.waits],
            "findings": [{"kind": f.kind, "tasks": list(f.tasks), "text": f.text, "evidence": list(f.evidence)}
                         for f in snap.waits.findings],
        },
        "coroutines": [{"id": i, "task": tid, "name": n.name, "address": _hex(n.addr)}
                       for i, (tid, n) in sorted(snap.coroutines.items())],
        "edges": [{"parent": e.parent, "child": e.child, "parent_name": e.parent_name, "child_name": e.child_name,
                   "await": _loc(e.loc), "status": e.status, "first_seq": e.first_seq, "last_seq": e.last_seq}
                  for e in snap.edges],
        "threads": [{"thread": th, "task": task} for th, task in sorted(snap.threads.items())],
        "stats": stats,
        "proxy": {str(k): _plain(v) for k, v in (proxy_stats or {}).items()},
    }


def _hex(v: int | None) -> str | None:
    return None if v is None else f"0x{v:x}"


def _loc(loc: SourceLoc | None) -> dict[str, object] | None:
    return None if loc is None else {"file": loc.file, "line": loc.line}


def _state(st: TaskState | None) -> dict[str, object] | None:
    if st is None:
        return None
    return {"kind": st.kind.value, "thread": st.thread, "file": st.loc.file if st.loc else None,
            "line": st.loc.line if st.loc else None, "suspend_index": st.suspend_index}


def _res(r: Resource) -> dict[str, object]:
    return {"kind": r.kind, "address": _hex(r.addr)}


def _hold(h: Hold) -> dict[str, object]:
    return {"resource": _res(h.resource), "evidence": h.evidence}


def _wait(w: Wait) -> dict[str, object]:
    return {"resource": _res(w.resource), "evidence": w.evidence,
            "wakers": None if w.wakers is None else list(w.wakers), "external": w.external}


def _frame(f: Frame) -> dict[str, object]:
    return {"level": f.level, "name": f.name, "address": _hex(f.addr), "type": f.type_name,
            "file": f.loc.file if f.loc else None, "line": f.loc.line if f.loc else None,
            "executing": f.executing, "resume_fn": _hex(f.resume_fn), "inlined": f.inlined,
            "state_value": f.state_value, "id": f.id}


def _node(n: FutureNode) -> dict[str, object]:
    return {"kind": n.kind, "name": n.name, "address": _hex(n.addr), "type": n.type_name,
            "state": _state(n.state), "detail": n.detail, "branch": n.branch,
            "waits": _res(n.waits) if n.waits else None, "holds": [_res(h) for h in n.holds],
            "id": n.id, "children": [_node(c) for c in n.children]}


def _task(t: Task) -> dict[str, object]:
    s = t.stats
    return {
        "id": t.id, "label": t.label, "address": _hex(t.addr), "type": t.type_name, "name": t.name,
        "state": _state(t.state), "found_by": list(t.found_by), "header": t.header,
        "polls": s.polls if s else None, "busy_ns": s.busy_ns if s else None,
        "idle_ns": s.idle_ns if s else None, "last_thread": s.last_thread if s else None,
        "stack": [_frame(f) for f in t.stack], "tree": _node(t.tree),
        "holds": [_hold(h) for h in t.holds], "waits": [_wait(w) for w in t.waits],
    }


def _plain(v: object) -> object:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def graph_document_empty(note: str | None = None) -> bytes:
    """The document when there is no graph (no async code, capture off, not run yet)."""
    doc = {"schema": SCHEMA, "version": VERSION, "complete": False, "last_seq": None,
           "binary": None, "tasks": [], "finished": 0, "waits": {"holds": [], "waits": [], "findings": []},
           "coroutines": [], "edges": [], "threads": [], "stats": {}, "proxy": {},
           "note": note or "no await graph"}
    return json.dumps(doc, separators=(",", ":")).encode()
