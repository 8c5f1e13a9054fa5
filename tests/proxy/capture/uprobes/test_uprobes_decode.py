"""The uprobe capture's pure parts: records -> events, masking, Z0 -> Z1."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from proxy.analysis.model import CoroutineKind, Era, Inventory, Layout, ResumeFn, State
from proxy.capture.uprobes.capture import UprobeCapture
from proxy.capture.uprobes.client_view import mask_bytes
from proxy.capture.uprobes.decode import (
    KIND_ENTRY,
    KIND_EXIT,
    KIND_UNWIND,
    Decoder,
    SiteInfo,
    entry_capture,
    pack_entry,
    pack_exit,
)
from proxy.graph.catalog import Catalog
from proxy.graph.engine import Engine
from proxy.graph.events import PollEnter, PollExit

SITES = [SiteInfo(KIND_ENTRY, 0x1000, 0x1000), SiteInfo(KIND_EXIT, 0x1000, 0x1040),
         SiteInfo(KIND_UNWIND, 0x1000, 0x1050), SiteInfo(KIND_ENTRY, 0x2000, 0x2000),
         SiteInfo(KIND_EXIT, 0x2000, 0x2030)]


def _inventory() -> Inventory:
    states = (State(0, "Unresumed", None), State(1, "Returned", None), State(2, "Panicked", None),
              State(3, "Suspend0", None))
    lay = Layout("a::{async_fn_env#0}", 32, 8, 1, states)
    lay2 = Layout("b::{async_fn_env#0}", 32, 8, 1, states)
    return Inventory(None, "x", False, 0x1000, [
        ResumeFn(0x1000, 0x1060, "", "a::{async_fn#0}", "a", CoroutineKind.ASYNC_FN, Era.MODERN, None,
                 (0x1040,), (0x1050,), "a::{async_fn_env#0}"),
        ResumeFn(0x2000, 0x2040, "", "b::{async_fn#0}", "b", CoroutineKind.ASYNC_FN, Era.MODERN, None,
                 (0x2030,), (), "b::{async_fn_env#0}"),
    ], {lay.type_name: lay, lay2.type_name: lay2})


def test_records_decode_to_events_in_order() -> None:
    d = Decoder(SITES, first_seq=10)
    e = d.decode(pack_entry(0, 7, 100, 0x1000, 0x7f00, 0xaa00, 0x1234, state=3, stack=b"\x34\x12" + b"\0" * 6))
    x = d.decode(pack_exit(1, 7, 200, 0x1040, 0x7f00, 0xaa00, 1, rax=0))
    u = d.decode(pack_exit(2, 7, 300, 0x1050, 0x7ec0, 0xaa00, 2, kind=KIND_UNWIND))
    assert e == PollEnter(10, 7, 0x1000, 0xaa00, 0x7f00, 0x1234, 3, 100)
    # rax is not a Poll discriminant in general: never given to the engine
    assert x == PollExit(11, 7, 0x1000, 0x7f00, 1, 0xaa00, None, False, 200)
    assert u == PollExit(12, 7, 0x1000, 0x7ec0, 2, 0xaa00, None, True, 300)


def test_exit_without_its_entry_has_no_self_nor_state() -> None:
    d = Decoder(SITES)
    x = d.decode(pack_exit(1, 7, 200, 0x1040, 0x7f00))
    assert isinstance(x, PollExit) and x.self_ptr is None and x.state is None
    assert d.stats.exit_self_known == 0


def test_an_exit_at_a_return_site_names_its_function() -> None:
    """A learned return site serves every function polled from there: its SiteInfo
    has no function (0) and the record carries the function's index + 1."""
    from proxy.capture.uprobes.decode import EXIT_REC

    d = Decoder(SITES + [SiteInfo(KIND_EXIT, 0, 0x3008, -8)], fn_sites={0: 0x1000, 1: 0x2000})
    rec = EXIT_REC.pack(KIND_EXIT, 3, 5, 7, 2, 300, 0x3008, 0x7f00, 0xaa0, 0, 0, 3)  # fn 1 + 1
    x = d.decode(rec)
    assert isinstance(x, PollExit) and (x.site, x.sp, x.self_ptr, x.state) == (0x2000, 0x7f00, 0xaa0, 3)
    assert d.decode(EXIT_REC.pack(KIND_EXIT, 0, 5, 7, 9, 300, 0x3008, 0x7f00, 0, 0, 0, 0)) is None  # no fn 8
    assert (d.stats.exits, d.stats.bad) == (1, 1)


