"""Cost of watching every poll: asyncrsp's hidden breakpoints vs gdb's Python breakpoints.

Runs the corpus `tokio_bench` (debug build, rustc 1.95) four ways, all in this
run, and prints the wall times, the number of poll events and the µs per event:

1. bare: the program alone;
2. gdbserver + gdb, no breakpoints (the cost of being debugged at all);
3. asyncrsp --mode full: entry + ret breakpoints on every resume function,
   handled and hidden by the proxy (gdb only connects and continues);
4. gdb Python breakpoints on the same addresses whose `stop()` returns False,
   straight through the same gdbserver (what a user can script today).

µs per event = (time - time of 2) / events. Usage:
    .venv/bin/python bench/bench_graph.py [N] [ct|mt]
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration" / "corpus"))
sys.path.insert(0, str(ROOT))

import build  # noqa: E402

from proxy.analysis.inventory import build_inventory  # noqa: E402

PIE_BASE = 0x555555554000  # gdbserver disables address randomisation by default


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gdb(prog: Path, port_or_pipe: str, extra: list[str]) -> tuple[float, str]:
    cmd = ["gdb", "-nx", "-batch", "-ex", "set pagination off", "-ex", f"target remote {port_or_pipe}",
           *extra, "-ex", "continue", str(prog)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    return time.perf_counter() - t0, out.stdout + out.stderr


def sites(prog: Path) -> list[int]:
    inv = build_inventory(prog)
    bias = PIE_BASE if inv.pie else 0
    out = []
    for fn in inv.resume_fns:
        out.append(fn.low_pc + bias)
        out.extend(r + bias for r in fn.rets)
    return out


def run_proxy(prog: Path, args: list[str]) -> tuple[float, int]:
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    proxy = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", "--capture", "breakpoints", "--listen", f"127.0.0.1:{port}",
         "--upstream", f"|gdbserver --once - {' '.join(args)}"],
        cwd=ROOT, stderr=log, stdout=subprocess.DEVNULL)
    for _ in range(200):
        if "listening on" in Path(log.name).read_text():
            break
        time.sleep(0.05)
    t, out = gdb(prog, f"127.0.0.1:{port}", ["-ex", "break _exit", "-ex", "continue", "-ex", "monitor async stats"])
    proxy.wait(timeout=60)
    os.unlink(log.name)
    m = re.search(r"hidden stops: (\d+)", out)
    return t, int(m.group(1)) if m else 0


def run_python(prog: Path, args: list[str], addrs: list[int]) -> tuple[float, int]:
    script = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    script.write("import gdb\nhits = [0]\nclass B(gdb.Breakpoint):\n"
                 "    def stop(self):\n        hits[0] += 1\n        return False\n")
    for a in addrs:
        script.write(f"B('*0x{a:x}', internal=True)\n")
    script.write("class Done(gdb.Command):\n    def __init__(self): super().__init__('hits', gdb.COMMAND_USER)\n"
                 "    def invoke(self, arg, tty): print('python hits:', hits[0])\nDone()\n")
    script.close()
    t, out = gdb(prog, f"| gdbserver --once - {' '.join(args)}",
                 ["-ex", f"source {script.name}", "-ex", "break _exit", "-ex", "continue", "-ex", "hits"])
    os.unlink(script.name)
    m = re.search(r"python hits: (\d+)", out)
    return t, int(m.group(1)) if m else 0


def main() -> int:
    small, large = (int(a) for a in (sys.argv[1:3] if len(sys.argv) > 2 else ("10", "60")))
    mode = sys.argv[3] if len(sys.argv) > 3 else "ct"
    prog = build.binary("debug", "tokio_bench")
    addrs = sites(prog)
    build_inventory(prog)  # warm the analysis cache: startup is not what is measured
    rows = []
    for name, fn in (("asyncrsp --mode full (hidden breakpoints)", lambda a: run_proxy(prog, a)),
                     ("gdb Python breakpoints, stop() -> False", lambda a: run_python(prog, a, addrs)),
                     ("gdb + gdbserver, no breakpoints", lambda a: (gdb(prog, f"| gdbserver --once - {' '.join(a)}", [])[0], 0))):
        (t1, e1), (t2, e2) = fn([str(prog), str(small), mode]), fn([str(prog), str(large), mode])
        rows.append((name, t1, e1, t2, e2))
    # The slope between the two sizes cancels start-up (gdb reading symbols,
    # the proxy's analysis and planting): what remains is the cost per event.
    base_slope = rows[2][3] - rows[2][1]
    print(f"tokio_bench N={small} and N={large}, {mode} (debug, rustc 1.95): {len(addrs)} entry+ret sites")
    print(f"{'configuration':44} {'wall s':>13} {'events':>13} {'us/event':>9}")
    per = {}
    for name, t1, e1, t2, e2 in rows:
        us = ((t2 - t1) - base_slope) / (e2 - e1) * 1e6 if e2 > e1 else float("nan")
        per[name] = us
        print(f"{name:44} {t1:6.2f} {t2:6.2f} {e1:6d} {e2:6d} {us:9.0f}")
    a, b = rows[0][0], rows[1][0]
    print(f"asyncrsp / gdb-python cost per event: {per[a] / per[b]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
