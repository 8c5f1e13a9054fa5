"""The gauntlet: real programs (../shared/realworld) under real gdb -> asyncrsp -> gdbserver,
driven by real clients into states their source predicts, checked against truth tables
(truth.py) in four ways:

* capture: gdbserver starts the program, the proxy captures polls (its default), gdb's
  stop is a SIGINT (what gdbserver makes of Ctrl-C);
* attach: the program runs alone, gdbserver attaches late, the proxy plants nothing
  (`--mode off`);
* breakpoint: a gdb breakpoint in a sync function called inside a request; `monitor async
  bt` must give the whole logical backtrace the source says;
* ids: a second stop (continue, SIGINT) in each of the first two ways: every task keeps
  its id.

    python -m integration.realworld.gauntlet [--config realworld-debug ...] [--program P ...]

prints, per program and way, items right / items checked, and the misses.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from integration.harness.gdb import MiSession
from integration.harness.stubs import (
    free_port,
    kill_tree,
    port_listening,
    spawn_proxy,
    start_stub,
)
from integration.realworld import clients as drivers
from integration.realworld.truth import Table, tables
from integration.realworld.views import VIEWS, Items, Stop, check_bt, check_ids, check_state, parse_doc

WAYS = ("capture", "attach", "breakpoint", "ids")
SETTLE = float(os.environ.get("REALWORLD_SETTLE", "0.6"))  # seconds for the clients' state to settle


@dataclass
class Result:
    program: str
    config: str
    ways: dict[str, Items] = field(default_factory=lambda: {w: Items() for w in WAYS})
    errors: list[str] = field(default_factory=list)


def _binary(config: str, program: str) -> Path:
    from integration.corpus import build

    skip = build.skip_reason(config)
    if skip is not None:
        raise RuntimeError(str(skip))
    return build.pinned(build.binary(config, program))  # type: ignore[no-any-return]


def _args(table: Table, port: int) -> list[str]:
    return [a.replace("{port}", str(port)) for a in table.args]


def _wait_port(port: int, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not port_listening(port):
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listens on port {port} after {timeout:.0f} s")
        time.sleep(0.05)


def fixed_ports_taken(table: Table, wait: float = 0.0) -> str | None:
    """Why the program cannot run now (a port fixed in its source is taken: another program,
    another checkout's run of the same one), waiting up to `wait` seconds for them to free; None
    when they are free."""
    deadline = time.monotonic() + wait
    while True:
        taken = [p for p in (*table.binds, *((table.port,) if table.port is not None else ())) if port_listening(p)]
        if not taken:
            return None
        if time.monotonic() >= deadline:
            return (f"port {taken[0]} (fixed in {table.program}'s source) is taken by another program "
                    f"after {wait:.0f} s")
        time.sleep(0.5)


def _port(table: Table) -> int:
    for other in table.binds:  # a port the program binds besides its own: taken, it panics quietly
        if port_listening(other):
            raise RuntimeError(f"port {other} (the program binds it too, fixed in its source) is taken")
    if table.port is None:
        return free_port()
    if port_listening(table.port):
        raise RuntimeError(f"port {table.port} (fixed in the program's source) is taken")
    return table.port


@contextlib.contextmanager
def _helpers(table: Table, config: str) -> Iterator[dict[str, int]]:
    """Programs that run beside the one under test (an upstream server), not debugged."""
    procs: list[subprocess.Popen[bytes]] = []
    ports: dict[str, int] = {}
    stalls: list[socket.socket] = []
    try:
        for port in table.stalls:  # a listening socket nobody accepts on: connects, sends, no answer
            if port_listening(port):
                raise RuntimeError(f"port {port} (the program's upstream, fixed in its source) is taken")
            stalls.append(socket.create_server(("127.0.0.1", port), backlog=16))
        for program, args in table.helpers:
            port = free_port()
            ports[program] = port
            argv = [str(_binary(config, program)), *(a.replace("{port}", str(port)) for a in args)]
            procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True))
            _wait_port(port)
        yield ports
    finally:
        for p in procs:
            kill_tree(p)
        for sock in stalls:
            sock.close()


def _expand(table: Table, ports: dict[str, int]) -> Table:
    """{helper:NAME} in the args: that helper's port."""
    args = []
    for a in table.args:
        for name, port in ports.items():
            a = a.replace("{helper:%s}" % name, str(port))
        args.append(a)
    return replace(table, args=tuple(args))


def _mi(prog: Path, address: str) -> MiSession:
    mi = MiSession(prog, init=("set remotetimeout 120",), timeout=240)
    mi.cmd(f"-target-select remote {address}", timeout=240)
    return mi


def _console(mi: MiSession, command: str) -> str:
    """A CLI command's output through MI; gdb writes non-ASCII bytes (the tree's lines) as
    octal escapes there, decoded back to UTF-8 here."""
    text = mi.console(command, timeout=240)
    raw = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)
    try:
        return raw.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return text


