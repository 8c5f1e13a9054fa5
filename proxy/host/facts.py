"""What is known about this host: plain data, read by read.py (and the uprobe
capture's host.py, and the doctor's reader), judged by checks.py."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .regsafety import XsaveLayout

# capability bits (linux/capability.h)
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39
CAP_NAMES = {"sys_ptrace": CAP_SYS_PTRACE, "sys_admin": CAP_SYS_ADMIN, "perfmon": CAP_PERFMON, "bpf": CAP_BPF}


@dataclass(frozen=True, slots=True)
class Tool:
    """A program found on PATH and the version it prints (None: not understood)."""

    path: str
    version: str | None


@dataclass(frozen=True, slots=True)
class BpfLoad:
    """The trial load of the BPF program: whether it loaded, and the loader's one line."""

    ok: bool
    text: str


@dataclass(frozen=True, slots=True)
class HostFacts:
    system: str = "Linux"
    machine: str = "x86_64"
    kernel: str = ""  # uname release, e.g. 6.1.0-18-amd64
    euid: int = 0
    caps: int = 0  # the effective capability set (CapEff)
    ptrace_scope: int | None = None  # kernel.yama.ptrace_scope; None: the kernel has no Yama
    uprobe_pmu: bool = True  # /sys/bus/event_source/devices/uprobe: the kernel has uprobes
    bpf_syscall: bool = True  # /proc/sys/kernel/unprivileged_bpf_disabled: the kernel has bpf(2)
    libbpf: str | None = None  # libbpf's version (None: not found)
    libbpf_error: str = ""
    bpf_object: str = ""  # the prebuilt object's file name
    bpf_object_problem: str | None = None  # why it cannot be used (bpf.object_problem)
    bpf_load: BpfLoad | None = None  # None: not tried (a check before it failed)
    gdbserver: Tool | None = None
    xsave: XsaveLayout | None = None
    dot: Tool | None = None
    lldb: Tool | None = None
    qemu: Tool | None = None
    simulated: tuple[str, ...] = field(default=())  # the facts a test put in place of the host's

    def has_cap(self, bit: int) -> bool:
        return bool(self.caps >> bit & 1)


def parse_capeff(status: str) -> int:
    """The effective capability set from /proc/self/status."""
    m = re.search(r"^CapEff:\s*([0-9a-fA-F]+)\s*$", status, re.M)
    return int(m.group(1), 16) if m else 0


def parse_caps(text: str) -> int:
    """``bpf,perfmon`` (or ``none``, or ``all``) -> a capability mask (the simulation seam)."""
    if text in ("", "none"):
        return 0
    if text == "all":
        return (1 << 41) - 1
    mask = 0
    for name in text.split(","):
        name = name.strip().lower().removeprefix("cap_")
        if name not in CAP_NAMES:
            raise ValueError(f"unknown capability {name!r} (known: {', '.join(CAP_NAMES)})")
        mask |= 1 << CAP_NAMES[name]
    return mask


def kernel_version(release: str) -> tuple[int, int]:
    """``6.1.0-18-amd64`` -> (6, 1); (0, 0) when unreadable."""
    m = re.match(r"(\d+)\.(\d+)", release)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


_VERSION = re.compile(r"(\d+\.\d+(?:\.\d+)?)")


def tool_version(text: str) -> str | None:
    """The version in a tool's ``--version`` / ``-V`` output: the last dotted
    number of its first line that has one (``GNU gdbserver (Debian 13.1-3) 13.1``
    -> 13.1, ``dot - graphviz version 2.43.0 (0)`` -> 2.43.0,
    ``qemu-x86_64 version 7.2.19 (Debian 1:7.2+dfsg-7+deb12u18)`` -> 7.2.19)."""
    for line in text.splitlines():
        found = _VERSION.findall(line.split("(")[0]) or _VERSION.findall(line)
        if found:
            return found[-1]
    return None
