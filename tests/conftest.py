"""Hypothesis in the suite: derandomized, so every run tests the same examples
(a red run is red again on a rerun, a green one stays green; the session fuzzer
once failed a single run on an example no later run drew).

``ASYNCRSP_HYPOTHESIS=random`` explores new examples each run (hypothesis'
random seed, printed with a failure; ``pytest --hypothesis-seed=N`` replays
it), e.g. the long session fuzz in docs/safety.md:
``ASYNCRSP_HYPOTHESIS=random ASYNCRSP_FUZZ_SESSION_EXAMPLES=5000 pytest --timeout=0
tests/proxy/session/test_fuzz_session.py``.
"""

from __future__ import annotations

import os

from hypothesis import settings

MODES = {"derandomized": True, "random": False}

settings.register_profile("asyncrsp-derandomized", derandomize=True)
settings.register_profile("asyncrsp-random", derandomize=False)

_mode = os.environ.get("ASYNCRSP_HYPOTHESIS", "derandomized")
if _mode not in MODES:
    raise SystemExit(f"ASYNCRSP_HYPOTHESIS must be one of {', '.join(MODES)}, not {_mode!r}")
settings.load_profile(f"asyncrsp-{_mode}")
