"""Compile uprobes.bpf.c into the committed object uprobes.bpf.o.

The object is prebuilt and committed (it has no CO-RE relocations and uses
only the UAPI ``struct pt_regs``, so one build runs on every x86-64 kernel with
uprobe_multi). Rebuild it after editing the C source:

    .venv/bin/python -m proxy.capture.uprobes.build

Needs clang and libbpf-dev (bpf_helpers.h), both installed by scripts/setup.
``uprobes.bpf.o.sha256`` records the hash of the source the object was built
from; a unit test fails when the two disagree.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "uprobes.bpf.c"
OBJECT = HERE / "uprobes.bpf.o"
STAMP = HERE / "uprobes.bpf.o.sha256"


def source_hash() -> str:
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def command(out: Path) -> list[str]:
    return [
        "clang", "-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86",
        f"-fdebug-prefix-map={HERE}=.", "-I/usr/include/x86_64-linux-gnu",
        "-c", str(SOURCE), "-o", str(out),
    ]


def build(out: Path = OBJECT) -> Path:
    if shutil.which("clang") is None:
        raise RuntimeError("clang is not installed (scripts/setup installs it)")
    subprocess.run(command(out), check=True)
    if out == OBJECT:
        STAMP.write_text(source_hash() + "\n")
    return out


if __name__ == "__main__":
    try:
        print(build())
    except (RuntimeError, subprocess.CalledProcessError) as err:
        sys.exit(f"build failed: {err}")
