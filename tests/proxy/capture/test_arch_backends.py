"""The capture backends whose code is x86-64's say so for another CPU's program instead of
misbehaving (tracepoints' agent expressions name x86-64 registers; uprobes read x86 pt_regs)."""

from __future__ import annotations

from proxy.arch import AARCH64, X86_64
from proxy.capture import unavailable
from proxy.capture.target import Target
from proxy.capture.tracepoints import NEEDED_FEATURES


def target(arch: object) -> Target:
    return Target(path="/prog", pid=None, local=False, stub_features=frozenset(NEEDED_FEATURES), arch=arch)  # type: ignore[arg-type]


def test_tracepoints_and_uprobes_refuse_an_aarch64_program() -> None:
    for name in ("tracepoints", "uprobes"):
        why = unavailable(name, target(AARCH64))
        assert why is not None and why.endswith("x86-64 only so far; this program is aarch64 (EM_AARCH64)"), why
    # x86-64: past the architecture, on to the backend's own checks (no analysis here)
    assert unavailable("tracepoints", target(X86_64)) == "no program analysis"
    assert unavailable("breakpoints", target(AARCH64)) is None
