"""Builds the server benchmark's axum service (bench/server) from Debian sid's crates.

    python -m bench.server.build_server [--config release|debug] [--variant bare|console]

Two variants of the same service, each in its own cargo target dir under
``<cache>/bench-server/`` (``cache_dir()`` of integration/corpus/build.py:
``~/.cache/asyncrsp``, shared by every clone, as the corpus' cargo targets):
``bare`` and ``console`` (the ``console`` feature: console-subscriber, with
``--cfg tokio_unstable`` as tokio-console asks). Crates come from ``bash
scripts/fetch-crates sid`` (or the directory in ``ASYNCRSP_SID_REGISTRY``),
offline, through cargo's ``--config`` source replacement: nothing is fetched
from crates.io. Returns (bare axum_server, console axum_server);
``console_stats`` is built with the console variant. ``scripts/test`` builds
both release variants before the suite (a warm build is cargo's no-op); the
tests take the binaries where ``binary()`` says and skip, saying why
(``missing()``), when they are not there.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from integration.corpus.build import cache_dir, crates_registry

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

# In the cache that outlives a clone: a fresh clone on a machine that built it once finds it
# warm. Resolved: the sources' copy (source_copy) must have one path whichever checkout builds.
# (It was integration/build/bench-server, which every fresh clone built cold.)
OUT = cache_dir().resolve() / "bench-server"
CARGO = Path.home() / ".cargo" / "bin" / "cargo"


class BuildError(RuntimeError):
    pass


def sid_registry() -> str:
    env = os.environ.get("ASYNCRSP_SID_REGISTRY")
    if env:
        return env
    script = ROOT / "scripts" / "fetch-crates"
    if not script.exists():
        raise BuildError("sid crates: scripts/fetch-crates is missing and ASYNCRSP_SID_REGISTRY is not set")
    res = subprocess.run(["bash", str(script), "sid"], capture_output=True, text=True, check=False)
    lines = res.stdout.strip().splitlines()
    if res.returncode != 0 or not lines:
        raise BuildError(f"scripts/fetch-crates sid failed: {res.stderr.strip()[-300:]}")
    return lines[-1]


def source_copy() -> Path:
    """The service's sources, copied under OUT into a directory named by their
    hash: cargo's fingerprints hold the sources' path, so building from each git
    worktree's own bench/server rebuilt the whole server (4-5 min) into the shared
    target dirs, replacing the binaries another checkout was measuring. The same
    sources now build from the same path (a warm build is cargo's no-op again)."""
    files = [HERE / "Cargo.toml", HERE / "Cargo.lock", *sorted((HERE / "src").rglob("*.rs"))]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(HERE)).encode() + b"\0" + f.read_bytes() + b"\0")
    where = OUT / "src" / h.hexdigest()[:16]
    if not (where / "Cargo.toml").exists():
        tmp = where.with_name(where.name + f".{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        for f in files:
            (tmp / f.relative_to(HERE)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, tmp / f.relative_to(HERE))
        try:
            tmp.rename(where)
        except OSError:  # another build made it first
            shutil.rmtree(tmp, ignore_errors=True)
    return where


def target_dir(variant: str) -> Path:
    """The variant's cargo target dir."""
    return OUT / f"{variant}-target"


def binary(variant: str = "console", config: str = "release", name: str = "axum_server") -> Path:
    """Where a built program of the service is (not building it)."""
    return target_dir(variant) / ("release" if config == "release" else "debug") / name


def missing(variant: str = "console", config: str = "release", names: tuple[str, ...] = ("axum_server",)) -> str | None:
    """Why the variant's programs are not there (a test's skip reason), or None when they are."""
    absent = [n for n in names if not binary(variant, config, n).exists()]
    if not absent:
        return None
    why = (f"the server benchmark's {variant} build ({config}) is not built: {', '.join(absent)} missing "
           f"under {binary(variant, config).parent}; scripts/test builds it "
           f"(python -m bench.server.build_server --variant {variant})")
    if not os.environ.get("ASYNCRSP_SID_REGISTRY") and not crates_registry("sid").is_dir():
        why += " from Debian sid's crates, which are not fetched (bash scripts/fetch-crates sid: needs Debian's mirror)"
    return why


def build(config: str = "release", variant: str = "bare", jobs: int = 2) -> Path:
    """The variant's target dir after `cargo build` (a warm build is cargo's no-op).
    One build at a time (a lock under OUT): checkouts share the target dirs."""
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(config, variant, jobs)


def _build(config: str, variant: str, jobs: int) -> Path:
    target = target_dir(variant)
    env = dict(os.environ)
    argv = [str(CARGO if CARGO.exists() else "cargo"), "build", "--offline", "-j", str(jobs),
            "--manifest-path", str(source_copy() / "Cargo.toml"), "--target-dir", str(target),
            "--config", 'source.crates-io.replace-with="debian-sid"',
            # resolved: a worktree reaches the shared crates through its integration/build link,
            # and cargo's fingerprints hold the registry's path as well as the sources'
            "--config", f'source.debian-sid.directory="{Path(sid_registry()).resolve()}"']
    if config == "release":
        argv.append("--release")
    if variant == "console":
        argv += ["--features", "console"]
        env["RUSTFLAGS"] = (env.get("RUSTFLAGS", "") + " --cfg tokio_unstable").strip()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise BuildError(f"cargo build ({config}, {variant}) failed:\n{res.stderr[-2000:]}")
    return binary(variant, config).parent


def build_server(config: str = "release") -> tuple[Path, Path]:
    return build(config, "bare") / "axum_server", build(config, "console") / "axum_server"


def console_stats(config: str = "release", addr: str = "http://127.0.0.1:6669") -> str:
    """console-subscriber's own per-task figures (`console_stats` output)."""
    prog = build(config, "console") / "console_stats"
    res = subprocess.run([str(prog), addr], capture_output=True, text=True, timeout=60, check=False)
    return res.stdout + (f"console_stats failed: {res.stderr.strip()[-300:]}" if res.returncode else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", choices=["release", "debug"], default="release")
    ap.add_argument("--variant", choices=["bare", "console"], action="append")
    args = ap.parse_args()
    try:
        for v in args.variant or ["bare", "console"]:
            print(build(args.config, v))
    except BuildError as err:
        print(f"build_server: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
