"""The uprobes capture's consumer: the records the BPF program wrote, folded into the graph's
engine in stream order (the capture's module docstring has the whole picture).

Records are decoded straight from the ring's pages, a batch at a time, and each batch's space
is given back to the kernel once folded; when the time runs out, what the ring holds is copied
into a backlog in one piece, so the kernel's buffer is freed and the program never loses events
to a slow fold. The ring's drops are fed as `EventsLost` in stream order, and the threads are then
resynchronised from their next entry's stack. A share of each fold's time goes to the deferred
unwinder (`unwind.py`), which checks the entries kept in its queue.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from proxy.graph.engine import Engine
from proxy.graph.events import PollEnter

from .decode import ENTRY_REC, PARENT, PARENT_AT, Decoder, EntryCapture, InstanceTotals, entry_capture

if TYPE_CHECKING:
    from .capture import UprobeCapture

_COOKIE = struct.Struct("<I")  # a record's cookie, at offset 4
BATCH = 2048  # records folded between two looks at the clock
RESYNC_CREDITS = 16  # stack slices a fold, a thread, while threads wait to be resynchronised after lost events


class RingFold:
    """The consumer half of a `UprobeCapture` (`cap.fold`): the backlog copied out of the ring,
    the threads waiting to be resynchronised, the unwinder's queue; `run` folds."""

    def __init__(self, cap: UprobeCapture, unwind_queue: int, keep_queue: bool, max_backlog: int) -> None:
        self.c = cap
        self.unwind_q: deque[EntryCapture] = deque(maxlen=unwind_queue)
        # Sampling takes no stack slices for the unwinder's sample: an 8 KiB slice
        # costs the recorded entry several µs, and the recorded polls calibrate the
        # cost per event that busy times subtract for every hit, recorded or not
        # (with slices 4.5 µs instead of 0.9: most connection polls of the server
        # benchmark came out at 0 busy).
        self.keep_q = keep_queue
        # records copied out of the ring and not folded yet: (chunk, [(offset, length)])
        # in stream order, and ints (events lost at that point)
        self.backlog: deque[tuple[bytes, list[tuple[int, int]]] | int] = deque()
        self.backlog_n = 0  # records in the backlog
        self.max_backlog = max_backlog
        self.resync: set[int] = set()  # threads to resynchronise from their next entry's stack
        self.drops_seen = 0  # the ring's drop counter at the last look

    def run(self, budget_s: float | None) -> bool:
        """Fold the backlog, then the ring, into the engine for up to `budget_s`
        (None: all of it, the program is stopped); True when the time ran out
        with records left.

        Records are decoded straight from the ring's pages, a batch at a time,
        and the batch's space is given back to the kernel after it is folded:
        no copy per record (copying each record out into a backlog first cost
        ~0.5 µs an event). When the time runs out, whatever the ring holds is
        copied into the backlog in one piece, so the kernel's buffer is freed
        and the program never loses events to a slow fold. The backlog, older
        than the ring, is always folded first."""
        dec, engine = self.c.decoder, self.c.engine
        if dec is None or engine is None:
            return False
        t0 = time.perf_counter()
        deadline = None if budget_s is None else t0 + budget_s
        n0 = self.c.events
        behind = not self._fold_backlog(dec, engine, deadline) or not self._fold_ring(dec, engine, deadline)
        if self.c.catchup is not None:
            self.c.catchup.measured(self.c.events - n0, time.perf_counter() - t0)
        if behind:
            self.drain_ring()
        if self.c._prog is not None:
            self.c._prog.set_credits(self.credits_wanted())
        if budget_s is None:
            self.unwind_some(self.c.stop_unwind_s)
        else:
            spent = time.perf_counter() - t0
            self.unwind_some(max(budget_s * self.c.unwind_share, 0.0) if spent < budget_s else 0.0)
        return behind

    def _fold_backlog(self, dec: Decoder, engine: Engine, deadline: float | None) -> bool:
        """Fold the backlog (chunks copied out of the ring, drop markers) in
        batches until the deadline; True when it is empty."""
        backlog = self.backlog
        n = 0  # records since the last look at the clock (chunks may be small: a look a batch)
        while backlog:
            item = backlog.popleft()
            if type(item) is int:  # the ring's drops, in stream order (_check_drops)
                self._lost_here(item, dec, engine)
                continue
            buf, spans = item  # type: ignore[misc]
            if len(spans) > BATCH - n:
                backlog.appendleft((buf, spans[BATCH - n:]))
                spans = spans[:BATCH - n]
            self.backlog_n -= len(spans)
            n += len(spans)
            self.feed(buf, spans, dec, engine)
            if n >= BATCH:
                n = 0
                if deadline is not None and time.perf_counter() > deadline:
                    return not backlog
        return True

    def _fold_ring(self, dec: Decoder, engine: Engine, deadline: float | None) -> bool:
        """Decode and fold records in place in the ring, a batch at a time, until
        it is empty (True) or the deadline passes (False)."""
        ring = self.c._ring
        if ring is None or self.c._prog is None:
            return True
        while True:
            end, spans = ring.spans(BATCH)
            if spans:
                self.feed(ring.view, spans, dec, engine)
            ring.release(end)  # folded: the kernel may write there again
            n = self._check_drops()
            if n:
                self._lost_here(n, dec, engine)
            if len(spans) < BATCH:
                return True
            if deadline is not None and time.perf_counter() > deadline:
                return False

    def _lost_here(self, n: int, dec: Decoder, engine: Engine) -> None:
        engine.feed(dec.lost(n, "uprobe ring buffer full"))
        self.resync = set(engine.threads_to_resync())

    def credits_wanted(self) -> int:
        """Stack slices worth capturing now: room in the unwinder's queue, and
        RESYNC_CREDITS a thread while threads wait to be resynchronised after
        lost events (each needs one entry with its stack; the proxy sets the
        credits again after every fold)."""
        want = 0
        if self.keep_q and not (self.c.catchup is not None and self.c.catchup.sampling):
            want = max((self.unwind_q.maxlen or 0) - len(self.unwind_q) - self.backlog_n, 0)
        if self.resync:
            # Not unbounded: it was, and a loss then gave every entry an 8 KiB slice
            # until the proxy had folded up to one of them, seconds later when behind
            # (--uprobe-strict): the BPF program's ns a hit doubled and more, the 64 MiB
            # ring filled in a fraction of a second and more records were lost, each
            # loss starting it again (docs/history/2026-speed.md, "The BPF program's cost a hit").
            want = max(want, RESYNC_CREDITS * len(self.resync))
        return want

    def drain_ring(self) -> None:
        """Copy what the ring holds into the backlog (one copy per contiguous
        span), freeing the kernel's buffer at once."""
        ring = self.c._ring
        if ring is None or self.c._prog is None:
            return
        while self.backlog_n < self.max_backlog:
            got = ring.copy_out(8 << 20)
            if got is not None:
                self.backlog.append(got)
                self.backlog_n += len(got[1])
            n = self._check_drops()
            if n:
                self.backlog.append(n)  # an int: n events lost here, after the records that filled the ring
            if got is None:
                break

    def _check_drops(self) -> int:
        """Events the ring had no room for since the last check. The caller puts the
        loss in stream order, after the records that filled the ring (the drops
        happened while they sat in it): fed before them, it made the parent check
        disagree on entries folded after it."""
        assert self.c._prog is not None
        drops = self.c._prog.counters().get("drops", 0)
        if drops <= self.drops_seen:
            return 0
        n = drops - self.drops_seen
        self.drops_seen = drops
        self.c.lost += n
        return n

    def feed(self, buf: Any, spans: list[tuple[int, int]], dec: Decoder, engine: Engine) -> None:
        """Decode the records at `spans` ((offset, length) in `buf`: the ring's
        pages or a chunk copied out of them) and feed them to the engine: the
        plain ones straight into it (``Decoder.fold``: no event objects, half the
        CPU a record, docs/history/2026-speed.md), the others one by one (``_feed_each``)."""
        feeders = (None if self.c.slice_duty < 1.0 or self.c.tasks.learning or self.resync
                   or self.c.nested_links.settle_ns is not None
                   else engine.feeders())
        if feeders is None:
            self._feed_each(buf, spans, dec, engine)
            return
        enter, exit_ = feeders
        i, end = 0, len(spans)
        while i < end:
            j = dec.fold(buf, spans, i, enter, exit_, engine.elided)
            self.c.events += j - i
            if j < end:
                self._feed_each(buf, spans[j:j + 1], dec, engine)
            i = j + 1

    def _feed_each(self, buf: Any, spans: list[tuple[int, int]], dec: Decoder, engine: Engine) -> None:
        c = self.c
        decode, feed = dec.decode_at, engine.feed
        q = self.unwind_q
        resync = self.resync
        sliced = c.slice_duty < 1.0
        tasks, nested = c.tasks, c.nested_links
        for off, n in spans:
            ev = decode(buf, off, n)
            if ev is None:
                continue
            if dec.elided:  # coroutines elided on the record's thread before it (full mode)
                engine.elided(dec.elided)
                dec.elided = 0
            if type(ev) is InstanceTotals:
                c.totals.credit(ev, engine)
                continue
            if dec.totals is not None:  # a completion's exit carrying its instance's totals
                feed(ev)
                c.events += 1
                c.totals.credit(dec.totals, engine)
                dec.totals = None
                continue
            if sliced and not c.slicing.feed(ev, engine):
                continue
            if nested.settle_ns is not None and nested.settling(ev, engine):
                continue
            if tasks.learning and type(ev) is PollEnter:
                tasks.entries_seen += 1
                (tasks.root_fns if engine.current_scope(ev.thread) is None else tasks.nested_fns).add(ev.site)
            c.events += 1
            if type(ev) is PollEnter:
                # the unwinder samples: entries drained without their stack are skipped
                has_stack = n > ENTRY_REC.size
                keep = self.keep_q and has_stack and len(q) < (q.maxlen or 0)
                if not keep and self.keep_q and c.unwinder is not None:
                    c.unwinder.stats.skipped += 1
                if keep or (resync and has_stack and ev.thread in resync):
                    scope = engine.current_scope(ev.thread)
                    rec = bytes(buf[off:off + n])  # kept after the ring's space is given back
                    parent = (scope.site, scope.sp) if scope is not None else None
                    if ev.parent is not None:  # the poll it runs inside, named by the kernel
                        parent = (ev.parent[1], PARENT.unpack_from(rec, PARENT_AT)[1])
                    cap = entry_capture(rec, ev, parent, dec.sites[_COOKIE.unpack_from(rec, 4)[0]].sp_adjust)
                    if resync and ev.thread in resync:
                        self._resync_from(cap, engine)
                        resync = self.resync
                    if keep:
                        self.unwind_q.append(cap)
            feed(ev)

    def _resync_from(self, cap: EntryCapture, engine: Engine) -> None:
        """After lost events: the entry's own stack says which polls enclose it."""
        assert self.c.unwinder is not None
        scopes = [(s.site, s.sp) for s in engine.scopes(cap.thread)]
        engine.resync_thread(cap.thread, self.c.unwinder.resync_frames(cap, scopes))
        self.resync.discard(cap.thread)

    def unwind_some(self, budget_s: float | None) -> None:
        u, q = self.c.unwinder, self.unwind_q
        if u is None:
            return
        t_end = None if budget_s is None else time.perf_counter() + budget_s
        while q:
            if t_end is not None and time.perf_counter() >= t_end:
                break
            u.check(q.popleft())

    def drop_unwind_queue(self) -> None:
        if self.c.unwinder is not None:
            self.c.unwinder.stats.skipped += len(self.unwind_q)
        self.unwind_q.clear()
