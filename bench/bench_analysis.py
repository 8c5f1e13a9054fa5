"""Time-to-inventory on the debug tokio corpus binary: cold, warm (cached), and a
full pyelftools DIE walk of the same file as the same-run baseline.

Each measurement runs in its own subprocess (a fresh interpreter: imports
counted, peak RSS and CPU time from resource.getrusage of that process alone).

    .venv/bin/python -m bench.bench_analysis [BINARY] [--no-walk] [--peers]

``--peers`` adds, on the same binary in the same run: gdb loading its
symbols and answering ``info functions ::poll$`` (``gdb -batch``: wall time
and peak RSS of gdb), drgn (libdw underneath: the debug info loaded and every
coroutine's ``__state`` layout type looked up by name) and LIEF 1.0's DWARF
reader (every function and type of every unit enumerated, the coroutine
variants counted); each skipped with the reason when the package is missing
(``pip install drgn lief``: measured, not dependencies of the proxy).

``--proxy`` measures what a user waits for, on a server binary that prints ``server ready
port=N`` (bench/server's axum service): the binary runs, ``gdbserver --attach`` holds it,
``asyncrsp serve`` (cache directory empty) stands in front, and a raw RSP client sends
``qSupported``, ``?`` and then ``monitor async tree``: the wall time of that first answer,
and the proxy's peak RSS (VmHWM) plus its unit walker's (sampled every 10 ms), against gdb
loading the same binary in the same run.

Cold analysis uses two processes (``proxy.analysis.unitwalk``: a second one walks the
units while the first scans them): its CPU time is both processes', its peak RSS the sum of
both processes' peaks (``self_mb`` + ``walker_mb``). ``ASYNCRSP_WALK_PROCESS=0`` measures
it in one process.

Targets: cold <= 2 s, warm <= 0.3 s, peak memory <= 250 MB.
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
elif mode == "drgn":
    import drgn
    prog = drgn.Program()
    prog.load_debug_info([path])
    t1 = time.perf_counter()
    # what the inventory needs first: the coroutine layouts (looked up by the
    # resume functions' names from the symbol table)
    from proxy.analysis.elf import open_elf
    names = [s.demangled for s in open_elf(path).symbols if s.is_func and "{{closure}}" in s.demangled]
    found = 0
    for n in names[:200]:
        try:
            prog.function(n.split(" ")[0])
            found += 1
        except (LookupError, ValueError, SyntaxError):
            pass
    extra = {"load_s": round(t1 - t0, 3), "lookups": min(len(names), 200), "found": found}
elif mode == "lief":
    import lief
    d = lief.dwarf.load(path)
    if d is None:  # the PyPI wheel: "Debug info not available for this build" (LIEF extended only)
        sys.exit(f"LIEF {lief.__version__} from PyPI has no DWARF reader (lief.dwarf.load: None; LIEF extended only)")
    fns = tys = coros = 0
    for cu in d.compilation_units:
        for f in cu.functions:
            fns += 1
        for t in cu.types:
            tys += 1
            name = t.name or ""
            if "{async_fn_env#" in name or "{async_block_env#" in name:
                coros += 1
    extra = {"functions": fns, "types": tys, "coroutine_types": coros}
else:
    from pathlib import Path
    from proxy.analysis import unitwalk
    from proxy.analysis.inventory import build_inventory
    inv = build_inventory(path, cache_dir=Path(cache))
    extra = {"resume_fns": len(inv.resume_fns), "layouts": len(inv.layouts), "inlined": len(inv.inlined),
             "walker_mb": round(unitwalk.last_peak_kb / 1024, 1)}
dt = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
ch = resource.getrusage(resource.RUSAGE_CHILDREN)  # the unit walker (proxy.analysis.unitwalk)
# peak: this process's plus the walker's own (VmHWM: its ru_maxrss would count this process's
# pages at the vfork), as if both peaks fell at the same moment
print(json.dumps({"mode": mode, "seconds": dt, "peak_mb": ru.ru_maxrss / 1024 + extra.get("walker_mb", 0),
                  "cpu_s": round(ru.ru_utime + ru.ru_stime + ch.ru_utime + ch.ru_stime, 2),
                  "self_mb": round(ru.ru_maxrss / 1024, 1), **extra}))
"""