@pytest.mark.parametrize("rec", [
    b"",  # empty
    b"\0" * 40,  # short
    pack_exit(99, 1, 1, 0, 0),  # unknown cookie
    pack_exit(0, 1, 1, 0, 0),  # cookie 0 is an entry site, the record says exit
    pack_entry(0, 1, 1, 0, 0, 1, 0)[:100],  # an entry cut short
])
def test_bad_records_are_counted_not_raised(rec: bytes) -> None:
    d = Decoder(SITES)
    assert d.decode(rec) is None
    assert d.stats.bad == 1


def test_entry_capture_reads_only_the_slice() -> None:
    stack = bytes(range(64))
    rec = pack_entry(0, 5, 1, 0x1000, 0x8000, 0xaa00, 0, stack=stack, regs={"rbp": 0x9000, "r15": 7})
    ev = Decoder(SITES).decode(rec)
    assert isinstance(ev, PollEnter)
    cap = entry_capture(rec, ev, (0x2000, 0x8100))
    assert cap.regs["rip"] == 0x1000 and cap.regs["rsp"] == 0x8000 and cap.regs["rbp"] == 0x9000
    assert cap.regs["r15"] == 7 and cap.parent == (0x2000, 0x8100)
    assert cap.read(0x8008, 8) == stack[8:16]
    assert cap.read(0x8000 + 60, 8) is None  # past the slice: unknown, not zeros
    assert cap.read(0x7ff8, 8) is None


def test_engine_folds_decoded_records_into_a_graph() -> None:
    inv = _inventory()
    eng = Engine(Catalog(inv, 0))
    d = Decoder(SITES)
    recs = [
        pack_entry(0, 1, 10, 0x1000, 0x7f00, 0xaa00, 0x5000, state=0),  # a (root)
        pack_entry(3, 1, 20, 0x2000, 0x7e00, 0xbb00, 0x1010, state=0),  # b awaited by a
        pack_exit(4, 1, 30, 0x2030, 0x7e00, 0xbb00, 3),  # b suspends
        pack_exit(1, 1, 40, 0x1040, 0x7f00, 0xaa00, 3),  # a suspends
        pack_entry(0, 1, 50, 0x1000, 0x7f00, 0xaa00, 0x5000, state=3),
        pack_entry(3, 1, 60, 0x2000, 0x7e00, 0xbb00, 0x1010, state=3),
        pack_exit(4, 1, 70, 0x2030, 0x7e00, 0xbb00, 1),  # b returns
        pack_exit(1, 1, 80, 0x1040, 0x7f00, 0xaa00, 1),  # a returns
    ]
    for r in recs:
        ev = d.decode(r)
        assert ev is not None
        eng.feed(ev)
    tasks = {t.path: t for t in eng.tasks()}
    assert tasks["b"].parent == tasks["a"].id
    assert tasks["a"].polls == 2 and tasks["b"].polls == 2
    [edge] = eng.edges()
    assert edge.completed and edge.parent == tasks["a"].id
    assert eng.stats().exits_missed == 0 and eng.stats().rejected == 0


def test_mask_puts_back_the_files_bytes() -> None:
    mask = [(0x1000, b"\x48\x83\xec\x08"), (0x1010, b"\xc3")]
    got = b"\xcc\x83\xec\x08" + b"\x90" * 12 + b"\xcc\x90"
    assert mask_bytes(0x1000, got, mask) == b"\x48\x83\xec\x08" + b"\x90" * 12 + b"\xc3\x90"
    # a read that starts inside a site's instruction
    assert mask_bytes(0x1002, b"\xec\x08", mask) == b"\xec\x08"
    assert mask_bytes(0x0ffe, b"\x90\x90\xcc", mask) == b"\x90\x90\x48"


def _capture_with_sites(sites: dict[int, bytes]) -> UprobeCapture:
    cap = UprobeCapture()
    cap._sites_by_addr = {a: SimpleNamespace(addr=a) for a in sites}
    cap._mask = sorted(sites.items())
    cap._prog = SimpleNamespace(links=[3], counters=lambda: {})  # type: ignore[assignment]
    return cap


