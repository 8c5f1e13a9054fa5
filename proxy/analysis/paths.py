"""How a source file's path is shown to people.

DWARF names files by the path they had on the machine that built them. A
crate from a registry then reads ``/usr/share/cargo/registry/tokio-1.53.2/
src/sync/watch.rs`` (Debian's packaged crates) or ``/home/ci/.cargo/registry/
src/index.crates.io-6f17d22bba15001f/tokio-1.38.0/src/sync/watch.rs``
(cargo's), and the standard library ``/rustc/<commit>/library/core/src/...``
(rustc's remapped prefix). Shown, such a path starts at the crate's
``name-version`` directory (``tokio-1.53.2/src/sync/watch.rs``), or at
``library/`` for the standard library; the program's own files are shown as
they are. JSON documents keep the full path.

The style is the process's display setting (``--paths short|full``), set once
by the command line before any rendering, in a context variable: every
renderer reads it through ``shown()``.
"""

from __future__ import annotations

import re
from contextvars import ContextVar

STYLES = ("short", "full")
STYLE: ContextVar[str] = ContextVar("asyncrsp_paths", default="short")

# a crate's directory in a registry or a vendor directory: name-semver
_CRATE_DIR = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*-\d+\.\d+\.\d+(?:-[0-9A-Za-z.-]+)?(?:\+[0-9A-Za-z.-]+)?")
_RUSTC_PREFIX = re.compile(r"/rustc/[0-9a-f]{7,64}/")


def short_path(path: str) -> str:
    """The path from its innermost crate directory on (``tokio-1.53.2/src/lib.rs``),
    rustc's remapped prefix dropped (``library/core/src/future/mod.rs``), or as is."""
    m = _RUSTC_PREFIX.match(path)
    if m:
        return path[m.end():]
    parts = path.split("/")
    for i in range(len(parts) - 2, -1, -1):  # a directory, never the file's own name
        if _CRATE_DIR.fullmatch(parts[i]):
            return "/".join(parts[i:])
    return path


def is_dependency(path: str) -> bool:
    """Whether `path` is a file of a registry or vendored crate, or of the standard library:
    not the program's own source."""
    return short_path(path) != path


def shown(path: str) -> str:
    """`path` in the process's style."""
    return path if STYLE.get() == "full" else short_path(path)


def set_style(style: str) -> None:
    if style not in STYLES:
        raise ValueError(f"--paths: want one of {', '.join(STYLES)}, not {style!r}")
    STYLE.set(style)
