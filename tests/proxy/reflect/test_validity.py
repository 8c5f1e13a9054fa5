"""Scan hits narrowed by the validity of their saved locals, on the real inventory of the
tk_dump release build (tokio 1.43). Fact: ``run`` parked in ``pending().await`` under
``block_on`` left 2 to 12 places in block_on's frame whose state byte said Suspend4 and
whose walk (a zero-sized awaitee) was clean; the live one was left out as ambiguous
about one attach in eight. The end-to-end run is
integration/test_task_threads.py::test_lldb_tokio_143_task_dump_program."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from integration.corpus import build

from proxy.analysis.elf import open_elf
from proxy.analysis.inventory import build_inventory
from proxy.reflect.memory import BlockReader
from proxy.reflect.stacks import StackFinder

ROOT = Path(__file__).resolve().parents[3]


RUN = "tk_dump::run::{async_fn_env#0}"
HEAP = 0x5600_0000_0000


@pytest.fixture(scope="module")
def finder() -> StackFinder:
    config = "trixie-release"
    skip = build.skip_reason(config)
    if skip is not None:
        pytest.skip(str(skip))
    path = build.binary(config, "tk_dump")
    return StackFinder(open_elf(path), build_inventory(path), 0)


class Memory:
    """Words at addresses; everything in [HEAP, HEAP + 1 MiB) and the fake stack is
    readable (zero unless written), the rest is not."""

    def __init__(self) -> None:
        self.words: dict[int, int] = {}

    def read(self, addr: int, size: int) -> bytes | None:
        if not (HEAP <= addr < HEAP + (1 << 20) or 0x7000 <= addr < 0x9000):
            return None
        return bytes(self.words.get(a - a % 8, 0).to_bytes(8, "little")[a % 8] for a in range(addr, addr + size))

    def put(self, addr: int, value: int, size: int = 8) -> None:
        base = addr - addr % 8
        data = bytearray(self.words.get(base, 0).to_bytes(8, "little"))
        data[addr % 8:addr % 8 + size] = value.to_bytes(size, "little")
        self.words[base] = int.from_bytes(data, "little")


def _run_future(mem: Memory, finder: StackFinder, at: int, live: bool) -> None:
    """run's env at `at` in Suspend4 (`pending().await`): the live one's locals are a
    Mutex Arc, an mpsc Sender, a oneshot Sender and five JoinHandles; a look-alike has the
    state byte only, with whatever the stack held around it."""
    lay = finder.inv.layouts[RUN]
    state = lay.state(7)
    assert state is not None and state.name == "Suspend4", lay.states
    mem.put(at + lay.state_offset, state.value, lay.state_size)
    if not live:
        mem.put(at, 0x7ff0_1234)  # a saved return address or a small count, say
        return
    inner = HEAP + 0x100
    mem.put(inner, 3)  # ArcInner: strong 3, weak 1
    mem.put(inner + 8, 1)
    for m in state.locals:
        if m.type_name == "bool":
            mem.put(at + m.offset, 1, 1)
        else:
            for word in range(0, m.size, 8):
                mem.put(at + m.offset + word, inner)


def test_a_look_alike_state_byte_is_not_taken_over_the_live_future(finder: StackFinder) -> None:
    mem = Memory()
    live, fake = 0x7100, 0x7400
    _run_future(mem, finder, live, live=True)
    _run_future(mem, finder, fake, live=False)
    r = SimpleNamespace(mem=BlockReader(mem.read))
    assert finder._narrow(r, RUN, [live, fake]) == [live]  # type: ignore[arg-type]
    assert finder._narrow(r, RUN, [fake, live]) == [live]  # type: ignore[arg-type]


def test_one_hit_stays_and_no_valid_one_keeps_them_all(finder: StackFinder) -> None:
    """A lone hit is taken as before (a live coroutine may keep an uninitialised local);
    several with none valid stay ambiguous (the caller takes none)."""
    mem = Memory()
    fakes = [0x7100, 0x7400]
    for at in fakes:
        _run_future(mem, finder, at, live=False)
    r = SimpleNamespace(mem=BlockReader(mem.read))
    assert finder._narrow(r, RUN, fakes[:1]) == fakes[:1]  # type: ignore[arg-type]
    assert finder._narrow(r, RUN, fakes) == fakes  # type: ignore[arg-type]


@pytest.mark.parametrize("word,as_nonnull,as_arc", [
    (0, False, False),  # null
    (8, True, False),  # NonNull::dangling() of an 8-aligned type (an empty Vec's); an Arc always allocates
    (24, False, False),  # below a page and not a power of two
    (HEAP + 0x100, True, True),  # readable; an ArcInner with strong 3, weak 1
    (HEAP + 0x104, True, False),  # readable; an ArcInner is 8-aligned
    (HEAP + 0x200, True, False),  # readable; strong count 0
    (0x1_0000_0000, False, False),  # unreadable
])
def test_a_pointer_word(finder: StackFinder, word: int, as_nonnull: bool, as_arc: bool) -> None:
    """The live future with one local's word replaced: `lock` (an Arc) and a JoinHandle
    (a plain NonNull<Header>)."""
    lay = finder.inv.layouts[RUN]
    state = lay.state(7)
    assert state is not None
    for name, want in (("lock", as_arc), ("_waiting", as_nonnull)):
        mem = Memory()
        _run_future(mem, finder, 0x7100, live=True)
        local = next(m for m in state.locals if m.name == name)
        mem.put(0x7100 + local.offset, word)
        assert finder.validity.plausible(BlockReader(mem.read).u, 0x7100, RUN, state) is want, (name, hex(word))


def test_a_bool_is_0_or_1(finder: StackFinder) -> None:
    state = finder.inv.layouts[RUN].state(7)
    assert state is not None
    flag = next(m for m in state.locals if m.type_name == "bool")
    for value, want in ((0, True), (1, True), (2, False), (0xFF, False)):
        mem = Memory()
        _run_future(mem, finder, 0x7100, live=True)
        mem.put(0x7100 + flag.offset, value, 1)
        assert finder.validity.plausible(BlockReader(mem.read).u, 0x7100, RUN, state) is want, value


def test_a_pointer_field_is_an_address_wide(finder: StackFinder) -> None:
    """Fact: rustc's pointer DIEs carry no DW_AT_byte_size; the analysis once took the
    pointee's size for them (an Arc's NonNull field said 64, its ArcInner's)."""
    types = finder.inv.types
    arc = types["alloc::sync::Arc<tokio::sync::mutex::Mutex<u64>, alloc::alloc::Global>"]
    nonnull = types[arc.fields[0].type_name]
    assert [(f.name, f.size) for f in nonnull.fields] == [("pointer", 8)]
    lay = finder.inv.layouts[RUN]
    state = lay.state(7)
    assert state is not None
    assert {m.name: m.size for m in state.locals}["lock"] == 8
