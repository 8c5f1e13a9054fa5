"""GDB's own testsuite through asyncrsp (`scripts/gdb-testsuite`, see --help).

The subset: gdb.server/*.exp but server-connect.exp (it needs host names the
machine may not have), and seven stepping and thread tests. Each way runs
the same tests with board native-gdbserver; what changes is the GDBSERVER
the testsuite starts:

  straight  the real gdbserver
  proxy     a wrapper: `asyncrsp serve` on the port the testsuite asked for,
            the real gdbserver on a private port behind it
  probe     the same with `--probe .` (a counting probe on every function: under
            the default `--capture auto` a uprobe where uprobes can run, no
            stop; else a hidden breakpoint, a stop per call)

The wrapper binds the port the testsuite asked for (so it listens before
gdbserver prints "Listening on", which is what the testsuite waits for),
hands the socket to the proxy (`serve --listen fd:N`), and becomes the real
gdbserver at once (exec): the testsuite's kill, close and `exp_pid` reach
the real stub, and the proxy learns of it as a client would, from the
closed link. A stub on stdio (`target remote | gdbserver - prog`) and runs
without a port (--selftest, --version) are passed to gdbserver as they are.
Every proxy the wrapper started is ended after its run, and its log kept;
so is every other process the run left behind (`reap`).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "integration" / "build" / "gdb-testsuite"
GDB_VERSION = "13.1"
TESTS = (
    # gdb.server/*.exp but server-connect.exp: filled in from the source
    "gdb.base/range-stepping.exp",
    "gdb.threads/step-over-lands-on-breakpoint.exp",
    "gdb.base/step-test.exp",
    "gdb.base/break.exp",
    "gdb.threads/step-over-trips-on-watchpoint.exp",
    "gdb.threads/interrupt-while-step-over.exp",
    "gdb.threads/schedlock.exp",
)
# `--forks`: how gdb follows forks, vforks and execs (follow-fork-mode,
# detach-on-fork, catch fork/vfork/exec/syscall), not in the subset: ~5 minutes
# for two ways.
FORK_TESTS = tuple(f"gdb.base/{name}.exp" for name in (
    "foll-fork", "foll-vfork", "foll-exec", "foll-exec-mode", "catch-fork-kill", "catch-follow-exec",
    "catch-syscall", "fork-print-inferior-events", "multi-forks", "pie-fork", "vfork-follow-parent",
    "fork-no-detach-follow-child-dlopen", "execl-update-breakpoints", "catch-signal-fork",
    "watch-before-fork", "pie-execl")) + tuple(f"gdb.threads/{name}.exp" for name in (
    # the same among threads: a fork or exec in one thread while gdb stops or steps
    # another, vfork, exec from a thread that is not the leader, signals, a process dying
    "execl", "thread-execl", "step-over-exec", "fork-child-threads", "fork-plus-threads",
    "fork-thread-pending", "forking-threads-plus-breakpoint", "pending-fork-event-detach",
    "vfork-follow-child-exec", "vfork-follow-child-exit", "vfork-multi-thread", "watchpoint-fork",
    "non-ldr-exc-1", "non-ldr-exc-2", "non-ldr-exc-3", "non-ldr-exc-4", "non-ldr-exit",
    "leader-exit", "kill", "killed-outside", "process-dies-while-handling-bp",
    "process-exit-status-is-leader-exit-status", "signal-delivered-right-thread", "signal-sigtrap",
    "sigstep-threads", "siginfo-threads", "queue-signal"))
SKIPPED = ("gdb.server/server-connect.exp",)
WAYS = {"straight": (), "proxy": (), "probe": ("--probe", ".")}
RESULT = re.compile(r"^(PASS|FAIL|XFAIL|XPASS|KFAIL|KPASS|UNRESOLVED|UNSUPPORTED|UNTESTED|ERROR|DUPLICATE): (\S+\.exp): ?(.*)$")
SHOWN = ("PASS", "FAIL", "UNRESOLVED", "ERROR")


# -- fetching and configuring (once, into CACHE) -------------------------------

def _apt_options(d: Path) -> list[str]:
    return [f"-oDir::State::Lists={d}/lists", f"-oDir::Etc::SourceList={d}/sources.list",
            "-oDir::Etc::SourceParts=/dev/null", f"-oDir::Cache={d}/cache",
            f"-oDir::State::status={d}/dpkg/status", "-oAPT::Install-Recommends=false",
            "-oDebug::NoLocking=1"]


def _debian_uri() -> str:
    """The system's Debian mirror (read only; the system's sources stay as they are)."""
    for f in [Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")]:
        try:
            text = f.read_text()
        except OSError:
            continue
        m = re.search(r"^URIs:\s*(\S+)", text, re.M) or re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M)
        if m and "security" not in m.group(1):
            return m.group(1)
    return "http://deb.debian.org/debian"


def _run(cmd: list[str], log: Path, cwd: Path | None = None) -> None:
    with open(log, "a") as fh:
        fh.write(f"$ {shlex.join(cmd)}\n")
        fh.flush()
        r = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=cwd)
    if r.returncode != 0:
        sys.exit(f"gdb-testsuite: `{shlex.join(cmd)}` failed (exit {r.returncode}); see {log}")


def ensure_testsuite() -> Path:
    """Fetch and configure once; returns the configured build directory."""
    obj = CACHE / "obj"
    if (obj / "site.exp").exists() and (CACHE / "root" / "usr" / "bin" / "runtest").exists():
        return obj
    CACHE.mkdir(parents=True, exist_ok=True)
    log = CACHE / "setup.log"
    apt = CACHE / "apt"
    for sub in ("lists/partial", "cache/archives/partial", "dpkg", "src"):
        (apt / sub).mkdir(parents=True, exist_ok=True)
    (apt / "dpkg" / "status").touch()
    uri = _debian_uri()
    key = "[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]"
    (apt / "sources.list").write_text(f"deb {key} {uri} bookworm main\ndeb-src {key} {uri} bookworm main\n")
    o = _apt_options(apt)
    print("gdb-testsuite: fetching Debian's gdb source package, dejagnu and expect (private apt state) ...",
          file=sys.stderr, flush=True)
    _run(["apt-get", *o, "update"], log)
    if not list((apt / "src").glob(f"gdb_{GDB_VERSION}.orig.tar.*")):
        _run(["apt-get", *o, "source", "--download-only", "gdb"], log, cwd=apt / "src")
    _run(["apt-get", *o, "install", "--download-only", "-y", "dejagnu", "expect"], log)
    root = CACHE / "root"
    root.mkdir(exist_ok=True)
    for name in ("dejagnu", "expect", "tcl-expect", "tcl8.6", "libtcl8.6"):
        for deb in (apt / "cache" / "archives").glob(f"{name}_*.deb"):
            _run(["dpkg", "-x", str(deb), str(root)], log)
    # gdb_13.1.orig.tar.xz, not its signature gdb_13.1.orig.tar.xz.asc (the glob finds both)
    tarball = next(t for t in (apt / "src").glob(f"gdb_{GDB_VERSION}.orig.tar.*") if t.suffix != ".asc")
    top = f"gdb-{GDB_VERSION}"
    _run(["tar", "xf", str(tarball), "-C", str(CACHE), "--wildcards", f"{top}/gdb/testsuite/*",
          f"{top}/gdb/silent-rules.mk", f"{top}/gdb/disable-implicit-rules.mk", f"{top}/config*",
          f"{top}/install-sh"], log)
    obj.mkdir(exist_ok=True)
    _run([str(CACHE / top / "gdb" / "testsuite" / "configure")], log, cwd=obj)
    _run(["make", "site.exp"], log, cwd=obj)
    return obj


def tool_env() -> dict[str, str]:
    root = CACHE / "root"
    env = dict(os.environ)
    env["PATH"] = f"{root}/usr/bin:{env.get('PATH', '/usr/bin:/bin')}"
    env["LD_LIBRARY_PATH"] = f"{root}/usr/lib/x86_64-linux-gnu"
    env["TCLLIBPATH"] = f"{root}/usr/lib/tcltk/x86_64-linux-gnu"
    return env


def all_tests() -> list[str]:
    src = CACHE / f"gdb-{GDB_VERSION}" / "gdb" / "testsuite"
    server = sorted(f"gdb.server/{p.name}" for p in (src / "gdb.server").glob("*.exp"))
    return [t for t in server if t not in SKIPPED] + list(TESTS)


# -- the wrapper (GDBSERVER=...): gdb_testsuite_wrap.py (a light import) -------

from scripts.gdb_testsuite_wrap import wrap  # noqa: E402


# -- the proxies: forks of one `asyncrsp resident` (default), or --cold -------
#
# Each gdbserver start of the testsuite (93 in the subset) otherwise starts a
# new Python that imports the proxy (~0.2 s of CPU, 0.5 s and more of wall
# time at load 7): gdb's `target remote` waits for it every time. The
# runner starts `asyncrsp resident` for each proxy way (the product's own
# mode for tools that start many sessions, see proxy/shell/resident.py) and
# each wrapper has it fork the session. --cold measures a fresh interpreter
# per gdbserver start instead.

def start_resident(run_dir: Path) -> tuple[subprocess.Popen, str]:  # type: ignore[type-arg]
    path = str(run_dir / "resident.sock")
    # The resident carries the run's mark too: its forks (the sessions, their
    # keepers) show the resident's environment in /proc/PID/environ (the one
    # they were exec'd with), not the caller's they took over. The resident
    # itself is left out of what is ended after each test file.
    proc = subprocess.Popen([sys.executable, "-m", "proxy.cli", "resident", "--socket", path],
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **{RUN_MARK: str(run_dir)}), cwd=ROOT,
                            start_new_session=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if "resident on" not in line:
        proc.kill()
        sys.exit(f"gdb-testsuite: asyncrsp resident did not start: {line.strip()}{proc.stderr.read()}")
    return proc, path


def _proxies_of(run_dir: str, spare: int = 0) -> list[int]:
    """The run's proxy sessions still alive (fresh ones or forks of the
    resident: both run proxy.cli; not their keepers, which end on their own)."""
    found = []
    for pid in _processes_of(run_dir, spare):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if b"proxy.cli" in cmd and comm != "asyncrsp-keeper" and not _zombie(pid):
            found.append(pid)
    return found


def _end_proxies(run_dir: Path, spare: int = 0) -> int:
    """End the proxies a test file left behind (each should have ended with
    its stub); how many there were. `spare`: the resident."""
    deadline = time.monotonic() + 3  # the last ones see their stub go as runtest ends
    while (pids := _proxies_of(str(run_dir), spare)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        with open(run_dir / "proxies-left", "a") as fh:
            fh.write(f"{pid}\n")
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    return len(pids)


# -- running and reporting ------------------------------------------------------

def label_of(way: str, capture: str | None, cold: bool = False) -> str:
    if way == "straight":
        return way
    return way + (f"-{capture}" if capture else "") + ("-cold" if cold else "")


class Way:
    """One way's run: its directory under runs/, the GDBSERVER the testsuite
    starts, the resident its proxies fork from. `run_file` runs one test file
    in a directory of its own (runtest writes gdb.sum and gdb.log where it
    runs); `record` sums them up."""

    def __init__(self, way: str, tests: list[str], capture: str | None, cold: bool, files: bool = False) -> None:
        obj = ensure_testsuite()
        self.label = label_of(way, capture, cold)
        self.tests = tests
        self.chosen_files = files  # test files named on the command line, not the subset or a part of it
        self.dir = CACHE / "runs" / self.label / time.strftime("%Y%m%d-%H%M%S")
        self.dir.mkdir(parents=True)
        self.site = obj / "site.exp"
        gdbserver = shutil.which("gdbserver") or "/usr/bin/gdbserver"
        server = gdbserver
        if way != "straight":
            extra = list(WAYS[way]) + (["--capture", capture] if capture else [])
            server = str(self.dir / "gdbserver-through-asyncrsp")
            Path(server).write_text(
                "#!/bin/sh\n"
                # -S: no site-packages (a faster start); PYTHONPATH: the repository's proxy for
                # the wrapper's fork of the resident
                f"PYTHONPATH={shlex.quote(str(Path(__file__).resolve().parents[1]))} "
                f"GDB_TESTSUITE_PYTHON={shlex.quote(sys.executable)} exec {shlex.quote(sys.executable)} -S "
                f"{shlex.quote(str(Path(__file__).with_name('gdb_testsuite_wrap.py')))} {shlex.quote(str(self.dir))}"
                f" {shlex.quote(gdbserver)} {shlex.quote(json.dumps(extra))} \"$@\"\n")
            os.chmod(server, 0o755)
        src = CACHE / f"gdb-{GDB_VERSION}" / "gdb" / "testsuite"
        self.cmd = ["runtest", f"--srcdir={src}", f"GDB={shutil.which('gdb') or '/usr/bin/gdb'}",
                    f"GDBSERVER={server}", "--target_board=native-gdbserver"]
        self.env = tool_env()
        self.resident = None
        if not cold and way != "straight":
            self.resident, self.env["GDB_TESTSUITE_RESIDENT"] = start_resident(self.dir)
        # Every process of the run carries the mark (the proxies too: they set up
        # sessions of their own); what is left when runtest ends is ended (reap).
        self.env[RUN_MARK] = str(self.dir)
        self.files: dict[str, float] = {}
        self.results: list[list[str]] = []
        self.left = self.stray = 0

    def run_file(self, test: str) -> None:
        where = self.dir / f"{len(self.files):02d}-{Path(test).stem}"
        where.mkdir()
        shutil.copy(self.site, where / "site.exp")
        try:
            self.files.update(_run_timed([*self.cmd, test], where, self.env, time.monotonic()))
        finally:
            spare = self.resident.pid if self.resident is not None else 0
            self.left += _end_proxies(self.dir, spare)
            self.stray += reap(str(self.dir), spare)
        self.results += parse_sum(where / "gdb.sum")

    def close(self) -> None:
        if self.resident is not None:
            self.resident.terminate()  # the sessions still running go on (reap ends them)
            self.resident.wait()
            self.resident = None

    def record(self) -> dict:
        rec = {"way": self.label, "tests": self.tests, "time": sum(self.files.values()), "dir": str(self.dir),
               "chosen_files": self.chosen_files,
               "proxies_left": self.left, "stray": self.stray, "files": self.files, "results": self.results}
        (self.dir / "result.json").write_text(json.dumps(rec))
        return rec


def run_ways(ways: list[str], tests: list[str], capture: str | None, cold: bool, files: bool = False) -> list[dict]:
    """Run the test files, the ways taking turns file by file (the first way
    moving on by one each file): a change of load on a shared machine then
    hits every way alike, not the one that happened to run during it. A
    way's time is the sum of its files' times (from runtest's "Running"
    line to its end: runtest's own start-up is not counted)."""
    runs = []
    try:
        for way in ways:
            runs.append(Way(way, tests, capture, cold, files))
        for i, test in enumerate(tests):
            for k in range(len(runs)):
                run = runs[(i + k) % len(runs)]
                print(f"gdb-testsuite: {run.label}: {test}", file=sys.stderr, flush=True)
                run.run_file(test)
    finally:
        for run in runs:
            run.close()
    return [run.record() for run in runs]


_RUNNING = re.compile(rb"^Running (\S+/testsuite/(\S+\.exp)) \.\.\.$")


def _run_timed(cmd: list[str], run_dir: Path, env: dict[str, str], t0: float) -> dict[str, float]:
    """Run runtest; each test file's wall time, from the "Running X ..."
    line runtest prints as it starts the file to the next one (or the end)."""
    files: dict[str, float] = {}
    current, since = None, t0
    with open(run_dir / "runtest.out", "wb") as fh:
        proc = subprocess.Popen(cmd, cwd=run_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            m = _RUNNING.match(line.rstrip())
            if m:
                now = time.monotonic()
                if current is not None:
                    files[current] = now - since
                current, since = m.group(2).decode(), now
        proc.wait()
    if current is not None:
        files[current] = time.monotonic() - since
    return files


RUN_MARK = "ASYNCRSP_GDB_TESTSUITE_RUN"


def _processes_of(run_dir: str, spare: int = 0) -> list[int]:
    """This run's processes still alive: those whose environment holds the
    run's mark (runtest, gdb, gdbserver, the programs, the proxies and their
    keepers all inherit it; other runs have another directory in it)."""
    mark = f"{RUN_MARK}={run_dir}".encode()
    me = os.getpid()
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) in (me, spare):
            continue
        try:
            environ = (d / "environ").read_bytes()
        except OSError:
            continue
        if mark in environ.split(b"\0"):
            found.append(int(d.name))
    return found


def reap(run_dir: str, spare: int = 0) -> int:
    """End what the run left behind (the testsuite leaves some: a
    `gdbserver - prog` on a pipe whose gdb is gone spins on its closed
    stdin). SIGTERM, then SIGKILL to what is still there after a second.
    Returns how many processes were left."""
    pids = _processes_of(run_dir, spare)
    found = len(pids)
    if not found:
        return 0
    with open(Path(run_dir) / "stray", "a") as fh:
        for pid in pids:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                cmd = "?"
            fh.write(f"{pid} {cmd}\n")
    for sig, wait in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 0.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + wait
        while (pids := [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
    return found


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def parse_sum(path: Path) -> list[list[str]]:
    out = []
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        m = RESULT.match(line)
        if m:
            out.append([m.group(1), m.group(2), m.group(3)])
    return out


def counts(results: list[list[str]]) -> collections.Counter:
    return collections.Counter(r[0] for r in results)


def names(results: list[list[str]], status: str) -> collections.Counter:
    return collections.Counter(f"{r[1]}: {r[2]}" for r in results if r[0] == status)


def per_file(base: dict, others: list[dict], top: int, out=sys.stdout) -> None:
    """The test files where the other ways lost the most time against straight."""
    bt = base.get("files") or {}
    others = [r for r in others if r.get("files")]
    if not bt or not others:
        return
    worst = sorted(bt, key=lambda f: -max(r["files"].get(f, 0.0) - bt[f] for r in others))[:top]
    print(f"\n{'test file (seconds)':<52} {'straight':>8} " + " ".join(f"{r['way'][:14]:>14}" for r in others), file=out)
    for f in worst:
        cells = " ".join(f"{r['files'].get(f, 0.0):>7.1f} {r['files'].get(f, 0.0) - bt[f]:>+6.1f}" for r in others)
        print(f"{f:<52} {bt[f]:>8.1f} {cells}", file=out)


def report(recs: list[dict], out=sys.stdout, files: int = 0) -> None:
    print(f"{'way':<22} {'PASS':>6} {'FAIL':>5} {'other':>6} {'time':>8}  ratio", file=out)
    base = next((r for r in recs if r["way"] == "straight"), None)
    for r in recs:
        c = counts(r["results"])
        other = sum(v for k, v in c.items() if k not in ("PASS", "FAIL"))
        ratio = f"{r['time'] / base['time']:.2f}x" if base and base["time"] else ""
        left = f"  ({r['proxies_left']} proxies left running, ended)" if r.get("proxies_left") else ""
        if r.get("stray"):
            left += f"  ({r['stray']} processes of the run left running, ended)"
        print(f"{r['way']:<22} {c['PASS']:>6} {c['FAIL']:>5} {other:>6} {r['time']:>7.1f}s  {ratio}{left}",
              file=out)
    if base is None:
        return
    if files:
        per_file(base, [r for r in recs if r is not base], files, out)
    bp, bf = names(base["results"], "PASS"), names(base["results"], "FAIL")
    for r in recs:
        if r is base:
            continue
        lost = bp - names(r["results"], "PASS")
        gained = names(r["results"], "PASS") - bp
        new_fail = names(r["results"], "FAIL") - bf
        if not (lost or gained or new_fail):
            print(f"\n{r['way']}: the same PASS set as straight, no new FAIL", file=out)
            continue
        print(f"\n{r['way']}: {sum(lost.values())} PASS missing, {sum(gained.values())} PASS extra, "
              f"{sum(new_fail.values())} new FAIL", file=out)
        for title, cnt in (("missing PASS", lost), ("extra PASS", gained), ("new FAIL", new_fail)):
            for name, n in sorted(cnt.items()):
                print(f"  {title}: {name}" + (f" (x{n})" if n > 1 else ""), file=out)


def _chosen_files(rec: dict) -> bool:
    # records from before the mark: a run of a few files was one named on the command line
    return bool(rec.get("chosen_files", len(rec["tests"]) < 5))


def stored(label: str, tests: list[str], prefer_parts: bool = True) -> dict | None:
    """The newest stored result of each of `tests` for one way, merged (for
    --report). The time is the sum of those files' times. A run of test files
    named on the command line (a check of one file, often made later and in
    other conditions) gives a file's figures only where no run of the subset
    or of a part of it has them: else one file's rerun, alone and in another
    hour, would stand in the report beside the parts' figures of the other ways.
    `prefer_parts` False (a report of files named on the command line): the
    newest run of each file, whatever ran it."""
    best: dict[str, dict] = {}
    recs = [json.loads(f.read_text()) for f in sorted((CACHE / "runs" / label).glob("*/result.json"))]
    if prefer_parts:
        recs.sort(key=lambda r: not _chosen_files(r))  # stable: the newest last within each kind
    for rec in recs:
        for t in rec["tests"]:
            if t in tests:
                best[t] = rec  # newest wins
    if not best:
        return None
    results = [r for t, rec in best.items() for r in rec["results"] if r[1] == t]
    files = {t: rec["files"][t] for t, rec in best.items() if t in rec.get("files", {})}
    # a record without a file's time (none seen) counts its mean per file
    spent = sum(files.get(t, rec["time"] / max(1, len(rec["tests"]))) for t, rec in best.items())
    missing = [t for t in tests if t not in best]
    return {"way": label + (f" ({len(missing)} tests not run)" if missing else ""),
            "time": spent, "results": results, "files": files}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--as-gdbserver"]:
        run_dir, gdbserver, extra = Path(argv[1]), argv[2], json.loads(argv[3])
        wrap(str(run_dir), extra, gdbserver, argv[4:])
        return 0
    p = argparse.ArgumentParser(prog="gdb-testsuite", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--way", action="append", choices=tuple(WAYS), help="run only these ways (repeatable; default all three)")
    p.add_argument("--part", metavar="N/K", help="run the N-th of K parts of the subset (each part < 10 min)")
    p.add_argument("--capture", choices=("uprobes", "tracepoints", "breakpoints"),
                   help="force a capture backend in the proxy ways")
    p.add_argument("--cold", action="store_true",
                   help="a fresh interpreter for each proxy (`asyncrsp serve`), instead of a fork of "
                        "`asyncrsp resident` (the default): measures the Python start-up, ~93 of them")
    p.add_argument("--report", action="store_true", help="print the figures over every stored part, run nothing")
    p.add_argument("--files", type=int, default=0, metavar="N",
                   help="also print the N test files that took the most extra time against straight")
    p.add_argument("--list", action="store_true", help="print the subset and exit")
    p.add_argument("--forks", action="store_true",
                   help="the fork, vfork, exec, signal and process-lifecycle tests of gdb.base and gdb.threads (FORK_TESTS) instead of the subset")
    p.add_argument("tests", nargs="*", help="test files (e.g. gdb.server/ext-run.exp) instead of the subset")
    a = p.parse_args(argv)
    if a.forks:
        a.tests = [*a.tests, *FORK_TESTS]
    ensure_testsuite()
    tests = a.tests or all_tests()
    if a.part:
        n, _, k = a.part.partition("/")
        if not (n.isdigit() and k.isdigit() and 1 <= int(n) <= int(k)):
            p.error("--part N/K, e.g. --part 1/3")
        tests = [t for i, t in enumerate(tests) if i % int(k) == int(n) - 1]
    if a.list:
        print("\n".join(tests))
        return 0
    ways = a.way or list(WAYS)
    if a.report:
        recs = [r for w in ways if (r := stored(label_of(w, a.capture, a.cold), tests, prefer_parts=not a.tests)) is not None]
        report(recs, files=a.files)
        return 0
    print(f"gdb-testsuite: {len(tests)} test files, ways {', '.join(label_of(w, a.capture, a.cold) for w in ways)} "
          "taking turns file by file", file=sys.stderr, flush=True)
    recs = run_ways(ways, tests, a.capture, a.cold, files=bool(a.tests))
    report(recs, files=a.files)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
