"""Ring-buffer records -> engine events (pure: bytes in, ``proxy.graph.events`` out).

Theory of operation: the BPF program writes one fixed-layout record per hit
(see uprobes.bpf.c ``struct rec``): 72 bytes at exits, 120 bytes plus a stack
slice at entries. The ring buffer keeps the order in which the hits reserved
their space, so the records of one thread come in program order, and the
decoder numbers them with increasing ``seq``. The cookie of a record is its
site's index in the table the backend attached (``SiteInfo``), which gives
the resume function's runtime ``low_pc`` the engine keys on.

What the engine gets:

* entries: ``self`` from the site's register, the return address read at
  ``sp``, and ``__state`` read through ``self`` at entry (the outcome of the
  previous poll), with the kernel's timestamp; with ``F_PARENT`` (only graph
  changes recorded) the poll it runs inside, whose entry may be no record:
  ``PollEnter.parent`` = (its self, its function's runtime ``low_pc``);
* exits: ``sp`` (a ``ret`` leaves with its entry's sp), ``self`` and
  ``__state`` when the BPF side still had the entry's (tid, sp) in its scope
  table. ``rax`` is kept in the record but not given to the engine as the
  ``Poll`` result: only a ``Poll<()>``-sized return has its discriminant in
  ``rax``, and nothing in the inventory says which do;
* unwind exits (``call _Unwind_Resume``): ``panicked``;
* exits at a learned return site (a function polled through a vtable): the
  site serves every function polled from there, so its ``SiteInfo.site`` is 0
  and the record names the function (index + 1 in the ``stack_len`` field);
* an instance's totals folded in the kernel (``KIND_STATS``: its address
  starts a new life, the old one's polls, raw ns and hits go out first): an
  ``InstanceTotals``, not an event; the capture credits it to the engine's
  node at that address;
* the coroutines created and completed inside one poll of their parent that
  went out as no record (full mode, ``CFG_ELIDE``): counted on the next record
  of their thread (``F_ELIDED``, the count in ``rax``), left in
  ``Decoder.elided`` for the capture to give the engine before that record's event;
* a completion's exit when only graph changes are recorded (``F_TOTALS``: the
  instance's totals in ret/rax/ip, its function's index + 1 in
  ``stack_len``): the ``PollExit``, and its ``InstanceTotals`` left in
  ``Decoder.totals`` for the capture to credit after feeding the exit.

Records whose kind or cookie makes no sense are counted, never raised.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.graph.events import EventsLost, PollEnter, PollEvent, PollExit
from proxy.graph.fast import slot_maker

KIND_ENTRY, KIND_EXIT, KIND_UNWIND, KIND_STATS = 0, 1, 2, 4
F_SELF, F_STATE, F_TOTALS, F_PARENT, F_ELIDED = 1, 2, 8, 16, 32

EXIT_REC = struct.Struct("<HHIIIQQQQQQQ")  # kind flags cookie tid stack_len ts ip sp self ret rax state
# ... then rbp rbx r12 r13 r14 r15, parent self, parent sp, parent fn, pad, stack bytes
ENTRY_REC = struct.Struct("<HHIIIQQQQQQQQQQQQQQQII")
PARENT = struct.Struct("<QQI")  # an entry's parent (F_PARENT): self, entry sp, fn index
PARENT_AT = 120
assert EXIT_REC.size == 72 and ENTRY_REC.size == 144
EXIT_SIZE, ENTRY_SIZE = EXIT_REC.size, ENTRY_REC.size
_unpack_exit = EXIT_REC.unpack_from


@dataclass(frozen=True, slots=True)
class SiteInfo:
    """What a cookie stands for."""

    kind: int  # KIND_ENTRY / KIND_EXIT / KIND_UNWIND
    site: int  # runtime low_pc of the resume function
    addr: int  # runtime address of the probed instruction
    sp_adjust: int = 0  # an entry probed after its prologue (emulated.py): entry sp = rsp + this


@dataclass(frozen=True, slots=True)
class EntryCapture:
    """An entry's registers and stack slice, kept for the deferred unwinder."""

    seq: int
    thread: int
    site: int
    regs: dict[str, int]  # rip rsp rbp rbx r12 r13 r14 r15
    stack: bytes  # memory from regs["rsp"] on
    parent: tuple[int, int] | None  # (site, sp) of the engine's enclosing scope, if any

    def read(self, addr: int, size: int) -> bytes | None:
        off = addr - self.regs["rsp"]
        if off < 0 or off + size > len(self.stack):
            return None
        return self.stack[off:off + size]


