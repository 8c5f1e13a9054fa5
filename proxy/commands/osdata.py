"""gdb osdata tables: ``info os async-tasks`` / ``info os async-edges``.

gdb asks ``qXfer:osdata:read:<type>:offset,length`` and prints the table
(MI: ``-info-os``). The format is gdb's osdata DTD, the same gdbserver emits:

    <?xml version="1.0"?>
    <!DOCTYPE target SYSTEM "osdata.dtd">
    <osdata type="async-tasks">
    <item><column name="Id">#1</column>...</item>
    </osdata>

``info os`` with no argument reads the ``types`` object (columns Type,
Description, Title); ``merge_osdata_types`` adds ours to the stub's list.
gdbserver 13.1 sends its listing without the XML declaration and DOCTYPE
(``tests/proxy/commands/gdbserver13_osdata_types.xml``, captured here);
gdb accepts both.
These functions return the document bytes; the caller slices it per
offset/length and must binary-escape the qXfer reply (a bare ``#`` from a
task id would end the packet early).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence

from proxy.snapshot.model import Snapshot

HEADER = '<?xml version="1.0"?>\n<!DOCTYPE target SYSTEM "osdata.dtd">\n'

# (Type, Description, Title) as gdbserver 13.1 lists its own: the description
# is the long text, the title the short one.
OUR_TYPES: tuple[tuple[str, str, str], ...] = (
    ("async-tasks", "Listing of all async tasks (coroutines) seen by asyncrsp", "Async tasks"),
    ("async-edges", "Listing of all await edges between async tasks", "Async await edges"),
)


class UnknownOsdataType(ValueError):
    pass


def osdata_table(kind: str, snap: Snapshot) -> bytes:
    """The ``<osdata type=kind>`` document (kind: async-tasks or async-edges), from the
    stop's snapshot (the names, states and lines every command shows)."""
    builders: dict[str, Callable[[Snapshot], list[list[tuple[str, str]]]]] = {
        "async-tasks": _task_rows,
        "async-edges": _edge_rows,
    }
    build = builders.get(kind)
    if build is None:
        raise UnknownOsdataType(f"no osdata table {kind!r}")
    return render(kind, build(snap))


def handles(kind: str) -> bool:
    return kind in {t for t, _d, _t in OUR_TYPES}


def render(kind: str, rows: Sequence[Sequence[tuple[str, str]]]) -> bytes:
    out = [HEADER, f'<osdata type="{_esc(kind)}">\n']
    for row in rows:
        cols = "".join(f'<column name="{_esc(n)}">{_esc(v)}</column>' for n, v in row)
        out.append(f"<item>{cols}</item>\n")
    out.append("</osdata>\n")
    return "".join(out).encode()


def _esc(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("'", "&apos;"))


def _task_rows(snap: Snapshot) -> list[list[tuple[str, str]]]:
    rows = []
    for t in snap.live():
        loc = t.location
        rows.append([
            ("Id", t.label),
            ("Address", f"0x{t.addr:x}"),
            ("Function", t.name),
            ("State", t.state.kind.value),
            ("Location", "" if loc is None else str(loc)),
            ("Polls", "" if t.stats is None else str(t.stats.polls)),
            ("Thread", "" if t.state.thread is None else str(t.state.thread)),
            ("Found by", ", ".join(t.found_by)),
            ("Waits on", ", ".join(str(w.resource) for w in t.waits)),
            ("Type", t.type_name),
        ])
    return rows


def _edge_rows(snap: Snapshot) -> list[list[tuple[str, str]]]:
    rows = []
    for e in snap.edges:
        rows.append([
            ("Parent", f"#{e.parent}"),
            ("Child", f"#{e.child}"),
            ("Callsite", str(e.loc) if e.loc is not None else ""),
            ("Status", e.status),
            ("First seen", str(e.first_seq)),
            ("Last seen", str(e.last_seq)),
        ])
    return rows


def merge_osdata_types(stub_types_xml: bytes | None) -> bytes:
    """The stub's ``types`` listing with ours appended (ours win on a name clash)."""
    rows = [r for r in _parse_items(stub_types_xml) if not handles(dict(r).get("Type", ""))]
    rows += [[("Type", t), ("Description", d), ("Title", title)] for t, d, title in OUR_TYPES]
    return render("types", rows)


def _parse_items(xml: bytes | None) -> list[list[tuple[str, str]]]:
    if not xml:
        return []
    try:
        root = ET.fromstring(xml)
    except ET.ParseError:
        return []  # a stub's broken listing: show ours alone rather than nothing
    if root.tag != "osdata":
        return []
    return [
        [(c.get("name", ""), c.text or "") for c in item.findall("column")]
        for item in root.findall("item")
    ]
