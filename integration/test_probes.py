"""Probe counts are exact.

probe_count calls ``probed()`` N times (from T threads) and prints
``sum=N*N calls=N`` (sum of 2i+1 for i < N). Through the proxy with
``--probe ^probed$ --capture breakpoints`` (a hidden breakpoint), a gdb
session stops at the ``printf`` after the last call and asks ``monitor async
stats``: the probe must have counted exactly N hits, in all-stop mode, with
one and with several threads, and with and without the client's own
breakpoint at the very same address (``break *probed``). With the client's
breakpoint, gdb must also have seen all N stops (an ``ignore`` count makes
gdb resume by itself; ``info breakpoints`` then says "already hit N times").

Under the default ``--capture auto`` on this C program (no async code), where
uprobes can run (root, the program a process of this host), every ``--probe``
is a counting uprobe instead: the same exact counts, and no hidden stop
(`test_auto_counts_probes_with_uprobes`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from integration.harness.gdb import gdb_batch
from integration.harness.stubs import start_proxy, start_stub
from integration.harness.tools import require_tool

N = 400


def _printf_line(programs: dict[str, Path]) -> int:
    src = Path(__file__).parent / "programs" / "probe_count.c"
    for no, line in enumerate(src.read_text().splitlines(), 1):
        if 'printf("sum=' in line:
            return no
    raise AssertionError("probe_count.c has no printf line")


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize("client_bp", [False, True], ids=["proxy-only", "shared-address"])
def test_probe_hits_exact(threads: int, client_bp: bool, programs: dict[str, Path]) -> None:
    require_tool("gdb", "gdbserver")
    prog = programs["probe_count"]
    cmds = []
    if client_bp:
        cmds += ["break *probed", f"ignore 1 {10 * N}"]
    cmds += [f"break probe_count.c:{_printf_line(programs)}", "continue",
             "monitor async stats --all", "info breakpoints", "continue"]
    with start_stub("gdbserver", prog, [str(N), str(threads)]) as stub, \
            start_proxy(stub.address, probes=["^probed$"], extra=["--capture", "breakpoints"]) as px:
        run = gdb_batch(prog, [f"target remote {px.address}", *cmds], timeout=120)
        assert px.wait(timeout=20) == 0, px.stderr_text()
        stub.wait(timeout=10)
        out = run.output
        assert f"sum={N * N} calls={N}" in stub.output_text(), stub.output_text()
    assert "exited normally" in out, out
    total = re.search(r"probe hits: (\d+)", out)
    assert total, f"no 'probe hits' in monitor output:\n{out}"
    assert int(total.group(1)) == N, out
    per_probe = re.search(r"^\s*probed: (\d+)", out, re.M)
    assert per_probe and int(per_probe.group(1)) == N, out
    if client_bp:
        assert re.search(rf"breakpoint already hit {N} times", out), out


@pytest.mark.parametrize("threads", [1, 4])
def test_a_target_side_condition_at_a_probe(threads: int, programs: dict[str, Path]) -> None:
    """gdb evaluates a breakpoint's condition in gdbserver (`condition-evaluation target`)
    through the proxy as straight, at the address of a hidden probe too: gdb stops where the
    condition holds, as many times as straight (once: the one call with x == 7), and the
    probe still counts every call (the stub holds the breakpoint without the condition for
    both, and gdb evaluates the condition again at each stop it is shown)."""
    require_tool("gdb", "gdbserver")
    prog = programs["probe_count"]
    cmds = ["set breakpoint condition-evaluation target", "break *probed if $rdi == 7",
            f"break probe_count.c:{_printf_line(programs)}", "continue", "info registers rdi", "continue",
            "info breakpoints", "continue"]
    outs = {}
    for way in ("straight", "proxy"):
        with start_stub("gdbserver", prog, [str(N), str(threads)]) as stub:
            if way == "straight":
                run = gdb_batch(prog, [f"target remote {stub.address}", *cmds], timeout=120)
            else:
                with start_proxy(stub.address, probes=["^probed$"], extra=["--capture", "breakpoints"]) as px:
                    run = gdb_batch(prog, [f"target remote {px.address}", *cmds[:-1], "monitor async stats --all",
                                           cmds[-1]], timeout=120)
                    assert px.wait(timeout=20) == 0, px.stderr_text()
            stub.wait(timeout=10)
            assert f"sum={N * N} calls={N}" in stub.output_text(), stub.output_text()
        outs[way] = run.output
    for way, out in outs.items():
        assert "does not support breakpoint condition evaluation" not in out, (way, out)
        assert re.search(r"rdi +0x7 +7", out), (way, out)
        assert re.search(r"stop only if \$rdi == 7 \(target evals\)\n\s+breakpoint already hit 1 time", out), (way, out)
        assert "exited normally" in out, (way, out)
    hits = re.search(r"^\s*probed: (\d+)", outs["proxy"], re.M)
    assert hits and int(hits.group(1)) == N, outs["proxy"]


@pytest.mark.parametrize("probe, capture", [("^worker$", "breakpoints"), ("^probed$", "breakpoints"),
                                            ("^probed$", "uprobes")], ids=["elsewhere", "same-address", "uprobe"])
def test_a_dprintf_in_agent_style(probe: str, capture: str, programs: dict[str, Path]) -> None:
    """gdb's `dprintf` in agent style (BreakpointCommands: gdbserver prints, gdb never stops):
    through the proxy as straight where the proxy has no breakpoint of its own (the stub prints
    each call, gdb shows `agent-printf`, no fallback warning), also at a uprobe's address (the
    client's breakpoint goes to the stub as a hardware one, with its commands); at a hidden
    breakpoint's own address the stub must hold the breakpoint plain (its commands would swallow
    the probe's hits, and gdb does not run agent commands at a stop it is shown): the proxy says
    so, and the probe still counts every call."""
    require_tool("gdb", "gdbserver")
    if capture == "uprobes":
        from proxy.capture.uprobes import available

        why = available(None)
        if why is not None:
            pytest.skip(f"uprobes cannot run here: {why}")
    prog = programs["probe_count"]
    n = 5
    cmds = ["set dprintf-style agent", 'dprintf *probed,"hit %d\\n",$rdi',
            f"break probe_count.c:{_printf_line(programs)}", "continue", "info breakpoints", "continue"]
    outs = {}
    for way in ("straight", "proxy"):
        with start_stub("gdbserver", prog, [str(n), "1"]) as stub:
            if way == "straight":
                run = gdb_batch(prog, [f"target remote {stub.address}", *cmds], timeout=120)
            else:
                with start_proxy(stub.address, probes=[probe], extra=["--capture", capture]) as px:
                    run = gdb_batch(prog, [f"target remote {px.address}", *cmds[:-1], "monitor async stats --all",
                                           cmds[-1]], timeout=120)
                    assert px.wait(timeout=20) == 0, px.stderr_text()
                    notices = px.stderr_text()
            stub.wait(timeout=10)
            printed = re.findall(r"^hit (\d+)$", stub.output_text(), re.M)
        outs[way] = (run.output, printed)
    straight, proxy = outs["straight"], outs["proxy"]
    assert straight[1] == [str(i) for i in range(n)], straight
    for out in (straight[0], proxy[0]):
        assert 'agent-printf "hit %d\\n",$rdi' in out and "Target cannot run dprintf" not in out, out
        assert "exited normally" in out, out
    if probe == "^worker$" or capture == "uprobes":
        assert proxy[1] == straight[1], proxy
        assert "carries target-side commands" not in notices, notices
    if capture == "uprobes":
        assert "capture: uprobes" in proxy[0], proxy[0]
        hits = re.search(r"^\s*probed: (\d+)", proxy[0], re.M)
        assert hits and int(hits.group(1)) == n, proxy[0]
    elif probe == "^probed$":
        assert "carries target-side commands" in notices, notices
        hits = re.search(r"^\s*probed: (\d+)", proxy[0], re.M)
        assert hits and int(hits.group(1)) == n, proxy[0]


def test_probe_hits_zero_without_calls(programs: dict[str, Path]) -> None:
    """The counter is not a constant: a run with no calls reports 0 hits."""
    require_tool("gdb", "gdbserver")
    prog = programs["probe_count"]
    with start_stub("gdbserver", prog, ["0"]) as stub, \
            start_proxy(stub.address, probes=["^probed$"], extra=["--capture", "breakpoints"]) as px:
        run = gdb_batch(prog, [f"target remote {px.address}",
                               f"break probe_count.c:{_printf_line(programs)}", "continue",
                               "monitor async stats --all", "continue"], timeout=60)
        px.wait(timeout=20)
    m = re.search(r"probe hits: (\d+)", run.output)
    assert m and int(m.group(1)) == 0, run.output


@pytest.mark.parametrize("client_bp", [False, True], ids=["proxy-only", "shared-address"])
@pytest.mark.parametrize("probe", ["^probed$", "."])
def test_auto_counts_probes_with_uprobes(probe: str, client_bp: bool, programs: dict[str, Path]) -> None:
    """`--capture auto` (the default), a C program: every --probe function is a
    kernel uprobe that counts, no hidden stop. 4 threads call probed() N times;
    the count equals the program's own printed count, with the client's
    `break *probed` at the same address too (gdb then sees all N stops: its
    Z0 there went to the stub as a hardware breakpoint). With `--probe .`
    every function of the program is counted, main once."""
    require_tool("gdb", "gdbserver")
    from proxy.capture.uprobes import available

    why = available(None)
    if why is not None:
        pytest.skip(f"uprobes cannot run here, auto keeps hidden breakpoints: {why}")
    prog = programs["probe_count"]
    cmds = ["break *probed", f"ignore 1 {10 * N}"] if client_bp else []
    cmds += [f"break probe_count.c:{_printf_line(programs)}", "continue",
             "monitor async stats --all", "monitor async capture", "info breakpoints", "continue"]
    with start_stub("gdbserver", prog, [str(N), "4"]) as stub, \
            start_proxy(stub.address, probes=[probe]) as px:
        run = gdb_batch(prog, [f"target remote {px.address}", *cmds], timeout=120)
        assert px.wait(timeout=20) == 0, px.stderr_text()
        stub.wait(timeout=10)
        printed = re.search(r"sum=(\d+) calls=(\d+)", stub.output_text())
        err = px.stderr_text()
    out = run.output
    assert printed and int(printed.group(2)) == N, stub.output_text()
    assert "exited normally" in out, out
    assert re.search(r"^\s*probed: (\d+)$", out, re.M).group(1) == printed.group(2), out  # type: ignore[union-attr]
    assert "hidden stops: 0" in out, out
    assert re.search(r"capture: uprobes \([^)]*, attached\) - auto: uprobes available", out), out
    assert "uprobes: count sites only" in out, out  # the small BPF program: no poll site here
    # attached from the client's first stop on (install_early), joined at the first resume
    assert re.search(r"from the client's first stop on: the first resume came [\d.]+ ms later and waited [\d.]+ ms", out), out
    n = len(re.findall(r"^  (\w+): (\d+)$", out, re.M))
    assert f"--probe functions: {n}, all counted by uprobes (no stop)" in out, out
    assert f"planted 0 probe(s); {n} counted by uprobes without a stop" in err, err
    if probe == ".":
        assert n > 5 and re.search(r"^\s*main: 1$", out, re.M) and re.search(r"^\s*worker: 4$", out, re.M), out
    if client_bp:
        assert re.search(rf"breakpoint already hit {N} times", out), out


@pytest.mark.parametrize("capture", ["breakpoints", "auto"])
def test_fork_child_does_not_inherit_the_probes(capture: str, programs: dict[str, Path]) -> None:
    """A forked child gets a copy of the parent's memory, the proxy's int3s
    included; gdb detaches the child after taking out only its own
    breakpoints. The proxy takes its own out of the child first: the child
    calls the probed function and exits normally."""
    require_tool("gdb", "gdbserver")
    prog = programs["forking"]
    with start_stub("gdbserver", prog, []) as stub, \
            start_proxy(stub.address, probes=["^probed$"], extra=["--capture", capture]) as px:
        run = gdb_batch(prog, [f"target remote {px.address}", "break _exit", "continue",
                               "monitor async stats --all", "delete", "continue"], timeout=120)
        assert px.wait(timeout=20) == 0, px.stderr_text()
        stub.wait(timeout=10)
        out = run.output
        child = stub.output_text()
    assert "child: exit 0" in child, child + out
    assert "fork children cleaned of the proxy's breakpoints: 1" in out, out
    assert re.search(r"^\s*probed: 3$", out, re.M), out  # the parent's three calls, hidden
