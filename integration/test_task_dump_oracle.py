"""tokio's own task dump as the oracle for `monitor async tree`.

`tk_dump` built with `--cfg tokio_unstable --cfg tokio_taskdump` (tokio 1.43, build config
trixie-dump-*) prints `Handle::dump()` (every spawned task's trace: `╼ fn::{{closure}} at
file:line:col` frames down to the leaf future's `poll`) into $TK_DUMP_FILE, then stops at its
`dumped` marker. The dump re-polls each idle task in a tracing mode and puts it back, so at
the marker the tasks are in the state the dump printed. asyncrsp's tree at that stop must
hold every frame of every tokio trace:

* an async fn / block frame (`X::{{closure}}`; not the closure `poll_fn` calls, which is no
  coroutine): a coroutine node at the same file and line (an await inside tokio's `join!`
  macro: DWARF gives asyncrsp the macro's own line, so there the fn's name must match);
* the leaf (the deepest `<T as Future>::poll`): the node asyncrsp draws for T.

Where asyncrsp knows more than the dump (a Sleep's time left, the task holding a Mutex)
the test prints it. Capture on and attached late (`--mode off`, the tokio adapter).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from integration.corpus import markers
from integration.harness.monitor import ask, attached, modern_binary, section, session
from integration.harness.task_dump import compare, parse_dump


@pytest.mark.parametrize("how", ["capture", "attach"])
@pytest.mark.parametrize("rt", ["ct", "mt"])
def test_no_frame_of_tokios_dump_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rt: str,
                                            how: str) -> None:
    prog = modern_binary("trixie-dump-debug", "tk_dump")
    dump_file = tmp_path / "dump.txt"
    monkeypatch.setenv("TK_DUMP_FILE", str(dump_file))
    if how == "capture":
        path, line = markers.breakpoint_markers("tk_dump")["dumped"]
        out = session(prog, [rt], [f"break {path.name}:{line}", "continue", *ask("tree")],
                      env={"TK_DUMP_FILE": str(dump_file)})
    else:
        out = attached(prog, [rt], "tk_dump ready", ask("tree"), ["--mode", "off"])
    tree = section(out, "tree")
    dump = dump_file.read_text()
    assert len(parse_dump(dump)) == 5, dump  # foo, holder, receiver, oneshot_waiter, waiter
    lacking, more = compare(dump, tree)
    print("asyncrsp shows more than tokio's dump:\n  " + "\n  ".join(more))
    assert not lacking, "\n".join(lacking) + "\n--- tokio's dump:\n" + dump + "\n--- tree:\n" + tree
    assert any("held by" in m for m in more) and any("left" in m for m in more), more


@pytest.mark.parametrize("how", ["capture", "attach"])
def test_a_multi_thread_join_of_three_sleeps_shows_every_sleep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                how: str) -> None:
    """tk_join3 (tokio 1.43, the multi-thread runtime): one task's `join!` of an async fn, an
    async block and a bare `Sleep`, each ending in a sleep. tokio's dump has three Sleep
    leaves under the join; the tree must have them too, each with its time left (a join!
    of sleeps on this runtime once showed none of them)."""
    prog = modern_binary("trixie-dump-debug", "tk_join3")
    dump_file = tmp_path / "dump.txt"
    monkeypatch.setenv("TK_DUMP_FILE", str(dump_file))
    if how == "capture":
        path, line = markers.breakpoint_markers("tk_join3")["dumped"]
        out = session(prog, ["mt"], [f"break {path.name}:{line}", "continue", *ask("tree")],
                      env={"TK_DUMP_FILE": str(dump_file)})
    else:
        out = attached(prog, ["mt"], "tk_join3 ready", ask("tree"), ["--mode", "off"])
    tree = section(out, "tree")
    dump = dump_file.read_text()
    assert len(parse_dump(dump)) == 1 and dump.count("Sleep as core::future") == 3, dump
    lacking, _ = compare(dump, tree)
    assert not lacking, "\n".join(lacking) + "\n--- tokio's dump:\n" + dump + "\n--- tree:\n" + tree
    block = tree.split("tk_join3::three", 1)[1].split("\ntask ", 1)[0]
    assert len(re.findall(r"tokio::time::Sleep \(\d[^)]* left", block)) == 3, tree
