"""What the proxy's hop costs on the wire: a real gdbserver, a real program,
a client over real sockets, straight against through the proxy, interleaved.

    .venv/bin/python -m bench.bench_exchange [--rounds 3] [--count 400] [--gdb-steps 300] [--base DIR]
                                             [--ways straight,relay,resident,serve,probe] [--only raw|gdb]

Each round runs every way once, the first way moving on by one each round
(as scripts/gdb-testsuite takes turns), on a fresh ``gdbserver --once`` of
integration/programs/spin:

* straight: the client connects to gdbserver.
* relay:    through bench/relay.py, a plain relay that reads nothing: the
  floor any forwarding proxy pays on the wire.
* resident: through a session forked by ``asyncrsp resident`` (what the
  GDB testsuite runner uses), ``serve --once``.
* serve:    through a fresh ``asyncrsp serve --once``.
* probe:    resident, with ``--probe .`` (a counting probe on every function:
  a uprobe under ``--capture auto`` as root, else a hidden breakpoint).

Two clients:

* raw: a hand-written client (gdb's handshake: qSupported, QStartNoAckMode,
  ``?``) that repeats, COUNT times, what gdb does around a ``stepi``:
  ``vCont;s:T`` to the stop, ``g``, ``p10`` (rip), ``m`` at the pc,
  ``p7`` (rsp), ``m`` at the stack, ``Hg``, ``qXfer:threads:read`` (pc and sp
  from the stop reply where ``p`` answers nothing, as gdb takes them).
  Prints the wall µs of each kind of exchange (median over every
  exchange of the way), the mean wall µs per exchange, and the proxy's CPU per
  exchange (its /proc/PID/schedstat run time across the loop).
* gdb: ``gdb -batch`` connecting with ``target remote``, one ``stepi`` (the
  proxy's session setup, as for the raw client), then GDB_STEPS times ``stepi``
  and ``x/2xg $sp``, timed inside gdb around those commands; prints ms for
  the block, µs per command, and the proxy's CPU.

Ratios are against straight in the same run; the load average is printed
at the start and the end, since the machine may be shared.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from integration.harness import debuggers
from integration.harness.programs import build
from integration.harness.rawrsp import RawPeer
from integration.harness.stubs import OutputPump, kill_tree, start_stub, venv_python
from proxy.shell.resident import request
from rsp.framing import rle_expand

REPO = Path(__file__).resolve().parents[1]

WAYS = ("straight", "relay", "resident", "serve", "probe")
RELAY_READY = re.compile(rb"relay: listening on 127\.0\.0\.1:(\d+)")
KINDS = ("vCont;s", "g", "p10", "m pc", "p7", "m sp", "Hg", "qXfer:threads")
QSUPPORTED = (b"qSupported:multiprocess+;swbreak+;hwbreak+;qRelocInsn+;fork-events+;vfork-events+;"
              b"exec-events+;vContSupported+;QThreadEvents+;no-resumed+;xmlRegisters=i386")
READY = re.compile(rb"asyncrsp: listening on 127\.0\.0\.1:(\d+)")


def run_time_ns(pid: int | None) -> int:
    """CPU time the process ran (ns, /proc/PID/schedstat); 0 without a pid."""
    if pid is None:
        return 0
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0])


# ------------------------------------------------------------------ the ways


class Resident:
    """One `asyncrsp resident` for the whole run."""

    def __init__(self, tmp: Path, tree: Path) -> None:
        self.path = str(tmp / "resident.sock")
        self.tree = tree
        self.proc = subprocess.Popen([venv_python(), "-m", "proxy", "resident", "--socket", self.path],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True, cwd=tree,
                                     env=dict(os.environ, PYTHONPATH=str(tree)))
        self.err = OutputPump(self.proc.stderr)
        deadline = time.monotonic() + 30
        while not os.path.exists(self.path):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise SystemExit(f"asyncrsp resident did not start: {self.err.text()!r}")
            time.sleep(0.02)
        time.sleep(0.2)  # bound, then preloading: the first request waits in its backlog anyway

    @contextlib.contextmanager
    def session(self, upstream: str, extra: list[str]) -> Iterator[tuple[str, int]]:
        rfd, wfd = os.pipe()
        null = os.open(os.devnull, os.O_RDONLY)
        try:
            pid, conn = request(self.path, ["serve", "--once", "--listen", "127.0.0.1:0", "--upstream", upstream,
                                            *extra], fds=[null, wfd, wfd], targets=[0, 1, 2], env=dict(os.environ, PYTHONPATH=str(self.tree)),
                                cwd=str(self.tree))
        finally:
            os.close(null)
            os.close(wfd)
        out = OutputPump(os.fdopen(rfd, "rb"))
        try:
            m = out.wait_for(READY, 10)
            if not m:
                raise SystemExit(f"resident session did not listen: {out.text()!r}")
            yield f"127.0.0.1:{int(m.group(1))}", pid
        finally:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
            conn.close()

    def close(self) -> None:
        kill_tree(self.proc)
        self.err.join()


@contextlib.contextmanager
def way_address(way: str, upstream: str, resident: Resident | None,
                tree: Path) -> Iterator[tuple[str, int | None]]:
    """(address the client connects to, the proxy's pid or None)."""
    if way == "straight":
        yield upstream, None
    elif way == "relay":
        proc = subprocess.Popen([sys.executable, "-m", "bench.relay", upstream], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, cwd=REPO)
        out = OutputPump(proc.stdout)
        try:
            m = out.wait_for(RELAY_READY, 20)
            if not m:
                raise SystemExit("the relay did not listen")
            yield f"127.0.0.1:{int(m.group(1))}", proc.pid
        finally:
            kill_tree(proc)
            out.join()
    elif way == "serve":
        proc = subprocess.Popen([venv_python(), "-m", "proxy", "serve", "--once", "--listen", "127.0.0.1:0",
                                 "--upstream", upstream], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, start_new_session=True, cwd=tree,
                                env=dict(os.environ, PYTHONPATH=str(tree)))
        err = OutputPump(proc.stderr)
        try:
            m = err.wait_for(READY, 20)
            if not m:
                raise SystemExit(f"asyncrsp serve did not listen: {err.text()!r}")
            yield f"127.0.0.1:{int(m.group(1))}", proc.pid
        finally:
            kill_tree(proc)
            err.join()
    else:
        assert resident is not None
        with resident.session(upstream, ["--probe", "."] if way == "probe" else []) as got:
            yield got


# ------------------------------------------------------------- the raw client


class Client(RawPeer):
    """gdb's side of the wire, as little as gdb does: no-ack after the handshake."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=20)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().__init__(sock, timeout=20)

    def ask(self, body: bytes) -> bytes:
        reply = self.request(body)
        while reply[:1] == b"O" and reply != b"OK":  # console output before a stop
            reply = self.reply(body)
        return reply

    def handshake(self) -> bytes:
        self.ask(QSUPPORTED)
        if self.ask(b"QStartNoAckMode") == b"OK":
            self.noack = True
        self.ask(b"Hgp0.0")
        stop = self.ask(b"?")
        m = re.search(rb"thread:([0-9a-fp.]+);", stop)
        if not m:
            raise SystemExit(f"no thread in the stop reply {stop!r}")
        return m.group(1)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.send_packet(b"k")
        self.sock.close()


def _le(hexbytes: bytes) -> int:
    return int.from_bytes(bytes.fromhex(hexbytes[:16].decode()), "little")


def _expedited(stop: bytes, regnum: bytes) -> int:
    """A register the stop reply carries (gdbserver answers `p` with nothing on x86-64: gdb
    takes pc and sp from the stop and reads the rest with `g`, so the `m`s read real code and
    stack; they read address 0 before, an error the stub answered)."""
    m = re.search(rb"(?:^T..|;)" + regnum + rb":([0-9a-f]+);", rle_expand(stop))
    return _le(m.group(1)) if m else 0


def raw_session(address: str, pid: int | None, count: int, times: dict[str, list[float]],
                setup: list[float]) -> tuple[float, int, int]:
    """COUNT stepi cycles; each exchange's wall µs into `times`; the wall
    seconds of the setup and the proxy's CPU ns up to its end added to `setup`. Returns (wall
    seconds of the loop, exchanges, the proxy's CPU ns across it)."""
    t0 = time.perf_counter()
    c = Client(address)
    try:
        thread = c.handshake()
        # The connection, gdb's handshake and the first resume are the proxy's
        # session setup (the stub asked what it is, the program's identity
        # proved, its capture planned and planted), not exchanges: timed apart,
        # with all the session's CPU so far.
        c.ask(b"vCont;s:" + thread)
        setup[0] += time.perf_counter() - t0
        setup[1] += run_time_ns(pid)
        cpu0 = run_time_ns(pid)
        t_start = time.perf_counter()
        n = 0
        clock = time.perf_counter
        for _ in range(count):
            t0 = clock()
            stop = c.ask(b"vCont;s:" + thread)
            t1 = clock()
            c.ask(b"g")
            t2 = clock()
            pc = _le(c.ask(b"p10")) or _expedited(stop, b"10")
            t3 = clock()
            c.ask(b"m%x,8" % pc)
            t4 = clock()
            sp = _le(c.ask(b"p7")) or _expedited(stop, b"07")
            t5 = clock()
            c.ask(b"m%x,40" % sp)
            t6 = clock()
            c.ask(b"Hg" + thread)
            t7 = clock()
            c.ask(b"qXfer:threads:read::0,fff")
            t8 = clock()
            if stop[:1] != b"T":
                raise SystemExit(f"a step ended in {stop!r}")
            for kind, a, b in zip(KINDS, (t0, t1, t2, t3, t4, t5, t6, t7), (t1, t2, t3, t4, t5, t6, t7, t8)):
                times[kind].append((b - a) * 1e6)
            n += len(KINDS)
        wall = time.perf_counter() - t_start
        cpu = run_time_ns(pid) - cpu0
    finally:
        c.close()
    return wall, n, cpu


# --------------------------------------------------------------------- gdb


def gdb_session(address: str, pid: int | None, prog: Path, steps: int, tmp: Path) -> tuple[float, int]:
    """gdb -batch: `steps` times stepi + x/2xg $sp after a first stepi, timed inside gdb. Returns
    (seconds of the block, the proxy's CPU ns across it)."""
    stat = f"/proc/{pid}/schedstat" if pid is not None else ""
    cpu = (f"python _c = int(open('{stat}').read().split()[0])" if stat else "python _c = 0")
    cpu_end = (f"python print('CPU %d' % (int(open('{stat}').read().split()[0]) - _c))" if stat
               else "python print('CPU 0')")
    # The first resume is the proxy's session setup (the program's identity proved, its
    # capture planned and planted: ~0.3 s of analysis), timed apart as the raw client's is:
    # in the block it was most of the proxy's cost per command at 300 steps.
    cmds = ["set confirm off", "set pagination off", f"target remote {address}", "stepi", cpu,
            "python import time; _t0 = time.perf_counter()"]
    cmds += ["stepi", "x/2xg $sp"] * steps
    cmds += ["python print('ELAPSED %.6f' % (time.perf_counter() - _t0))", cpu_end, "kill"]
    script = tmp / "steps.gdb"
    script.write_text("\n".join(cmds) + "\n")
    res = subprocess.run(debuggers.argv("gdb", "-nx", "-batch", "-x", str(script), str(prog)),
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, check=False)
    out = res.stdout + res.stderr
    m, c = re.search(r"ELAPSED ([\d.]+)", out), re.search(r"CPU (\d+)", out)
    if not m or not c:
        raise SystemExit(f"gdb did not finish its steps:\n{out[-2000:]}")
    return float(m.group(1)), int(c.group(1))


# ------------------------------------------------------------------- the run


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--count", type=int, default=400, help="stepi cycles of the raw client per session")
    p.add_argument("--gdb-steps", type=int, default=300, help="stepi + x commands of gdb per session")
    p.add_argument("--ways", default=",".join(WAYS), help=f"comma-separated, of {','.join(WAYS)}")
    p.add_argument("--only", choices=("raw", "gdb"), help="only one of the two clients")
    p.add_argument("--base", type=Path, metavar="DIR",
                   help="also run each proxy way with the proxy of checkout DIR (as WAY@base), e.g. main, "
                        "to measure a change in the same run")
    a = p.parse_args(argv)
    ways = [w for w in a.ways.split(",") if w]
    if "straight" not in ways or any(w not in WAYS for w in ways):
        raise SystemExit(f"--ways: straight and any of {', '.join(WAYS[1:])}")
    if a.base is not None:
        ways += [f"{w}@base" for w in ways if w not in ("straight", "relay")]
    prog = build("spin")
    load0 = os.getloadavg()
    raw: dict[str, dict[str, list[float]]] = {w: {k: [] for k in KINDS} for w in ways}
    raw_tot = {w: [0.0, 0, 0] for w in ways}  # wall s, exchanges, CPU ns
    first = {w: [0.0, 0.0] for w in ways}  # connection, handshake, first step: wall s, CPU ns
    gdb_tot = {w: [0.0, 0, 0] for w in ways}  # wall s, commands, CPU ns
    with tempfile.TemporaryDirectory(prefix="bench_exchange.") as tmpdir:
        tmp = Path(tmpdir)
        residents: dict[str, Resident] = {}
        trees = {"": REPO, "@base": a.base}
        try:
            for suffix, tree in trees.items():
                if tree is not None and any(w in (f"resident{suffix}", f"probe{suffix}") for w in ways):
                    (tmp / suffix.strip("@")).mkdir(exist_ok=True)
                    residents[suffix] = Resident(tmp / suffix.strip("@"), tree)
            for r in range(a.rounds):
                order = ways[r % len(ways):] + ways[:r % len(ways)]
                for way in order:
                    kind, at, _ = way.partition("@")
                    suffix = at and "@base"
                    tree, resident = trees[suffix] or REPO, residents.get(suffix)
                    if a.only != "gdb":
                        with start_stub("gdbserver", prog, ["600"]) as stub, \
                                way_address(kind, stub.address, resident, tree) as (addr, pid):
                            wall, n, cpu = raw_session(addr, pid, a.count, raw[way], first[way])
                            for i, v in enumerate((wall, n, cpu)):
                                raw_tot[way][i] += v
                    if a.only != "raw":
                        with start_stub("gdbserver", prog, ["600"]) as stub, \
                                way_address(kind, stub.address, resident, tree) as (addr, pid):
                            wall, cpu = gdb_session(addr, pid, prog, a.gdb_steps, tmp)
                            for i, v in enumerate((wall, a.gdb_steps * 2, cpu)):
                                gdb_tot[way][i] += v
        finally:
            for resident in residents.values():
                resident.close()
    load1 = os.getloadavg()
    print(f"load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end; {a.rounds} rounds, "
          f"the ways interleaved" + (f"; WAY@base: the proxy of {a.base}" if a.base else ""))
    if a.only != "gdb":
        print(f"\nraw client: {a.count} stepi cycles of {len(KINDS)} exchanges per session "
              "(median wall us per exchange of each kind; mean; proxy CPU us per exchange;\n"
              "the connection, the handshake and the first step, the proxy's session setup, apart:\n"
              "wall ms, and the session's CPU ms since it started, mean per session)")
        print(f"{'way':<15}" + "".join(f"{k:>14}" for k in KINDS) + f"{'mean':>9}{'ratio':>7}{'CPU':>7}{'setup':>8}{'CPU':>7}")
        base = raw_tot["straight"][0] / raw_tot["straight"][1]
        for w in ways:
            wall, n, cpu = raw_tot[w]
            cells = "".join(f"{statistics.median(raw[w][k]):14.0f}" for k in KINDS)
            print(f"{w:<15}{cells}{wall / n * 1e6:9.0f}{wall / n / base:6.2f}x"
                  f"{cpu / n / 1e3 if cpu else 0:7.1f}{first[w][0] / a.rounds * 1e3:8.1f}"
                  f"{first[w][1] / a.rounds / 1e6:7.1f}")
    if a.only != "raw":
        print(f"\ngdb -batch: {a.gdb_steps} x (stepi, x/2xg $sp) per session, timed inside gdb")
        print(f"{'way':<15}{'block ms':>10}{'us/command':>12}{'ratio':>8}{'+us/command':>13}{'proxy CPU us/command':>22}")
        base = gdb_tot["straight"][0] / gdb_tot["straight"][1]
        for w in ways:
            wall, n, cpu = gdb_tot[w]
            per = wall / n
            print(f"{w:<15}{wall / a.rounds * 1e3:10.0f}{per * 1e6:12.0f}{per / base:7.2f}x"
                  f"{(per - base) * 1e6:13.0f}{cpu / n / 1e3 if cpu else 0:22.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
