"""The whole await graph as one JSON document (``qXfer:asyncrsp.graph:read``).

Schema ``asyncrsp.graph``, version 1. Addresses are hex strings ("0x...")
because JSON numbers lose precision past 2**53; everything else is plain
JSON. Fields may be added in later minor revisions without a version bump;
a field is removed or changes meaning only with a new ``version``.

    {
      "schema": "asyncrsp.graph",
      "version": 1,
      "complete": true,               // false after lost events, until resync
      "last_seq": 1234,               // seq of the last event folded (null: none)
      "binary": {"path": "...", "build_id": "...", "load_bias": "0x..."},
      "tasks": [{
        "id": 1, "label": "#1",
        "address": "0x7ffff7c0a010", "generation": 0,
        "type": "rt::a::{async_fn_env#0}",   // state-machine type (or resume fn name)
        "path": "rt::a",                      // the async fn / block
        "site": "0x5555...",                  // runtime low_pc of its resume fn
        "state": {"kind": "Suspended",        // Unresumed|Suspended|Running|Returned|Panicked|Unknown
                  "file": "src/main.rs", "line": 9,   // Suspended only (else null)
                  "suspend_index": 0,                  // Suspended only (null: not read yet)
                  "thread": null},                     // Running only
        "state_value": 3,                     // last known __state (null: unknown)
        "polls": 2, "last_thread": 4242,
        "parent": null, "root": true,         // parent: task id of the latest poller
        "first_seq": 1, "last_seq": 40,
        "busy_ns": 0, "idle_ns": 0,           // 0 when events carry no time
        "exits_missed": 0, "dropped": false
      }],
      "edges": [{
        "parent": 1, "child": 2,
        "callsite": {"file": "src/main.rs", "line": 9},   // from the child's return address
        "await": {"file": "src/main.rs", "line": 9},      // from the parent's suspend state
        "status": "pending",                              // pending|completed|dropped
        "first_seq": 2, "last_seq": 39
      }],
      "threads": [{"thread": 4242, "scopes": [           // poll scopes, outermost first
        {"task": 1, "site": "0x...", "sp": "0x...", "entry_seq": 38}]}],
      "stats": {"events": 40, "...": "every EngineStats field"},
      "proxy": {"...": "counters the proxy adds (probe hits, hidden stops, ...)"}
    }
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from proxy.analysis.model import SourceLoc
from proxy.graph.engine import Engine
from proxy.graph.model import Edge, StateKind, Task

SCHEMA = "asyncrsp.graph"
VERSION = 1


def graph_document(engine: Engine, proxy_stats: Mapping[str, object] | None = None) -> bytes:
    return json.dumps(graph_dict(engine, proxy_stats), separators=(",", ":")).encode()


def graph_dict(engine: Engine, proxy_stats: Mapping[str, object] | None = None) -> dict[str, object]:
    cat = engine.catalog
    stats = dataclasses.asdict(engine.stats())
    stats["rejected_reasons"] = dict(engine.stats().rejected_reasons)
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "complete": engine.complete,
        "last_seq": engine.cursor_seq,
        "binary": {
            "path": cat.inventory.path,
            "build_id": cat.inventory.build_id,
            "load_bias": _hex(cat.load_bias),
        },
        "tasks": [_task(t) for t in engine.tasks()],
        "edges": [_edge(e) for e in engine.edges()],
        "threads": [
            {"thread": th, "scopes": [
                {"task": s.task, "site": _hex(s.site), "sp": _hex(s.sp), "entry_seq": s.entry_seq}
                for s in engine.scopes(th)
            ]}
            for th in engine.threads()
        ],
        "stats": stats,
        "proxy": {str(k): _plain(v) for k, v in (proxy_stats or {}).items()},
    }


def _hex(v: int) -> str:
    return f"0x{v:x}"


def _loc(loc: SourceLoc | None) -> dict[str, object] | None:
    return None if loc is None else {"file": loc.file, "line": loc.line}


def _task(t: Task) -> dict[str, object]:
    st = t.state
    loc = st.loc if st.kind is StateKind.SUSPENDED else None
    return {
        "id": t.id, "label": t.label, "address": _hex(t.self_ptr), "generation": t.generation,
        "type": t.type_name, "path": t.path, "site": _hex(t.site),
        "state": {
            "kind": st.kind.value,
            "file": loc.file if loc else None, "line": loc.line if loc else None,
            "suspend_index": st.suspend_index, "thread": st.thread,
        },
        "state_value": t.state_value, "polls": t.polls, "last_thread": t.last_thread,
        "parent": t.parent, "root": t.is_root, "first_seq": t.first_seq, "last_seq": t.last_seq,
        "busy_ns": t.busy_ns, "idle_ns": t.idle_ns, "exits_missed": t.exits_missed,
        "dropped": t.dropped,
    }


def _edge(e: Edge) -> dict[str, object]:
    return {
        "parent": e.parent, "child": e.child,
        "callsite": _loc(e.callsite), "await": _loc(e.await_loc),
        "status": "completed" if e.completed else "dropped" if e.dropped else "pending",
        "first_seq": e.first_seq, "last_seq": e.last_seq,
    }


def _plain(v: object) -> object:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def graph_document_empty(note: str | None = None) -> bytes:
    """The document when there is no graph (no async code, capture off, not run yet)."""
    doc = {"schema": SCHEMA, "version": VERSION, "complete": False, "last_seq": None,
           "binary": None, "tasks": [], "edges": [], "threads": [], "stats": {}, "proxy": {},
           "note": note or "no await graph"}
    return json.dumps(doc, separators=(",", ":")).encode()
