"""Broken binaries for `asyncrsp inspect` (scripts/fuzz-binaries and
tests/proxy/analysis/test_garbage_binaries.py): truncated copies, bit flips
aimed at the ELF header, the program and section header tables and the
DWARF, CFI and line sections, zeroed sections, and debug-less copies.

`check(path)` runs `asyncrsp inspect` on one mutant in a child process
with a time and memory limit: the answer must be a report, or one line
saying what is wrong, never a traceback.
"""

from __future__ import annotations

import random
import resource
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from elftools.elf.elffile import ELFFile

TIME_LIMIT = 60.0  # seconds per mutant
MEMORY_LIMIT = 3 << 30  # bytes of address space per mutant

SECTIONS = (".debug_info", ".debug_abbrev", ".debug_str", ".debug_line", ".debug_line_str", ".eh_frame",
            ".eh_frame_hdr", ".debug_frame", ".debug_ranges", ".debug_rnglists", ".debug_loclists", ".symtab",
            ".strtab", ".text", ".dynamic", ".note.gnu.build-id")


def regions(data: bytes) -> dict[str, tuple[int, int]]:
    """name -> (file offset, size) of the header tables and the sections worth breaking."""
    import io

    out: dict[str, tuple[int, int]] = {"elf header": (0, 64)}
    try:
        elf = ELFFile(io.BytesIO(data))
        h = elf.header
        out["program headers"] = (h.e_phoff, h.e_phentsize * h.e_phnum)
        out["section headers"] = (h.e_shoff, h.e_shentsize * h.e_shnum)
        for sec in elf.iter_sections():
            if sec.name in SECTIONS and sec.header.sh_type != "SHT_NOBITS":
                out[sec.name] = (sec.header.sh_offset, sec.header.sh_size)
    except Exception:  # noqa: BLE001 - a mutant of a mutant: the header is all we know
        pass
    return out


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One mutant of `data` and what was done to it."""
    kind = rng.choice(("truncate", "flip", "flip", "flip", "flips", "zero", "field"))
    if kind == "truncate":
        n = rng.choice((rng.randrange(1, 64), rng.randrange(len(data)), len(data) - rng.randrange(1, 4096)))
        return data[:max(n, 0)], f"truncated to {max(n, 0)} bytes"
    regs = regions(data)
    name = rng.choice(sorted(regs))
    off, size = regs[name]
    size = max(1, min(size, len(data) - off)) if off < len(data) else 1
    off = min(off, len(data) - 1)
    b = bytearray(data)
    if kind == "zero":
        n = rng.randrange(1, min(size, 4096) + 1)
        at = off + rng.randrange(max(size - n, 0) + 1)
        b[at:at + n] = bytes(n)
        return bytes(b), f"{n} bytes of {name} zeroed at {at:#x}"
    if kind == "field":
        # a header-sized field made huge or negative (lengths, offsets, counts)
        at = off + rng.randrange(max(size - 8, 0) + 1) // 4 * 4
        width = rng.choice((2, 4, 8))
        value = rng.choice((0, 1, (1 << (8 * width)) - 1, 1 << (8 * width - 1), rng.randrange(1 << (8 * width))))
        b[at:at + width] = value.to_bytes(width, "little")[:len(b) - at]
        return bytes(b), f"{width}-byte field of {name} at {at:#x} set to {value:#x}"
    flips = 1 if kind == "flip" else rng.randrange(2, 32)
    for _ in range(flips):
        at = off + rng.randrange(size)
        b[at] ^= 1 << rng.randrange(8)
    return bytes(b), f"{flips} bit(s) flipped in {name}"


@dataclass
class Verdict:
    ok: bool
    what: str
    exit: int | None
    first_line: str
    seconds: float


def _limits() -> None:  # pragma: no cover - in the child
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def check(path: Path, what: str, cache: Path, python: str = sys.executable) -> Verdict:
    """`asyncrsp inspect PATH` in a child process; never a traceback."""
    import os
    import time

    env = dict(os.environ, XDG_CACHE_HOME=str(cache), ASYNCRSP_CACHE_DIR=str(cache))
    t0 = time.monotonic()
    try:
        res = subprocess.run([python, "-m", "proxy", "inspect", str(path)], capture_output=True, text=True,
                             timeout=TIME_LIMIT, env=env, preexec_fn=_limits, check=False)
    except subprocess.TimeoutExpired:
        return Verdict(False, what, None, f"no answer in {TIME_LIMIT:.0f} s", time.monotonic() - t0)
    dt = time.monotonic() - t0
    err = res.stderr.strip()
    out = res.stdout.strip()
    if "Traceback" in res.stderr or "Traceback" in res.stdout:
        return Verdict(False, what, res.returncode, err.splitlines()[-1] if err else "traceback", dt)
    if res.returncode == 0:
        return Verdict(True, what, 0, (out.splitlines() or [""])[0], dt)
    text = err or out
    lines = text.splitlines()
    one_line = res.returncode == 1 and len(lines) == 1 and lines[0].startswith("asyncrsp inspect: ")
    return Verdict(one_line, what, res.returncode, lines[0] if lines else "", dt)


@dataclass
class Campaign:
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def failures(self) -> list[Verdict]:
        return [v for v in self.verdicts if not v.ok]


def campaign(binary: Path, n: int, seed: int, work: Path) -> Campaign:
    rng = random.Random(seed)
    data = binary.read_bytes()
    out = Campaign()
    for i in range(n):
        mutant, what = mutate(data, rng)
        p = work / f"mutant-{seed}-{i}"
        p.write_bytes(mutant)
        p.chmod(0o755)
        out.verdicts.append(check(p, what, work / "cache"))
        p.unlink()
    return out


__all__ = ["Campaign", "Verdict", "campaign", "check", "mutate", "regions", "struct"]
