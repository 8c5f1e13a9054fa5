"""The versioned JSON graph document."""

from __future__ import annotations

import json

from tests.proxy.graph.graphfix import BIAS, Script, engine, snapshot

from proxy.commands.document import SCHEMA, VERSION, graph_document


def test_document_of_a_small_graph() -> None:
    s = Script()
    s.enter("sel", 0x200000); s.enter("x", 0x200100); s.exit(3); s.enter("y", 0x200200); s.exit(1)
    e = engine()
    e.feed_many(s.events)
    doc = json.loads(graph_document(snapshot(e), e, {"hidden stops": 5, "obj": object()}))
    assert (doc["schema"], doc["version"]) == (SCHEMA, VERSION) == ("asyncrsp.graph", 2)
    assert doc["complete"] is True and doc["last_seq"] == 5
    assert doc["binary"] == {"path": "/tmp/prog", "build_id": "f00d", "load_bias": hex(BIAS)}
    (task,) = doc["tasks"]  # sel, running on thread 1: x is pending below it, y completed
    assert task["label"] == "#1" and task["name"] == "rt::sel" and task["found_by"] == ["observed"]
    assert task["state"] == {"kind": "running", "thread": 1, "file": None, "line": None, "suspend_index": None}  # no pc given
    x = task["tree"]["children"][0]
    assert x["name"] == "rt::x" and x["address"] == "0x200100" and x["id"] == 2
    assert x["state"] == {"kind": "suspended", "file": "src/main.rs", "line": 13, "suspend_index": 0, "thread": None}
    assert [f["name"] for f in task["stack"]] == ["rt::x", "rt::sel"]
    assert [(d["child"], d["status"]) for d in doc["edges"]] == [(2, "pending"), (3, "completed")]
    assert doc["edges"][0]["await"] == {"file": "src/main.rs", "line": 21}
    assert doc["threads"] == [{"thread": 1, "task": 1}]
    assert doc["waits"] == {"holds": [], "waits": [], "findings": []}
    assert doc["stats"]["events"] == 5 and doc["stats"]["rejected_reasons"] == {}
    assert doc["proxy"]["hidden stops"] == 5 and doc["proxy"]["obj"].startswith("<object")


def test_document_is_compact_ascii_safe_json() -> None:
    e = engine()
    raw = graph_document(snapshot(e), e)
    assert raw.startswith(b'{"schema":"asyncrsp.graph","version":2,')
    assert json.loads(raw)["tasks"] == []
