"""Time-to-inventory on the debug tokio corpus binary: cold, warm (cached), and a
full pyelftools DIE walk of the same file as the same-run baseline.

Each measurement runs in its own subprocess (a fresh interpreter: imports
counted, peak RSS from resource.getrusage of that process alone).

    .venv/bin/python bench/bench_analysis.py [BINARY] [--no-walk]

Targets (issue 3): cold <= 2 s, warm <= 0.3 s, peak memory <= 250 MB.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, resource, sys, time
t0 = time.perf_counter()
mode, path, cache = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "walk":
    from elftools.elf.elffile import ELFFile
    n = 0
    with open(path, "rb") as f:
        dwarf = ELFFile(f).get_dwarf_info()
        for cu in dwarf.iter_CUs():
            for _ in cu.iter_DIEs():
                n += 1
    extra = {"dies": n}
else:
    from pathlib import Path
    from proxy.analysis.inventory import build_inventory
    inv = build_inventory(path, cache_dir=Path(cache))
    extra = {"resume_fns": len(inv.resume_fns), "layouts": len(inv.layouts), "inlined": len(inv.inlined)}
dt = time.perf_counter() - t0
print(json.dumps({"mode": mode, "seconds": dt, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra}))
"""


def measure(mode: str, path: Path, cache: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(path), str(cache)], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def default_binary() -> Path:
    sys.path.insert(0, str(REPO))
    from integration.corpus.build import binary

    return binary("debug", "tokio_app")


def main(argv: list[str]) -> int:
    args = [a for a in argv if not a.startswith("--")]
    path = Path(args[0]) if args else default_binary()
    print(f"binary: {path} ({path.stat().st_size / 1e6:.1f} MB)")
    with tempfile.TemporaryDirectory() as cache:
        cold = measure("cold", path, Path(cache))
        warm = measure("warm", path, Path(cache))
    rows = [cold, warm]
    if "--no-walk" not in argv:
        rows.append(measure("walk", path, Path(".")))
    for r in rows:
        info = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("mode", "seconds", "peak_mb"))
        print(f"{r['mode']:>5}: {r['seconds']:7.3f} s  peak {r['peak_mb']:6.1f} MB  ({info})")
    if len(rows) == 3:
        walk = rows[2]
        print(f"cold is {walk['seconds'] / cold['seconds']:.1f}x faster than the full DIE walk, "
              f"warm {walk['seconds'] / warm['seconds']:.0f}x; memory {walk['peak_mb'] / cold['peak_mb']:.1f}x less")
    ok = cold["seconds"] <= 2.0 and warm["seconds"] <= 0.3 and cold["peak_mb"] <= 250
    print("targets (cold <= 2 s, warm <= 0.3 s, peak <= 250 MB):", "met" if ok else "NOT met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