def _views(mi: MiSession) -> Stop:
    text = {v: _console(mi, f"monitor async {v}") for v in VIEWS}
    chunks = []
    for i in range(256):
        out = mi.console(f"maint packet qXfer:asyncrsp.graph:read::{i * 0x800:x},800", timeout=240)
        chunks.append(out)
        if 'received: "l' in out or 'received: "E' in out or 'received: ""' in out:
            break
    stop = Stop(text, parse_doc("\n".join(chunks)))
    _dump(stop)
    return stop


_dumped = [0]


def _dump(stop: Stop) -> None:
    """REALWORLD_DUMP=DIR: every stop's views in DIR/stop-N.txt (for writing a truth table)."""
    where = os.environ.get("REALWORLD_DUMP")
    if not where:
        return
    import json

    _dumped[0] += 1
    Path(where).mkdir(parents=True, exist_ok=True)
    body = "".join(f"=={v}==\n{t}\n" for v, t in stop.text.items()) + "==json==\n" + json.dumps(stop.doc, indent=1)
    (Path(where) / f"stop-{_dumped[0]}.txt").write_text(body)


def _dump_log(px) -> None:  # type: ignore[no-untyped-def]
    """REALWORLD_DUMP=DIR: the proxy's own log (stderr) beside the stops' views."""
    where = os.environ.get("REALWORLD_DUMP")
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        with open(Path(where) / "proxy.log", "a") as f:
            f.write(px.stderr_text())


def _interrupt(mi: MiSession, pid: int) -> None:
    os.kill(pid, signal.SIGINT)  # what gdbserver sends for gdb's Ctrl-C
    mi.wait_stopped(timeout=240)


def _run_states(mi: MiSession, pid: int, table: Table, port: int, res: Result, way: str) -> None:
    """Each state: drive, stop, check; a second stop checks the ids."""
    src = table.where
    for state in table.states:
        conns = drivers.drive(state.clients, port)
        try:
            time.sleep(SETTLE)
            _interrupt(mi, pid)
            first = _views(mi)
            items, ids = check_state(first, state, src, table.program)
            res.ways[way].merge(items)
            mi.cmd("-exec-continue")
            time.sleep(SETTLE)
            _interrupt(mi, pid)
            res.ways["ids"].merge(check_ids(ids, _views(mi), state, src))
            mi.cmd("-exec-continue")
        finally:
            drivers.close_all(conns)
        time.sleep(0.2)


def run_capture(prog: Path, table: Table, res: Result) -> None:
    port = _port(table)
    with start_stub("gdbserver", prog, _args(table, port)) as stub:
        px = spawn_proxy(stub.address)
        try:
            mi = _mi(prog, px.address)
            try:
                pid = stub.find_inferior()
                assert pid is not None
                mi.cmd("-exec-continue")
                _wait_port(port)
                _run_states(mi, pid, table, port, res, "capture")
                if table.breakpoint is not None:
                    _run_breakpoint(mi, table, port, res)
            finally:
                mi.close()
        finally:
            _dump_log(px)
            px.close()


def _run_breakpoint(mi: MiSession, table: Table, port: int, res: Result) -> None:
    bp = table.breakpoint
    assert bp is not None
    _interrupt_now(mi)
    setup = drivers.drive(bp.setup, port)
    mi.cmd(f"-break-insert {bp.function}")
    mi.cmd("-exec-continue")
    conns: list[drivers.Connection] = []
    try:
        conns = drivers.drive(bp.clients, port)
        mi.wait_stopped(timeout=240)
        text = _console(mi, "monitor async bt")
        if os.environ.get("REALWORLD_DUMP"):
            _views(mi)  # the breakpoint's stop beside the states' (the views only: no item)
        items = check_bt(text, bp.bt, table.where)
        res.ways["breakpoint"].merge(items)
        if items.misses:
            res.errors.append("bt at the breakpoint:\n" + text)
    finally:
        drivers.close_all(conns + setup)


