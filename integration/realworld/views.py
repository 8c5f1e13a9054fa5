"""What the proxy shows at one stop, as the gauntlet reads it: the text of `monitor async
tasks / tree / waits / deadlocks / bt` and the qXfer:asyncrsp.graph JSON document, and
the checks of a truth table against them (pure: text in, items out)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from integration.realworld.truth import Frame, Leaf, Place, State, TaskTruth

VIEWS = ("tasks", "tree", "waits", "deadlocks")


@dataclass
class Stop:
    """One stop's views (text per command, the JSON document parsed)."""

    text: dict[str, str]
    doc: dict  # type: ignore[type-arg]

    def tree_block(self, label: str) -> str:
        """The `tree` lines of one task (from its `task #N` line to the next)."""
        m = re.search(rf"^task {re.escape(label)} .*?(?=^task #|\Z)", self.text.get("tree", ""), re.S | re.M)
        return m.group(0) if m else ""

    def task_row(self, label: str) -> str:
        return next((ln for ln in self.text.get("tasks", "").splitlines() if ln.startswith(label + " ")), "")


@dataclass
class Items:
    """Items right / checked, and what was wrong (for the report)."""

    right: int = 0
    checked: int = 0
    misses: list[str] = field(default_factory=list)

    def add(self, ok: bool, what: str) -> None:
        self.checked += 1
        if ok:
            self.right += 1
        else:
            self.misses.append(what)

    def merge(self, other: Items) -> None:
        self.right += other.right
        self.checked += other.checked
        self.misses += other.misses


def _coroutines(node: dict, depth: int = 0) -> list[tuple[int, dict]]:  # type: ignore[type-arg]
    out = [(depth, node)] if node.get("kind") == "coroutine" else []
    for c in node.get("children", ()):
        out += _coroutines(c, depth + 1)
    return out


def is_source(path: str | None, source: str) -> bool:
    """Whether a file (as a view shows it: full, or from its crate's directory) is the
    program's source (its path from its root, truth.Table.where)."""
    return bool(path) and (path == source or path.endswith("/" + source))  # type: ignore[union-attr]


def _in_source(node: dict, source: str) -> bool:  # type: ignore[type-arg]
    return is_source((node.get("state") or {}).get("file"), source)


def leaves(task: dict, source: str) -> list[dict]:  # type: ignore[type-arg]
    """The task's leaves: the coroutines of the program's source in its tree with no other
    such coroutine below them (a finished branch of a combinator is none), in tree order."""
    out: list[dict] = []  # type: ignore[type-arg]

    def walk(node: dict) -> bool:  # type: ignore[type-arg]
        below = False
        for c in node.get("children", ()):
            below = walk(c) or below
        if below:
            return True
        if node.get("kind") == "coroutine" and _in_source(node, source) \
                and (node.get("state") or {}).get("kind") != "finished":
            out.append(node)
            return True
        return False

    walk(task["tree"])
    return out


def matches(doc: dict, truth: TaskTruth, source: str) -> list[dict]:  # type: ignore[type-arg]
    """The live tasks of the document that are this truth's task: a coroutine of its name in
    its tree (the root, or one a library's root polls: axum's upgrade, smol's block_on), and
    its leaves (coroutines of the program's source) at the truth's lines, no more, no fewer."""
    live = [t for t in doc.get("tasks", ()) if (t.get("state") or {}).get("kind") != "finished"]
    return [t for t in live if any(n["name"] == truth.name for _, n in _coroutines(t["tree"]))
            and _leaves_are(leaves(t, source), truth)]


def _leaves_are(nodes: list[dict], truth: TaskTruth) -> bool:  # type: ignore[type-arg]
    """The task's leaves are the truth's: the same lines, and a leaf the truth names by its
    coroutine has that name."""
    if tuple(sorted(n["state"].get("line") or 0 for n in nodes)) != truth.lines:
        return False
    return all(any(n["state"]["line"] == leaf.at.line and n["name"] == leaf.name for n in nodes)
               for leaf in truth.leaves if leaf.name is not None)


