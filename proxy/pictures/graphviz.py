"""DOT text -> SVG or PNG with Graphviz's ``dot``, found at run time (Debian: graphviz)."""

from __future__ import annotations

import shutil
import subprocess

INSTALL = "install Graphviz (Debian: apt-get install graphviz)"
TIMEOUT_S = 120.0  # dot lays out a few hundred boxes in well under a second; a bound, not an estimate


class GraphvizMissing(RuntimeError):
    """No ``dot`` on PATH: the message says what to install."""


class GraphvizFailed(RuntimeError):
    pass


def find_dot() -> str | None:
    return shutil.which("dot")


def render(dot_text: str, fmt: str = "svg") -> bytes:
    """``dot -T<fmt>`` of the text (fmt: svg, png, ...)."""
    exe = find_dot()
    if exe is None:
        raise GraphvizMissing(f"Graphviz's dot is not on PATH: {INSTALL}")
    try:
        done = subprocess.run([exe, f"-T{fmt}"], input=dot_text.encode(), capture_output=True,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise GraphvizFailed(f"dot took over {TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        raise GraphvizFailed(f"dot failed: {err[-1] if err else f'exit {done.returncode}'}")
    return done.stdout


def svg_or_note(dot_text: str) -> tuple[str | None, str | None]:
    """(the SVG text, None), or (None, why there is none) when dot is missing or fails."""
    try:
        svg = render(dot_text, "svg").decode()
    except (GraphvizMissing, GraphvizFailed) as err:
        return None, str(err)
    start = svg.find("<svg")  # the XML prolog and DOCTYPE do not belong inline in HTML
    return (svg[start:] if start >= 0 else svg), None
