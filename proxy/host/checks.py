"""The host checks: pure functions of a host's facts (facts.HostFacts), what
`asyncrsp doctor` prints and what the uprobe capture and `asyncrsp run` refuse by.

Each check gives one line: its status, what it found, and when it is not ok
what to do. ``affects`` says what a failure costs: ``run`` (asyncrsp cannot
run a program here at all), ``uprobes`` (the capture falls back to a dearer
one), ``feature`` (one optional feature is missing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .facts import CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE, HostFacts, Tool, kernel_version
from .regsafety import decide_policy, parse_gdbserver_version

Status = Literal["ok", "warn", "no"]
Affects = Literal["run", "uprobes", "feature"]

MIN_KERNEL = (6, 6)  # uprobe_multi links (BPF ring buffers came with 5.8)
GRANT_BPF = "run asyncrsp as root (sudo), or grant it CAP_BPF and CAP_PERFMON"


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    text: str
    fix: str = ""
    affects: Affects = "feature"

    def line(self) -> str:
        """`ok    gdbserver   /usr/bin/gdbserver 13.1`, with `: what to do` when not ok."""
        tail = f": {self.fix}" if self.fix and self.status != "ok" else ""
        return f"{self.status:<5} {self.name:<11} {self.text}{tail}"


def _ok(name: str, text: str, affects: Affects) -> Check:
    return Check(name, "ok", text, affects=affects)


def check_gdbserver(f: HostFacts) -> Check:
    if f.gdbserver is None:
        return Check("gdbserver", "no", "not found on PATH",
                     "install it (Debian, Ubuntu: apt-get install gdbserver; Fedora: dnf install gdb-gdbserver)",
                     "run")
    if f.gdbserver.version is None:
        return Check("gdbserver", "warn", f"{f.gdbserver.path}: `--version` not understood",
                     "check that it is GNU gdbserver", "run")
    return _ok("gdbserver", f"{f.gdbserver.path} {f.gdbserver.version}", "run")


def bpf_capable(f: HostFacts) -> bool:
    """The kernel's bpf_capable() and perfmon_capable(): CAP_BPF/CAP_PERFMON, or CAP_SYS_ADMIN."""
    admin = f.has_cap(CAP_SYS_ADMIN)
    return (f.has_cap(CAP_BPF) or admin) and (f.has_cap(CAP_PERFMON) or admin)


def _who(f: HostFacts) -> str:
    return "root" if f.euid == 0 else f"uid {f.euid}"


def check_privileges(f: HostFacts) -> Check:
    caps = (("CAP_BPF", CAP_BPF), ("CAP_PERFMON", CAP_PERFMON), ("CAP_SYS_PTRACE", CAP_SYS_PTRACE))
    if bpf_capable(f):
        held = ", ".join(n for n, bit in caps if f.has_cap(bit)) or "CAP_SYS_ADMIN"
        return _ok("privileges", f"{_who(f)} ({held})", "uprobes")
    lacking = " and ".join(n for n, bit in caps[:2] if not f.has_cap(bit))
    return Check("privileges", "no", f"{_who(f)} without {lacking}: the BPF program cannot be loaded",
                 GRANT_BPF, "uprobes")


def check_ptrace(f: HostFacts) -> Check:
    """kernel.yama.ptrace_scope against this process's CAP_SYS_PTRACE (Yama's rules:
    1 = only a descendant, 2 = only CAP_SYS_PTRACE, 3 = no one, until reboot)."""
    scope, ptrace_cap = f.ptrace_scope, f.has_cap(CAP_SYS_PTRACE)
    name = "ptrace"
    if scope is None:
        return _ok(name, "kernel.yama.ptrace_scope absent (no Yama): only users and capabilities limit ptrace", "run")
    head = f"kernel.yama.ptrace_scope = {scope}"
    if scope == 0:
        return _ok(name, f"{head}: only users and capabilities limit ptrace", "run")
    if scope == 1:
        if ptrace_cap:
            return _ok(name, f"{head} (descendants only), CAP_SYS_PTRACE lifts it", "run")
        return Check(name, "warn", f"{head}: `run` works (gdbserver starts the program), attaching to a "
                                   "running one (ps, tree PID, gdbserver --attach) is refused",
                     "to attach, grant CAP_SYS_PTRACE or sysctl kernel.yama.ptrace_scope=0", "run")
    if scope == 2:
        if ptrace_cap:
            return _ok(name, f"{head} (CAP_SYS_PTRACE only), held", "run")
        return Check(name, "no", f"{head}: only CAP_SYS_PTRACE may trace, gdbserver cannot start a program",
                     "run asyncrsp as root, or grant CAP_SYS_PTRACE, or sysctl kernel.yama.ptrace_scope=1", "run")
    return Check(name, "no", f"{head}: no process may trace another, not even root; gdbserver cannot "
                             "start or attach to a program",
                 "only a reboot lowers it: set kernel.yama.ptrace_scope to 1 or 0 in /etc/sysctl.d, reboot", "run")


