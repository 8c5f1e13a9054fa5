"""Stack discovery pieces (sans-IO): DWARF location expressions, `g` parsing, and the
real location lists of a release corpus binary (the end-to-end runs, with gdbserver and
real stacks, are in integration/test_reflection.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from integration.corpus import build

from proxy.analysis.elf import open_elf
from proxy.analysis.inventory import build_inventory
from proxy.reflect.memory import BlockReader
from proxy.reflect.stacks import G_ORDER, StackFinder, _variables, evaluate, frame_first, frame_name, parse_g

ROOT = Path(__file__).resolve().parents[3]


def _mem(words: dict[int, int]) -> BlockReader:
    def read(addr: int, size: int) -> bytes | None:
        out = bytearray()
        for a in range(addr, addr + size):
            base = a - a % 8
            out.append(words.get(base, 0).to_bytes(8, "little")[a - base])
        return bytes(out)
    return BlockReader(read)


REGS = {"rsp": 0x7000, "rbp": 0x7100, "rbx": 0x5555_0000, "rdi": 0x1234}


@pytest.mark.parametrize("expr,want", [
    (bytes([0x91, 0x10]), ("addr", 0x7010)),  # DW_OP_fbreg 16 (frame base = rsp)
    (bytes([0x77, 0x20]), ("addr", 0x7020)),  # DW_OP_breg7 rsp+32
    (bytes([0x77, 0x20, 0x9F]), ("value", 0x7020)),  # ... DW_OP_stack_value
    (bytes([0x53]), ("value", 0x5555_0000)),  # DW_OP_reg3 rbx
    (bytes([0x55, 0x93, 0x08]), ("value", 0x1234)),  # DW_OP_reg5 rdi, DW_OP_piece 8
    (bytes([0x76, 0x00, 0x06, 0x23, 0x08]), ("addr", 0x4008)),  # breg6 rbp+0; deref; plus_uconst 8
    (bytes([0x9C, 0x11, 0x70, 0x22]), ("addr", 0x7200 - 16)),  # call_frame_cfa; consts -16; plus
    (bytes([0xF3, 0x01, 0x55, 0x9F]), None),  # DW_OP_GNU_entry_value(rdi): not located
    (bytes([0x5A]), None),  # DW_OP_reg10: a caller-saved register unknown in this frame
    (bytes([0x77]), None),  # truncated
])
def test_location_expressions(expr: bytes, want: tuple[str, int] | None) -> None:
    mem = _mem({0x7100: 0x4000})
    assert evaluate(expr, REGS, REGS["rsp"], 0x7200, mem, 0) == want


def test_parse_g_reads_gdbs_order_and_unavailable_registers() -> None:
    values = list(range(1, len(G_ORDER) + 1))
    reply = b"".join(v.to_bytes(8, "little").hex().encode() for v in values) + b"xx" * 8
    regs = parse_g(reply)
    assert regs is not None and regs["rax"] == 1 and regs["rsp"] == 8 and regs["rip"] == 17
    assert parse_g(b"E01") is None and parse_g(b"00" * 8) is None


def _binary(config: str) -> Path:
    got = build.build(configs=[config], programs=["tokio_app"]).get((config, "tokio_app"))
    if not isinstance(got, Path):
        pytest.skip(f"tokio_app ({config}) not built: {got}")
    return got


@pytest.mark.parametrize("config", ["debug", "release", "old-release"])
def test_resume_functions_self_is_located(config: str) -> None:
    """At some pc of each out-of-line resume function, its self parameter has a location
    whose evaluation gives the coroutine address we put in the registers/stack."""
    path = _binary(config)
    inv, elf = build_inventory(path), open_elf(path)
    finder = StackFinder(elf, inv, 0)
    located = 0
    for fn in inv.resume_fns:
        if not fn.layout_name:
            continue
        for pc in range(fn.low_pc, fn.high_pc, max(1, (fn.high_pc - fn.low_pc) // 16)):
            chain = finder.map._die_chain(pc)  # type: ignore[union-attr]
            if not chain:
                continue
            unit, sub = chain[0]
            hit = False
            for var in _variables(finder.dwarf, unit, sub, pc):  # type: ignore[arg-type]
                kind = finder._future_type(var)
                expr = finder._location(unit, var, pc) if kind is not None else None
                if kind is None or expr is None:
                    continue
                # every register and stack word holds the coroutine's address
                regs = {r: 0x10_0000 for r in ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8",
                                               "r9", "r10", "r11", "r12", "r13", "r14", "r15")}
                mem = BlockReader(lambda a, n: (0x10_0000).to_bytes(8, "little") * (n // 8) + b"\0" * (n % 8))
                got = evaluate(expr, regs, 0x10_0000, 0x10_0000, mem, 0)
                if got is not None:
                    assert kind[1] == fn.layout_name or kind[1] in inv.layouts, (fn.name, kind)
                    hit = True
            located += hit
    assert located >= 2, f"{config}: no resume function's self is located"


def test_scan_takes_the_frames_own_future_before_a_stale_image_in_a_caller() -> None:
    """Fact (stuck mt, release, under load): a caller's frame held a stale image of
    block_on's future in an older suspended state next to the live one in block_on's
    own frame; the unique hit in the frame itself is the live one."""
    sp, cfa, top = 0x1000, 0x1800, 0x4000
    live, stale = 0x1100, 0x1a80

    def scan(lo: int, hi: int) -> list[int]:
        return [a for a in (live, stale) if lo <= a < hi]
    assert frame_first(scan, sp, cfa, top) == [live]
    # nothing in the frame itself (a by-value argument in the caller's memory): callers'
    assert frame_first(lambda lo, hi: [a for a in (stale,) if lo <= a < hi], sp, cfa, top) == [stale]
    # two in the frame itself: both reported (ambiguous, the caller takes none)
    assert frame_first(lambda lo, hi: [a for a in (live, live + 8, stale) if lo <= a < hi], sp, cfa, top) \
        == [live, live + 8, stale]
    # an unknown CFA: the whole range
    assert frame_first(scan, sp, 0, top) == [live, stale]


class _Mem:
    def __init__(self, base: int, data: bytes) -> None:
        self.base, self.data = base, data

    def read(self, addr: int, n: int) -> bytes | None:
        if addr != self.base:
            return None
        return self.data[:n].ljust(n, b"\0")


def test_of_several_images_the_one_a_stack_word_points_at_is_the_future() -> None:
    """tokio's graceful-shutdown, release: block_on's frame and its callers held 5 suspended,
    plausible images of `#[tokio::main]`'s block; only the live one is pointed at (the
    executor's Pin<&mut F>). None or several pointed at: all stay (no guess)."""
    from proxy.reflect.memory import BLOCK
    from proxy.reflect.stacks import pinned

    base = 0x7FFFFFFF0000
    hits = [base + 0x100, base + 0x200, base + 0x300]
    words = bytearray(BLOCK)
    words[0x40:0x48] = (base + 0x200).to_bytes(8, "little")  # the Pin<&mut F>
    r = type("R", (), {"mem": _Mem(base, bytes(words))})()
    assert pinned(r, hits, base, base + BLOCK) == [base + 0x200]  # type: ignore[arg-type]
    words[0x48:0x50] = (base + 0x300).to_bytes(8, "little")
    r = type("R", (), {"mem": _Mem(base, bytes(words))})()
    assert pinned(r, hits, base, base + BLOCK) == hits  # type: ignore[arg-type]
    r = type("R", (), {"mem": _Mem(base, bytes(BLOCK))})()
    assert pinned(r, hits, base, base + BLOCK) == hits  # type: ignore[arg-type]


