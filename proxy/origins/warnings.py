"""``monitor async warnings``: tokio-console's warnings, from the observed polls and wakes.

The same checks and thresholds as tokio-console's defaults (its ``warnings.rs``):

* **lost waker**: a task pending, not woken since its last poll, not running,
  whose wakers were all dropped (``WakeWords.lost``): nothing can wake it;
* **self-wakes**: a task that woke itself (from inside its own poll) in more
  than ``SELF_WAKE_PERCENT`` of its wakes;
* **never yielded**: the task's first poll still running at the stop, for
  ``NEVER_YIELDED_NS`` (1 s) or more (console's ``NeverYielded``: state running,
  at most one poll, busy >= 1 s; polls counted since the capture began);
* **long poll** (not console's): any other poll longer than that, finished (the
  engine's longest poll) or still running: a task that did yield, but late;
* **large future**: the task's future, in its cell, takes ``LARGE_FUTURE`` (1,024)
  bytes or more (its type's size in the program's DWARF: console's ``size.bytes``);
* **auto-boxed future**: the future lies outside its cell and is over tokio's
  smallest box threshold (2 KiB): the runtime boxed it for its size (console's
  ``original_size.bytes`` differs from ``size.bytes``). A future the program
  boxed itself before spawning it, over 2 KiB, is taken for one.

Each warning names the task, where it is (its line) and where it was spawned.
"""

from __future__ import annotations

from typing import Any

SELF_WAKE_PERCENT = 50
NEVER_YIELDED_NS = 1_000_000_000
LARGE_FUTURE = 1024  # console's LargeFuture::DEFAULT_MIN_SIZE_BYTES
BOX_MIN = 2048  # tokio's smallest BOX_FUTURE_THRESHOLD (debug assertions on; 16 KiB without)


def render_warnings(snap: Any, org: Any, engine: Any, now_ns: int, *, self_wake_percent: int = SELF_WAKE_PERCENT,
                    never_yielded_ns: int = NEVER_YIELDED_NS) -> str:
    from proxy.graph.timing import fmt_ns

    words = org.wake_words(snap)
    out: list[str] = []
    seen: set[int] = set()
    for t in snap.tasks:
        if t.id in seen or not t.live:
            continue
        seen.add(t.id)
        where = f"at {t.location or '?'}, spawned at {org.spawn_line(t)}"
        w = org.wakes_of(t)
        if words.lost(t):
            out.append(f"lost waker: {t.label} {t.name} ({where}): no waker alive; it will never be woken again")
        if w is not None and w.wakes and w.self_wakes * 100 > self_wake_percent * w.wakes:
            out.append(f"self-wakes: {t.label} {t.name} ({where}): woke itself in {w.self_wakes} of {w.wakes} wakes "
                       f"({100 * w.self_wakes // w.wakes}% > {self_wake_percent}%)")
        size = org.future_size(t)
        if size is not None and size[1] and size[0] > BOX_MIN:
            out.append(f"auto-boxed future: {t.label} {t.name} ({where}): its future ({size[0]:,} bytes) was boxed "
                       f"by the runtime for its size")
        elif size is not None and not size[1] and size[0] >= LARGE_FUTURE:
            out.append(f"large future: {t.label} {t.name} ({where}): its future takes {size[0]:,} bytes "
                       f"(>= {LARGE_FUTURE:,})")
        longest = _longest(engine, t)
        running = now_ns - w.poll_at if w is not None and w.poll_at and t.state.thread is not None else 0
        if running >= never_yielded_ns and (w is None or w.polls <= 1):
            out.append(f"never yielded: {t.label} {t.name} ({where}): its first poll has run {fmt_ns(running)} "
                       f"without yielding (still running) (>= {fmt_ns(never_yielded_ns)})")
        elif max(longest, running) > never_yielded_ns:
            what = (f"its poll has run {fmt_ns(running)} without yielding (still running)" if running > longest
                    else f"a poll ran {fmt_ns(longest)} without yielding")
            out.append(f"long poll: {t.label} {t.name} ({where}): {what} (> {fmt_ns(never_yielded_ns)}; not "
                       f"console's: it yielded before)")
    lost = "lost waker" if getattr(org.sw, "want_wakers", True) else "lost waker not probed (--lost-wakers)"
    head = (f"warnings (tokio-console's: {lost}; self-wakes > {self_wake_percent}% of wakes; never yielded: a "
            f"first poll running >= {fmt_ns(never_yielded_ns)}; large and auto-boxed futures; and long poll: any poll "
            f"longer): {len(out)}")
    return "\n".join([head, *out])


def _longest(engine: Any, task: Any) -> int:
    if engine is None:
        return 0
    timing = getattr(engine, "timing", None)
    try:
        return int(timing.longest_ns(task.id)) if timing is not None and timing.of(task.id) is not None else 0
    except (KeyError, AttributeError):
        return 0
