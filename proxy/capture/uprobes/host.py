"""The host's side of uprobe capture: can this machine load the BPF program,
and which file does the running process map (``running_file``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from . import bpf as B

MIN_KERNEL = (6, 6)  # uprobe_multi links


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
    """Root, a kernel with uprobe_multi, libbpf, the object, and a real load
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


def _host_check_uncached() -> tuple[bool, str]:
    import platform

    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False, f"uprobes: needs Linux on x86-64 (this is {platform.system()} {platform.machine()})"
    rel = platform.release().split("-")[0].split(".")
    try:
        ver = (int(rel[0]), int(rel[1]))
    except (ValueError, IndexError):
        ver = (0, 0)
    if ver < MIN_KERNEL:
        return False, f"uprobes: Linux {platform.release()} has no uprobe_multi links (needs >= 6.6)"
    if os.geteuid() != 0:
        return False, "uprobes: loading BPF needs root (CAP_BPF and CAP_PERFMON)"
    mark = _host_mark()
    if mark is not None and mark.exists():
        return True, "uprobes: available"
    try:
        prog = B.Program.open(ring_bytes=B.PAGE, max_sites=1)
    except B.BpfError as err:
        return False, f"uprobes: {err}"
    prog.close()
    if mark is not None:
        try:
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.touch()
        except OSError:
            pass  # the mark only saves time
    return True, "uprobes: available"
