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
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration" / "corpus"))

import markers  # noqa: E402

from integration.harness.expected_tree import MACRO_FILES, Actual, parse_rendered, short  # noqa: E402
from integration.test_await_graph import ask, section, session  # noqa: E402
from integration.test_modern_corpus import binary  # noqa: E402
from integration.test_reflection import attached  # noqa: E402

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


@pytest.mark.parametrize("how", ["capture", "attach"])
@pytest.mark.parametrize("rt", ["ct", "mt"])
def test_no_frame_of_tokios_dump_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rt: str,
                                            how: str) -> None:
    prog = binary("trixie-dump-debug", "tk_dump")
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
