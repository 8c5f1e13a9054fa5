"""Uprobe capture's fast path (``Decoder.fold`` into ``Engine.feeders``, the innermost
poll's exit matched inline) against the general one (``Decoder.decode_at`` +
``Engine.feed``, record by record; every exit matched by ``_pop_matching``): the same
engine state, decoder stats and capture counters on any stream of records,
including the odd ones (missed and unmatched exits, new lives at an address,
coroutines elided, entries resumed at a stop, lost events, stack slices, named
parents, totals, unwinds, bad records)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.capture.uprobes.capture import UprobeCapture
from proxy.capture.uprobes.decode import (
    ENTRY_REC,
    EXIT_REC,
    F_ELIDED,
    F_PARENT,
    F_SELF,
    F_STATE,
    F_TOTALS,
    KIND_ENTRY,
    KIND_EXIT,
    KIND_STATS,
    KIND_UNWIND,
    Decoder,
    SiteInfo,
)
from proxy.graph.catalog import Catalog
from proxy.graph.engine import Engine
from proxy.graph.events import PollEnter, PollResumed

from .test_uprobes_decode import SITES as DECODE_SITES
from .test_uprobes_decode import _inventory

# a: entry 0, exit 1, unwind 2; b: entry 3, exit 4 (the decoder's tests' table); a learned
# return site (5) serving both
SITES = [*DECODE_SITES, SiteInfo(KIND_EXIT, 0, 0x3008, -8)]
FN_SITES = {0: 0x1000, 1: 0x2000}
SELFS = [0xAA00, 0xBB00, 0xCC00]
SPS = [0x7F00, 0x7E00, 0x7D00, 0x7C00]
STATES = [None, 0, 1, 2, 3, 9]  # 9: not a state of the layouts


def entry(cookie: int, tid: int, ts: int, sp: int, self_ptr: int, state: int | None, *, elided: int = 0,
          stack: bytes = b"", parent: tuple[int, int, int] | None = None) -> bytes:
    flags = F_SELF | (F_STATE if state is not None else 0) | (F_ELIDED if elided else 0) \
        | (F_PARENT if parent is not None else 0)
    p = parent or (0, 0, 0)
    return ENTRY_REC.pack(KIND_ENTRY, flags, cookie, tid, len(stack), ts, cookie * 0x1000, sp, self_ptr,
                          0x5000 + sp, elided, state or 0, 0, 0, 0, 0, 0, 0, p[0], p[1], p[2], 0) + stack


def exit_(cookie: int, tid: int, ts: int, sp: int, self_ptr: int | None, state: int | None, *, elided: int = 0,
          kind: int = KIND_EXIT, fn: int = 0, totals: bool = False) -> bytes:
    flags = (F_SELF if self_ptr is not None else 0) | (F_STATE if state is not None else 0) \
        | (F_ELIDED if elided else 0) | (F_TOTALS if totals else 0)
    rax = elided if elided else (4000 if totals else 0)
    return EXIT_REC.pack(kind, flags, cookie, tid, fn, ts, 0x1040, sp, self_ptr or 0, 5 if totals else 0, rax,
                         state or 0)


class _Watched(Engine):
    """`feed` overridden: every event must come through it (no feeders)."""

    def feed(self, ev: Any) -> None:
        super().feed(ev)


def _capture(eng: Engine) -> tuple[UprobeCapture, Decoder]:
    cap = UprobeCapture()
    dec = Decoder(SITES, first_seq=1, fn_sites=FN_SITES)
    cap.target = SimpleNamespace(engine=eng)  # type: ignore[assignment]
    cap.decoder, cap._fn_site = dec, FN_SITES
    return cap, dec


def state_of(eng: Engine, cap: UprobeCapture, dec: Decoder) -> dict[str, Any]:
    g = eng._g
    return dict(
        tasks=sorted((r.pack() for r in g.tasks.values()), key=repr),
        edges=sorted((e.pack() for e in g.edges.values()), key=repr),
        index=sorted((a, sorted(m.items())) for a, m in g.index.items()),
        addr_gen=sorted(g.addr_gen.items()),
        scopes=sorted((t, list(s)) for t, s in g.scopes.items()),
        finished=list(g.finished), reads=sorted(g.reads.items()), next_id=g.next_id, last_seq=g.last_seq,
        last_time=g.last_time, resync=g.resync_needed, counters=g.c,
        timing=sorted((k, v.polls, v.raw_ns, v.events, v.longest, list(v.samples)) for k, v in eng.timing.tasks.items()),
        leaves=(eng.timing.leaf_polls, list(eng.timing._leaves)),
        dec=(dec.stats, dec.seq, dec.elided, dec.totals), events=cap.events, queued=len(cap.fold.unwind_q),
        closed=cap.totals.closed_polls,
    )


def replay(ops: list[Any], eng: Engine) -> dict[str, Any]:
    """`ops`: lists of records (a `_feed` batch each) and, between them, what a stop
    feeds (a resumed entry, lost events)."""
    cap, dec = _capture(eng)
    for op in ops:
        if isinstance(op, list):
            buf, spans, off = b"".join(op), [], 0
            for r in op:
                spans.append((off, len(r)))
                off += len(r)
            cap.fold.feed(buf, spans, dec, eng)
        elif op[0] == "resumed":
            _, tid, site, self_ptr, sp, state = op
            eng.feed(PollResumed(dec.next_seq(), tid, site, self_ptr, sp, None, state, None))
        else:
            eng.feed(dec.lost(op[1], "test"))
    return state_of(eng, cap, dec)


def both(ops: list[Any], keep_log: bool = False) -> tuple[dict[str, Any], dict[str, Any]]:
    fast = Engine(Catalog(_inventory(), 0), keep_log=keep_log)
    general = _Watched(Catalog(_inventory(), 0), keep_log=keep_log)
    general._g.shortcuts = False  # every exit matched by GraphState._pop_matching
    assert general.feeders() is None
    return replay(ops, fast), replay(ops, general)


# ---- a stream with every odd case, by hand ------------------------------------------


def test_the_odd_cases_fold_as_record_by_record() -> None:
    t = iter(range(100, 100_000, 10))
    a, b = 0xAA00, 0xBB00
    first = [
        entry(0, 1, next(t), 0x7F00, a, 0),  # a at the root, new
        entry(3, 1, next(t), 0x7E00, b, 0),  # b under a, new
        exit_(4, 1, next(t), 0x7E00, b, 3),  # b suspends
        exit_(1, 1, next(t), 0x7F00, a, 3, elided=2),  # a suspends, 2 coroutines elided inside
        entry(0, 1, next(t), 0x7F00, a, 3),
        entry(3, 1, next(t), 0x7E00, b, 3),
        entry(0, 1, next(t), 0x7F00, a, 3),  # at a's sp again: b's and a's exits were missed
        exit_(1, 1, next(t), 0x7000, a, 3),  # an exit no scope has (unmatched), below a's: a stays
        exit_(5, 1, next(t), 0x7F00, a, 3, fn=1),  # at the return site, naming fn 0 (a)
        entry(3, 2, next(t), 0x7E00, b, 0),  # b's new life (Unresumed after polls), thread 2
        entry(0, 2, next(t), 0x7D00, b, 0, stack=b"\x11" * 64),  # a at b's address, a stack slice
        exit_(2, 2, next(t), 0x7C00, b, 2, kind=KIND_UNWIND),  # a panics (unwind)
        exit_(4, 2, next(t), 0x7E00, None, None),  # b's exit without self or state: read at a stop
    ]
    second = [
        entry(3, 1, next(t), 0x7E00, 0xCC00, 0, parent=(a, 0x7F00, 0)),  # names its parent (a)
        exit_(4, 1, next(t), 0x7E00, 0xCC00, 1, totals=True, fn=2),  # returns, carries its totals
        EXIT_REC.pack(KIND_STATS, 0, 1, 1, 0, next(t), 3, 0, 0xCC00, 2, 500, 3),  # a closed instance
        exit_(99, 1, next(t), 0x7E00, None, None, elided=1),  # a bad record carrying an elided count
        entry(0, 1, next(t), 0x7F00, a, 9),  # a bad __state value
        exit_(1, 1, next(t), 0x7F00, a, 1),  # a returns
        entry(0, 1, next(t), 0x7F00, a, 3),  # a finished and entered again: a new life
        exit_(1, 1, next(t), 0x7F00, a, 3),
        b"\0" * 40,  # short
    ]
    ops: list[Any] = [first, ("resumed", 1, 0x1000, a, 0x7F00, 3), ("lost", 3), second]
    fast, general = both(ops)
    assert fast == general
    c = fast["counters"]
    assert c.exits_missed >= 2 and c.unmatched_exits >= 1 and c.elided == 3 and c.rejected >= 1
    assert fast["queued"] == 1 and fast["dec"][0].bad == 2
    assert both(ops, keep_log=True)[0] == fast  # with the event log on, all of it goes record by record


# ---- random streams ---------------------------------------------------------------------

_fn = st.sampled_from([0, 1])
_record = st.one_of(
    st.tuples(st.just("enter"), _fn, st.sampled_from([1, 2]), st.sampled_from(SPS), st.sampled_from(SELFS),
              st.sampled_from(STATES), st.sampled_from([0, 0, 0, 1, 2]), st.sampled_from([False, False, False, True]),
              st.sampled_from([None, None, None, (0xAA00, 0x7F00, 0), (0xBB00, 0x7E00, 1)])),
    st.tuples(st.just("exit"), _fn, st.sampled_from([1, 2]), st.sampled_from(SPS),
              st.sampled_from([None, *SELFS]), st.sampled_from(STATES), st.sampled_from([0, 0, 0, 1]),
              st.sampled_from(["exit", "exit", "exit", "retsite", "unwind", "totals"])),
    st.tuples(st.just("bad"), st.sampled_from(["cookie", "short", "stats", "kind"]), st.sampled_from([0, 1])),
)
_stop = st.one_of(
    st.tuples(st.just("resumed"), st.sampled_from([1, 2]), st.sampled_from([0x1000, 0x2000]),
              st.sampled_from(SELFS), st.sampled_from(SPS), st.sampled_from([None, 0, 3])),
    st.tuples(st.just("lost"), st.integers(0, 3)),
)


def _build(draw: list[Any]) -> list[Any]:
    ops: list[Any] = []
    ts = 100
    for item in draw:
        if not isinstance(item, list):
            ops.append(item)
            continue
        batch = []
        for r in item:
            ts += 7
            if r[0] == "enter":
                _, fn, tid, sp, self_ptr, state, el, stack, parent = r
                batch.append(entry(0 if fn == 0 else 3, tid, ts, sp, self_ptr, state, elided=el,
                                   stack=b"\x22" * 32 if stack else b"", parent=parent))
            elif r[0] == "exit":
                _, fn, tid, sp, self_ptr, state, el, how = r
                cookie = {"exit": 1 if fn == 0 else 4, "retsite": 5, "unwind": 2, "totals": 1 if fn == 0 else 4}[how]
                batch.append(exit_(cookie, tid, ts, sp, self_ptr, state, elided=el,
                                   kind=KIND_UNWIND if how == "unwind" else KIND_EXIT, fn=fn + 1,
                                   totals=how == "totals"))
            else:
                _, how, el = r
                batch.append({"cookie": exit_(42, 1, ts, 0x7F00, None, None, elided=el),
                              "short": b"\0" * 50,
                              "stats": EXIT_REC.pack(KIND_STATS, F_ELIDED if el else 0, 0, 1, 0, ts, 2, 0, 0xAA00,
                                                     3, el or 100, 4),
                              "kind": exit_(0, 1, ts, 0x7F00, None, None, elided=el)}[how])
        ops.append(batch)
    return ops


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.lists(_record, min_size=1, max_size=30), _stop), min_size=1, max_size=8))
def test_random_streams_fold_as_record_by_record(draw: list[Any]) -> None:
    ops = _build(draw)
    fast, general = both(ops)
    assert fast == general


def test_a_watched_feed_gets_every_event() -> None:
    """A wrapper on `feed` (the integration tests count entries that way) turns the fast path off."""
    eng = Engine(Catalog(_inventory(), 0), keep_log=False)
    assert eng.feeders() is not None
    seen: list[Any] = []
    feed = eng.feed

    def watched(ev: Any) -> None:
        seen.append(ev)
        feed(ev)

    eng.feed = watched  # type: ignore[method-assign]
    assert eng.feeders() is None
    replay([[entry(0, 1, 10, 0x7F00, 0xAA00, 0), exit_(1, 1, 20, 0x7F00, 0xAA00, 3)]], eng)
    assert [type(e) for e in seen][:1] == [PollEnter] and len(seen) == 2
