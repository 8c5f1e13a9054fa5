"""The gauntlet's truth tables: what a program's source says must be shown (pure).

One TOML file per program (``integration/realworld/truth/<program>.toml``), written by
reading the program's source in ``../shared/realworld``. Every place in it is named by
the text of its source line (``at = "listener.accept().await"``), found in the source
when the table is loaded: a table whose text is not on exactly one line (or not on the
``line`` it also gives) is an error, so a table cannot drift from the source it reads.

    program = "tokio_echo_tcp"                    # the bin of integration/realworld/Cargo.toml
    source = "tokio-examples/echo-tcp.rs"         # under ../shared/realworld; "crates:P": P in
                                                  # sid's crates (a packaged crate's example)
    args = ["127.0.0.1:{port}"]                   # {port}: a free port; or `port = 6142` fixed
    binds = [3000]                                # other fixed ports it binds (checked free first)

    [[state]]                                     # one state the clients drive the program into
    name = "two idle connections"
    clients = [{kind = "line", send = ["hello"], expect = "hello"}, {kind = "line"}]

    [[state.task]]                                # a task that must be alive, `count` times
    name = "tokio_echo_tcp::main"                 # its root's name as the snapshot gives it
    at = "listener.accept().await"                # the line its innermost coroutine waits at
    line = 23
    waits = "readiness"                           # what its leaf waits on (words of `waits`);
                                                  # a list: one item each
    frames = ["tokio_echo_tcp::main"]             # coroutines of its tree (optional), outermost first
    thread = "server"                             # the thread it lives on, by a name of the state's
                                                  # own: tasks of one name on one thread, of two on two

    [[state.task]]                                # a task whose tree holds several leaves (a join
    name = "app::main"                            # of two loops): each one named by its line
    [[state.task.leaf]]                           # instead of `at`; the task's leaves are these
    at = "a.accept().await"                       # lines, no more, no fewer (in any order)
    waits = "waits for READABLE"                  # what this leaf waits on (below it in the tree)
    name = "app::main::{async_block@36}"          # the leaf's coroutine (optional)
    [[state.task.leaf]]
    at = "b.accept().await"

    [[stall]]                                     # an upstream that never answers (a proxy's)
    port = 3000                                   # listens; the kernel takes connections, no one reads

    [breakpoint]                                  # a sync function inside a request
    function = "tokio_tinydb::handle_request"
    clients = [{kind = "line", send = ["GET foo"]}]
    bt = [{name = "...", at = "..."}, ...]        # the logical backtrace, innermost first

A task's leaves are the coroutines of the program's source in its tree with no other such
coroutine below them (finished branches aside): one for a chain of awaits, one per pending
branch of a `join` or `select!` of the program's own futures.

Items: each expected task (times its count) is one item per view (tasks, JSON; tree: one
per leaf, and one per thing a leaf says it waits on, found below that leaf); each state
adds one for `deadlocks` (the truth says which cycles there are: none unless `cycles` is
given) and one for the tasks the source does not make (a live task with a coroutine of the
program's source that no truth task is: there must be none); a task that names its
`thread` one more: the thread shown for it (running there, polled there last, found on its
stack, local to it) is the one every task of that name shows, and no task of another name's;
each backtrace frame one,
each task's id one at the second stop.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
SHARED = REPO.parent / "shared" / "realworld"
TRUTH_DIR = HERE / "truth"
# Debian sid's packaged crates (`bash scripts/fetch-crates realworld`): a table whose source is
# "crates:<crate>-<version>/examples/..." reads an example shipped in a crate's package.
CRATES = REPO / "integration" / "build" / "crates" / "realworld" / "root" / "usr" / "share" / "cargo" / "registry"


class TruthError(Exception):
    """A table that does not match its source (a text on no line, or on several)."""


@dataclass(frozen=True, slots=True)
class Place:
    text: str
    line: int


@dataclass(frozen=True, slots=True)
class Leaf:
    """A coroutine of the program's source with no other below it in the task's tree."""

    at: Place
    waits: tuple[str, ...] = ()  # words of what it waits on, below it in the tree (each one an item)
    name: str | None = None  # its coroutine's name, when the table says


@dataclass(frozen=True, slots=True)
class TaskTruth:
    name: str
    leaves: tuple[Leaf, ...]
    count: int = 1
    frames: tuple[Place | str, ...] = ()
    thread: str | None = None  # a name for the thread it lives on (its runtime's, its LocalSet's)

    @property
    def lines(self) -> tuple[int, ...]:
        """The leaves' lines, sorted: what a live task's leaves must be."""
        return tuple(sorted(leaf.at.line for leaf in self.leaves))

    @property
    def key(self) -> str:
        return f"{self.name}@{'+'.join(map(str, self.lines))}"


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    at: Place | None  # None: a frame whose line is not the program's (the executor's root)


@dataclass(frozen=True, slots=True)
class Client:
    kind: str  # line | http | http-partial (headers cut off) | http-partial-body (body cut off) | h2
    #            | h2-partial-body (its stream left open after one DATA frame) | ws
    send: tuple[str, ...] = ()
    expect: str | None = None
    path: str = "/"
    method: str = "GET"
    body: str = ""
    port: int | None = None  # another port than the program's own
    headers: tuple[str, ...] = ()  # more HTTP header lines ("User-Agent: x")


@dataclass(frozen=True, slots=True)
class State:
    name: str
    clients: tuple[Client, ...]
    tasks: tuple[TaskTruth, ...]
    cycles: int = 0


@dataclass(frozen=True, slots=True)
class Breakpoint:
    function: str
    clients: tuple[Client, ...]
    bt: tuple[Frame, ...]
    setup: tuple[Client, ...] = ()


@dataclass(frozen=True, slots=True)
class Table:
    program: str
    source: Path
    args: tuple[str, ...]
    port: int | None
    states: tuple[State, ...]
    breakpoint: Breakpoint | None
    env: dict[str, str] = field(default_factory=dict)
    helpers: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (program, args): run beside it
    stalls: tuple[int, ...] = ()  # ports of upstreams that take connections and never answer
    binds: tuple[int, ...] = ()  # other ports the program binds (its own upstream's), fixed
    file: str = ""  # the source as the table names it, "crates:" aside (see `where`)

    @property
    def where(self) -> str:
        """What a frame's file must end with to be the program's source: its path from its
        root (``tokio-examples/echo-tcp.rs``, ``h2-0.4.20/examples/server.rs``), not its name
        alone: a crate's example shares its name with a file of the crate itself (h2's
        ``src/server.rs`` beside its ``examples/server.rs``), whose coroutines are no leaves of
        the program's."""
        return self.file or self.source.name