def check_kernel(f: HostFacts) -> Check:
    name = "uprobes"
    where = f"{f.system} {f.kernel} {f.machine}"
    if f.system != "Linux" or f.machine not in ("x86_64", "AMD64"):
        return Check(name, "no", f"{where}: uprobe capture runs on Linux x86-64 only", "", "uprobes")
    if kernel_version(f.kernel) < MIN_KERNEL:
        return Check(name, "no", f"Linux {f.kernel} has no uprobe_multi links (needs >= 6.6)",
                     "boot a newer kernel (Debian bookworm: linux-image-amd64 from bookworm-backports)", "uprobes")
    if not f.uprobe_pmu:
        return Check(name, "no", f"Linux {f.kernel} was built without uprobes (no "
                                 "/sys/bus/event_source/devices/uprobe)",
                     "a kernel with CONFIG_UPROBES and CONFIG_UPROBE_EVENTS", "uprobes")
    if not f.bpf_syscall:
        return Check(name, "no", f"Linux {f.kernel} was built without bpf(2)",
                     "a kernel with CONFIG_BPF_SYSCALL", "uprobes")
    return _ok(name, f"Linux {f.kernel} {f.machine}: uprobes, uprobe_multi links and BPF ring buffers", "uprobes")


def check_libbpf(f: HostFacts) -> Check:
    if f.libbpf is None:
        return Check("libbpf", "no", f"not found ({f.libbpf_error})" if f.libbpf_error else "not found",
                     "install it (Debian, Ubuntu: apt-get install libbpf1; Fedora: dnf install libbpf)", "uprobes")
    return _ok("libbpf", f"libbpf {f.libbpf}", "uprobes")


def check_bpf_object(f: HostFacts) -> Check:
    name = "bpf object"
    if f.bpf_object_problem is not None:
        return Check(name, "no", f.bpf_object_problem, "", "uprobes")
    if f.bpf_load is None:
        return Check(name, "warn", f"{f.bpf_object}: this version's; not loaded (a check above failed)", "",
                     "uprobes")
    if not f.bpf_load.ok:
        return Check(name, "no", f"{f.bpf_object} does not load: {f.bpf_load.text}", "", "uprobes")
    return _ok(name, f"{f.bpf_object}: this version's, loads", "uprobes")


def check_registers(f: HostFacts) -> Check:
    """The register-safety verdict (proxy/host/regsafety.py) for this host's gdbserver and CPU."""
    name = "registers"
    if f.gdbserver is None:
        return Check(name, "warn", "not judged: no gdbserver", "see gdbserver above")
    version = parse_gdbserver_version(f"GNU gdbserver {f.gdbserver.version}") if f.gdbserver.version else None
    policy = decide_policy(requested=None, stub_is_local=True, stub_kind="gdbserver",
                           stub_version=version, host_layout=f.xsave)
    if policy.safe:
        return Check(name, "warn", f"{policy.mode}: {policy.reason}",
                     "gdbserver >= 14 shows every register (it reads the layout from CPUID)")
    return _ok(name, f"{policy.mode}: {policy.reason}", "feature")


def _tool(name: str, tool: Tool | None, what: str, fix: str) -> Check:
    if tool is None:
        return Check(name, "no", f"not found on PATH ({what})", fix)
    return _ok(name, f"{tool.path} {tool.version or '(version not understood)'}", "feature")


def check_graphviz(f: HostFacts) -> Check:
    return _tool("graphviz", f.dot, "`dot` draws the pictures",
                 "install it for the pictures (Debian, Ubuntu: apt-get install graphviz)")


def check_lldb(f: HostFacts) -> Check:
    return _tool("lldb", f.lldb, "only to debug through lldb", "apt-get install lldb")


def check_qemu(f: HostFacts) -> Check:
    return _tool("qemu", f.qemu, "only for programs under QEMU's gdbstub", "apt-get install qemu-user")


CHECKS = (check_gdbserver, check_privileges, check_ptrace, check_kernel, check_libbpf, check_bpf_object,
          check_registers, check_graphviz, check_lldb, check_qemu)
UPROBE_CHECKS = (check_kernel, check_privileges, check_libbpf, check_bpf_object)


def run_checks(f: HostFacts) -> list[Check]:
    return [check(f) for check in CHECKS]


def uprobes_prerequisite(f: HostFacts) -> str | None:
    """Why the uprobe capture cannot run here before any trial load (None: try
    it), one line: what the doctor's first failing uprobe check says."""
    for check in UPROBE_CHECKS:
        c = check(f)
        if c.status == "no":
            return f"uprobes: {c.text}" + (f"; {c.fix}" if c.fix else "")
    return None


def uprobes_problem(f: HostFacts) -> str | None:
    """Why the uprobe capture cannot run here (None: it can), counting the trial load."""
    why = uprobes_prerequisite(f)
    if why is None and f.bpf_load is not None and not f.bpf_load.ok:
        return f"uprobes: {f.bpf_load.text}"
    return why


def run_problem(f: HostFacts) -> str | None:
    """Why `asyncrsp run` cannot start a program here (None: it can)."""
    for check in (check_gdbserver, check_ptrace):
        c = check(f)
        if c.status == "no":
            return f"{c.name}: {c.text}: {c.fix}"
    return None


def exit_code(checks: list[Check]) -> int:
    """0: every check ok; 2: `run` cannot work here; 1: anything else to do."""
    if any(c.status == "no" and c.affects == "run" for c in checks):
        return 2
    return 0 if all(c.status == "ok" for c in checks) else 1
