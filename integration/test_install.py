"""asyncrsp installed as users install it: the sdist of the checkout, a wheel
built from it (`pip wheel --no-deps`), installed with its PyPI dependencies into a fresh
venv outside the checkout, and the demo's session run from that install:
`asyncrsp run` on the corpus' tokio_app with a real gdb, uprobe capture
active, `monitor async tree` and `bt` right. A data file the wheel leaves
out (the prebuilt BPF object) fails here, not on a user's machine.

The dependencies come from the index pip is configured with on this host
(`pip config list`); the wheel is built with pip's default build isolation,
as `pipx`/`uv` do.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from integration.corpus import build, markers
from integration.harness.runcmd import monitor, run_session, section
from proxy.capture.uprobes import prebuilt

ROOT = Path(__file__).resolve().parents[1]


def _sources(dest: Path) -> Path:
    """The checkout's files as a fresh clone plus uncommitted work has them
    (tracked and untracked, nothing ignored: no build/, no .venv, no egg-info)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the files a clone would have are unknown")
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def _pip(*args: str | Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *map(str, args)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def _bp(name: str) -> int:
    return markers.breakpoint_markers("tokio_app")[name][1]


def _await_line(parent: str, child: str) -> int:
    return next(m.line for m in markers.await_markers("tokio_app") if (m.parent, m.child) == (parent, child))


def test_wheel_installed_in_a_fresh_venv_runs_the_demo_session_with_uprobes(tmp_path: Path) -> None:
    from proxy.capture.uprobes.host import host_check

    ok, why = host_check()
    if not ok:
        pytest.skip(f"uprobe capture cannot run on this host: {why} (asyncrsp doctor says what to do)")
    got = build.build(configs=["debug"], programs=["tokio_app"]).get(("debug", "tokio_app"))
    if not isinstance(got, Path):
        pytest.skip(f"tokio_app (debug) not built: {got}")
    prog = build.pinned(got)

    # The sdist (setuptools' own hook, as `python -m build` calls it), then the
    # wheel built from it: both must carry the object and its source.
    dist = tmp_path / "dist"
    made = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; build_meta.build_sdist({str(dist)!r})"],
                          cwd=_sources(tmp_path / "src"), capture_output=True, text=True, timeout=300, check=False)
    assert made.returncode == 0, made.stderr[-3000:]
    sdist, = dist.glob("asyncrsp-*.tar.gz")
    names = tarfile.open(sdist).getnames()
    _pip("wheel", "--no-deps", "-q", "-w", dist, sdist)
    wheel, = dist.glob("asyncrsp-*.whl")
    names += zipfile.ZipFile(wheel).namelist()
    for data in (prebuilt.OBJECT_NAME, "uprobes.bpf.c", "prebuilt.py"):
        assert f"{sdist.name.removesuffix('.tar.gz')}/proxy/capture/uprobes/{data}" in names, names
        assert f"proxy/capture/uprobes/{data}" in names, names

    # A venv without pip of its own, filled by this pip (--python): ensurepip's
    # ~3 s of CPU would test nothing of asyncrsp's; the bytecode is written at
    # the first import instead of for every module of numpy (--no-compile).
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    _pip("--python", venv / "bin" / "python", "install", "-q", "--no-compile", wheel)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import proxy; print(proxy.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(venv)), where  # the install, not the checkout

    res = run_session([str(venv / "bin" / "asyncrsp")], [str(prog), "ct"],
                      [f"break tokio_app.rs:{_bp('c_after_sleep')}", "continue", *monitor("stats", "tree", "bt")],
                      env=env, cwd=tmp_path)
    assert "==end==" in res.gdb, res.proxy + res.gdb
    stats = section(res.gdb, "stats")
    assert re.search(r"^capture: uprobes \([^)]*attached\)", stats, re.M), stats
    assert "dearer than" not in res.proxy, res.proxy
    tree = section(res.gdb, "tree")
    nodes = {m.group(2): (len(m.group(1)), int(m.group(3)))
             for m in re.finditer(r"^(.*?)╼ tokio_app::(\w+) at \S+:(\d+)", tree, re.M)}
    chain = [nodes.get(fn) for fn in ("run", "a", "b", "c")]
    assert [line for _, line in chain] == [_await_line("run", "a"), _await_line("a", "b"),  # type: ignore[misc]
                                           _await_line("b", "c"), _bp("c_after_sleep")], tree
    depths = [depth for depth, _ in chain]  # type: ignore[misc]
    assert depths == sorted(set(depths)), tree  # run > a > b > c, each one level deeper
    frames = re.findall(r"^#\d+\s+(\S+) .*?(?:at|awaiting at) (\S+):(\d+)", section(res.gdb, "bt"), re.M)
    assert [f[0] for f in frames[:4]] == ["tokio_app::c", "tokio_app::b", "tokio_app::a", "tokio_app::run"], frames
    assert [int(f[2]) for f in frames[:4]] == [_bp("c_after_sleep"), _await_line("b", "c"), _await_line("a", "b"),
                                               _await_line("run", "a")], frames