def place(source: Path, text: str, line: int | None) -> Place:
    """The one line of ``source`` holding ``text`` (checked against ``line`` when given)."""
    lines = source.read_text().splitlines()
    hits = [i for i, s in enumerate(lines, 1) if text in s]
    if line is not None:
        if line not in hits:
            raise TruthError(f"{source.name}:{line} does not hold {text!r} (it is on {hits or 'no line'})")
        return Place(text, line)
    if len(hits) != 1:
        raise TruthError(f"{text!r} is on {len(hits)} lines of {source.name} ({hits}): give `line`")
    return Place(text, hits[0])


CLIENT_KINDS = ("line", "http", "http-partial", "http-partial-body", "h2", "h2-partial-body", "ws")


def _client(raw: dict) -> Client:  # type: ignore[type-arg]
    if raw.get("kind") not in CLIENT_KINDS:
        raise TruthError(f"client kind {raw.get('kind')!r}: one of {', '.join(CLIENT_KINDS)}")
    return Client(raw["kind"], tuple(raw.get("send", ())), raw.get("expect"), raw.get("path", "/"),
                  raw.get("method", "GET"), raw.get("body", ""), raw.get("port"),
                  tuple(raw.get("headers", ())))


def _waits(raw: dict) -> tuple[str, ...]:  # type: ignore[type-arg]
    """`waits`: one text, or a list (a leaf that waits on several things: each is an item)."""
    w = raw.get("waits", ())
    return (w,) if isinstance(w, str) else tuple(w)


def _leaf(source: Path, raw: dict) -> Leaf:  # type: ignore[type-arg]
    return Leaf(place(source, raw["at"], raw.get("line")), _waits(raw), raw.get("name"))


def _task(source: Path, raw: dict) -> TaskTruth:  # type: ignore[type-arg]
    frames: list[Place | str] = []
    for f in raw.get("frames", ()):
        frames.append(f if isinstance(f, str) else place(source, f["at"], f.get("line")))
    if ("at" in raw) == ("leaf" in raw):
        raise TruthError(f"task {raw['name']!r}: give its one leaf's `at` or several [[state.task.leaf]], not "
                         + ("both" if "at" in raw else "neither"))
    if "leaf" in raw:
        leaves = tuple(_leaf(source, x) for x in raw["leaf"])
        if len(leaves) < 2:
            raise TruthError(f"task {raw['name']!r}: one [[state.task.leaf]]: give it as the task's `at`")
    else:
        leaves = (Leaf(place(source, raw["at"], raw.get("line")), _waits(raw)),)
    return TaskTruth(raw["name"], leaves, raw.get("count", 1), tuple(frames), raw.get("thread"))


def _frame(source: Path, raw: dict) -> Frame:  # type: ignore[type-arg]
    at = raw.get("at")
    return Frame(raw["name"], None if at is None else place(source, at, raw.get("line")))


def source_path(name: str, shared: Path = SHARED, crates: Path = CRATES) -> Path:
    """A table's ``source``: under ../shared/realworld, or ``crates:P`` in sid's crates."""
    return crates / name.removeprefix("crates:") if name.startswith("crates:") else shared / name


def load(path: Path, shared: Path = SHARED, crates: Path = CRATES) -> Table:
    raw = tomllib.loads(path.read_text())
    source = source_path(raw["source"], shared, crates)
    if not source.exists():
        where = "bash scripts/fetch-crates realworld?" if raw["source"].startswith("crates:") else \
            "../shared/realworld beside the project?"
        raise TruthError(f"{path.name}: no {source} ({where})")
    states = tuple(State(s["name"], tuple(_client(c) for c in s.get("clients", ())),
                         tuple(_task(source, t) for t in s.get("task", ())), s.get("cycles", 0))
                   for s in raw.get("state", ()))
    bp = raw.get("breakpoint")
    breakpoint = None if bp is None else Breakpoint(
        bp["function"], tuple(_client(c) for c in bp.get("clients", ())),
        tuple(_frame(source, f) for f in bp["bt"]), tuple(_client(c) for c in bp.get("setup", ())))
    helpers = tuple((h["program"], tuple(h.get("args", ()))) for h in raw.get("helper", ()))
    stalls = tuple(int(s["port"]) for s in raw.get("stall", ()))
    return Table(raw["program"], source, tuple(raw.get("args", ())), raw.get("port"), states, breakpoint,
                 dict(raw.get("env", {})), helpers, stalls, tuple(raw.get("binds", ())),
                 raw["source"].removeprefix("crates:"))


def tables(names: list[str] | None = None) -> list[Table]:
    paths = sorted(TRUTH_DIR.glob("*.toml"))
    if names:
        paths = [p for p in paths if p.stem in names]
    return [load(p) for p in paths]
