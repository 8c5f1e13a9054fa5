"""Compile uprobes.bpf.c into the prebuilt object the package ships.

Why prebuilt and committed, not compiled when the wheel is built: installing
asyncrsp (``pipx install``, ``uv tool install``, ``pip install``, from the
wheel or the sdist) must not need clang and libbpf-dev, and one build runs
on every x86-64 kernel with uprobe_multi (the object has no CO-RE
relocations and uses only the UAPI ``struct pt_regs``). The build is
reproducible (clang runs in this directory on the relative source with
``-fdebug-compilation-dir=.``: no checkout path is embedded), so a unit test
rebuilds the committed source with the same clang and compares the bytes
with the committed object; another checks the recorded hashes.

Rebuild after editing the C source:

    .venv/bin/python -m proxy.capture.uprobes.build

It writes ``uprobes-<source hash>.bpf.o`` (the name carries the first 12 hex
digits of the source's SHA-256, so the objects of two versions of the
package never share a file name), removes the objects of older sources, and
rewrites ``prebuilt.py`` with both hashes: the loader (bpf.py) opens only the
object whose bytes hash to what ``prebuilt.py`` says. Needs clang and
libbpf-dev (bpf_helpers.h), both installed by scripts/setup.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "uprobes.bpf.c"
RECORD = HERE / "prebuilt.py"
OBJECT_GLOB = "uprobes-*.bpf.o"


def source_hash(source: Path = SOURCE) -> str:
    return hashlib.sha256(source.read_bytes()).hexdigest()


def object_name(src_hash: str) -> str:
    return f"uprobes-{src_hash[:12]}.bpf.o"


def command(out: Path, source: Path = SOURCE) -> list[str]:
    """clang's arguments, run in `source`'s directory (relative names only)."""
    return [
        "clang", "-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86",
        "-fdebug-compilation-dir=.", "-I/usr/include/x86_64-linux-gnu",
        "-c", source.name, "-o", str(out),
    ]


def clang_version() -> str | None:
    """The first line of ``clang --version`` (None: no clang)."""
    if shutil.which("clang") is None:
        return None
    done = subprocess.run(["clang", "--version"], capture_output=True, text=True, check=False)
    return done.stdout.splitlines()[0].strip() if done.returncode == 0 and done.stdout else None


def compile_to(out: Path, source: Path = SOURCE) -> Path:
    if shutil.which("clang") is None:
        raise RuntimeError("clang is not installed (scripts/setup installs it)")
    subprocess.run(command(out.resolve(), source), check=True, cwd=source.parent)
    return out


def record_text(src_hash: str, obj_hash: str, clang: str) -> str:
    return (
        '"""The prebuilt BPF object this version of the package loads (written by build.py:\n'
        'do not edit). bpf.py opens ``OBJECT_NAME`` next to this file and refuses it unless\n'
        'its bytes hash to ``OBJECT_SHA256``."""\n\n'
        f'SOURCE_SHA256 = "{src_hash}"  # uprobes.bpf.c\n'
        f'OBJECT_SHA256 = "{obj_hash}"\n'
        f'OBJECT_NAME = "{object_name(src_hash)}"\n'
        f'CLANG = "{clang}"  # the compiler that built it (the reproducibility test needs the same)\n'
    )


def build() -> Path:
    """Compile, drop the objects of older sources, record the hashes."""
    src_hash = source_hash()
    out = HERE / object_name(src_hash)
    compile_to(out)
    for old in HERE.glob(OBJECT_GLOB):
        if old != out:
            old.unlink()
    obj_hash = hashlib.sha256(out.read_bytes()).hexdigest()
    RECORD.write_text(record_text(src_hash, obj_hash, clang_version() or "unknown"))
    return out


if __name__ == "__main__":
    try:
        print(build())
    except (RuntimeError, subprocess.CalledProcessError) as err:
        sys.exit(f"build failed: {err}")
