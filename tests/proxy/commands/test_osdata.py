"""osdata tables and the types listing merged with gdbserver's."""

from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from tests.proxy.graph.graphfix import Script, engine, snapshot

from proxy.commands.osdata import UnknownOsdataType, merge_osdata_types, osdata_table
from proxy.graph.engine import Engine

HERE = Path(__file__).resolve().parent
GDBSERVER_TYPES = (HERE / "gdbserver13_osdata_types.xml").read_bytes()  # captured from gdbserver 13.1


def graph() -> Engine:
    s = Script()
    s.enter("sel", 0x200000); s.enter("x", 0x200100); s.exit(3); s.enter("y", 0x200200); s.exit(1)
    s.exit(3)
    e = engine()
    e.feed_many(s.events)
    return e


def rows(xml: bytes) -> list[dict[str, str]]:
    root = ET.fromstring(xml)
    return [{c.get("name", ""): c.text or "" for c in item} for item in root.findall("item")]


def test_async_tasks_table() -> None:
    """One row per live task of the snapshot: the names, states and lines of `tasks`."""
    xml = osdata_table("async-tasks", snapshot(graph()))
    assert xml.startswith(b'<?xml version="1.0"?>\n<!DOCTYPE target SYSTEM "osdata.dtd">\n'
                          b'<osdata type="async-tasks">\n<item><column name="Id">#1</column>')
    assert rows(xml) == [{
        "Id": "#1", "Address": "0x200000", "Function": "rt::sel", "State": "suspended",
        "Location": "src/main.rs:13", "Polls": "1", "Thread": "", "Found by": "observed", "Waits on": "",
        "Type": "rt::sel::{async_fn_env#0}",
    }]


def test_async_edges_table() -> None:
    assert rows(osdata_table("async-edges", snapshot(graph()))) == [
        {"Parent": "#1", "Child": "#2", "Callsite": "src/main.rs:21", "Status": "pending",
         "First seen": "2", "Last seen": "2"},
        {"Parent": "#1", "Child": "#3", "Callsite": "src/main.rs:22", "Status": "completed",
         "First seen": "4", "Last seen": "4"},
    ]


def test_xml_is_escaped() -> None:
    from proxy.commands.osdata import render
    xml = render("t<", [[("a&b", '<x> "q" \'s\' & more')]])
    assert rows(xml) == [{"a&b": '<x> "q" \'s\' & more'}]
    assert b'type="t&lt;"' in xml


def test_unknown_table() -> None:
    with pytest.raises(UnknownOsdataType):
        osdata_table("processes", snapshot(graph()))


def test_types_merged_with_gdbservers() -> None:
    merged = rows(merge_osdata_types(GDBSERVER_TYPES))
    types = [r["Type"] for r in merged]
    assert types[:2] == ["cpus", "files"] and types[-2:] == ["async-tasks", "async-edges"]
    assert len(types) == 12 and merged[-1]["Title"] == "Async await edges"


def test_types_without_or_with_a_broken_stub_listing() -> None:
    for stub in (None, b"", b"<osdata type='types'><item>", b"<html/>"):
        assert [r["Type"] for r in rows(merge_osdata_types(stub))] == ["async-tasks", "async-edges"]


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed")
def test_real_gdb_prints_our_tables_in_cli_and_mi() -> None:
    root = HERE.parents[2]
    stub = f"python3 -m tests.proxy.commands.osdata_stub {HERE / 'gdbserver13_osdata_types.xml'}"
    target = f"target remote | {stub}"
    cli = subprocess.run(
        ["gdb", "-batch", "-nx", "-ex", "set architecture i386:x86-64", "-ex", target,
         "-ex", "info os async-edges", "-ex", "info os"],
        capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    ).stdout
    assert "#1         #2         src/main.rs:21 pending" in cli
    assert "async-tasks Listing of all async tasks" in cli and "processes  Listing" in cli
    mi = subprocess.run(
        ["gdb", "-nx", "-batch", "--interpreter=mi", "-ex", "set architecture i386:x86-64",
         "-ex", target, "-ex", 'interpreter-exec mi "-info-os async-tasks"'],
        capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
    ).stdout
    assert 'OSDataTable={nr_rows="1",nr_cols="10"' in mi
    assert 'col0="#1",col1="0x200000",col2="rt::sel",col3="suspended"' in mi
