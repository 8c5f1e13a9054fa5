"""Scripted debugger sessions for the transparency matrix.

Theory of operation: a :class:`Scenario` names a C program and, for each
client (``gdb`` CLI, ``mi``, ``lldb``), a list of :class:`Step`. The same
steps are run once with the client connected straight to the stub
(``route="direct"``) and once through ``python -m proxy serve`` with
``--probe`` on the program's probed function (``route="proxy"``), so hidden
stops really happen. The matrix adds ``--capture C`` for each capture it
runs under (``proxy_extra``): with ``breakpoints`` the probe is a hidden
breakpoint (hidden stops), with ``uprobes`` a kernel uprobe counts it (an
``int3`` the kernel owns under the client's reads, breakpoints and steps). :func:`run_session` returns a :class:`SessionRun`: the
(label, output) transcript to compare after normalisation, the program's own
output, the proxy's ``monitor async stats --all`` text (proxy route only) and
exit codes.

Step kinds:

* ``cmd``: a command whose output ends at the next prompt (gdb CLI waits for
  the stop of ``continue`` by itself; lldb batch mode too).
* ``resume``: (MI) an ``-exec-*`` command, then wait for ``*stopped``.
* ``interrupt``: resume, wait until the program has run (1 s, then until it
  has used CPU: :func:`running.wait_until_running`), interrupt (Ctrl-C on the
  gdb pty, ``-exec-interrupt`` in MI, ``SendAsyncInterrupt`` in lldb). Where
  the program stops is timing-dependent, so only the stop *reason* is kept.
* ``stats``: ``monitor async stats --all``, proxy route only, kept out of the
  comparison.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from . import gdb as gdbh
from . import lldb as lldbh
from .running import wait_until_running
from .stubs import (ProxyProc, StubProc, become_subreaper, start_proxy, start_stub,
                    wait_orphan)

PROBES = ("^probed$",)


@dataclass(frozen=True)
class Step:
    text: str
    kind: str = "cmd"  # cmd | resume | interrupt | stats


def C(text: str) -> Step:
    return Step(text)


def R(text: str) -> Step:
    return Step(text, "resume")


INTERRUPT = Step("continue", "interrupt")
STATS = Step("monitor async stats --all", "stats")


@dataclass(frozen=True)
class Scenario:
    name: str
    program: str
    args: tuple[str, ...]
    scripts: dict[str, tuple[Step, ...]]
    # regexes the DIRECT transcript (joined) must contain: proof that the
    # session really exercised what it claims, so equal-but-empty runs fail.
    evidence: dict[str, tuple[str, ...]]
    # regex the program's own output must match at the end (None: no check)
    program_output: str | None = None
    # (client, stub) -> the evidence that pair can show (a direct limitation)
    evidence_limited: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    # stubs with which the program's output cannot be seen after the session
    output_lost_on: tuple[str, ...] = ()

    def evidence_for(self, client: str, stub: str) -> tuple[str, ...]:
        return self.evidence_limited.get((client, stub), self.evidence[client])


@dataclass
class SessionRun:
    steps: list[tuple[str, str]]
    program_output: str = ""
    stats: list[str] = field(default_factory=list)
    proxy_exit: int | None = None
    proxy_stderr: str = ""
    stub_exit: int | None = None
    inferior_pid: int | None = None
    program_exit: int | None = None  # detach scenario: the program's own exit status

    def text(self) -> str:
        return "\n".join(f"{lbl}\n{out}" for lbl, out in self.steps)


# ------------------------------------------------------------------ stop summaries

GDB_SIGNAL = re.compile(r"Program received signal (\w+)")
MI_REASON = re.compile(r'reason="([\w-]+)"(?:,signal-name="(\w+)")?')
LLDB_REASON = re.compile(r"stop reason = ([^\n]+)")


def summarise_interrupt(client: str, out: str) -> str:
    """Only the reason of an interrupt stop (its location depends on timing)."""
    if client == "gdb":
        m = GDB_SIGNAL.search(out)
        return f"stopped by {m.group(1)}" if m else f"NO SIGNAL STOP: {out!r}"
    if client == "mi":
        m = MI_REASON.search(out)
        return f"stopped: {m.group(1)} {m.group(2)}" if m else f"NO *stopped: {out!r}"
    m = LLDB_REASON.search(out)
    return f"stop reason = {m.group(1)}" if m else f"NO STOP: {out!r}"


# ------------------------------------------------------------------ drivers


def _connect_step(client: str, address: str) -> Step:
    return {"gdb": C(f"target remote {address}"),
            "mi": C(f"-target-select remote {address}"),
            "lldb": C(f"gdb-remote {address}")}[client]


def _run_gdb(program: Path, steps: Sequence[Step], proxied: bool, run: SessionRun) -> None:
    con = gdbh.gdb_cli(program)
    try:
        for st in steps:
            if st.kind == "stats":
                if proxied:
                    run.stats.append(con.cmd(st.text))
            elif st.kind == "interrupt":
                con.start(st.text)
                wait_until_running(run.inferior_pid)
                run.steps.append(("<Ctrl-C>", summarise_interrupt("gdb", con.interrupt())))
            else:
                run.steps.append((st.text, con.cmd(st.text)))
    finally:
        con.close()


def _mi_text(recs: Sequence[gdbh.MiRecord]) -> str:
    return "\n".join(r.raw for r in recs)


def _run_mi(program: Path, steps: Sequence[Step], proxied: bool, run: SessionRun) -> None:
    with gdbh.MiSession(program) as mi:
        for st in steps:
            if st.kind == "stats":
                if proxied:
                    run.stats.append(mi.console(st.text))
            elif st.kind == "interrupt":
                mi.cmd("-exec-continue")
                wait_until_running(run.inferior_pid)
                mi.cmd("-exec-interrupt")
                stop = mi.wait_stopped()
                run.steps.append(("-exec-interrupt", summarise_interrupt("mi", stop.raw)))
            elif st.kind == "resume":
                start = len(mi.log)
                recs = mi.cmd(st.text)
                if any(r.kind == "^" and r.cls == "running" for r in recs):
                    mi.wait_stopped(or_error=True)
                    recs = mi.log[start:]
                run.steps.append((st.text, _mi_text(recs)))
            else:
                run.steps.append((st.text, _mi_text(mi.cmd(st.text))))


def _run_lldb(program: Path, steps: Sequence[Step], proxied: bool, run: SessionRun) -> None:
    cmds: list[str] = []
    for st in steps:
        if st.kind == "stats":
            if proxied:
                cmds.append("process plugin packet monitor " + st.text.removeprefix("monitor "))
        elif st.kind == "interrupt":
            cmds += [lldbh.interrupt_when_running(run.inferior_pid), "process continue"]
        else:
            cmds.append(st.text)
    res = lldbh.lldb_batch(program, cmds)
    # lldb prints some results (e.g. of `thread select`) from its event
    # thread, sometimes after the echo of the next command: compare the
    # whole session as one text with the echo lines left out.
    texts: list[str] = []
    for label, out in res.steps():
        if label.startswith("script import base64") or label.startswith("settings set"):
            continue
        if label.startswith("process plugin packet monitor"):
            run.stats.append(out)
        elif label == "process continue":
            texts.append(summarise_interrupt("lldb", out))
        else:
            texts.append(out)
    shown = [c for c in cmds if not c.startswith(("script", "process plugin packet monitor"))]
    run.steps.append(("lldb --batch " + " ; ".join(shown),
                      "\n".join(texts)))


DRIVERS: dict[str, Callable[[Path, Sequence[Step], bool, SessionRun], None]] = {
    "gdb": _run_gdb, "mi": _run_mi, "lldb": _run_lldb}


@contextmanager
def endpoint(stub_kind: str, program: Path, args: Sequence[str], route: str,
             probes: Sequence[str] = PROBES,
             proxy_extra: Sequence[str] = ()) -> Iterator[tuple[StubProc, ProxyProc | None]]:
    """A stub on ``program`` and, for ``route="proxy"``, the proxy in front of it."""
    with ExitStack() as stack:
        stub = stack.enter_context(start_stub(stub_kind, program, args))
        # QEMU's gdbstub cannot tell the program's file (no qXfer:exec-file,
        # pid 1): the user names it with --elf, as the README says.
        extra = ["--elf", str(program)] if stub_kind == "qemu" else []
        extra += list(proxy_extra)
        proxy = (stack.enter_context(start_proxy(stub.address, probes, extra))
                 if route == "proxy" else None)
        yield stub, proxy


def run_session(client: str, stub_kind: str, scenario: Scenario, route: str,
                programs: dict[str, Path], probes: Sequence[str] = PROBES,
                proxy_extra: Sequence[str] = ()) -> SessionRun:
    """Run ``scenario`` with ``client`` against ``stub_kind`` via ``route``
    (the proxy with ``--probe`` for each of `probes` and `proxy_extra`)."""
    program = programs[scenario.program]
    run = SessionRun(steps=[])
    become_subreaper()  # a detached program becomes our child: its exit status is readable
    with endpoint(stub_kind, program, scenario.args, route, probes, proxy_extra) as (stub, proxy):
        run.inferior_pid = stub.find_inferior()
        address = proxy.address if proxy else stub.address
        steps = (_connect_step(client, address), *scenario.scripts[client])
        DRIVERS[client](program, steps, proxy is not None, run)
        if proxy is not None:
            try:
                run.proxy_exit = proxy.wait(timeout=10)
            except Exception:  # noqa: BLE001 - reported, not hidden: the test asserts on it
                run.proxy_exit = None
            run.proxy_stderr = proxy.stderr_text()
        run.stub_exit = _wait_quietly(stub)
        if scenario.name == "detach":
            run.program_exit = _detached_exit(stub_kind, run)
        run.program_output = stub.output_text()
        if scenario.name == "detach" and run.program_exit is None:
            run.program_exit = _detached_exit(stub_kind, run)
    return run


def _detached_exit(stub_kind: str, run: SessionRun) -> int | None:
    """Exit status of a program after ``detach``: QEMU is the program itself;
    otherwise the orphan becomes ours (subreaper) unless the stub, still alive
    when it exits, reaps it (gdbserver 13 stays until then and says nothing:
    None, and the program's output is the evidence)."""
    if stub_kind == "qemu":
        return run.stub_exit
    code = wait_orphan(run.inferior_pid, timeout=15) if run.inferior_pid else None
    if code is None:
        m = re.search(r"Child exited with status (\d+)", run.program_output)
        code = int(m.group(1)) if m else None
    return code


def _wait_quietly(stub: StubProc, timeout: float = 10.0) -> int | None:
    try:
        return stub.wait(timeout)
    except Exception:  # noqa: BLE001 - a stub still running is reported as None
        return None
