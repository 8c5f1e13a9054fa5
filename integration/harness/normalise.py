"""Normalise debugger transcripts so that a session straight against a stub
and the same session through asyncrsp compare equal when they should.

Each rule removes one thing that legitimately differs between two runs of
the same session; nothing else is touched (addresses of code, stack and heap
are kept: gdbserver, lldb-server and QEMU all run the program with ASLR off,
so they are equal run to run, and a wrong address is exactly what the
comparison must catch). The rules, in order:

1. ``ports``: ``127.0.0.1:NNNN`` / ``localhost:NNNN`` -> ``127.0.0.1:PORT``
   (the stub's port differs from the proxy's).
2. ``pids``: ``process NNN``, ``Process NNN``, ``pid = NNN``, ``pid="NNN"``,
   ``pid NNN`` -> ``PID`` (each run starts a new program).
3. ``lwps``: thread LWP numbers (``LWP NNN``, multiprocess ``Thread PID.LWP``
   (gdbserver; QEMU's pid is always 1) -> ``Thread P.#n``,
   lldb's ``tid = NNN``/``tid = 0x...``, ``Thread NNN``-style hex ids) ->
   ordinals by first appearance in the transcript (``LWP#1``, ...), so
   the order in which threads appear is still compared.
4. ``cores``: gdb/MI ``core="N"`` -> ``core="*"`` (the CPU the thread last
   ran on).
5. ``mi tokens``: the numeric token before an MI result (``107^done``) is
   dropped (the proxy route runs one extra ``monitor async stats``
   command, which shifts every later token).
6. ``lines``: trailing blanks are dropped and runs of empty lines folded.
7. ``thread tables``: in gdb's ``info threads`` table (its header and its
   rows) runs of blanks become one: the Target Id column is as wide as its
   widest cell, and the pid/LWP digits in it differ between runs (pid_max is
   32768 here: after a wrap one run's ids have a digit fewer, seen as a
   one-blank diff in a CI run).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable

PORTS = re.compile(r"\b(127\.0\.0\.1|localhost):\d+")
PIDS = re.compile(r"\b([Pp]rocess|pid =|pid) \d+\b|\bpid=\"\d+\"")
LWP = re.compile(r"\bLWP (\d+)\b|\bThread \d+\.(\d+)\b|\btid = (0x[0-9a-f]+|\d+)\b")
CORE = re.compile(r'\bcore="\d+"')
MI_TOKEN = re.compile(r"^\d+(?=[\^*+=])", re.M)
THREAD_TABLE = re.compile(r"^\s+Id\s+Target Id\s|^[* ] +\d+ +(?:Thread |LWP#|process |Remote target)")


def _pids(m: re.Match[str]) -> str:
    if m.group(0).startswith("pid="):
        return 'pid="PID"'
    return f"{m.group(1)} PID"


def _lwp_renamer() -> Callable[[re.Match[str]], str]:
    seen: dict[str, int] = {}

    def rename(m: re.Match[str]) -> str:
        raw = m.group(1) or m.group(2) or m.group(3)
        key = str(int(raw, 0))
        n = seen.setdefault(key, len(seen) + 1)
        if m.group(1):
            return f"LWP#{n}"
        if m.group(2):
            return f"Thread P.#{n}"
        return f"tid = #{n}"

    return rename


def normalise(text: str, rename: Callable[[re.Match[str]], str] | None = None) -> str:
    """Apply every rule of this module to one piece of output."""
    text = PORTS.sub(lambda m: f"{m.group(1)}:PORT", text)
    text = PIDS.sub(_pids, text)
    text = LWP.sub(rename or _lwp_renamer(), text)
    text = CORE.sub('core="*"', text)
    text = MI_TOKEN.sub("", text)
    lines = [ln.rstrip() for ln in text.replace("\r\n", "\n").split("\n")]
    lines = [re.sub(r" {2,}", " ", ln) if THREAD_TABLE.match(ln) else ln for ln in lines]
    out: list[str] = []
    for ln in lines:
        if ln or (out and out[-1]):
            out.append(ln)
    while out and not out[-1]:
        out.pop()
    return "\n".join(out)


def normalise_transcript(steps: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Normalise (label, output) pairs with one LWP numbering for the whole run."""
    rename = _lwp_renamer()
    return [(normalise(label, rename), normalise(out, rename)) for label, out in steps]


_DURATION_CELL = re.compile(r"(?<=\s)(?:\d+(?:\.\d+)?(?:ns|us|ms|s)|-)(?=\s|$)")


def mask_timing(text: str) -> str:
    """Poll timing differs run to run (``monitor async tasks``' BUSY/IDLE/LONGEST
    cells and its ``capture cost subtracted`` line): cells become ``D`` and runs
    of blanks one blank (column widths follow the values)."""
    out = []
    for line in text.splitlines():
        if line.startswith("capture cost subtracted:"):
            continue
        out.append(re.sub(r"[ \t]+", " ", _DURATION_CELL.sub("D", line)))
    return "\n".join(out)