@dataclass(frozen=True, slots=True)
class InstanceTotals:
    """A coroutine instance's totals folded in the kernel, closed (a new life at its address)."""

    self_ptr: int
    fn: int  # the resume function's index in the inventory
    polls: int
    raw_ns: int
    hits: int  # 1 + the hits inside, summed over its polls
    recorded: int  # polls whose records went out


@dataclass(slots=True)
class DecodeStats:
    records: int = 0
    entries: int = 0
    exits: int = 0
    unwinds: int = 0
    bad: int = 0  # unknown kind, cookie or a short record
    exit_self_known: int = 0
    exit_state_known: int = 0
    closed: int = 0  # InstanceTotals records


_enter = slot_maker(PollEnter)  # proxy/graph/fast.py: half the cost of the dataclass __init__
_exit = slot_maker(PollExit)


class Decoder:
    def __init__(self, sites: list[SiteInfo], *, first_seq: int = 1, fn_sites: dict[int, int] | None = None) -> None:
        self.sites = sites
        self.fn_sites = fn_sites if fn_sites is not None else {}  # fn index -> runtime low_pc (return sites)
        self.seq = first_seq - 1
        self.stats = DecodeStats()
        self.totals: InstanceTotals | None = None  # the last exit's (F_TOTALS), until the capture takes it
        # coroutines elided on a thread before the last records (F_ELIDED: in rax), until the capture
        # gives them to the engine (Engine.elided) before feeding the record's event
        self.elided = 0
        self._by_cookie: list[tuple[int, int]] = []  # (kind, site) per cookie, for fold

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def lost(self, count: int, reason: str) -> EventsLost:
        return EventsLost(self.next_seq(), count, reason)

    def decode(self, rec: bytes) -> PollEvent | InstanceTotals | None:
        """One record -> one event (None: a bad record, counted)."""
        return self.decode_at(rec, 0, len(rec))

    def decode_at(self, buf: Any, off: int, length: int) -> PollEvent | InstanceTotals | None:
        """The record of `length` bytes at `off` in `buf` (bytes, or the ring's
        pages themselves: no copy) -> one event (None: a bad record, counted)."""
        st = self.stats
        st.records += 1
        if length < EXIT_REC.size:
            st.bad += 1
            return None
        kind, flags, cookie, tid, slen, ts, _ip, sp, self_ptr, ret, _rax, state = _unpack_exit(buf, off)
        if flags & F_ELIDED:
            self.elided += _rax
        if kind == KIND_STATS:  # cookie = the function's index, ret/rax/state/ip = the totals
            st.closed += 1
            return InstanceTotals(self_ptr, cookie, ret, _rax, state, _ip)
        if cookie >= len(self.sites):
            st.bad += 1
            return None
        info = self.sites[cookie]
        if kind != info.kind:
            st.bad += 1
            return None
        if kind == KIND_ENTRY:
            if length < ENTRY_REC.size:
                st.bad += 1
                return None
            st.entries += 1
            self.seq += 1
            parent = None
            if flags & F_PARENT:
                p_self, _p_sp, p_fn = PARENT.unpack_from(buf, off + PARENT_AT)
                p_site = self.fn_sites.get(p_fn)
                parent = (p_self, p_site) if p_site else None
            return _enter(self.seq, tid, info.site, self_ptr, sp, ret or None,
                          state if flags & F_STATE else None, ts, parent)
        site = info.site
        if kind == KIND_EXIT:
            if not site:  # a return site: the record names its function
                site = self.fn_sites.get(slen - 1, 0)
                if not site:
                    st.bad += 1
                    return None
            st.exits += 1
        elif kind == KIND_UNWIND:
            st.unwinds += 1
        else:
            st.bad += 1
            return None
        if flags & F_SELF:
            st.exit_self_known += 1
        if flags & F_STATE:
            st.exit_state_known += 1
        if flags & F_TOTALS:  # a completion: polls in ret, raw ns in rax, hits in ip
            st.closed += 1
            self.totals = InstanceTotals(self_ptr, slen - 1, ret, _rax, _ip, 0)
        self.seq += 1
        return _exit(self.seq, tid, site, sp,
                     state if flags & F_STATE else None,
                     self_ptr if flags & F_SELF else None,
                     None, kind == KIND_UNWIND, ts)


    def fold(self, buf: Any, spans: list[tuple[int, int]], start: int, enter: Callable[..., Any],
             exit: Callable[..., Any], elided: Callable[[int], None]) -> int:
        """Decode the records at ``spans[start:]`` straight into the engine: `enter`
        and `exit` get what ``decode_at`` would put in a ``PollEnter``/``PollExit``
        (``Engine.feeders``), `elided` the count an ``F_ELIDED`` record carries,
        before its event (``Engine.elided``). The plain records only: a plain entry
        (no stack slice, no parent named), a plain exit (no totals); at any other
        record (a stack slice for the unwinder, ``F_PARENT``, ``F_TOTALS``, an unwind
        exit, ``KIND_STATS``, a bad record, coroutines elided before a bad record
        still to give) it stops and returns that record's index, for the caller to
        take the general way (``decode_at``); len(spans) when all were folded. The
        same engine state and stats as ``decode_at`` + ``Engine.feed`` record by
        record (tests/proxy/capture/uprobes/test_uprobes_fold.py)."""
        end = len(spans)
        if self.elided:
            return start
        sites = self.sites
        by_cookie = self._by_cookie
        if len(by_cookie) != len(sites):  # the table only grows (return sites appended)
            by_cookie = self._by_cookie = [(s.kind, s.site) for s in sites]
        n_sites = len(by_cookie)
        fn_sites = self.fn_sites
        unpack = _unpack_exit
        plain = F_SELF | F_STATE | F_ELIDED
        seq = self.seq
        entries = exits = self_known = state_known = 0
        i = start
        for i in range(start, end):  # noqa: B007 - i is the stop
            off, length = spans[i]
            if length < EXIT_SIZE:
                break
            kind, flags, cookie, tid, slen, ts, _ip, sp, self_ptr, ret, rax, state = unpack(buf, off)
            if flags & ~plain or cookie >= n_sites:
                break
            site_kind, site = by_cookie[cookie]
            if kind != site_kind:
                break
            if kind == KIND_ENTRY:
                if length != ENTRY_SIZE:
                    break
                if flags & F_ELIDED:
                    elided(rax)
                seq += 1
                enter(seq, tid, site, self_ptr, sp, ret or None, state if flags & F_STATE else None, ts)
                entries += 1
            elif kind == KIND_EXIT:
                if not site:  # a return site: the record names its function
                    site = fn_sites.get(slen - 1, 0)
                    if not site:
                        break
                if flags & F_ELIDED:
                    elided(rax)
                seq += 1
                if flags & F_SELF:
                    self_known += 1
                if flags & F_STATE:
                    state_known += 1
                exit(seq, tid, site, sp, state if flags & F_STATE else None, self_ptr if flags & F_SELF else None,
                     None, False, ts)
                exits += 1
            else:
                break
        else:
            i = end
        self.seq = seq
        st = self.stats
        st.records += i - start
        st.entries += entries
        st.exits += exits
        st.exit_self_known += self_known
        st.exit_state_known += state_known
        return i


