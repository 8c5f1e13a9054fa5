from __future__ import annotations

import io
import json
import time
from pathlib import Path

from tests.proxy.analysis.corpus_util import corpus_binary
from proxy.analysis import cache
from proxy.analysis.inventory import build_inventory
from proxy.analysis.report import inspect_main


def test_cache_round_trip_and_corruption(tmp_path: Path) -> None:
    path = corpus_binary("debug", "nested")
    cold = build_inventory(path, cache_dir=tmp_path)
    files = list(tmp_path.glob(f"{cold.build_id}-v{cache.ANALYSIS_VERSION}.pickle"))
    assert len(files) == 1
    t = time.perf_counter()
    warm = build_inventory(path, cache_dir=tmp_path)
    assert time.perf_counter() - t < 1.0
    assert warm.resume_fns == cold.resume_fns and warm.layouts == cold.layouts
    files[0].write_bytes(b"not a pickle")
    again = build_inventory(path, cache_dir=tmp_path)  # a broken cache is ignored, then rewritten
    assert again.layouts == cold.layouts
    assert cache.load(cold.build_id or "", tmp_path) is not None


def test_cache_written_with_dataclasses_own_state_loads(tmp_path: Path) -> None:
    """model's frozen dataclasses pickle their fields as a tuple (``_fast_state``); a cache
    written with dataclasses' own state (a list of the same values) loads the same."""
    import dataclasses
    import pickle

    from proxy.analysis import model

    inv = build_inventory(corpus_binary("debug", "nested"), cache_dir=tmp_path)
    assert inv.resume_fns and inv.layouts and inv.types
    assert pickle.loads(pickle.dumps(inv, protocol=pickle.HIGHEST_PROTOCOL)) == inv
    frozen = [c for c in vars(model).values()
              if isinstance(c, type) and dataclasses.is_dataclass(c) and c.__dataclass_params__.frozen]
    own = dataclasses._dataclass_getstate  # type: ignore[attr-defined]
    saved = {c: c.__getstate__ for c in frozen}
    try:
        for c in frozen:
            c.__getstate__ = own  # type: ignore[method-assign]
        old = pickle.dumps(inv, protocol=pickle.HIGHEST_PROTOCOL)
    finally:
        for c, get in saved.items():
            c.__getstate__ = get  # type: ignore[method-assign]
    assert pickle.loads(old) == inv
    assert {type(s) for s in (model.SourceLoc("f", 1), inv.resume_fns[0])} <= set(frozen)


def test_cache_rejects_odd_build_ids(tmp_path: Path) -> None:
    assert cache.cache_path("../../etc", tmp_path) is None


def test_inspect_json_and_tree(monkeypatch, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ASYNCRSP_CACHE_DIR", str(tmp_path))
    path = str(corpus_binary("debug", "nested"))
    out = io.StringIO()
    assert inspect_main(path, as_json=True, tree=False, out=out) == 0
    doc = json.loads(out.getvalue())
    assert doc["format"] == "asyncrsp-inventory" and doc["version"] == 1
    names = {c["name"] for c in doc["coroutines"]}
    assert {"nested::a::{async_fn#0}", "nested::b::{async_fn#0}", "nested::c::{async_fn#0}"} <= names
    edges = {(e["parent"], e["child"]) for e in doc["await_edges"]}
    assert ("nested::a::{async_fn#0}", "nested::b::{async_fn#0}") in edges
    assert ("nested::b::{async_fn#0}", "nested::c::{async_fn#0}") in edges
    c = next(c for c in doc["coroutines"] if c["name"] == "nested::c::{async_fn#0}")
    assert c["resume_fns"] and c["resume_fns"][0]["rets"]
    tree = io.StringIO()
    inspect_main(path, as_json=False, tree=True, out=tree)
    text = tree.getvalue()
    assert "nested::run::{async_fn#0}" in text and "└╼ nested::c::{async_fn#0}" in text
    plain = io.StringIO()
    inspect_main(path, as_json=False, tree=False, out=plain)
    assert "Suspend0 at " in plain.getvalue()
