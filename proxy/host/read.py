"""The thin reads of this host's files (/proc, /sys) that more than one checker
needs, and the simulation seam.

The simulation seam: ``ASYNCRSP_SIMULATE_HOST`` puts facts in place of the
host's, e.g. ``ASYNCRSP_SIMULATE_HOST="ptrace_scope=3"`` or ``"euid=65534
caps=none"``, for the doctor and for the session's own check (the uprobe
capture's host check, `run`'s refusal to start a program it cannot trace).
It exists so the tests can show each host state without changing the
machine: kernel.yama.ptrace_scope=3, once written, holds until reboot for
every process. The doctor says which facts are simulated.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .facts import HostFacts, Tool, parse_capeff, parse_caps

SIMULATE_ENV = "ASYNCRSP_SIMULATE_HOST"
PTRACE_SCOPE = Path("/proc/sys/kernel/yama/ptrace_scope")
UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe")
BPF_SYSCTL = Path("/proc/sys/kernel/unprivileged_bpf_disabled")


class SimulationError(ValueError):
    """ASYNCRSP_SIMULATE_HOST could not be read."""


def simulated(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The facts ASYNCRSP_SIMULATE_HOST sets: ``ptrace_scope=N|none``,
    ``euid=N``, ``caps=none|all|bpf,perfmon,sys_ptrace,sys_admin``, ``kernel=RELEASE``."""
    text = (os.environ if env is None else env).get(SIMULATE_ENV, "").strip()
    out: dict[str, Any] = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        try:
            if not sep:
                raise ValueError("want KEY=VALUE")
            if key == "ptrace_scope":
                out[key] = None if value == "none" else int(value)
            elif key == "euid":
                out[key] = int(value)
            elif key == "caps":
                out[key] = parse_caps(value)
            elif key == "kernel":
                out[key] = value
            else:
                raise ValueError("known: ptrace_scope, euid, caps, kernel")
        except ValueError as err:
            raise SimulationError(f"{SIMULATE_ENV}: {item!r}: {err}") from None
    return out


def simulated_words(env: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The words of ASYNCRSP_SIMULATE_HOST, as the doctor repeats them."""
    return tuple((os.environ if env is None else env).get(SIMULATE_ENV, "").split())


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def ptrace_scope() -> int | None:
    text = read_text(PTRACE_SCOPE)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def capeff() -> int:
    """This process's effective capability set."""
    return parse_capeff(read_text(Path("/proc/self/status")) or "")


def read_run_facts(env: Mapping[str, str] | None = None) -> HostFacts:
    """What `asyncrsp run` needs to start a program: gdbserver on PATH, ptrace allowed."""
    sim = simulated(env)
    path = shutil.which("gdbserver")
    facts = HostFacts(euid=os.geteuid(), caps=capeff(),
                      ptrace_scope=ptrace_scope(), gdbserver=Tool(path, "?") if path else None)
    return dataclasses.replace(facts, **sim)