def measure(mode: str, path: Path, cache: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(path), str(cache)], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def measure_gdb(path: Path) -> dict[str, float]:
    """gdb -batch loading the binary's symbols and answering `info functions ::poll$`:
    wall time and the child's peak RSS (wait4's rusage)."""
    import os
    import time

    t0 = time.perf_counter()
    proc = subprocess.Popen(["gdb", "-nx", "-batch", "-ex", "info functions ::poll$", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read() if proc.stdout else b""
    _pid, _status, ru = os.wait4(proc.pid, 0)
    dt = time.perf_counter() - t0
    return {"mode": "gdb", "seconds": dt, "peak_mb": ru.ru_maxrss / 1024,
            "cpu_s": round(ru.ru_utime + ru.ru_stime, 2), "lines": out.count(b"\n")}


def measure_proxy(path: Path) -> dict[str, float] | str:
    """The first `monitor async tree` answer through the real proxy, cold (see the module
    docstring); a string says why it could not run."""
    import os
    import re
    import shutil
    import threading
    import time

    from integration.harness.rawrsp import RawPeer
    from integration.harness.stubs import free_port

    if shutil.which("gdbserver") is None:
        return "gdbserver is not installed"
    procs: list[subprocess.Popen[bytes]] = []
    peaks: dict[int, tuple[str, int]] = {}
    stop = threading.Event()
    # BENCH_PROXY_TIMELINE=1: the proxy's resident set every 0.25 s of the answer, printed
    timeline: list[tuple[float, int]] | None = [] if os.environ.get("BENCH_PROXY_TIMELINE") else None

    def hwm(pid: int, what: str = "VmHWM:") -> int:
        try:
            with open(f"/proc/{pid}/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith(what))
        except (OSError, StopIteration, ValueError):
            return 0

    def cpu(pid: int) -> float:  # the process's CPU time and its reaped children's (the walkers)
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")

    def sample(root: int) -> None:  # the proxy and its children (the walker, the keeper)
        while not stop.is_set():
            pids = [root]
            try:
                for t in os.listdir(f"/proc/{root}/task"):
                    with open(f"/proc/{root}/task/{t}/children") as f:
                        pids += [int(c) for c in f.read().split()]
            except OSError:
                pass
            for pid in pids:
                try:  # the command line first: a child read between its vfork and its exec
                    with open(f"/proc/{pid}/cmdline", "rb") as f:  # shows the proxy's memory
                        cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                except OSError:
                    continue
                kb = hwm(pid)
                if kb and (pid == root or "unitwalk" in cmd):
                    peaks[pid] = (cmd, max(kb, peaks.get(pid, ("", 0))[1]))
                if pid == root and timeline is not None:
                    timeline.append((time.perf_counter(), hwm(pid, "VmRSS:")))
            time.sleep(0.01)

    with tempfile.TemporaryDirectory() as cache:
        try:
            server = subprocess.Popen([str(path), "0"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT)
            procs.append(server)
            assert server.stdout is not None
            line = server.stdout.readline()
            if b"server ready" not in line:
                return f"the server did not start: {line[:200]!r}"
            gport, pport = free_port(), free_port()
            gs = subprocess.Popen(["gdbserver", "--attach", f"127.0.0.1:{gport}", str(server.pid)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            procs.append(gs)
            assert gs.stderr is not None
            while "Listening" not in gs.stderr.readline():
                pass
            # where each thread was when gdbserver stopped it (a syscall number, -1: in user
            # space): the console variant's first tree has 4 tasks, 1 of them on the main
            # thread and 3 on console-subscriber's own runtime thread; a run that answers
            # 1 task says here whether that thread was still starting (not reproduced in 22
            # runs at load 2.5: parked in epoll_wait, 232, in 19, in user space in 3, 4 tasks each)
            threads = []
            for t in sorted(os.listdir(f"/proc/{server.pid}/task"), key=int):
                try:
                    with open(f"/proc/{server.pid}/task/{t}/comm") as f:
                        comm = f.read().strip()
                    with open(f"/proc/{server.pid}/task/{t}/syscall") as f:
                        threads.append(f"{comm}:{f.read().split()[0]}")
                except (OSError, IndexError):
                    threads.append(f"{t}:?")
            env = {**os.environ, "ASYNCRSP_CACHE_DIR": cache}
            prof = os.environ.get("BENCH_PROXY_PROFILE")  # a file: the proxy run under cProfile
            proxy = subprocess.Popen([sys.executable, *(["-m", "cProfile", "-o", prof] if prof else []),
                                      "-m", "proxy", "serve", "--listen", f"127.0.0.1:{pport}",
                                      "--upstream", f"127.0.0.1:{gport}"], cwd=REPO, env=env,
                                     stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
            procs.append(proxy)  # type: ignore[arg-type]
            assert proxy.stderr is not None and "listening" in proxy.stderr.readline()
            watcher = threading.Thread(target=sample, args=(proxy.pid,), daemon=True)
            watcher.start()
            peer = RawPeer.connect(f"127.0.0.1:{pport}", timeout=600)
            peer.request(b"qSupported:multiprocess+;swbreak+;hwbreak+;qRelocInsn+;xmlRegisters=i386")
            peer.request(b"?")
            cpu0 = cpu(proxy.pid)
            t0 = time.perf_counter()
            peer.send_packet(b"qRcmd," + b"async tree".hex().encode())
            text = b""
            while True:
                reply, _ok = peer.read_packet()
                peer.send(b"+")
                if reply.startswith(b"O") and reply != b"OK":
                    text += bytes.fromhex(reply[1:].decode())
                    continue
                break
            dt = time.perf_counter() - t0
            cpu_s = cpu(proxy.pid) - cpu0
            stop.set()
            watcher.join()
            try:
                peer.request(b"D")  # detach: the proxy ends its session and exits
            except (OSError, EOFError, AssertionError):
                pass
            peer.close()
            try:
                proxy.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        finally:
            stop.set()
            for p in reversed(procs):
                p.kill()
                p.wait()
    tree = text.decode(errors="replace")
    if timeline:
        marks, last = [], -1.0
        for t, kb in timeline:
            if t - t0 >= last + 0.25:
                marks.append(f"{t - t0:+.2f}s {kb / 1024:.0f}")
                last = t - t0
        print("proxy RSS (MB) from the command on:", ", ".join(marks))
    own = max((kb for pid, (cmd, kb) in peaks.items() if pid == proxy.pid), default=0)
    walker = max((kb for cmd, kb in peaks.values() if "unitwalk" in cmd), default=0)
    return {"mode": "proxy", "seconds": dt, "peak_mb": (own + walker) / 1024, "cpu_s": round(cpu_s, 2),
            "self_mb": round(own / 1024, 1),
            "walker_mb": round(walker / 1024, 1), "answer": reply.decode(errors="replace")[:20],
            "tasks": tree.count("task #"), "lines": tree.count("\n"), "threads": " ".join(threads)}


def peer(mode: str, path: Path) -> dict[str, float] | str:
    try:
        return measure(mode, path, Path("."))
    except subprocess.CalledProcessError as err:
        tail = (err.stderr or err.stdout or "").strip().splitlines()
        return tail[-1] if tail else f"{mode} failed"


def default_binary() -> Path:
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
    if "--proxy" in argv:
        got = measure_proxy(path)
        if isinstance(got, str):
            print(f"proxy: skipped: {got}")
        else:
            rows.append(got)
    if "--peers" in argv or "--proxy" in argv:
        rows.append(measure_gdb(path))
        for mode in ("drgn", "lief") if "--peers" in argv else ():
            got = peer(mode, path)
            if isinstance(got, str):
                print(f"{mode:>5}: skipped: {got}")
            else:
                rows.append(got)
    if "--no-walk" not in argv:
        rows.append(measure("walk", path, Path(".")))
    for r in rows:
        info = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("mode", "seconds", "peak_mb"))
        print(f"{r['mode']:>5}: {r['seconds']:7.3f} s  peak {r['peak_mb']:6.1f} MB  ({info})")
    if rows[-1]["mode"] == "walk":
        walk = rows[-1]
        print(f"cold is {walk['seconds'] / cold['seconds']:.1f}x faster than the full DIE walk, "
              f"warm {walk['seconds'] / warm['seconds']:.0f}x; memory {walk['peak_mb'] / cold['peak_mb']:.1f}x less")
    gdb = next((r for r in rows if r["mode"] == "gdb"), None)
    if gdb is not None:
        print(f"cold vs gdb (same run): time {cold['seconds'] / gdb['seconds']:.2f}x, "
              f"CPU {cold['cpu_s'] / gdb['cpu_s']:.2f}x, peak RSS {cold['peak_mb'] / gdb['peak_mb']:.2f}x "
              "(CPU time is what a loaded machine disturbs least)")
        px = next((r for r in rows if r["mode"] == "proxy"), None)
        if px is not None:
            print(f"first `monitor async tree` through the proxy, cold, vs gdb's load (same run): time "
                  f"{px['seconds'] / gdb['seconds']:.2f}x, CPU {px['cpu_s'] / gdb['cpu_s']:.2f}x, "
                  f"peak RSS {px['peak_mb'] / gdb['peak_mb']:.2f}x")
    try:
        import os

        print(f"load average: {os.getloadavg()[0]:.1f}")
    except OSError:
        pass
    ok = cold["seconds"] <= 2.0 and warm["seconds"] <= 0.3 and cold["peak_mb"] <= 250
    print("targets (cold <= 2 s, warm <= 0.3 s, peak <= 250 MB):", "met" if ok else "NOT met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
