"""The versioned JSON graph document."""

from __future__ import annotations

import json

from graphfix import BIAS, Script, engine

from proxy.commands.document import SCHEMA, VERSION, graph_document


def test_document_of_a_small_graph() -> None:
    s = Script()
    s.enter("sel", 0x200000); s.enter("x", 0x200100); s.exit(3); s.enter("y", 0x200200); s.exit(1)
    e = engine()
    e.feed_many(s.events)
    doc = json.loads(graph_document(e, {"hidden stops": 5, "obj": object()}))
    assert (doc["schema"], doc["version"]) == (SCHEMA, VERSION) == ("asyncrsp.graph", 1)
    assert doc["complete"] is True and doc["last_seq"] == 5
    assert doc["binary"] == {"path": "/tmp/prog", "build_id": "f00d", "load_bias": hex(BIAS)}
    x = doc["tasks"][1]
    assert x["label"] == "#2" and x["address"] == "0x200100" and x["parent"] == 1 and not x["root"]
    assert x["state"] == {"kind": "Suspended", "file": "src/main.rs", "line": 13,
                          "suspend_index": 0, "thread": None}
    assert doc["tasks"][0]["state"]["kind"] == "Running" and doc["tasks"][0]["state"]["thread"] == 1
    assert [(d["child"], d["status"]) for d in doc["edges"]] == [(2, "pending"), (3, "completed")]
    assert doc["edges"][0]["callsite"] == {"file": "src/main.rs", "line": 21}
    assert doc["threads"] == [{"thread": 1, "scopes": [
        {"task": 1, "site": hex(0x6000 + BIAS), "sp": hex(0x7FFF_0000 + 0x10_0000), "entry_seq": 1}]}]
    assert doc["stats"]["events"] == 5 and doc["stats"]["rejected_reasons"] == {}
    assert doc["proxy"]["hidden stops"] == 5 and doc["proxy"]["obj"].startswith("<object")


def test_document_is_compact_ascii_safe_json() -> None:
    e = engine()
    raw = graph_document(e)
    assert raw.startswith(b'{"schema":"asyncrsp.graph","version":1,')
    assert json.loads(raw)["tasks"] == []
