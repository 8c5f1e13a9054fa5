"""`asyncrsp doctor` and `asyncrsp run` on host states a user may have.

Real: the host as it is (every check passes on a machine set up by
scripts/setup), a PATH without gdbserver, an unprivileged user
(`setpriv --reuid=65534`: nobody, no capabilities), and nobody given only
CAP_BPF and CAP_PERFMON. Simulated through the reader's seam
(ASYNCRSP_SIMULATE_HOST): kernel.yama.ptrace_scope=3, which once written
holds for every process until reboot, so no test may set it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from integration.corpus import build, markers
from integration.harness.runcmd import LISTENING, monitor, run_session, section
from integration.harness.stubs import OutputPump, kill_tree, venv_python

ROOT = Path(__file__).resolve().parents[1]


CHECKS = ["gdbserver", "privileges", "ptrace", "uprobes", "libbpf", "bpf object", "registers", "graphviz",
          "lldb", "qemu"]
ASYNCRSP = [venv_python(), "-m", "proxy"]
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
BPF_CAPS = ["--inh-caps=+bpf,+perfmon", "--ambient-caps=+bpf,+perfmon"]


def doctor(prefix: list[str] = [], env: dict[str, str] | None = None) -> tuple[int, list[str]]:  # noqa: B006
    done = subprocess.run([*prefix, *ASYNCRSP, "doctor"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=None if env is None else {**os.environ, **env}, check=False)
    assert not done.stderr.strip() or done.returncode == 2, done.stderr
    return done.returncode, done.stdout.splitlines()


def line_of(lines: list[str], name: str) -> str:
    got = [line for line in lines if re.match(rf"\S+\s+{re.escape(name)}\s", line)]
    assert len(got) == 1, lines
    return got[0]


def _root_only() -> None:
    if os.geteuid() != 0:
        pytest.skip("the host-wide states need root (this test runs as another user)")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may enter, straight under /tmp: pytest's tmp_path
    is under pytest-of-root, which every pytest run of root sets back to 0700."""
    path = Path(tempfile.mkdtemp(prefix="asyncrsp-doctor-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _tokio_app(directory: Path) -> Path:
    """A copy of the corpus' tokio_app in `directory` (the unprivileged user runs it)."""
    got = build.build(configs=["debug"], programs=["tokio_app"]).get(("debug", "tokio_app"))
    if not isinstance(got, Path):
        pytest.skip(f"tokio_app (debug) not built: {got}")
    return Path(shutil.copy2(got, directory / "tokio_app"))


def _registers_warn() -> bool:
    """This CPU's XSAVE layout (CPUID leaf 0xD) is not the one gdbserver 13 assumes (its
    AVX-512 state at other offsets): the doctor's registers check must warn here, and
    exit 1 (the integration/regsafety tests check the layout against gdbserver itself)."""
    from proxy.host.regsafety import layout_matches_gdbserver13, read_host_xsave_layout

    layout = read_host_xsave_layout()
    return layout is not None and not layout_matches_gdbserver13(layout)


def test_doctor_here_prints_every_check_and_all_pass() -> None:
    """Every check passes on this host; but for the register-safety verdict on a CPU whose
    XSAVE layout gdbserver 13.1 gets wrong (AVX-512 machines: a warning, ymm/zmm/k hidden)."""
    _root_only()
    code, lines = doctor()
    assert [line[6:17].strip() for line in lines[:-1]] == CHECKS, lines
    warn = _registers_warn()
    assert all(line.startswith("ok ") for line in lines[:-1] if not (warn and "registers" in line[6:17])), lines
    assert line_of(lines, "registers").startswith("warn " if warn else "ok "), lines
    assert lines[-1].startswith("capture: uprobes"), lines
    assert code == (1 if warn else 0)
    assert f" {shutil.which('gdbserver')} " in line_of(lines, "gdbserver")
    done = subprocess.run([*ASYNCRSP, "doctor", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    doc = json.loads(done.stdout)
    assert [c["name"] for c in doc["checks"]] == CHECKS and doc["exit"] == done.returncode == code
    assert doc["capture"] == lines[-1]


def test_without_gdbserver_on_path_doctor_and_run_name_it(tmp_path: Path) -> None:
    """PATH holds only an empty directory: no gdbserver (nor dot, lldb, qemu)."""
    empty = tmp_path / "bin"
    empty.mkdir()
    code, lines = doctor(env={"PATH": str(empty)})
    line = line_of(lines, "gdbserver")
    assert line.startswith("no ") and "not found on PATH" in line and "apt-get install gdbserver" in line
    assert lines[-1].startswith("capture: none"), lines
    assert code == 2
    run = subprocess.run([*ASYNCRSP, "run", "--", "/bin/true"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, "PATH": str(empty)}, timeout=60, check=False)
    assert run.returncode == 2
    assert "asyncrsp: run: gdbserver: not found on PATH: install it" in run.stderr, run.stderr


def test_ptrace_scope_3_simulated_doctor_names_it_and_run_refuses() -> None:
    """ptrace_scope 3: no process may trace, not even root. Simulated (see the module's doc)."""
    env = {"ASYNCRSP_SIMULATE_HOST": "ptrace_scope=3"}
    code, lines = doctor(env=env)
    assert lines[0] == "simulated: ptrace_scope=3 (ASYNCRSP_SIMULATE_HOST)"
    line = line_of(lines, "ptrace")
    assert line.startswith("no ") and "kernel.yama.ptrace_scope = 3" in line and "reboot" in line
    assert lines[-1].startswith("capture: none") and code == 2
    run = subprocess.run([*ASYNCRSP, "run", "--", "/bin/true"], cwd=ROOT, capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=60, check=False)
    assert run.returncode == 2 and "listening" not in run.stderr
    assert "asyncrsp: run: ptrace: kernel.yama.ptrace_scope = 3: no process may trace another" in run.stderr


def _bp(name: str) -> int:
    return markers.breakpoint_markers("tokio_app")[name][1]


@pytest.mark.parametrize("caps,capture", [([], "tracepoints"), (BPF_CAPS, "uprobes")],
                         ids=["nobody", "nobody-with-cap-bpf-perfmon"])
def test_unprivileged_doctor_and_run_say_which_capture(caps: list[str], capture: str, shared_dir: Path) -> None:
    """A real unprivileged user: nobody, no capabilities -> the doctor names
    the missing privileges and `run` says in one line that it falls back to
    tracepoints (and does). Given only CAP_BPF and CAP_PERFMON, nobody gets
    uprobe capture: root is not what it needs."""
    _root_only()
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    prog = _tokio_app(shared_dir)
    code, lines = doctor(NOBODY + caps)
    priv = line_of(lines, "privileges")
    if capture == "tracepoints":
        assert priv.startswith("no ") and "uid 65534 without CAP_BPF and CAP_PERFMON" in priv, lines
        assert "run asyncrsp as root" in priv
        verdict = lines[-1]
        assert verdict.startswith("capture: tracepoints, dearer than uprobes (uprobes: uid 65534 without"), lines
        assert code == 1
    else:
        assert priv.startswith("ok ") and "CAP_BPF, CAP_PERFMON" in priv, lines
        assert lines[-1].startswith("capture: uprobes") and code == (1 if _registers_warn() else 0), lines
    res = run_session([*NOBODY, *caps, *ASYNCRSP], [str(prog), "ct"],
                      [f"break tokio_app.rs:{_bp('c_after_sleep')}", "continue", *monitor("stats", "bt")], cwd=ROOT)
    assert "==end==" in res.gdb, res.proxy + res.gdb
    stats = section(res.gdb, "stats")
    assert re.search(rf"^capture: {capture} \(", stats, re.M), stats
    fallback = [line for line in res.proxy.splitlines() if "dearer than" in line]
    if capture == "tracepoints":
        assert fallback == [f"asyncrsp: {verdict}"], res.proxy
    else:
        assert fallback == [], res.proxy
    frames = re.findall(r"^#\d+\s+(\S+) ", section(res.gdb, "bt"), re.M)
    assert frames[:4] == ["tokio_app::c", "tokio_app::b", "tokio_app::a", "tokio_app::run"], res.gdb


def test_serve_says_the_doctors_verdict_when_it_falls_back(tmp_path: Path) -> None:
    """`serve` (a stub it spawns) under a simulated user without the BPF
    capabilities: its one fallback line is the doctor's verdict, word for word."""
    env = {"ASYNCRSP_SIMULATE_HOST": "euid=1000 caps=none"}
    code, lines = doctor(env=env)
    assert code == 1 and lines[-1].startswith("capture: tracepoints, dearer than uprobes"), lines
    prog = _tokio_app(tmp_path)
    proxy = subprocess.Popen([*ASYNCRSP, "serve", "--listen", "127.0.0.1:0", "--upstream",
                              f"|gdbserver --once - {prog} ct"], cwd=ROOT, stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env={**os.environ, **env},
                             start_new_session=True)
    err = OutputPump(proxy.stderr)
    try:
        m = err.wait_for(LISTENING, 30.0)
        assert m, err.text()
        gdb = subprocess.run(["gdb", "-nx", "-batch", "-ex", "set remotetimeout 60", "-ex",
                              f"target remote 127.0.0.1:{int(m.group(1))}",
                              "-ex", f"break tokio_app.rs:{_bp('c_after_sleep')}", "-ex", "continue",
                              "-ex", "monitor async stats", "-ex", "kill", str(prog)],
                             capture_output=True, text=True, timeout=180, check=False)
        assert re.search(r"^capture: tracepoints \(", gdb.stdout + gdb.stderr, re.M), gdb.stdout + gdb.stderr
        proxy.wait(timeout=30)
    finally:
        if proxy.poll() is None:
            kill_tree(proxy)
        err.join()
    said = [line for line in err.text().splitlines() if "dearer than" in line]
    assert said == [f"asyncrsp: {lines[-1]}"], err.text()