def test_client_breakpoints_at_sites_become_hardware_and_stop_as_software() -> None:
    base = pytest.importorskip("proxy.capture.base")
    if not hasattr(base, "Forward"):
        pytest.skip("proxy.capture.base has no verdicts yet (capture hooks not landed)")
    cap = _capture_with_sites({0x1000: b"\x55", 0x1040: b"\xc3"})
    v = cap.client_request(b"Z0,1000,1")
    assert isinstance(v, base.Forward) and v.body == b"Z1,1000,1"
    assert cap.client_request(b"Z0,2000,1") is None  # not a site
    stop = b"T05thread:p10.10;10:0010000000000000;hwbreak:;"
    assert cap.client_reply(b"vCont;c", stop) == stop.replace(b"hwbreak:", b"swbreak:")
    other = b"T05thread:p10.10;10:0020000000000000;hwbreak:;"
    assert cap.client_reply(b"vCont;c", other) == other  # the client's own hbreak elsewhere
    v = cap.client_request(b"z0,1000,1")
    assert isinstance(v, base.Forward) and v.body == b"z1,1000,1"
    assert cap.client_reply(b"vCont;c", stop) == stop  # removed: no rewriting any more


def test_a_fifth_debug_register_or_a_code_write_hands_over() -> None:
    base = pytest.importorskip("proxy.capture.base")
    if not hasattr(base, "Handover"):
        pytest.skip("proxy.capture.base has no verdicts yet (capture hooks not landed)")
    cap = _capture_with_sites({0x1000: b"\x55", 0x1040: b"\xc3"})
    for i in range(4):
        assert cap.client_request(b"Z2,%x,8" % (0x9000 + 8 * i)) is None  # the client's watchpoints
    assert isinstance(cap.client_request(b"Z0,1000,1"), base.Handover)
    assert isinstance(cap.client_request(b"M1040,1:90"), base.Handover)
    assert cap.client_request(b"M3000,1:90") is None


def test_memory_replies_over_sites_are_masked() -> None:
    cap = _capture_with_sites({0x1000: b"\x48\x8b"})
    assert cap.client_reply(b"m1000,4", b"cc8b1571") == b"488b1571"
    assert cap.client_reply(b"mfff,2", b"90cc") == b"9048"
    assert cap.client_reply(b"m2000,2", b"cccc") == b"cccc"  # not a site: the program's own int3
    assert cap.client_reply(b"m1000,4", b"E14") == b"E14"


def test_binary_memory_replies_over_sites_are_masked() -> None:
    """gdb >= 16 reads memory with `x` from a stub that offers binary-upload+
    (gdbserver >= 16: reply `b` + escaped bytes); lldb's `x` reply has no `b`."""
    cap = _capture_with_sites({0x1000: b"\x48\x8b", 0x1010: b"}"})
    cap.target = SimpleNamespace(stub_features=frozenset({"binary-upload", "swbreak"}))
    assert cap.client_reply(b"x1000,4", b"b\xcc\x8b\x15\x71") == b"b\x48\x8b\x15\x71"
    assert cap.client_reply(b"x100f,2", b"b\x90\xcc") == b"b\x90}]"  # `}` escaped in the reply
    assert cap.client_reply(b"x2000,2", b"b\xcc\xcc") == b"b\xcc\xcc"  # not a site
    assert cap.client_reply(b"x1000,4", b"") == b""  # x not supported
    cap.target = SimpleNamespace(stub_features=frozenset({"QThreadSuffixSupported"}))
    assert cap.client_reply(b"x1000,2", b"\xcc\x8b") == b"\x48\x8b"  # lldb's form


def test_exit_of_a_followed_child_keeps_the_parents_links() -> None:
    cap = _capture_with_sites({0x1000: b"\x55"})
    cap._pid = 0x10
    closed: list[int] = []
    cap._close_links = lambda: closed.append(1)  # type: ignore[method-assign]
    cap.client_reply(b"vCont;c", b"W00;process:11")  # a child gdb followed too
    assert closed == []
    cap.client_reply(b"vCont;c", b"W00;process:10")
    cap.client_reply(b"vCont;c", b"W00")  # no multiprocess: the only process
    assert closed == [1, 1]