def subtree(lines: list[str], i: int) -> str:
    """Line ``i`` of a `tree` block and every line drawn below it (deeper than it)."""
    depth = lines[i].find("╼")
    end = i + 1
    while end < len(lines) and lines[end].find("╼") > depth:
        end += 1
    return "\n".join(lines[i:end])


def _frames_ok(task: dict, frames: tuple[Place | str, ...], source: str) -> list[str]:  # type: ignore[type-arg]
    """Which of the expected frames (a name, or a line of the source) the tree lacks."""
    nodes = _coroutines(task["tree"])
    missing = []
    for f in frames:
        if isinstance(f, str):
            if not any(n["name"] == f for _, n in nodes):
                missing.append(f)
        elif not any(_in_source(n, source) and n["state"]["line"] == f.line for _, n in nodes):
            missing.append(f"line {f.line} ({f.text})")
    return missing


def _leaf_line(block: str, leaf: Leaf, source: str) -> str:
    """The tree line of the leaf and the lines below it: the first line at the leaf's place
    (`SOURCE:LINE` at its end, or before its own detail) with the leaf's name if given."""
    where = re.compile(rf"(?:^|[/ ]){re.escape(source)}:{leaf.at.line}(?!\d)")
    lines = block.splitlines()
    for i, ln in enumerate(lines):
        if where.search(ln) and (leaf.name is None or f"{leaf.name} at " in ln):
            return subtree(lines, i)
    return ""


def _places(truth: TaskTruth, source: str) -> str:
    """The task's leaves for a report: `main.rs:7 (text)`, or `main.rs:3, 6` for several."""
    if len(truth.leaves) == 1:
        return f"{source}:{truth.leaves[0].at.line} ({truth.leaves[0].at.text})"
    return f"{source}:{', '.join(str(leaf.at.line) for leaf in truth.leaves)}"


def check_state(stop: Stop, state: State, source: str, crate: str | None = None) -> tuple[Items, dict[str, list[int]]]:
    """A state's items at one stop; returns the ids matched per truth task (for the next stop).
    ``crate``: the program's own crate (a task named in it is the program's too)."""
    items = Items()
    ids: dict[str, list[int]] = {}
    claimed: set[int] = set()
    threads: dict[str, list[tuple[str, int | None]]] = {}  # the truth's thread name -> (task, thread shown)
    for truth in state.tasks:
        found = matches(stop.doc, truth, source)
        ids[truth.key] = [t["id"] for t in found]
        claimed.update(t["id"] for t in found[:truth.count])
        for k in range(truth.count):
            t = found[k] if k < len(found) else None
            what = f"{state.name}: {truth.name} at {_places(truth, source)}"
            items.add(t is not None, f"json: no live task {what}")
            label = t["label"] if t else "#?"
            row = stop.task_row(label) if t else ""
            items.add(bool(row) and truth.name in row, f"tasks: no row {label} for {what}")
            block = stop.tree_block(label) if t else ""
            for leaf in truth.leaves:
                below = _leaf_line(block, leaf, source)
                named = f" ({leaf.name})" if leaf.name else ""
                items.add(bool(below) and truth.name in block,
                          f"tree: {what}: line {leaf.at.line}{named} not in {label}'s tree")
                for w in leaf.waits:
                    items.add(w in below, f"tree: {label} of {what}: nothing below line {leaf.at.line} waits on {w!r}")
            for f in truth.frames:
                items.add(t is not None and not _frames_ok(t, (f,), source), f"tree: {label} of {what} lacks the frame {f}")
            if truth.thread is not None:
                threads.setdefault(truth.thread, []).append((label, shown_thread(t) if t else None))
    for name, shown in threads.items():
        others = {th for n, s in threads.items() if n != name for _, th in s}
        mine = {th for _, th in shown}
        for label, th in shown:
            items.add(th is not None and len(mine) == 1 and th not in others,
                      f"thread: {label} ({name}) on thread {th}; {name}'s tasks on {sorted(map(str, mine))}, "
                      f"the others' on {sorted(map(str, others))}")
    extra = unmade(stop.doc, claimed, source, crate)
    items.add(not extra, f"json: {state.name}: tasks the source does not make: {'; '.join(extra)}")
    cycles = len(re.findall(r"^cycle:", stop.text.get("deadlocks", ""), re.M))
    items.add(cycles == state.cycles, f"deadlocks: {cycles} cycles, the source makes {state.cycles}")
    return items, ids


