"""The layers of proxy/, checked from the real imports (ast): no import circle between
modules, and no module importing from a layer above its own.

Every ``import`` and ``from ... import`` counts, at module level or inside a function
(a lazy import is a dependency all the same), except those under ``if TYPE_CHECKING:``
(annotations only: nothing runs them). ``LAYERS`` is the order, lowest first; a module
may import its own layer and the ones below. Within a layer, packages are peers, and
the imports between them go one way: a circle between two of their modules fails, and
so does a circle between the packages themselves (capture importing doctor while
doctor imports capture, through different modules).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "proxy"

# lowest first; each entry: the top-level names under proxy/ (packages or modules) of one layer
LAYERS: tuple[tuple[str, ...], ...] = (
    ("analysis",),  # ELF, DWARF, CFI: what the binary says
    ("host", "graph", "arch"),  # this host's side of a local program; the await graph; the architecture
    ("procedure", "probes", "symbols"),  # what procedures yield and probes (session and capture both use them); --probe
    ("reflect",),  # memory -> future trees
    ("snapshot",),  # the stop's async state (pure)
    ("origins",),  # spawn and wake records (the uprobes capture fills them)
    ("capture", "threads", "commands", "corefile"),  # backends; task threads' view; renderers; cores
    ("doctor",),  # `asyncrsp doctor`: the host checks (proxy/host) and the capture it would take
    ("pictures",),  # the stop drawn (reports, timelines, stacks)
    ("program",),  # one debugged process: its snapshot
    ("session", "ps"),  # the session core; `asyncrsp ps`
    ("shell",),  # sockets, processes, clocks
    ("app",),  # composes a session
    ("cli", "__main__"),
)
RANK = {name: i for i, names in enumerate(LAYERS) for name in names}


def modules() -> dict[str, Path]:
    out = {}
    for path in PROXY.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imports_of(name: str, path: Path, known: dict[str, Path], missing: list[str] | None = None,
               ) -> set[tuple[str, int]]:
    """The proxy modules ``name`` imports, with the line; ``missing`` gets the imports of a
    proxy module that does not exist."""
    out = set()
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in _imports(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                up = package[:len(package) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            # `from pkg import mod` imports the module pkg.mod; `from mod import name`, mod
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        # the module named must exist (`from M import name`: M; `import M`: M)
        for wanted in ([node.module and base] if isinstance(node, ast.ImportFrom) else targets):
            if missing is not None and wanted and wanted.startswith("proxy.") and wanted not in known:
                missing.append(f"{name}:{node.lineno} imports {wanted}")
        for t in targets:
            while t and t not in known:  # a name inside a module: the module
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add((t, node.lineno))
    return out


def graph() -> dict[str, set[tuple[str, int]]]:
    known = modules()
    return {name: imports_of(name, path, known) for name, path in known.items()}


def circles(g: dict[str, set[tuple[str, int]]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in g:
        if start in index:
            continue
        work = [(start, iter(sorted(t for t, _ in g[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(t for t, _ in g.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_top_level_name_has_a_layer() -> None:
    names = {_top(m) for m in modules()} - {""}
    assert names <= set(RANK), f"give these a layer in LAYERS: {sorted(names - set(RANK))}"


def test_every_import_names_a_module() -> None:
    """An import of a proxy module that is not there (moved, renamed) fails here first."""
    known = modules()
    missing: list[str] = []
    for name, path in known.items():
        imports_of(name, path, known, missing)
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(sorted(missing))


def test_no_import_circle() -> None:
    found = circles(graph())
    assert not found, "import circles:\n" + "\n".join(" <-> ".join(c) for c in found)


def package_graph(g: dict[str, set[tuple[str, int]]]) -> dict[str, set[tuple[str, int]]]:
    """``g`` seen from the top-level names under proxy/: one edge per pair of packages
    a module of one imports a module of the other (the line of the first seen)."""
    out: dict[str, set[tuple[str, int]]] = {}
    for name, targets in g.items():
        here = _top(name)
        if not here:
            continue
        edges = out.setdefault(here, set())
        for t, line in targets:
            there = _top(t)
            if there and there != here and all(there != e for e, _ in edges):
                edges.add((there, line))
    return out


def _package_imports(g: dict[str, set[tuple[str, int]]], a: str, b: str) -> list[str]:
    return sorted(f"{n}:{line} imports {t}" for n, ts in g.items() if _top(n) == a
                  for t, line in ts if _top(t) == b)


def test_no_package_circle() -> None:
    """Packages import each other one way: the shared part goes below both."""
    g = graph()
    found = circles(package_graph(g))
    said = []
    for c in found:
        said.append(" <-> ".join(c))
        said += ["  " + line for a in c for b in c if a != b for line in _package_imports(g, a, b)]
    assert not found, "package circles:\n" + "\n".join(said)


def test_no_upward_import() -> None:
    bad = []
    for name, targets in graph().items():
        here = RANK.get(_top(name))
        for t, line in targets:
            there = RANK.get(_top(t))
            if here is not None and there is not None and there > here:
                bad.append(f"{name}:{line} imports {t} (layer {there} above {here})")
    assert not bad, "upward imports:\n" + "\n".join(sorted(bad))


def test_the_check_sees_a_circle_and_an_upward_import(tmp_path: Path) -> None:
    """The checker itself, on a made-up graph."""
    g = {"proxy.a.x": {("proxy.a.y", 1)}, "proxy.a.y": {("proxy.a.x", 3)}, "proxy.a.z": set()}
    assert circles(g) == [["proxy.a.x", "proxy.a.y"]]
    assert circles({"proxy.a.x": {("proxy.a.z", 1)}, "proxy.a.z": set()}) == []
    # two packages whose modules never form a module circle, but whose packages do
    g = {"proxy.a.x": {("proxy.b.y", 1)}, "proxy.b.y": set(), "proxy.b.z": {("proxy.a.w", 2)}, "proxy.a.w": set()}
    assert circles(g) == []
    assert circles(package_graph(g)) == [["a", "b"]]


def test_the_session_is_its_parts_not_mixins() -> None:
    """`Session` derives from its state and runner only; hidden stops, non-stop mode, the
    capture's lifecycle, queries, stepping and task threads are parts it holds, each its own
    object (a new attribute of one part cannot shadow another's)."""
    from proxy.session.core import Session
    from proxy.session.state import SessionBase, SessionConfig

    assert Session.__mro__ == (Session, SessionBase, object)
    s = Session(SessionConfig())
    parts = {name: getattr(s, name) for name in ("hidden", "ns", "lifecycle", "queries", "stepping", "task_threads")}
    assert len({id(p) for p in parts.values()}) == len(parts)
    assert all(type(p).__module__.startswith("proxy.session.") for p in parts.values()), parts


def test_the_uprobe_capture_is_its_parts_not_mixins() -> None:
    """UprobeCapture derives from the backends' base only; its strategies are parts it holds."""
    from proxy.capture.base import CaptureBase
    from proxy.capture.uprobes.capture import UprobeCapture

    assert UprobeCapture.__mro__ == (UprobeCapture, CaptureBase, object)
    cap = UprobeCapture()
    parts = [cap.view, cap.slicing, cap.tasks, cap.returns, cap.nested_links]
    assert all(p.c is cap for p in parts)
