"""`asyncrsp doctor`: print the checks, one a line, and the capture `run` would take."""

from __future__ import annotations

import json
from typing import TextIO

from proxy.capture import fallback_line
from proxy.host.checks import Check, exit_code, run_checks, run_problem, uprobes_problem
from proxy.host.facts import HostFacts
from proxy.host.read import SIMULATE_ENV, SimulationError

from .reader import read_host

EXIT_MEANING = {0: "every check passes", 1: "asyncrsp runs here; the lines not ok say what is missing",
                2: "asyncrsp run cannot start a program here"}


def capture_verdict(f: HostFacts) -> str:
    """The capture `asyncrsp run` takes here, in the line `run` and `serve` print when they fall back."""
    if run_problem(f) is not None:
        return "capture: none (asyncrsp run cannot start a program here: see above)"
    why = uprobes_problem(f)
    if why is None:
        return "capture: uprobes (in the kernel: the program is never stopped to record a poll)"
    return fallback_line("tracepoints", [("uprobes", why)])


def report(facts: HostFacts) -> tuple[list[str], int]:
    """The doctor's lines for `facts` and its exit status (pure)."""
    checks = run_checks(facts)
    lines = [f"simulated: {' '.join(facts.simulated)} ({SIMULATE_ENV})"] if facts.simulated else []
    lines += [c.line() for c in checks]
    lines.append(capture_verdict(facts))
    return lines, exit_code(checks)


def _as_json(facts: HostFacts, checks: list[Check], code: int) -> str:
    return json.dumps({
        "checks": [{"name": c.name, "status": c.status, "text": c.text, "fix": c.fix, "affects": c.affects}
                   for c in checks],
        "capture": capture_verdict(facts), "exit": code, "simulated": list(facts.simulated),
    }, indent=2)


def doctor_main(out: TextIO, err: TextIO, *, as_json: bool = False) -> int:
    try:
        facts = read_host()
    except SimulationError as e:
        print(f"asyncrsp doctor: {e}", file=err)
        return 2
    lines, code = report(facts)
    if as_json:
        print(_as_json(facts, run_checks(facts), code), file=out)
    else:
        print("\n".join(lines), file=out)
    return code
