"""tokio's own task dump (`Handle::dump()`) read as trees of frames, and compared with
asyncrsp's `monitor async tree` (integration/test_task_dump_oracle.py has the rules)."""

from __future__ import annotations

import re

from integration.harness.expected_tree import MACRO_FILES, Actual, parse_rendered, short


# The leaf future types tokio's traces end in -> the label asyncrsp gives that future.
LEAVES = {
    "tokio::time::sleep::Sleep": "tokio::time::Sleep",
    "tokio::sync::oneshot::Receiver": "tokio::sync::oneshot::Receiver",
    "tokio::sync::batch_semaphore::Acquire": "tokio::sync::Semaphore::acquire",
    "core::future::poll_fn::PollFn": "::poll_fn",  # a poll_fn over an object (mpsc's recv)
}
_FRAME = re.compile(r"^(?P<pre>[\s│├└]*)╼\s(?P<name>.+) at (?P<file>\S+):(?P<line>\d+):\d+$")
_POLL = re.compile(r"^<(?P<type>.+?) as core::future::future::Future>::poll$")


class Frame:
    def __init__(self, name: str, file: str, line: int, depth: int) -> None:
        self.name, self.file, self.line, self.depth = name, file.rsplit("/", 1)[-1], line, depth
        self.children: list[Frame] = []


def parse_dump(text: str) -> list[Frame]:
    """The root frame of each task's trace."""
    body = text.split("==dump==", 1)[1].split("==end==", 1)[0]
    roots: list[Frame] = []
    for block in body.split("TASK\n")[1:]:
        stack: list[Frame] = []
        for line in block.splitlines():
            m = _FRAME.match(line)
            if m is None:
                continue
            f = Frame(m["name"], m["file"], int(m["line"]), len(m["pre"]))
            while stack and stack[-1].depth >= f.depth:
                stack.pop()
            (stack[-1].children if stack else roots).append(f)
            stack.append(f)
    return roots


def paths(f: Frame, above: tuple[Frame, ...] = ()) -> list[tuple[Frame, ...]]:
    here = above + (f,)
    return [here] if not f.children else [p for c in f.children for p in paths(c, here)]


def _fn(name: str) -> str:
    """`tk_dump::bar::{{closure}}` -> `bar`; `tokio::sync::mutex::Mutex<T>::lock::{{closure}}` -> `lock`."""
    parts = [p for p in re.sub(r"::\{\{closure\}\}", "", short(name)).split("::") if p]
    return parts[-1] if parts else name


def coroutine_frames(path: tuple[Frame, ...]) -> list[Frame]:
    """Async fn / block frames: `{{closure}}` frames not called by PollFn::poll."""
    out = []
    for i, f in enumerate(path):
        if not f.name.endswith("::{{closure}}"):
            continue
        if i and "core::future::poll_fn::PollFn" in path[i - 1].name:
            continue  # the closure poll_fn calls (join!'s, recv's): no coroutine
        out.append(f)
    return out


def leaf(path: tuple[Frame, ...]) -> str | None:
    for f in reversed(path):
        m = _POLL.match(f.name)
        if m:
            return short(m["type"])
    return None


def has_frame(task: Actual, f: Frame) -> bool:
    for n in task.iter():
        if n.file is None or n.line is None:
            continue
        base = n.file.rsplit("/", 1)[-1]
        if (base, n.line) == (f.file, f.line):
            return True
        if base in MACRO_FILES and _fn(n.label) == _fn(f.name):
            return True
    return False


def has_leaf(task: Actual, t: str) -> bool:
    want = LEAVES.get(t)
    return want is not None and any(short(n.label).endswith(want) if want.startswith("::") else short(n.label) == want
                                    for n in task.iter())


def compare(dump: str, tree: str) -> tuple[list[str], list[str]]:
    """(frames tokio has that the tree lacks, things the tree says that the dump does not)."""
    tasks = parse_rendered(tree)
    lacking, more = [], []
    for root in parse_dump(dump):
        name = re.sub(r"::\{\{closure\}\}$", "", root.name)
        mine = [t for _, t in tasks for n in t.iter() if short(n.label) == name]
        if not mine:
            lacking.append(f"task {name}: not in the tree")
            continue
        task = next((t for _, t in tasks if any(short(n.label) == name for n in t.iter())))
        for path in paths(root):
            for f in coroutine_frames(path):
                if not has_frame(task, f):
                    lacking.append(f"task {name}: frame {f.name} at {f.file}:{f.line}")
            t = leaf(path)
            if t is not None and not has_leaf(task, t):
                lacking.append(f"task {name}: leaf {t}")
        for n in task.iter():
            if n.detail and ("left" in n.detail or "held by" in n.detail):
                more.append(f"task {name}: {short(n.label)} ({n.detail})")
    return lacking, more
