"""Capture through Linux uprobes and BPF (see capture.py): the program is never stopped."""

from __future__ import annotations

from proxy.capture.target import Target

from .capture import UprobeCapture
from .catchup import BUDGET


def available(target: Target | None) -> str | None:
    """None when uprobes can capture this program, else the one-line reason."""
    if target is not None and target.arch.name != "x86-64":  # x86 pt_regs, entry emulation
        return target.arch.unsupported("uprobe capture")
    ok, why = UprobeCapture.available(target)
    return None if ok else why


def make(*, mode: str = "full", only: str | None = None, exclude: str | None = None,
         options: dict[str, object] | None = None) -> UprobeCapture:
    opts = options or {}
    kw: dict[str, int] = {}
    for opt, arg in (("uprobe_stack", "stack_bytes"), ("uprobe_ring", "ring_bytes")):
        v = opts.get(opt)
        if isinstance(v, int) and v >= 0:
            kw[arg] = v
    sample = opts.get("sample")
    if isinstance(sample, int) and sample > 1:
        kw["sample_every"] = sample
    elif mode == "tasks":
        kw["sample_every"] = 64  # the kernel folds the counts: one root poll in 64 recorded
    if opts.get("uprobe_changes"):
        kw["record_changes"] = True  # type: ignore[assignment]
    if opts.get("uprobe_every"):
        kw["elide_nested"] = False  # type: ignore[assignment]
    if opts.get("wakes"):
        kw["spawns"] = True  # type: ignore[assignment]  # spawn records and the tasks' wakes (wakes.py)
    if opts.get("lost_wakers"):
        kw["spawns"] = kw["wakers"] = True  # type: ignore[assignment]  # waker clones and drops too
    if opts.get("uprobe_strict"):
        kw["catch_up"] = False  # type: ignore[assignment]
    budget = opts.get("uprobe_budget")
    # the share of one core the watcher may take while the program runs (catchup.py); 0: no bound
    kw["cpu_budget"] = (BUDGET if not isinstance(budget, (int, float)) else budget / 100.0)  # type: ignore[assignment]
    if opts.get("uprobe_rets"):
        kw["learn_returns"] = False  # type: ignore[assignment]
    share = opts.get("sample_time")
    if isinstance(share, (int, float)) and 0 < share < 100:
        kw["slice_duty"] = share / 100.0  # type: ignore[assignment]
    return UprobeCapture(only=only, exclude=exclude, entry_only=mode == "entry",
                         tasks_only=mode == "tasks", **kw)


__all__ = ["UprobeCapture", "available", "make"]
