"""Uprobe capture, for real: the kernel's uprobes on real programs, real gdb and gdbserver.

Needs root and a kernel with BPF uprobe_multi links (Linux >= 6.6): every
test skips with the exact reason otherwise.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from integration.harness import programs as cprogs
from proxy.analysis.elf import open_elf
from proxy.analysis.inventory import build_inventory
from proxy.analysis.model import CoroutineKind, Era, Inventory, ResumeFn
from proxy.capture.uprobes.capture import UprobeCapture
from proxy.graph.catalog import Catalog
from proxy.graph.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "integration" / "corpus"))
sys.path.insert(0, str(ROOT / "integration"))

import build  # noqa: E402
import markers  # noqa: E402
import test_await_graph as ag  # noqa: E402

_OK, _WHY = UprobeCapture.available(SimpleNamespace(local=True))
pytestmark = pytest.mark.skipif(not _OK, reason=_WHY)


def _binary(config: str, program: str) -> Path:
    got = build.build(configs=[config], programs=[program]).get((config, program))
    if not isinstance(got, Path):
        pytest.skip(f"{program} ({config}) not built: {got}")
    return got


# ---------------------------------------------------------------- without gdb

def spawn_stopped(argv: list[str]) -> int:
    """fork; the child stops itself (ASLR off, as gdbserver does), then execs `argv` on SIGCONT."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            import ctypes

            ctypes.CDLL(None).personality(0x0040000)  # ADDR_NO_RANDOMIZE
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, 1)
            os.kill(os.getpid(), signal.SIGSTOP)
            os.execv(argv[0], argv)
        finally:
            os._exit(127)
    os.waitpid(pid, os.WUNTRACED)
    return pid


def run_captured(prog: Path, args: list[str], inv: Inventory, **kw: object) -> tuple[UprobeCapture, Engine, int]:
    """Run `prog` to its exit under uprobe capture alone; (capture, engine, exit status)."""
    bias = 0x555555554000 if inv.pie else 0
    eng = Engine(Catalog(inv, bias), keep_log=False)
    pid = spawn_stopped([str(prog), *map(str, args)])
    target = SimpleNamespace(path=str(prog), pid=pid, local=True, inventory=inv, bias=bias, engine=eng,
                             note=None, extra={})
    cap = UprobeCapture(**kw)  # type: ignore[arg-type]
    cap.plan(target)  # type: ignore[arg-type]
    assert cap.install() is None
    assert cap.attached, cap.note
    os.kill(pid, signal.SIGCONT)
    t0 = time.perf_counter()
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        cap.poll()
        time.sleep(0.005)
    cap.program_wall = time.perf_counter() - t0  # type: ignore[attr-defined]
    cap.sync()
    cap.uninstall()
    return cap, eng, os.waitstatus_to_exitcode(status)


def _c_inventory(path: Path, fn: str) -> Inventory:
    """A one-function 'inventory' for a C program: its entry and its rets."""
    import capstone

    elf = open_elf(path)
    [sym] = [s for s in elf.symbols if s.name == fn]
    code = elf.read(sym.addr, sym.size) or b""
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    rets = tuple(i.address for i in md.disasm(code, sym.addr) if i.mnemonic == "ret")
    rf = ResumeFn(sym.addr, sym.addr + sym.size, fn, fn, fn, CoroutineKind.UNKNOWN, Era.MODERN, None, rets)
    return Inventory(None, str(path), elf.pie, elf.entry, [rf], {})


@pytest.mark.parametrize("calls,threads", [(1000, 1), (20000, 4), (5000, 8)])
def test_exact_counts_on_the_c_probe_program(calls: int, threads: int) -> None:
    prog = cprogs.build("probe_count")
    inv = _c_inventory(prog, "probed")
    cap, eng, code = run_captured(prog, [calls, threads], inv, unwind_share=0.0)
    assert code == 0
    assert cap.decoder is not None
    d = cap.decoder.stats
    assert (d.entries, d.exits, d.bad) == (calls, calls, 0), cap.stats_lines()
    assert cap.lost == 0
    # probed(0) has a null "self": the engine rejects that one entry, nothing else
    st = eng.stats()
    assert st.exits_missed == 0 and st.rejected == 1 and st.rejected_reasons == (("null self pointer", 1),)
    assert st.unmatched_exits == 1  # the exit of that rejected entry


def test_release_build_without_frame_pointers_unwinds_from_the_slice() -> None:
    prog = _binary("release", "tokio_bench")
    inv = build_inventory(str(prog))
    cap, eng, code = run_captured(prog, [300, "mt"], inv, unwind_share=1.0, unwind_queue=1 << 20)
    assert code == 0
    u = cap.unwinder
    assert u is not None
    s = u.stats
    cap.drop_unwind_queue()
    print("\n".join(cap.stats_lines()))
    assert s.unwound > 1000, s
    good = s.full + s.five_or_more
    assert good >= 0.9 * s.unwound, s
    assert s.full + s.partial == s.unwound  # the rest are marked partial
    assert s.parent_disagree == 0, s