def _interrupt_now(mi: MiSession) -> None:
    """The program runs after the states: stop it to set the breakpoint."""
    mi.cmd("-exec-interrupt")
    mi.wait_stopped(timeout=240)


def run_attach(prog: Path, table: Table, res: Result) -> None:
    port = _port(table)
    p = subprocess.Popen([str(prog), *_args(table, port)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, env={**os.environ, **table.env})
    try:
        _wait_port(port)
        for state in table.states:
            conns = drivers.drive(state.clients, port)
            try:
                time.sleep(SETTLE)
                _attached_state(prog, p.pid, table, state, res)
            finally:
                drivers.close_all(conns)
            if p.poll() is not None:
                raise RuntimeError(f"the program died after the detach (status {p.returncode})")
    finally:
        kill_tree(p)


def _attached_state(prog: Path, pid: int, table: Table, state, res: Result) -> None:  # type: ignore[no-untyped-def]
    src = table.where
    with start_stub("gdbserver", prog, attach=pid) as stub:
        px = spawn_proxy(stub.address, extra=["--mode", "off"])
        try:
            mi = _mi(prog, px.address)
            try:
                first = _views(mi)
                items, ids = check_state(first, state, src, table.program)
                items.merge(_bt_thread(mi))
                res.ways["attach"].merge(items)
                mi.cmd("-exec-continue")
                time.sleep(SETTLE)
                _interrupt(mi, pid)
                res.ways["ids"].merge(check_ids(ids, _views(mi), state, src))
                mi.cmd("-target-detach")
            finally:
                mi.close()
        finally:
            _dump_log(px)
            px.close()


def _bt_thread(mi: MiSession) -> Items:
    """`monitor async bt` with no argument describes the thread gdb stopped in (its current
    thread), as gdb's own `bt` does."""
    items = Items()
    cur = re.search(r"Thread \d+\.(\d+)", _console(mi, "thread"))
    text = _console(mi, "monitor async bt")
    said = re.search(r"thread (\d+)", text)
    items.add(cur is not None and said is not None and cur.group(1) == said.group(1),
              f"bt: gdb's current thread is {cur and cur.group(1)}, `monitor async bt` describes {said and said.group(1)}")
    return items


def run(table: Table, config: str, ways: tuple[str, ...] = WAYS) -> Result:
    res = Result(table.program, config)
    try:
        prog = _binary(config, table.program)
        with _helpers(table, config) as ports:
            t = _expand(table, ports)
            if "capture" in ways or "breakpoint" in ways:
                run_capture(prog, t, res)
            if "attach" in ways:
                run_attach(prog, t, res)
    except Exception as err:  # noqa: BLE001 - reported per program, the gauntlet goes on
        res.errors.append(f"{type(err).__name__}: {err}")
    return res


def report(results: list[Result], verbose: bool = True) -> str:
    lines = []
    total = Items()
    for r in results:
        cells = []
        for w in WAYS:
            it = r.ways[w]
            total.right += it.right
            total.checked += it.checked
            cells.append(f"{w} {it.right}/{it.checked}")
        lines.append(f"{r.program:24} {r.config:18} " + "  ".join(cells) + ("  ERROR" if r.errors else ""))
        if verbose:
            for w in WAYS:
                lines += [f"    {w}: {m}" for m in r.ways[w].misses[:12]]
            lines += ["    " + e.replace("\n", "\n    ") for e in r.errors]
    pct = 100.0 * total.right / total.checked if total.checked else 0.0
    lines.append(f"realworld: {total.right}/{total.checked} items right ({pct:.1f}%) over {len(results)} runs")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", action="append", help="default: realworld-debug and realworld-release")
    ap.add_argument("--program", action="append", help="default: every truth table")
    ap.add_argument("--way", action="append", choices=WAYS[:3], help="default: all")
    ap.add_argument("-q", "--quiet", action="store_true", help="only the figures, no misses")
    a = ap.parse_args(argv)
    from integration.harness.stubs import become_subreaper

    become_subreaper()
    results = []
    for config in a.config or ["realworld-debug", "realworld-release"]:
        for table in tables(a.program):
            r = run(table, config, tuple(a.way or WAYS))
            results.append(r)
            print(report([r], not a.quiet).rsplit("\n", 1)[0], flush=True)
    print(report(results, verbose=False).splitlines()[-1])
    return 0 if all(not r.errors and all(not i.misses for i in r.ways.values()) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