def shown_thread(task: dict) -> int | None:  # type: ignore[type-arg]
    """The thread the views give a task: running there, polled there last (capture), else the
    one its heading names (found on that thread's stack, local to that thread)."""
    st = task.get("state") or {}
    if st.get("thread") is not None:
        return int(st["thread"])
    if task.get("last_thread") is not None:
        return int(task["last_thread"])
    m = re.search(r"\bthread (\d+)", task.get("header") or "")
    return int(m.group(1)) if m else None


def unmade(doc: dict, claimed: set[int], source: str, crate: str | None = None) -> list[str]:  # type: ignore[type-arg]
    """The live tasks with a coroutine of the program's source in their tree (or named in its
    ``crate``) that no truth task is (beyond its count): a task the state does not have (a
    stale image taken for a future, one task shown twice, a task dropped unfinished shown
    alive over the bytes its slot holds now), as `#N NAME at LINES`."""
    out = []
    for t in doc.get("tasks", ()):
        if t["id"] in claimed or (t.get("state") or {}).get("kind") == "finished":
            continue
        if any(_in_source(n, source) for _, n in _coroutines(t["tree"])) \
                or crate is not None and str(t.get("name", "")).startswith(crate + "::"):
            lines = ", ".join(str(n["state"].get("line")) for n in leaves(t, source))
            out.append(f"{t.get('label', '#?')} {t.get('name') or t['tree'].get('name', '?')} at {source}:{lines}")
    return out


def check_ids(first: dict[str, list[int]], second: Stop, state: State, source: str) -> Items:
    """Every task matched at the first stop is there at the second with its id."""
    items = Items()
    for truth in state.tasks:
        now = {t["id"] for t in matches(second.doc, truth, source)}
        before = first.get(truth.key, [])
        for k in range(truth.count):
            tid = before[k] if k < len(before) else None
            items.add(tid is not None and tid in now,
                      f"ids: {truth.name} at lines {truth.lines}: #{tid} at the first stop, {sorted(now)} at the second")
    return items


BT_LINE = re.compile(r"^#(?P<level>\d+)\s+(?P<name>\S.*?)(?: \(#\d+\)| \[inlined\]| \(no id\))?(?: awaiting)?(?: at (?P<file>\S+):(?P<line>\d+))?\s*$")


def bt_frames(text: str) -> list[tuple[str, str | None, int | None]]:
    out = []
    for ln in text.splitlines():
        m = BT_LINE.match(ln.strip())
        if m:
            out.append((m["name"], m["file"], int(m["line"]) if m["line"] else None))
    return out


def check_bt(text: str, want: tuple[Frame, ...], source: str) -> Items:
    """The logical backtrace at the breakpoint, frame by frame (innermost first)."""
    items = Items()
    got = bt_frames(text)
    for i, f in enumerate(want):
        have = got[i] if i < len(got) else None
        ok = have is not None and have[0] == f.name and (
            f.at is None or (is_source(have[1], source) and have[2] == f.at.line))
        where = f" at {source}:{f.at.line}" if f.at else ""
        items.add(ok, f"bt #{i}: want {f.name}{where}, got {have}")
    return items


def parse_doc(text: str) -> dict:  # type: ignore[type-arg]
    from integration.harness.monitor import decode_maint_packet

    raw = decode_maint_packet(text)
    try:
        return json.loads(raw)  # type: ignore[no-any-return]
    except ValueError:  # what came back, when it was no document (an error reply, none at all)
        return {"tasks": [], "error": raw[-300:].decode(errors="replace") or text[:300]}