def test_exec_report_closes_the_links_and_stops_masking() -> None:
    cap = _capture_with_sites({0x1000: b"\x55"})
    cap._pid = 0x10
    closed: list[int] = []
    cap._close_links = lambda: closed.append(1)  # type: ignore[method-assign]
    cap.exec_happened("/bin/true")
    assert closed == [1] and "exec'd /bin/true" in (cap.note or "")
    # the new image's code is not the planned file's: no masking any more
    assert cap.client_reply(b"m1000,1", b"90") == b"90"
    assert any("exec'd /bin/true" in ln for ln in cap.stats_lines())


def test_past_four_debug_registers_count_sites_are_left_out_first() -> None:
    """The client's Z0s already at sites when the capture installs: 4 become Z1s; the
    rest stay unprobed, count-only sites (the session counts those with its own
    hidden breakpoint instead) before poll sites."""
    from proxy.capture.uprobes import bpf as B
    from proxy.session.breakpoints import BreakpointTable

    poll = [0x1000, 0x1100, 0x1200, 0x1300]
    count = [0x1050, 0x1150]
    cap = _capture_with_sites({a: b"\x55" for a in poll + count})
    for a in poll:
        cap._sites_by_addr[a] = SimpleNamespace(addr=a, spec=B.SiteSpec(B.KIND_ENTRY))
    for a in count:
        cap._sites_by_addr[a] = SimpleNamespace(addr=a, spec=B.SiteSpec(B.KIND_COUNT))
    table = BreakpointTable()
    for a in poll + count:
        table.client_insert((0, a, 1))
    cap._table = table
    convert, leave_out = cap._split_conflicts()
    assert convert == poll and leave_out == set(count)
    table.client_insert((2, 0x9000, 8))  # a watchpoint takes a debug register too
    cap.view.client_sw.clear()
    convert, leave_out = cap._split_conflicts()
    assert convert == poll[:3] and leave_out == {poll[3], *count}


def test_fast_constructors_build_the_same_frozen_events() -> None:
    """decode.py fills the slots directly (twice as fast as the frozen __init__):
    the objects must be indistinguishable from the dataclass's own."""
    from proxy.capture.uprobes.decode import _enter, _exit

    a, b = _enter(1, 2, 3, 4, 5, None, 7, 8, None), PollEnter(1, 2, 3, 4, 5, None, 7, 8)
    assert a == b and hash(a) == hash(b) and repr(a) == repr(b)
    c, d = _exit(9, 2, 3, 5, None, 4, None, True, 10), PollExit(9, 2, 3, 5, None, 4, None, True, 10)
    assert c == d and hash(c) == hash(d) and c.panicked is True
    with pytest.raises(AttributeError):
        a.seq = 3  # type: ignore[misc]  # still frozen


def test_an_entry_names_its_parent_and_a_completion_carries_its_totals() -> None:
    """Only graph changes recorded (uprobes.bpf.c CFG_CHANGES): an entry names the
    poll it runs inside (F_PARENT: that poll's self and function index, whose
    own entry may be no record), and a completion's exit carries its
    instance's totals (F_TOTALS: polls, raw ns, hits), left for the capture."""
    from proxy.capture.uprobes.decode import EXIT_REC, F_SELF, F_STATE, F_TOTALS, InstanceTotals

    d = Decoder(SITES, fn_sites={0: 0x1000, 1: 0x2000})
    e = d.decode(pack_entry(3, 7, 100, 0x2000, 0x7e00, 0xbb00, 0x1010, state=3, parent=(0xaa00, 0x7f00, 0)))
    assert isinstance(e, PollEnter) and e.parent == (0xaa00, 0x1000)
    assert d.decode(pack_entry(3, 7, 110, 0x2000, 0x7e00, 0xbb00, 0x1010, state=3)).parent is None  # type: ignore[union-attr]
    rec = EXIT_REC.pack(KIND_EXIT, F_SELF | F_STATE | F_TOTALS, 4, 7, 2, 200, 17, 0x7e00, 0xbb00, 5, 4000, 1)
    x = d.decode(rec)
    assert isinstance(x, PollExit) and (x.site, x.state, x.self_ptr) == (0x2000, 1, 0xbb00)
    assert d.totals == InstanceTotals(0xbb00, 1, 5, 4000, 17, 0)


