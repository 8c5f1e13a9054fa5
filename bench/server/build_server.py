"""Builds the server benchmark's axum service (bench/server) from Debian sid's crates.

    python bench/server/build_server.py [--config release|debug] [--variant bare|console]

Two variants of the same service, each in its own cargo target dir under
``integration/build/bench-server/``: ``bare`` and ``console`` (the
``console`` feature: console-subscriber, with ``--cfg tokio_unstable`` as
tokio-console asks). Crates come from ``bash scripts/fetch-crates sid`` (or
the directory in ``ASYNCRSP_SID_REGISTRY``), offline, through cargo's
``--config`` source replacement: nothing is fetched from crates.io.
Returns (bare axum_server, console axum_server); ``console_stats`` is built
with the console variant.
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# resolved: a git worktree's integration/build may be a link to the shared build dir, and the
# sources' copy (source_copy) must have one path whichever checkout builds
OUT = (ROOT / "integration" / "build").resolve() / "bench-server"
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


def build(config: str = "release", variant: str = "bare", jobs: int = 2) -> Path:
    """The variant's target dir after `cargo build` (a warm build is cargo's no-op).
    One build at a time (a lock under OUT): checkouts share the target dirs."""
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _build(config, variant, jobs)


def _build(config: str, variant: str, jobs: int) -> Path:
    target = OUT / f"{variant}-target"
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
    return target / ("release" if config == "release" else "debug")


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
