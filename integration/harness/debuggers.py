"""Which gdb, gdbserver, lldb and lldb-server the harness runs: the host's,
or the newer ones of a Debian chroot (``scripts/debuggers-chroot``).

This host (bookworm) has gdb/gdbserver 13.1 and lldb 14. trixie's gdb 16 and
lldb 19, and sid's gdb 18 and lldb 21, need a newer libc, so they run in a
chroot: ``chroot DIR gdbserver ...``. The proxy stays on the host; the
chroot shares the network (loopback) and the pids. Every chroot command
runs in a private mount namespace (``unshare -m``) that mounts ``/proc``,
``/dev``, the checkout, the build tree and the temp dir inside the chroot first, so programs and
sources have the same paths inside and out, and nothing stays mounted after
the command ends (a chroot tree with a live ``/proc`` in it must never be
walked or copied). ``unshare`` and ``chroot`` exec, so the pid the harness
holds is the debugger's own.

The set in use is module state: :func:`use` switches it for the length of a
test (``with debuggers.use("trixie"): ...``); the drivers (stubs.py, gdb.py,
lldb.py) build their command lines with :func:`argv`.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARK = ".asyncrsp-ready"  # written by scripts/debuggers-chroot when a chroot is complete


def shared_dirs() -> list[Path]:
    """Host directories the chroot sees at the same path: the checkout, the
    build tree (a symlink in a worktree) and the temp dir (the C programs)."""
    dirs = [REPO.resolve(), (REPO / "integration" / "build").resolve(), Path(tempfile.gettempdir()).resolve()]
    out: list[Path] = []
    for d in sorted(dirs, key=lambda p: len(p.parts)):  # a checkout under /tmp: /tmp covers it
        if d.is_dir() and not any(d == o or o in d.parents for o in out):
            out.append(d)
    return out


def _enter_script(dirs: Sequence[Path]) -> str:
    """sh -c script: $0 is the chroot, "$@" the command; mounts, then exec chroot."""
    binds = "".join(f'mkdir -p "$0"{shlex.quote(str(d))} && mount --rbind {shlex.quote(str(d))} "$0"{shlex.quote(str(d))} && '
                    for d in dirs)
    return ('mount -t proc proc "$0/proc" && mount --rbind /dev "$0/dev" && '
            + binds + 'exec chroot "$0" "$@"')


def chroots_dir() -> Path:
    """scripts/debuggers-chroot's: $ASYNCRSP_CHROOTS, else the cache's ``chroots``."""
    env = os.environ.get("ASYNCRSP_CHROOTS")
    if env:
        return Path(env)
    cache = os.environ.get("ASYNCRSP_CACHE_DIR")
    if cache:
        return Path(cache) / "chroots"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "asyncrsp" / "chroots"


@dataclass(frozen=True)
class DebuggerSet:
    """One gdb/gdbserver/lldb/lldb-server family; ``release`` None is the host."""

    name: str
    release: str | None
    gdb: str   # the version Debian ships there, for ids and reports
    lldb: str

    @property
    def root(self) -> Path | None:
        return chroots_dir() / self.release if self.release else None

    def missing(self) -> str | None:
        """Why this set cannot run here, or None."""
        if self.root is None:
            return None
        if not (self.root / MARK).exists():
            return f"{self.release} chroot not built ({self.root}): run scripts/debuggers-chroot {self.release}"
        if os.geteuid() != 0 or shutil.which("unshare") is None:
            return "running a chroot's debuggers needs root and unshare(1)"
        return None

    def has(self, tool: str) -> bool:
        if self.root is None:
            return shutil.which(tool) is not None
        return (self.root / "usr" / "bin" / tool).exists()

    def argv(self, tool: str, *args: str) -> list[str]:
        """The command line that runs ``tool args`` from this set."""
        if self.root is None:
            return [tool, *args]
        return ["unshare", "-m", "--", "sh", "-c", _enter_script(shared_dirs()), str(self.root), tool, *args]


HOST = DebuggerSet("host", None, "13.1", "14.0")
SETS = {s.name: s for s in (
    HOST,
    DebuggerSet("trixie", "trixie", "16.3", "19.1"),
    DebuggerSet("sid", "sid", "18.1", "21.1"),
)}
NEWER = ("trixie", "sid")

# How much of the newer-debugger tests a run takes (ASYNCRSP_DEBUGGERS):
# "full" (scripts/test-debuggers), "subset" (the default: one case per newer
# debugger, for the suite's budget) or "none".
MODES = ("full", "subset", "none")


def newer_mode() -> str:
    mode = os.environ.get("ASYNCRSP_DEBUGGERS", "subset")
    if mode not in MODES:
        raise ValueError(f"ASYNCRSP_DEBUGGERS must be one of {', '.join(MODES)}, not {mode!r}")
    return mode


_current = HOST


def current() -> DebuggerSet:
    return _current


@contextlib.contextmanager
def use(name: str) -> Iterator[DebuggerSet]:
    """Run the drivers with set ``name`` inside the block."""
    global _current
    before, _current = _current, SETS[name]
    try:
        yield _current
    finally:
        _current = before


def argv(tool: str, *args: str) -> list[str]:
    return _current.argv(tool, *args)


def missing_tools(names: Sequence[str]) -> list[str]:
    return [n for n in names if not _current.has(n)]
