"""Build the C test programs of ``integration/programs`` with ``gcc -g -O0``.

Binaries are cached under ``$TMPDIR/asyncrsp-cprogs/<sha256 of source and
flags>/`` so repeated test runs (and parallel sessions) reuse one build; a
build writes to a temporary name and renames it into place (atomic).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

SOURCES = Path(__file__).resolve().parents[1] / "programs"
CFLAGS = ("-g", "-O0", "-pthread", "-Wall", "-Wextra", "-fno-omit-frame-pointer")
NAMES = ("probe_count", "threads", "signals", "watch", "spin", "exitcode", "forking")


class BuildError(RuntimeError):
    """gcc failed; carries its output."""


def cache_root() -> Path:
    return Path(tempfile.gettempdir()) / "asyncrsp-cprogs"


# Not position-independent, with a 5-byte nop at every function entry
# (-pg -mfentry -mnop-mcount, compiled only: linking without -pg keeps gmon
# out): -O0 leaves no instruction of 5+ bytes before a leaf's red-zone
# stores, so this is what gives fast tracepoints a site (the Linux kernel's
# ftrace sites are made the same way).
NOPIE_FLAGS = ("-fno-pie", "-pg", "-mfentry", "-mnop-mcount")


def build(name: str, nopie: bool = False) -> Path:
    """Return the path of the built program ``name`` (building it if needed);
    `nopie`: the fast-tracepoint variant (NOPIE_FLAGS, linked -no-pie)."""
    src = SOURCES / f"{name}.c"
    if not src.exists():
        raise BuildError(f"no such program: {src}")
    if nopie:
        return _build_nopie(name, src)
    key = hashlib.sha256(src.read_bytes() + " ".join(CFLAGS).encode()).hexdigest()[:16]
    out = cache_root() / key / name
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{name}.{os.getpid()}")
    res = subprocess.run(["gcc", *CFLAGS, "-o", str(tmp), str(src)],
                         capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise BuildError(f"gcc failed for {src}:\n{res.stderr}")
    os.replace(tmp, out)
    return out


def _build_nopie(name: str, src: Path) -> Path:
    flags = (*CFLAGS, *NOPIE_FLAGS)
    key = hashlib.sha256(src.read_bytes() + " ".join(flags).encode() + b"nopie").hexdigest()[:16]
    out = cache_root() / key / name
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    obj = out.with_name(f".{name}.{os.getpid()}.o")
    tmp = out.with_name(f".{name}.{os.getpid()}")
    for argv in (["gcc", *flags, "-c", "-o", str(obj), str(src)], ["gcc", "-no-pie", "-pthread", "-o", str(tmp), str(obj)]):
        res = subprocess.run(argv, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise BuildError(f"gcc failed for {src}:\n{res.stderr}")
    obj.unlink()
    os.replace(tmp, out)
    return out


def build_all() -> dict[str, Path]:
    return {n: build(n) for n in NAMES}
