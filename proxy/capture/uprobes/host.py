"""The host's side of uprobe capture: can this machine load the BPF program
(the facts it needs, read here and judged by proxy/host/checks.py, which the
doctor prints too), and which file does the running process map (``running_file``)."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxy.host.checks import uprobes_prerequisite
from proxy.host.facts import BpfLoad, HostFacts
from proxy.host.read import BPF_SYSCTL, UPROBE_PMU, SimulationError, capeff, ptrace_scope, simulated, simulated_words

from . import bpf as B


def running_file(pid: int, path: str) -> tuple[str, str | None]:
    """The file to analyse and attach to: `path`, or ``/proc/PID/exe`` when the
    program's file was replaced after it started (and a note saying so).

    A uprobe is keyed by inode. Replacing a file by rename (what a rebuild does:
    integration/corpus/build.py) leaves the running process on the old inode,
    and a link attached by path goes to the new one: it records nothing at all,
    and its int3s are not in the process (reproduced: 0 hits by path, 393,659 in
    0.3 s through /proc/PID/exe, integration/test_uprobes.py). /proc/PID/exe
    opens the running file even when its name is gone. Only when its link says
    "(deleted)": before the exec (a process stopped to be attached early)
    /proc/PID/exe is still the parent's program."""
    exe = f"/proc/{pid}/exe"
    try:
        target = os.readlink(exe)
        if os.path.samefile(exe, path):
            return path, None
    except OSError:
        return path, None
    if target.endswith(" (deleted)"):
        return exe, (f"uprobes: {path} was replaced after the program started: the probes and the "
                     f"analysis use the running file ({exe})")
    return path, None


def stub_pid(target: Any, pid: int) -> int:
    """The program's pid as the stub numbers it (another in a pid namespace)."""
    ident = getattr(target, "identity", None)
    return ident.stub_pid if ident is not None and ident.stub_pid else pid


_HOST: tuple[bool, str] | None = None


def host_check() -> tuple[bool, str]:
    """Privileges (root, or CAP_BPF and CAP_PERFMON), a kernel with uprobe_multi,
    libbpf, this version's object, and a real load
    (cached in the process, and a success on disk for this boot: the real
    load takes 0.4-0.8 s, paid by every proxy start otherwise - GDB's own
    testsuite starts 93 of them)."""
    global _HOST
    if _HOST is not None:
        return _HOST
    _HOST = _host_check_uncached()
    return _HOST


def _host_mark() -> Path | None:
    """The file that says the check passed: per boot, kernel, user and BPF object."""
    import hashlib

    from proxy.analysis.cache import default_dir

    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        st = B.OBJECT.stat()
    except OSError:
        return None
    key = f"{boot} {os.uname().release} {os.geteuid()} {st.st_size} {st.st_mtime_ns}"
    return default_dir() / f"uprobes-ok-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _libbpf() -> tuple[str | None, str]:
    """libbpf's version string, or None and why it could not be loaded."""
    try:
        lib = B.libbpf().lib
    except B.BpfError as err:
        return None, str(err)
    try:
        fn = lib.libbpf_version_string
    except AttributeError:
        return "< 0.7", ""  # libbpf_version_string came with 0.7
    fn.restype = ctypes.c_char_p
    return (fn() or b"?").decode().lstrip("v"), ""


def read_uprobe_facts(env: Mapping[str, str] | None = None) -> HostFacts:
    """What the uprobe capture needs before its trial load: no subprocess, no load."""
    sim = simulated(env)
    version, why = _libbpf()
    facts = HostFacts(
        system=platform.system(), machine=platform.machine(), kernel=platform.release(),
        euid=os.geteuid(), caps=capeff(), ptrace_scope=ptrace_scope(), uprobe_pmu=UPROBE_PMU.exists(),
        bpf_syscall=BPF_SYSCTL.exists(), libbpf=version, libbpf_error=why, bpf_object=B.OBJECT.name,
        bpf_object_problem=B.object_problem(),
    )
    return dataclasses.replace(facts, simulated=simulated_words(env) if sim else (), **sim)


def trial_load() -> BpfLoad:
    """Load the BPF program once (its ring buffer, task storage, uprobe_multi type) and close it."""
    try:
        prog = B.Program.open(ring_bytes=B.PAGE, max_sites=1)
    except B.BpfError as err:
        return BpfLoad(False, str(err))
    prog.close()
    return BpfLoad(True, "loaded")


def _host_check_uncached() -> tuple[bool, str]:
    """The host's uprobe checks (proxy/host/checks.py: the doctor's words), then a trial load."""
    try:
        why = uprobes_prerequisite(read_uprobe_facts())
    except SimulationError as err:
        return False, f"uprobes: {err}"
    if why is not None:
        return False, why
    mark = _host_mark()
    try:
        if mark is not None and mark.exists():
            return True, "uprobes: available"
    except OSError:  # a cache directory this user may not enter (HOME left at another user's)
        mark = None
    load = trial_load()
    if not load.ok:
        return False, f"uprobes: {load.text}"
    if mark is not None:
        try:
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.touch()
        except OSError:
            pass  # the mark only saves time
    return True, "uprobes: available"
