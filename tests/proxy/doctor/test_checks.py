"""The doctor's checks as pure functions of host facts: each host state a
user may have, fed as facts (no machine is changed to show them)."""

from __future__ import annotations

import dataclasses

import pytest

from proxy.capture import fallback_line
from proxy.doctor.main import capture_verdict, report
from proxy.host.checks import exit_code, run_checks, run_problem, uprobes_problem
from proxy.host.facts import (
    CAP_BPF,
    CAP_PERFMON,
    CAP_SYS_ADMIN,
    CAP_SYS_PTRACE,
    BpfLoad,
    HostFacts,
    Tool,
    parse_capeff,
    parse_caps,
    tool_version,
)
from proxy.host.read import SimulationError, simulated
from proxy.host.regsafety import GDBSERVER13_ASSUMED, XsaveLayout

ALL_CAPS = (1 << 41) - 1
INTEL = XsaveLayout(offsets=dict(GDBSERVER13_ASSUMED), sizes={}, xcr0=0x2E7)
ZEN4 = XsaveLayout(offsets={**GDBSERVER13_ASSUMED, 5: 832, 6: 896, 7: 1408, 9: 2432}, sizes={}, xcr0=0x2E7)
GOOD = HostFacts(
    kernel="6.12.9-amd64", euid=0, caps=ALL_CAPS, ptrace_scope=1, libbpf="1.1",
    bpf_object="uprobes-0123456789ab.bpf.o", bpf_load=BpfLoad(True, "loaded"),
    gdbserver=Tool("/usr/bin/gdbserver", "13.1"), xsave=INTEL, dot=Tool("/usr/bin/dot", "2.43.0"),
    lldb=Tool("/usr/bin/lldb", "14.0.6"), qemu=Tool("/usr/bin/qemu-x86_64", "7.2.22"))


def by_name(facts: HostFacts) -> dict[str, tuple[str, str]]:
    return {c.name: (c.status, c.line()) for c in run_checks(facts)}


def test_a_good_host_passes_every_check() -> None:
    lines, code = report(GOOD)
    assert code == 0
    assert all(line.startswith("ok ") for line in lines[:-1]), lines
    assert [line.split()[1] for line in lines[:-1]] == ["gdbserver", "privileges", "ptrace", "uprobes", "libbpf",
                                                       "bpf", "registers", "graphviz", "lldb", "qemu"]
    assert lines[-1].startswith("capture: uprobes")


def test_no_gdbserver_stops_run_and_says_how_to_install_it() -> None:
    facts = dataclasses.replace(GOOD, gdbserver=None)
    status, line = by_name(facts)["gdbserver"]
    assert status == "no" and "not found on PATH" in line and "apt-get install gdbserver" in line
    assert run_problem(facts) is not None and "apt-get install gdbserver" in run_problem(facts)  # type: ignore[operator]
    assert report(facts)[1] == 2
    assert capture_verdict(facts).startswith("capture: none")


@pytest.mark.parametrize("scope,caps,status,words", [
    (None, 0, "ok", "no Yama"),
    (0, 0, "ok", "= 0"),
    (1, ALL_CAPS, "ok", "CAP_SYS_PTRACE lifts it"),
    (1, 0, "warn", "attaching to a running one"),
    (2, 1 << CAP_SYS_PTRACE, "ok", "held"),
    (2, 0, "no", "only CAP_SYS_PTRACE may trace"),
    (3, ALL_CAPS, "no", "not even root"),
])
def test_ptrace_scope_against_this_process_capabilities(scope: int | None, caps: int, status: str, words: str) -> None:
    facts = dataclasses.replace(GOOD, ptrace_scope=scope, caps=caps, euid=0 if caps else 1000)
    got, line = by_name(facts)["ptrace"]
    assert (got, words in line) == (status, True), line
    assert (run_problem(facts) is None) == (status != "no")


def test_ptrace_scope_3_names_the_reboot() -> None:
    facts = dataclasses.replace(GOOD, ptrace_scope=3)
    assert "reboot" in by_name(facts)["ptrace"][1]
    assert report(facts)[1] == 2