def test_an_image_inside_another_images_awaitee_is_no_image() -> None:
    """tokio's echo-tcp, release: block_on's frame held `#[tokio::main]`'s block at its accept
    `.await` (state 4) and, 0x40 above, a plausible state 3 whose state byte lies inside the
    first one's awaitee; nothing on the stack pointed at either (main missing from every
    view). Bytes that belong to one live image's awaitee are not another image; two images
    apart, or one's state byte outside the other's live bytes: all stay (no guess)."""
    from proxy.analysis.model import Layout, Member, State
    from proxy.reflect.stacks import unoverlapped

    bind = Member("__awaitee", 32, 48, "bind")
    accept = Member("__awaitee", 32, 184, "accept")
    lay = Layout("main", 248, 24, 1, (State(3, "Suspend0", None, bind, ()), State(4, "Suspend1", None, accept, ())))
    base = 0x7FFF_0000
    words = {base + 24: 4, base + 0x40 + 24: 3}  # the state bytes (the only byte of each word)
    r = type("R", (), {"mem": _mem(words)})()
    assert unoverlapped(r, lay, [base, base + 0x40]) == [base]  # type: ignore[arg-type]
    apart = {base + 24: 4, base + 0x200 + 24: 3}
    r = type("R", (), {"mem": _mem(apart)})()
    assert unoverlapped(r, lay, [base, base + 0x200]) == [base, base + 0x200]  # type: ignore[arg-type]
    r = type("R", (), {"mem": _mem({base + 24: 3, base + 0x40 + 24: 4})})()  # the lower one at bind:
    assert unoverlapped(r, lay, [base, base + 0x40]) == [base, base + 0x40]  # type: ignore[arg-type]