def test_an_elided_coroutine_takes_its_id_and_counts_finished() -> None:
    """Full mode (uprobes.bpf.c CFG_ELIDE): a coroutine created and completed inside
    one poll of its parent writes no record; the next record of its thread carries
    the count (F_ELIDED, in rax). Fed through the capture's _feed, the graph has the
    same tasks, ids, parents and finished count as the stream with the child's
    entry and exit recorded, and no task for the child."""
    from proxy.capture.uprobes.decode import EXIT_REC, F_ELIDED, F_SELF, F_STATE

    def run(recs: list[bytes]) -> tuple[Engine, Decoder]:
        eng = Engine(Catalog(_inventory(), 0), keep_log=False)
        cap = UprobeCapture()
        d = Decoder(SITES)
        cap.target = SimpleNamespace(engine=eng)  # type: ignore[assignment]
        cap.decoder = d
        buf, spans, off = b"".join(recs), [], 0
        for r in recs:
            spans.append((off, len(r)))
            off += len(r)
        cap.fold.feed(buf, spans, d, eng)
        return eng, d

    a_in = pack_entry(0, 1, 10, 0x1000, 0x7f00, 0xaa00, 0x5000, state=0)  # a (root)
    b_in = pack_entry(3, 1, 20, 0x2000, 0x7e00, 0xbb00, 0x1010, state=0)  # b, new, inside a
    b_out = pack_exit(4, 1, 30, 0x2030, 0x7e00, 0xbb00, 1)  # b returns in its first poll
    a_out = pack_exit(1, 1, 40, 0x1040, 0x7f00, 0xaa00, 3)  # a suspends
    a2_in = pack_entry(0, 1, 50, 0x1000, 0x7f00, 0xaa00, 0x5000, state=3)
    c_in = pack_entry(3, 1, 60, 0x2000, 0x7e00, 0xcc00, 0x1010, state=0)  # c, new, inside a: suspends
    c_out = pack_exit(4, 1, 70, 0x2030, 0x7e00, 0xcc00, 3)
    every, _ = run([a_in, b_in, b_out, a_out, a2_in, c_in, c_out])
    # b elided: a's exit carries it (rax = 1)
    a_out_el = EXIT_REC.pack(KIND_EXIT, F_SELF | F_STATE | F_ELIDED, 1, 1, 0, 40, 0x1040, 0x7f00, 0xaa00, 0, 1, 3)
    elided, d = run([a_in, a_out_el, a2_in, c_in, c_out])
    assert d.elided == 0 and elided._g.c.elided == 1
    ids = lambda e: sorted((t.id, t.path, t.parent, t.self_ptr) for t in e.tasks() if not t.state.kind.value == "finished")  # noqa: E731
    assert ids(elided) == ids(every)
    assert {t.self_ptr for t in elided.tasks()} == {0xaa00, 0xcc00}
    assert elided.finished_count() == every.finished_count() == 1
    assert elided.stats().tasks_seen == every.stats().tasks_seen == 3


def test_the_clients_breakpoints_made_hardware_at_install_keep_their_conditions() -> None:
    """A client's Z0 at a site before the install goes back as a Z1 with the conditions and
    commands its Z0 carried (a dprintf in agent style: gdbserver runs them on the hardware
    breakpoint, the uprobe counts): a plain Z1 lost the commands' output."""
    from proxy.capture.uprobes import bpf as B
    from proxy.session.breakpoints import BreakpointTable

    cap = _capture_with_sites({0x1000: b"\x55", 0x1100: b"\x55"})
    for a in (0x1000, 0x1100):
        cap._sites_by_addr[a] = SimpleNamespace(addr=a, spec=B.SiteSpec(B.KIND_ENTRY))
    table = BreakpointTable()
    table.client_insert((0, 0x1000, 1), b";cmds:1,X3,220701")
    table.client_insert((0, 0x1100, 1))
    cap._table = table
    cap._attach = lambda leave_out: None  # type: ignore[method-assign]
    convert, leave_out = cap._split_conflicts()
    proc = cap._proc_install(convert, leave_out)
    assert next(proc).bodies == (b"z0,1000,1", b"z0,1100,1")
    assert proc.send([b"OK", b"OK"]).bodies == (b"Z1,1000,1;cmds:1,X3,220701", b"Z1,1100,1")