def entry_capture(rec: bytes, ev: PollEnter, parent: tuple[int, int] | None,
                  sp_adjust: int = 0) -> EntryCapture:
    """The unwinder's view of an entry record: rip is the probed instruction and
    rsp the real one there (the record's sp is the entry's: ``sp_adjust`` more);
    the slice starts at the real rsp."""
    f = ENTRY_REC.unpack_from(rec)
    stack_len = f[4]
    regs = {"rip": f[6], "rsp": f[7] - sp_adjust, "rbp": f[12], "rbx": f[13],
            "r12": f[14], "r13": f[15], "r14": f[16], "r15": f[17]}
    stack = rec[ENTRY_REC.size:ENTRY_REC.size + stack_len]
    return EntryCapture(ev.seq, ev.thread, ev.site, regs, bytes(stack), parent)


def pack_entry(cookie: int, tid: int, ts: int, ip: int, sp: int, self_ptr: int, ret: int,
               state: int | None = None, stack: bytes = b"", regs: dict[str, int] | None = None,
               parent: tuple[int, int, int] | None = None) -> bytes:
    """Build an entry record as the BPF program writes it (for tests and benchmarks);
    `parent`: (its self, its entry sp, its function's index)."""
    r = regs or {}
    flags = F_SELF | (F_STATE if state is not None else 0) | (F_PARENT if parent is not None else 0)
    p_self, p_sp, p_fn = parent or (0, 0, 0)
    return ENTRY_REC.pack(KIND_ENTRY, flags, cookie, tid, len(stack), ts, ip, sp, self_ptr, ret, 0,
                          state or 0, r.get("rbp", 0), r.get("rbx", 0), r.get("r12", 0),
                          r.get("r13", 0), r.get("r14", 0), r.get("r15", 0), p_self, p_sp, p_fn, 0) + stack


def pack_exit(cookie: int, tid: int, ts: int, ip: int, sp: int, self_ptr: int | None = None,
              state: int | None = None, rax: int = 0, kind: int = KIND_EXIT) -> bytes:
    flags = (F_SELF if self_ptr is not None else 0) | (F_STATE if state is not None else 0)
    return EXIT_REC.pack(kind, flags, cookie, tid, 0, ts, ip, sp, self_ptr or 0, 0, rax, state or 0)
