"""Uprobe capture without gdb, and the helpers of the uprobe tests that use gdb.

``spawn_stopped`` forks a program that stops itself before its exec (ASLR off, as
gdbserver runs it); ``run_captured`` runs it to its exit under a ``UprobeCapture``
alone; ``http_server_session`` drives the keep-alive http_server under one;
``stopped_under_wakes`` stops a program gdbserver runs under gdb (MI) and the proxy with
``--capture uprobes --wakes``.
``AVAILABLE``/``WHY``: whether this machine can attach uprobes (root, BPF
uprobe_multi links), and why not.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from integration.harness.normalise import normalise_transcript
from proxy.analysis.elf import open_elf
from proxy.analysis.model import CoroutineKind, Era, Inventory, ResumeFn
from proxy.capture.uprobes.capture import UprobeCapture
from proxy.graph.catalog import Catalog
from proxy.graph.engine import Engine
from proxy.graph.events import PollEnter

AVAILABLE, WHY = UprobeCapture.available(SimpleNamespace(local=True))


def spawn_stopped(argv: list[str], stdout: int | None = None) -> int:
    """fork; the child stops itself (ASLR off, as gdbserver does), then execs `argv` on SIGCONT
    (its stdout: the fd `stdout`, or /dev/null)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            import ctypes

            ctypes.CDLL(None).personality(0x0040000)  # ADDR_NO_RANDOMIZE
            os.dup2(stdout if stdout is not None else os.open(os.devnull, os.O_WRONLY), 1)
            os.kill(os.getpid(), signal.SIGSTOP)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    os.waitpid(pid, os.WUNTRACED)
    return pid


def run_captured(prog: Path, args: list[str], inv: Inventory, *, stalled: bool = False,
                 eng: Engine | None = None, cap: UprobeCapture | None = None,
                 before_exec: Callable[[], None] = lambda: None,
                 **kw: object) -> tuple[UprobeCapture, Engine, int]:
    """Run `prog` to its exit under uprobe capture alone; (capture, engine, exit status).
    `stalled`: the consumer reads nothing until the program has exited. `cap`: this
    capture instead of one made with `kw`. `before_exec`: called once the probes are
    attached, before the program's exec."""
    bias = 0x555555554000 if inv.pie else 0
    eng = eng if eng is not None else Engine(Catalog(inv, bias), keep_log=False)
    pid = spawn_stopped([str(prog), *map(str, args)])
    target = SimpleNamespace(path=str(prog), pid=pid, local=True, inventory=inv, bias=bias, engine=eng,
                             note=None, extra={})
    cap = cap if cap is not None else UprobeCapture(**kw)  # type: ignore[arg-type]
    cap.plan(target)  # type: ignore[arg-type]
    assert cap.install() is None
    assert cap.attached, cap.note
    before_exec()
    os.kill(pid, signal.SIGCONT)
    t0 = time.perf_counter()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if not stalled:
            cap.poll()
        time.sleep(0.005)
    cap.program_wall = time.perf_counter() - t0  # type: ignore[attr-defined]
    cap.sync()
    cap.uninstall()
    return cap, eng, os.waitstatus_to_exitcode(status)


def c_inventory(path: Path, fn: str) -> Inventory:
    """A one-function 'inventory' for a C program: its entry and its rets."""
    import capstone

    elf = open_elf(path)
    [sym] = [s for s in elf.symbols if s.name == fn]
    code = elf.read(sym.addr, sym.size) or b""
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    rets = tuple(i.address for i in md.disasm(code, sym.addr) if i.mnemonic == "ret")
    rf = ResumeFn(sym.addr, sym.addr + sym.size, fn, fn, fn, CoroutineKind.UNKNOWN, Era.MODERN, None, rets)
    return Inventory(None, str(path), elf.pie, elf.entry, [rf], {})


STATS = "monitor async stats --all"
BIAS = 0x555555554000  # gdbserver runs the program with ASLR off


