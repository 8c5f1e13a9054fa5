"""Reads the test markers written in the corpus sources.

Two kinds of trailing comment mark lines of ``integration/corpus/src``:

* ``// await: <parent> -> <child>`` on the line of an ``.await`` (or of the
  ``join!``/``select!`` call whose generated awaits rustc puts on that line).
  ``parent`` names the coroutine that awaits: the async fn's own name
  (``a``), or ``<fn>::{async_block}`` / ``<fn>::{async_closure}`` for a block
  or closure inside ``fn``. ``child`` is the awaited async fn's name, or a word
  for a leaf: ``yield``, ``sleep``, ``join``, ``select``, ``handle``,
  ``boxed``, ``recv``, ``lock``, ``notify``, ...
* ``// bp: <name>`` on a line where a test may ``break file:line``; the name
  is unique within a program.

Markers trail code: comment-only lines are never markers (docs may quote
the syntax). A file whose first line is ``// corpus: min-rustc X.Y`` only compiles with
rustc >= X.Y (it is left out by ``--cfg old_rustc``); its await markers carry
``min_rustc`` and ``await_markers(..., rustc=(1, 63))`` drops them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SRC_DIR = Path(__file__).resolve().parent / "src" / "bin"
# The modern corpus (integration/corpus_modern): programs shared by its
# packages, then each package's own; program names are unique across all.
MODERN_DIR = Path(__file__).resolve().parent.parent / "corpus_modern"
SRC_DIRS = (SRC_DIR, MODERN_DIR / "common", MODERN_DIR / "trixie" / "src" / "bin", MODERN_DIR / "sid" / "src" / "bin")

_AWAIT = re.compile(r"//\s*await:\s*(?P<parent>\S+)\s+->\s+(?P<child>\S+)\s*$")
_AWAIT_ANY = re.compile(r"//\s*await:")
_BP = re.compile(r"//\s*bp:\s*(?P<name>[A-Za-z_]\w*)\s*$")
_BP_ANY = re.compile(r"//\s*bp:")
_MIN_RUSTC = re.compile(r"^//\s*corpus:\s*min-rustc\s+(\d+)\.(\d+)\s*$")
_AWAITING_CODE = re.compile(r"\.await\b|\b(?:join|try_join|select)!\s*[({]")

Version = tuple[int, int]


class MarkerError(ValueError):
    """A malformed or misplaced marker, with its file and line."""

    def __init__(self, file: Path, line: int, message: str) -> None:
        super().__init__(f"{file}:{line}: {message}")
        self.file = file
        self.line = line


@dataclass(frozen=True, slots=True)
class AwaitMarker:
    """One marked await: where it is and which coroutine awaits what."""

    file: Path
    line: int
    parent: str
    child: str
    min_rustc: Version | None = None


@dataclass(frozen=True, slots=True)
class FileMarkers:
    """Every marker of one source file."""

    awaits: tuple[AwaitMarker, ...]
    breakpoints: tuple[tuple[str, int], ...]


def format_await_marker(parent: str, child: str) -> str:
    """The comment text that marks an await (the inverse of parsing)."""
    return f"// await: {parent} -> {child}"


def _min_rustc(first_line: str) -> Version | None:
    match = _MIN_RUSTC.match(first_line.strip())
    return (int(match[1]), int(match[2])) if match else None


def _parse_await(file: Path, number: int, line: str, since: Version | None) -> AwaitMarker:
    match = _AWAIT.search(line)
    if match is None:
        raise MarkerError(file, number, f"malformed await marker (want '// await: P -> C'): {line.strip()}")
    if not _AWAITING_CODE.search(line[: match.start()]):
        raise MarkerError(file, number, "await marker on a line with no .await, join! or select!")
    return AwaitMarker(file, number, match["parent"], match["child"], since)


def _parse_bp(file: Path, number: int, line: str) -> str:
    match = _BP.search(line)
    if match is None:
        raise MarkerError(file, number, f"malformed breakpoint marker (want '// bp: NAME'): {line.strip()}")
    return match["name"]


def parse_markers(text: str, file: Path) -> FileMarkers:
    """Parses the markers of one file's text; ``file`` is only recorded."""
    lines = text.splitlines()
    since = _min_rustc(lines[0]) if lines else None
    awaits: list[AwaitMarker] = []
    breakpoints: list[tuple[str, int]] = []
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith("//"):
            continue  # comment-only lines (docs quoting the marker syntax)
        if _AWAIT_ANY.search(line):
            awaits.append(_parse_await(file, number, line, since))
        elif _BP_ANY.search(line):
            breakpoints.append((_parse_bp(file, number, line), number))
    return FileMarkers(tuple(awaits), tuple(breakpoints))


def program_sources(program: str) -> list[Path]:
    """The Rust source files of ``program`` (a file or a directory in src/bin)."""
    for src in SRC_DIRS:
        single = src / f"{program}.rs"
        directory = src / program
        if single.is_file():
            return [single]
        if directory.is_dir():
            return sorted(directory.glob("*.rs"))
    known = sorted(p.stem for src in SRC_DIRS if src.is_dir() for p in src.iterdir() if p.suffix in (".rs", ""))
    raise ValueError(f"unknown corpus program {program!r}; known: {', '.join(known)}")


def _all_markers(program: str) -> list[FileMarkers]:
    return [parse_markers(path.read_text(), path) for path in program_sources(program)]


def await_markers(program: str, rustc: Version | None = None) -> list[AwaitMarker]:
    """Every await marker of ``program``, in file then line order.

    With ``rustc`` (e.g. ``(1, 63)``), markers of files that need a newer
    rustc are left out, as they are left out of that build.
    """
    markers = [m for fm in _all_markers(program) for m in fm.awaits]
    if rustc is None:
        return markers
    return [m for m in markers if m.min_rustc is None or m.min_rustc <= rustc]


def breakpoint_markers(program: str) -> dict[str, tuple[Path, int]]:
    """Breakpoint name -> (file, line) for ``program``; names are unique."""
    found: dict[str, tuple[Path, int]] = {}
    for path, fm in zip(program_sources(program), _all_markers(program)):
        for name, line in fm.breakpoints:
            if name in found:
                first = found[name]
                raise MarkerError(path, line, f"breakpoint {name!r} already at {first[0]}:{first[1]}")
            found[name] = (path, line)
    return found
