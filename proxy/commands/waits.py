"""``monitor async waits`` and ``monitor async deadlocks``: the snapshot's wait-for graph.

    waits:
    #3 deadlock::lock_ab  holds Mutex 0x5555... (a live guard in deadlock::lock_ab at deadlock.rs:30)
    #3 deadlock::lock_ab  waits on Mutex 0x5555...: deadlock::lock_ab awaits ... held by #4

    deadlocks:
    cycle: #3 deadlock::lock_ab -> Mutex 0x... held by #4 deadlock::lock_ba -> Mutex 0x... held by #3
      #3: ...evidence
    blocked: #5 deadlock::joiner -> JoinHandle 0x... -> #3 deadlock::lock_ab (in a cycle)
    nothing can wake: #6 deadlock::lonely -> Notify 0x...
"""

from __future__ import annotations

from typing import Any

from proxy.snapshot.model import Snapshot


def render_waits(snap: Snapshot, observed: Any = None) -> str:
    """``observed``: the observed wakes (``proxy.origins.view.WakeWords``): a wait memory cannot
    tell the waker of gets what the capture saw instead of "unknown waker"."""
    lines = list(snap.notes)
    names = {t.id: f"{t.label} {t.name}" for t in snap.tasks}
    g = snap.waits
    if not g.holds and not g.waits:
        lines.append("no task holds or waits on anything memory shows")
        return "\n".join(lines)
    for h in g.holds:
        lines.append(f"{names.get(h.task, f'#{h.task}')}  holds {h.resource} ({h.evidence})")
    for w in g.waits:
        wakers = [k for k in w.wakers or () if k != w.task][:8]  # (a waiter among the holders wakes only itself)
        more = len([k for k in w.wakers or () if k != w.task]) - len(wakers)
        seen = observed.evidence(_task(snap, w.task)) if observed is not None else None
        who = ("woken from outside the tasks" if w.external else (seen or "unknown waker") if w.wakers is None
               else "nothing can wake it" if not wakers
               else "woken by " + ", ".join(names.get(k, f"#{k}") for k in wakers) + (f" and {more} more" if more else ""))
        if seen and w.wakers is not None:
            who += f"; {seen}"
        lines.append(f"{names.get(w.task, f'#{w.task}')}  waits on {w.resource}: {w.evidence} [{who}]")
    return "\n".join(lines)


def _task(snap: Snapshot, tid: int) -> Any:
    return next((t for t in snap.tasks if t.id == tid), None)


def render_deadlocks(snap: Snapshot, observed: Any = None) -> str:
    lines = list(snap.notes)
    found = snap.waits.findings
    lost = [t for t in snap.tasks if observed is not None and observed.lost(t)]
    for t in lost:
        lines.append(f"lost waker: {t.label} {t.name} at {t.location or '?'}: {observed.evidence(t)}")
    if lost and not found:
        return "\n".join(lines)
    if not found:
        unknown = sum(1 for w in snap.waits.waits if w.wakers is None)
        tail = f" ({unknown} waits whose waker memory does not tell: see 'monitor async waits')" if unknown else ""
        lines.append("no deadlock: every blocked task can be woken" + tail)
        return "\n".join(lines)
    for f in found:
        lines.append(f.text)
        lines += [f"  {e}" for e in f.evidence]
    return "\n".join(lines)