@pytest.mark.parametrize("caps,ok", [
    (0, False),
    (1 << CAP_BPF, False),
    (1 << CAP_PERFMON, False),
    (1 << CAP_BPF | 1 << CAP_PERFMON, True),
    (1 << CAP_SYS_ADMIN, True),  # the kernel's bpf_capable()/perfmon_capable() accept CAP_SYS_ADMIN
])
def test_bpf_needs_cap_bpf_and_cap_perfmon_not_uid_0(caps: int, ok: bool) -> None:
    facts = dataclasses.replace(GOOD, euid=1000, caps=caps, bpf_load=None)
    status, line = by_name(facts)["privileges"]
    assert (status == "ok") == ok, line
    if not ok:
        assert "root" in line and "CAP_BPF and CAP_PERFMON" in line
        why = uprobes_problem(facts)
        assert why is not None and why.startswith("uprobes: uid 1000 without ")
        assert capture_verdict(facts) == fallback_line("tracepoints", [("uprobes", why)])
        assert report(facts)[1] == 1
    root_without = dataclasses.replace(facts, euid=0)  # uid 0 in a container without the capabilities
    assert (by_name(root_without)["privileges"][0] == "ok") == ok


@pytest.mark.parametrize("change,words", [
    (dict(kernel="6.1.0-18-amd64"), "needs >= 6.6"),
    (dict(uprobe_pmu=False), "without uprobes"),
    (dict(bpf_syscall=False), "without bpf(2)"),
    (dict(machine="aarch64"), "x86-64 only"),
    (dict(libbpf=None, libbpf_error="libbpf is not installed"), "apt-get install libbpf1"),
    (dict(bpf_object_problem="the BPF object uprobes-x.bpf.o is missing"), "is missing"),
    (dict(bpf_load=BpfLoad(False, "the verifier said no")), "the verifier said no"),
])
def test_each_uprobe_prerequisite_makes_the_capture_fall_back(change: dict[str, object], words: str) -> None:
    facts = dataclasses.replace(GOOD, **change)  # type: ignore[arg-type]
    lines, code = report(facts)
    assert code == 1
    bad = [line for line in lines[:-1] if not line.startswith("ok ")]
    assert len(bad) == 1 and words in bad[0], lines
    assert lines[-1].startswith("capture: tracepoints, dearer than uprobes (uprobes: ") and words in lines[-1]


def test_register_verdict_is_regsafetys() -> None:
    assert by_name(GOOD)["registers"] == ("ok", by_name(GOOD)["registers"][1])
    assert "full" in by_name(GOOD)["registers"][1]
    zen = dataclasses.replace(GOOD, xsave=ZEN4)
    status, line = by_name(zen)["registers"]
    assert status == "warn" and "safe" in line and "opmask at 832 not 1088" in line and "gdbserver >= 14" in line
    newer = dataclasses.replace(zen, gdbserver=Tool("/usr/bin/gdbserver", "16.3"))
    assert by_name(newer)["registers"][0] == "ok"


@pytest.mark.parametrize("name,field", [("graphviz", "dot"), ("lldb", "lldb"), ("qemu", "qemu")])
def test_a_missing_optional_tool_is_named_with_its_package(name: str, field: str) -> None:
    facts = dataclasses.replace(GOOD, **{field: None})  # type: ignore[arg-type]
    status, line = by_name(facts)[name]
    assert status == "no" and "apt-get install" in line
    lines, code = report(facts)
    assert code == 1 and lines[-1].startswith("capture: uprobes")  # the capture does not need it


def test_simulated_facts_are_said() -> None:
    facts = dataclasses.replace(GOOD, simulated=("ptrace_scope=3",))
    assert report(facts)[0][0].startswith("simulated: ptrace_scope=3")


def test_simulation_seam_parses_and_refuses_unknown_keys() -> None:
    env = {"ASYNCRSP_SIMULATE_HOST": "ptrace_scope=3 euid=65534 caps=bpf,perfmon kernel=6.1.0"}
    assert simulated(env) == {"ptrace_scope": 3, "euid": 65534, "caps": 1 << CAP_BPF | 1 << CAP_PERFMON,
                              "kernel": "6.1.0"}
    assert simulated({"ASYNCRSP_SIMULATE_HOST": "ptrace_scope=none caps=none"}) == {"ptrace_scope": None, "caps": 0}
    for bad in ("ptrace_scope", "uid=3", "caps=net_admin", "euid=x"):
        with pytest.raises(SimulationError, match="ASYNCRSP_SIMULATE_HOST"):
            simulated({"ASYNCRSP_SIMULATE_HOST": bad})


def test_fact_parsers() -> None:
    assert parse_capeff("Name:\tx\nCapEff:\t000001fffeffffff\n") == 0x1FFFEFFFFFF
    assert parse_caps("cap_sys_ptrace") == 1 << CAP_SYS_PTRACE
    assert tool_version("GNU gdbserver (Debian 13.1-3) 13.1\nCopyright (C) 2023") == "13.1"
    assert tool_version("dot - graphviz version 2.43.0 (0)") == "2.43.0"
    assert tool_version("qemu-x86_64 version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)") == "7.2.22"
    assert tool_version("lldb version 14.0.6") == "14.0.6"
    assert tool_version("no version here") is None