def test_an_executors_future_held_inside_a_found_future_is_no_root_to_scan() -> None:
    """hyper's single_threaded, debug: each server thread runs `LocalSet::block_on(&rt,
    server())`, which is `rt.block_on(self.run_until(server()))`: the server's future moves
    into run_until's, found on the stack by its location in the runtime's block_on. The scan
    for LocalSet::block_on's own `F` took a stale, clean-walking image of the server's fn in
    that frame (at its first `.await`, `bind` not yet polled): a second, false task beside
    the live one. The coroutine types inside the futures found on a thread are held, not
    roots. The compiler's own types and offsets."""
    from proxy.reflect.stacks import Found, held_layouts
    from proxy.reflect.walker import Reflector
    from tests.proxy.reflect.test_walker import BASE, Mem, _inv

    inv = _inv("realworld-debug", "hyper_single_threaded")
    server = "hyper_single_threaded::http1_server::{async_fn_env#0}"
    run_until = f"tokio::task::local::{{impl#4}}::run_until::{{async_fn_env#0}}<{server}>"
    lay = inv.layouts[run_until]
    st = lay.state(3)  # Suspend0: at `run_until.await`, its awaitee RunUntil { future, .. }
    assert st is not None and st.awaitee is not None
    holder = inv.types[st.awaitee.type_name]
    fut = next(f for f in holder.fields if f.type_name == server)
    inner = inv.layouts[server]
    mem = Mem()
    mem.write(BASE, bytes(lay.size))
    mem.write(BASE + lay.state_offset, (3).to_bytes(lay.state_size, "little"))
    at = BASE + st.awaitee.offset + fut.offset
    mem.write(at + inner.state_offset, (4).to_bytes(inner.state_size, "little"))  # at its accept
    r = Reflector(inv, 0, mem.read)
    assert server in held_layouts(r, [Found(BASE, run_until, 1, "CoreGuard::block_on", "location")])
    assert run_until not in held_layouts(r, [Found(BASE, run_until, 1, "CoreGuard::block_on", "location")])
    assert held_layouts(r, []) == set()


def test_the_frames_one_image_is_counted_after_the_overlap_rule() -> None:
    """tokio's echo-tcp, release, under load: block_on's frame held main's block at its accept
    (state 4) and, 0x40 above, a `bind` (state 3) pattern inside its awaitee; a caller's frame
    another image. Counted before the overlap rule, the frame held two, the callers' were
    searched too and two stayed: none taken. The frame's images after the rule: one."""
    from proxy.analysis.model import Layout, Member, State
    from proxy.reflect.stacks import owned_images

    bind = Member("__awaitee", 32, 48, "bind")
    accept = Member("__awaitee", 32, 184, "accept")
    lay = Layout("main", 248, 24, 1, (State(3, "Suspend0", None, bind, ()), State(4, "Suspend1", None, accept, ())))
    sp, cfa, top = 0x7FFF_0000, 0x7FFF_02D0, 0x7FFF_0A00
    live, pattern, caller = sp + 0x10, sp + 0x50, cfa + 0x100
    r = type("R", (), {"mem": _mem({live + 24: 4, pattern + 24: 3, caller + 24: 3})})()

    def scan(lo: int, hi: int) -> list[int]:
        return [a for a in (live, pattern, caller) if lo <= a and a + lay.size <= hi]
    assert owned_images(r, lay, scan, sp, cfa, top) == [live]  # type: ignore[arg-type]
    # two images of the frame's own apart (neither inside the other): both, as before
    r = type("R", (), {"mem": _mem({live + 24: 4, sp + 0x120 + 24: 3})})()
    assert owned_images(r, lay, lambda lo, hi: [a for a in (live, sp + 0x120) if lo <= a < hi], sp, cfa, top) \
        == [live, sp + 0x120]  # type: ignore[arg-type]


