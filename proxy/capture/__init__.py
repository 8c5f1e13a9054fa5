"""Capture backends: turn the program's poll entries and exits into engine events.

`BACKENDS` names every backend with the module that holds it. A backend
module exposes `available(target) -> str | None` (None when it can run, else
the one-line reason it cannot) and `make(mode=..., only=..., exclude=...,
options=...)`. `--capture auto` takes the first available in `AUTO_ORDER`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.capture.base import CaptureBase
from proxy.capture.target import Target

BACKENDS: dict[str, str] = {
    "breakpoints": "proxy.capture.breakpoints",
    "uprobes": "proxy.capture.uprobes",
    "tracepoints": "proxy.capture.tracepoints",
}
# Cheapest first: uprobes (in the kernel), tracepoints (in gdbserver), breakpoints (any stub).
AUTO_ORDER = ("uprobes", "tracepoints", "breakpoints")
MODES = ("full", "tasks", "entry", "off")


def names() -> list[str]:
    return list(BACKENDS)


def unavailable(name: str, target: Target | None) -> str | None:
    """Why backend `name` cannot run for `target` (None: it can)."""
    mod = BACKENDS.get(name)
    if mod is None:
        return f"unknown capture backend {name!r} (known: {', '.join(BACKENDS)})"
    try:
        module = importlib.import_module(mod)
    except Exception as err:  # noqa: BLE001 - a broken optional backend is a reason, not a crash
        return f"{name} backend cannot load: {err}"
    check = getattr(module, "available", None)
    return check(target) if check is not None and target is not None else None


def fallback_line(chosen: str, passed: Sequence[tuple[str, str]]) -> str:
    """The one line `run` and `serve` print when ``--capture auto`` passed over
    a cheaper capture, and `asyncrsp doctor` prints as its verdict: `passed` are
    the (name, why not) of the cheaper ones, cheapest first."""
    over = ", ".join(name for name, _ in passed)
    whys = "; ".join(why if why.startswith(f"{name}:") else f"{name}: {why}" for name, why in passed)
    return f"capture: {chosen}, dearer than {over} ({whys})"


def make_capture(
    name: str,
    mode: str,
    target: Target | None = None,
    *,
    only: str | None = None,
    exclude: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> CaptureBase | None:
    """The backend `name` (or the best available for `auto`); None in mode off.

    Raises ValueError with the reason when an explicitly named backend cannot run.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")
    if mode == "off":
        return None
    why = "asked for"
    passed: list[tuple[str, str]] = []
    if name == "auto":
        for cand in AUTO_ORDER:
            if cand not in BACKENDS:
                continue
            reason = unavailable(cand, target)
            if reason is None:
                name = cand
                why = "auto: " + ("; ".join(f"no {n}: {r}" for n, r in passed) if passed else f"{cand} available")
                break
            passed.append((cand, reason))
        else:
            name = "breakpoints"
    else:
        reason = unavailable(name, target)
        if reason is not None:
            raise ValueError(reason)
    module = importlib.import_module(BACKENDS[name])
    cap: CaptureBase = module.make(mode=mode, only=only, exclude=exclude, options=dict(options or {}))
    cap.why = why
    cap.fallback = fallback_line(name, passed) if passed else None
    return cap


__all__ = ["AUTO_ORDER", "BACKENDS", "MODES", "CaptureBase", "fallback_line", "make_capture", "names", "unavailable"]