def test_sigkill_of_the_capturing_process_leaves_the_program_running() -> None:
    """A separate Python process attaches, then dies by SIGKILL: the kernel takes the probes out."""
    prog = cprogs.build("probe_count")
    pid = spawn_stopped([str(prog), "300000", "2"])
    code = f"""
import sys, time
from types import SimpleNamespace
sys.path.insert(0, {str(ROOT)!r})
from integration.test_uprobes import _c_inventory
from proxy.capture.uprobes.capture import UprobeCapture
from proxy.graph.catalog import Catalog
from proxy.graph.engine import Engine
from pathlib import Path
inv = _c_inventory(Path({str(prog)!r}), "probed")
eng = Engine(Catalog(inv, 0x555555554000 if inv.pie else 0), keep_log=False)
t = SimpleNamespace(path={str(prog)!r}, pid={pid}, local=True, inventory=inv, bias=eng.catalog.load_bias,
                    engine=eng, note=None, extra={{}})
cap = UprobeCapture(unwind_share=0.0)
cap.plan(t); cap.install()
print("attached" if cap.attached else cap.note, flush=True)
while True:
    cap.poll(); time.sleep(0.005)
"""
    loader = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert loader.stdout is not None
        assert loader.stdout.readline().strip() == "attached"
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.3)  # the program is mid-run, its calls probed
        loader.send_signal(signal.SIGKILL)
        loader.wait()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        if loader.poll() is None:
            loader.kill()


def test_high_event_rate_drops_under_one_percent() -> None:
    """The tokio benchmark (~25k events/s here: its debug entries are single-stepped sites)."""
    prog = _binary("debug", "tokio_bench")
    inv = build_inventory(str(prog))
    cap, eng, code = run_captured(prog, [900, "ct"], inv)
    wall = cap.program_wall  # type: ignore[attr-defined]
    assert code == 0
    st = eng.stats()
    rate = st.events / wall
    print(f"\n{st.events} events while the program ran {wall:.2f} s ({rate:,.0f}/s); lost {cap.lost}")
    assert st.events > 100_000
    assert cap.lost < 0.01 * (st.events + cap.lost), cap.stats_lines()


# ---------------------------------------------------------------- through gdb

def _norm(text: str, polls: bool) -> str:
    """Thread ids differ between two runs: every tid becomes TID. With `polls`
    False the POLLS column is masked too: at the end of the run the number of
    times `run` found a tokio timer still Pending depends on how fast the
    program ran, and breakpoint capture slows it ~100 times."""
    text = re.sub(r"(?<![#x\w])\d{4,7}\b", "TID", text)
    if not polls:
        text = re.sub(r"^(#\d+\s+\S+\s+\S+(?: on thread TID)?\s+)\d+", r"\1N", text, flags=re.M)
    return text


SAME_GRAPH = [
    ("debug", "tokio_app", ["ct"], "tokio_app.rs", "c_after_sleep"),
    ("debug", "tokio_app", ["ct"], "tokio_app.rs", "main_done"),
    ("debug", "tokio_app", ["mt"], "tokio_app.rs", "c_after_sleep"),
    ("old-debug", "tokio_app", ["ct"], "tokio_app.rs", "c_after_sleep"),
    ("old-debug", "tokio_app", ["ct"], "tokio_app.rs", "main_done"),
    ("debug", "nested", [], "main.rs", "c_after_yield"),
    ("debug", "nested", [], "main.rs", "main_done"),
    ("old-debug", "nested", [], "main.rs", "c_after_yield"),
]


@pytest.mark.parametrize("config,program,args,src,bp", SAME_GRAPH)
def test_same_graph_as_breakpoint_capture(config: str, program: str, args: list[str], src: str, bp: str) -> None:
    prog = _binary(config, program)
    line = markers.breakpoint_markers(program)[bp][1]
    got = {}
    for capture in ("breakpoints", "uprobes"):
        out = ag.session(prog, args, [f"break {src}:{line}", "continue", *ag.ask("bt", "edges", "tasks", "tree", "stats")],
                         extra=["--capture", capture])
        stats = ag.section(out, "stats")
        assert f"capture: {capture}" in stats, stats
        got[capture] = {s: _norm(ag.section(out, s), bp != "main_done") for s in ("bt", "edges", "tasks", "tree")}
    for s in ("bt", "edges", "tasks", "tree"):
        assert got["uprobes"][s] == got["breakpoints"][s], (s, got)


def test_c_program_near_100k_events_per_second_drops_under_one_percent() -> None:
    """probe_count -O0: `probed` starts with an emulated `push %rbp`, so it runs at ~90k events/s here."""
    prog = cprogs.build("probe_count")
    cap, eng, code = run_captured(prog, [500000, 2], _c_inventory(prog, "probed"))
    assert code == 0 and cap.decoder is not None
    n = cap.decoder.stats.records
    print(f"\n{n} events while the program ran {cap.program_wall:.2f} s "  # type: ignore[attr-defined]
          f"({n / cap.program_wall:,.0f}/s); lost {cap.lost}")  # type: ignore[attr-defined]
    assert n + cap.lost == 1_000_000
    assert cap.lost < 0.01 * 1_000_000
