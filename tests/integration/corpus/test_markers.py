"""Tests of the corpus marker parser (integration/corpus/markers.py).

The synthetic cases pin the grammar; the real-corpus cases check that the
committed Rust sources carry well-formed, well-placed markers.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from integration.corpus import markers
from integration.corpus.markers import AwaitMarker, MarkerError, parse_markers

F = Path("x.rs")
PROGRAMS = ("nested", "tokio_app", "tokio_bench", "stuck", "many_tasks")


def test_await_and_breakpoint_markers_are_parsed_with_lines() -> None:
    text = (
        "async fn a() {\n"
        "    let y = b().await; // await: a -> b\n"
        "    y + 1 // bp: a_end\n"
        "}\n"
    )
    fm = parse_markers(text, F)
    assert fm.awaits == (AwaitMarker(F, 2, "a", "b"),)
    assert fm.breakpoints == (("a_end", 3),)


def test_macro_call_lines_may_carry_await_markers() -> None:
    text = "    tokio::select! { // await: race -> select\n    let x = tokio::join!(a, b); // await: r -> join\n"
    fm = parse_markers(text, F)
    assert [(m.parent, m.child) for m in fm.awaits] == [("race", "select"), ("r", "join")]


def test_comment_only_lines_are_not_markers() -> None:
    fm = parse_markers("//! quote: `// await: <p> -> <c>` and `// bp: x`\n", F)
    assert fm.awaits == () and fm.breakpoints == ()


def test_min_rustc_header_tags_every_await_of_the_file() -> None:
    text = "// corpus: min-rustc 1.85\nfn f() { g().await; // await: f -> g\n}\n"
    (marker,) = parse_markers(text, F).awaits
    assert marker.min_rustc == (1, 85)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("x.await; // await: a b", "malformed await marker"),
        ("let x = 1; // await: a -> b", "no .await"),
        ("x; // bp: 9lives", "malformed breakpoint marker"),
    ],
)
def test_bad_markers_raise_with_file_and_line(line: str, message: str) -> None:
    with pytest.raises(MarkerError, match=message) as info:
        parse_markers("fn f() {}\n" + line + "\n", F)
    assert info.value.line == 2 and str(info.value).startswith("x.rs:2:")


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}(::\{async_block\})?", fullmatch=True)


@given(parent=names, child=names)
def test_format_then_parse_round_trips(parent: str, child: str) -> None:
    line = "    x.await; " + markers.format_await_marker(parent, child)
    (marker,) = parse_markers(line, F).awaits
    assert (marker.parent, marker.child) == (parent, child)


@pytest.mark.parametrize("program", PROGRAMS)
def test_every_program_has_markers_on_real_await_lines(program: str) -> None:
    found = markers.await_markers(program)
    assert found, f"{program} has no await markers"
    for marker in found:
        text = marker.file.read_text().splitlines()[marker.line - 1]
        assert ".await" in text or "join!" in text or "select!" in text


@pytest.mark.parametrize("program", PROGRAMS)
def test_breakpoint_names_are_unique_and_point_at_code(program: str) -> None:
    for name, (file, line) in markers.breakpoint_markers(program).items():
        assert f"// bp: {name}" in file.read_text().splitlines()[line - 1]


def test_nested_has_a_u16_state_function_and_new_rustc_only_markers() -> None:
    found = markers.await_markers("nested")
    assert sum(m.parent == "many_awaits" for m in found) > 255
    newer = {m for m in found if m.min_rustc == (1, 85)}
    assert {m.parent for m in newer} >= {"speak", "modern_part::{async_closure}"}
    assert set(markers.await_markers("nested", rustc=(1, 63))) == set(found) - newer


def test_unknown_program_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown corpus program 'nope'"):
        markers.await_markers("nope")


def test_generated_many_awaits_source_is_up_to_date() -> None:
    path = Path(markers.__file__).with_name("gen_many_awaits.py")
    spec = importlib.util.spec_from_file_location("gen_many_awaits", path)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    assert generator.TARGET.read_text() == generator.render()
