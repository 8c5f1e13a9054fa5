"""A subset of the gauntlet of real programs (integration/realworld, docs/realworld.md;
the whole gauntlet is `bash scripts/realworld`): programs their authors wrote (tokio's
tinydb and echo-tcp here), built against Debian sid's crates, driven by real line
clients into states their source predicts, and every item of their truth tables right,
with capture on (and its second stop: ids kept) and at a breakpoint in a sync function
inside a request. Without ../shared/realworld beside the project or sid's crates the
tests skip, saying why."""

from __future__ import annotations


import pytest

from integration.corpus import build
from integration.harness.stubs import become_subreaper
from integration.harness.tools import require_tool
from integration.realworld import gauntlet
from integration.realworld.truth import SHARED, TRUTH_DIR, load



def _table(program: str):  # type: ignore[no-untyped-def]
    if not SHARED.is_dir():
        pytest.skip(f"no {SHARED}: the real programs live beside the project (../shared/realworld)")
    skip = build.skip_reason("realworld-debug")
    if skip is not None:
        pytest.skip(str(skip))
    return load(TRUTH_DIR / f"{program}.toml")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("program", ["tokio_tinydb", "tokio_echo_tcp"])
def test_every_truth_item_right_with_capture_on_at_a_breakpoint_and_across_stops(program: str) -> None:
    """echo-tcp: its connections await tokio's io::util `Read`, a leaf that polls the stream
    itself (what it waits for is in the stream's ScheduledIo)."""
    require_tool("gdbserver")
    become_subreaper()
    table = _table(program)
    res = gauntlet.run(table, "realworld-debug", ("capture", "breakpoint"))
    text = gauntlet.report([res])
    assert not res.errors, text
    for way in ("capture", "ids") + (("breakpoint",) if table.breakpoint is not None else ()):
        items = res.ways[way]
        assert items.checked > 0 and items.right == items.checked, text