def file_bytes(prog: Path, fn: str, n: int) -> bytes:
    elf = open_elf(prog)
    [sym] = [s for s in elf.symbols if s.name == fn]
    data = elf.read(sym.addr, n)
    assert data is not None
    return data


def symbol_addr(prog: Path, fn: str) -> int:
    [sym] = [s for s in open_elf(prog).symbols if s.name == fn]
    return sym.addr + (BIAS if open_elf(prog).pie else 0)


def proc_mem(pid: int, addr: int, n: int) -> bytes:
    with open(f"/proc/{pid}/mem", "rb") as f:
        f.seek(addr)
        return f.read(n)


def same_transcript(direct: list[tuple[str, str]], proxied: list[tuple[str, str]]) -> None:
    d, p = normalise_transcript(direct), normalise_transcript(proxied)
    for (dl, do), (pl, po) in zip(d, p):
        assert (dl, do) == (pl, po), f"{dl!r}:\n--- direct\n{do}\n--- proxy\n{po}"
    assert len(d) == len(p)


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/children") as f:
            out += [int(x) for x in f.read().split()]
    return out


def http_server_session(prog: Path, inv: Inventory, eng: Engine, cap: UprobeCapture,
                         drive: Callable[[int, int], list[Any]], after: Callable[[], Any]) -> tuple[str, Any]:
    """The keep-alive http_server (spawned stopped) under `cap`: `drive(pid, port)` once it
    listens (it returns its open connections), then the connections closed and /quit;
    `cap` synced after the exit, `after()` taken, and `cap` uninstalled. (The server's output,
    what `after` gave.)"""
    import http.client

    from integration.harness.stubs import free_port, port_listening

    bias = 0x555555554000 if inv.pie else 0
    port = free_port()
    out_r, out_w = os.pipe()
    pid = spawn_stopped([str(prog), str(port)], stdout=out_w)
    os.close(out_w)
    try:
        cap.plan(SimpleNamespace(path=str(prog), pid=pid, local=True, inventory=inv,  # type: ignore[arg-type]
                                 bias=bias, engine=eng, note=None, extra={}))
        assert cap.plan_ is not None
        assert cap.install() is None and cap.attached, cap.note
        os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while not port_listening(port) and time.monotonic() < deadline:
            time.sleep(0.01)
        for c in drive(pid, port):
            c.close()
        q = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            q.request("GET", "/quit")
            q.getresponse().read()
        except OSError:
            pass  # the server may close the connection as it ends
        os.waitpid(pid, 0)
        pid = 0
        cap.sync()
        got = after()
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        cap.uninstall()
    with os.fdopen(out_r) as f:
        return f.read(), got


class EntryCounting(Engine):
    """Counts the entries fed per site (recorded, sent late, or read at a stop)."""

    entries_by_site: dict[int, int]

    def feed(self, ev: Any) -> Any:
        if isinstance(ev, PollEnter):
            self.entries_by_site = getattr(self, "entries_by_site", {})
            self.entries_by_site[ev.site] = self.entries_by_site.get(ev.site, 0) + 1
        return super().feed(ev)


@contextlib.contextmanager
def stopped_under_wakes(prog: Path, args: list[str], ready: Callable[[Any], None],
                        extra: tuple[str, ...] = ()) -> Iterator[tuple[Any, Any]]:
    """gdb (MI) through the proxy with `--capture uprobes --wakes` (and `extra`) over gdbserver
    running `prog`: resumed, `ready(stub)` waited for, interrupted; yields (the MI session, the
    stop's views)."""
    from integration.harness.stubs import spawn_proxy, start_stub
    from integration.realworld import gauntlet

    with start_stub("gdbserver", prog, args) as stub:
        px = spawn_proxy(stub.address, extra=["--capture", "uprobes", "--wakes", *extra])
        try:
            mi = gauntlet._mi(prog, px.address)
            try:
                pid = stub.find_inferior()
                assert pid is not None
                mi.cmd("-exec-continue")
                ready(stub)
                gauntlet._interrupt(mi, pid)
                yield mi, gauntlet._views(mi)
            finally:
                mi.close()
        finally:
            px.close()
