"""The doctor's thin host reader: the uprobe capture's facts
(proxy/capture/uprobes/host.py), the tools' ``--version``, the host's XSAVE
layout, one trial load of the BPF program. Everything judged is in
proxy/host/checks.py; the simulation seam is proxy/host/read.py's.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from collections.abc import Mapping

from proxy.host.checks import uprobes_prerequisite
from proxy.host.facts import HostFacts, Tool, tool_version
from proxy.host.regsafety import read_host_xsave_layout


def _tool(names: tuple[str, ...], flag: str = "--version") -> Tool | None:
    for name in names:
        path = shutil.which(name)
        if path is None:
            continue
        try:
            done = subprocess.run([path, flag], capture_output=True, text=True, timeout=20, check=False)
        except (OSError, subprocess.SubprocessError):
            return Tool(path, None)
        return Tool(path, tool_version(done.stdout or done.stderr))  # dot -V writes to stderr
    return None


def read_host(env: Mapping[str, str] | None = None) -> HostFacts:
    """Every fact the doctor judges; the trial load only when nothing before it fails."""
    from proxy.capture.uprobes.host import read_uprobe_facts, trial_load  # loads libbpf: only when asked

    facts = read_uprobe_facts(env)
    facts = dataclasses.replace(
        facts, gdbserver=_tool(("gdbserver",)), xsave=read_host_xsave_layout(), dot=_tool(("dot",), "-V"),
        lldb=_tool(("lldb",)), qemu=_tool(("qemu-x86_64", "qemu-system-x86_64")))
    if uprobes_prerequisite(facts) is None:
        facts = dataclasses.replace(facts, bpf_load=trial_load())
    return facts