def test_an_image_whose_awaitee_is_unpolled_or_finished_is_stale() -> None:
    """h2's examples/server.rs, release, attached under load: block_on's frame held
    `#[tokio::main]`'s block at its accept (accept suspended, state 3) and a stale image at
    `bind` (bind Returned); the callers' frame a third at accept whose accept read Unresumed
    (garbage: a walk stops at a coroutine not yet polled, so it walked clean). Three, none
    taken: main missing. A coroutine suspends at an `.await` only after its awaitee returned
    Pending, suspended: of several images those whose awaitee coroutine is suspended stay;
    an awaitee that is no coroutine says nothing; none suspended: all stay."""
    from proxy.analysis.model import Layout, Member, State
    from proxy.reflect.stacks import awaiting, owned_images

    bind_lay = Layout("bind", 56, 48, 1, (State(3, "Suspend0", None, None, ()),))
    accept_lay = Layout("accept", 184, 176, 1, (State(3, "Suspend0", None, None, ()),))
    bind = Member("__awaitee", 8, 56, "bind")
    accept = Member("__awaitee", 8, 184, "accept")
    lay = Layout("main", 224, 0, 1, (State(3, "Suspend0", None, bind, ()), State(4, "Suspend1", None, accept, ())))
    sp, cfa, top = 0x7FFF_0000, 0x7FFF_0770, 0x7FFF_1000
    live, stale, garbage = sp + 0x10, sp + 0x238, cfa + 0x128
    layouts = {"bind": bind_lay, "accept": accept_lay}
    words = {live: 4, live + 8 + 176: 3, stale: 3, stale + 8 + 48: 1, garbage: 4, garbage + 8 + 176: 0}
    r = type("R", (), {"mem": _mem(words)})()
    assert awaiting(r, lay, [live, stale, garbage], layouts.get) == [live]  # type: ignore[arg-type]

    def scan(lo: int, hi: int) -> list[int]:
        inside = [a for a in (live, stale, garbage) if lo <= a and a + lay.size <= hi]
        return awaiting(r, lay, inside, layouts.get)  # type: ignore[arg-type]
    assert owned_images(r, lay, scan, sp, cfa, top) == [live]  # type: ignore[arg-type]
    # before: the frame held two, the callers' a third, and none was taken
    assert owned_images(r, lay, lambda lo, hi: [a for a in (live, stale, garbage) if lo <= a and a + lay.size <= hi],
                        sp, cfa, top) == [live, stale, garbage]  # type: ignore[arg-type]
    # an awaitee that is no coroutine (no layout): no evidence, kept; none suspended: all kept
    assert awaiting(r, lay, [live, stale], {}.get) == [live, stale]  # type: ignore[arg-type]
    r = type("R", (), {"mem": _mem({live: 4, stale: 3, stale + 8 + 48: 1})})()
    assert awaiting(r, lay, [live, stale], layouts.get) == [live, stale]  # type: ignore[arg-type]


@pytest.mark.parametrize("function, shown", [
    ("tokio::runtime::park::CachedParkThread::block_on<tokio_app::run::{async_fn_env#0}>",
     "tokio::runtime::park::CachedParkThread::block_on"),
    # rustc 1.63 names an async fn's frame by GenFuture's Future impl: a cut at the first `<`
    # showed nothing ("in ;")
    ("<core::future::from_generator::GenFuture<T> as core::future::future::Future>::poll",
     "<core::future::from_generator::GenFuture as core::future::future::Future>::poll"),
    ("<alloc::boxed::Box<F, A> as core::ops::FnOnce<Args>>::call_once<(), dyn core::ops::FnOnce<(), Output=()>>",
     "<alloc::boxed::Box as core::ops::FnOnce>::call_once"),
    ("tokio_app::c::{{closure}}", "tokio_app::c::{{closure}}"),
])
def test_a_frames_name_in_a_header_keeps_its_qualified_path(function: str, shown: str) -> None:
    assert frame_name(function) == shown
