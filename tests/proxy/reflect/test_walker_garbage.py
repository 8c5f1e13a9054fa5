"""The reflection walker over adversarial memory (hypothesis): every word of
the region is drawn from what hurts a walker most - a pointer back into the
region (cycles, self-references), a huge length or count, a pointer just
past a mapped page, an unmapped address, zero, a state value one past the
layout's last, a vtable pointer at random bytes, or random bytes. Every
layout of the debug and release tokio_app, and of combinators (join_all,
select, FuturesUnordered, Readiness), is walked from several starts.

The walk never raises, stays within its node and read budgets, ends in
bounded time, and marks what it could not read as `<unreadable ...>`.
Cases per suite run: 20 memory images x every layout x 2 starts, for the
debug and release tokio_app and the debug combinators (about 3,000 walks).
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.reflect.memory import BLOCK, BlockReader
from proxy.reflect.walker import Reflector

from .test_walker import BASE, Mem, _inv

WORDS = 512  # 4 KiB of adversarial words at BASE
READ_BUDGET = 1 << 18


def _word(kind: int, value: int, n_states: int) -> int:
    if kind == 0:
        return BASE + (value % WORDS) * 8  # into the region: cycles
    if kind == 1:
        return (1 << 63) + value % (1 << 20)  # a huge length / count
    if kind == 2:
        return BASE + WORDS * 8 + value % 64  # just past the mapped pages
    if kind == 3:
        return value  # anywhere (mostly unmapped)
    if kind == 4:
        return 0
    if kind == 5:
        return n_states + value % 3  # a state value the layout does not have
    return value


_words = st.lists(st.tuples(st.integers(0, 6), st.integers(0, (1 << 64) - 1)), min_size=WORDS, max_size=WORDS)


@pytest.fixture(scope="module", params=["debug", "release"])
def tokio_app(request):  # type: ignore[no-untyped-def]
    return _inv(request.param)


@pytest.fixture(scope="module")
def combinators():  # type: ignore[no-untyped-def]
    return _inv("debug", "combinators")


def _walk_all(inv, words) -> None:  # type: ignore[no-untyped-def]
    mem = Mem()
    mem.write(BASE, b"".join(_word(k, v, 8).to_bytes(8, "little") for k, v in words))
    names = list(inv.layouts)
    names += [n for n in inv.types if n.startswith(("futures_util::future::join_all::JoinAll<",
                                                      "futures_util::stream::futures_unordered::FuturesUnordered<",
                                                      "tokio::runtime::io::scheduled_io::Readiness",
                                                      "futures_util::future::select::Select<"))]
    for name in names:
        for start in (0, 40):
            before = mem.reads
            r = Reflector(inv, 0, BlockReader(mem.read, budget=READ_BUDGET))
            t0 = time.perf_counter()
            tree = r.walk(BASE + start, name)
            assert time.perf_counter() - t0 < 5.0, name
            nodes = list(tree.iter())
            assert len(nodes) <= r.max_nodes + 1
            assert mem.reads - before <= READ_BUDGET // BLOCK + r.max_nodes * 4
            for n in nodes:
                if n.kind == "unreadable":
                    assert n.label.startswith("<"), n.label


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.data_too_large])
@given(words=_words)
def test_adversarial_memory_under_tokio_app_layouts(tokio_app, words) -> None:  # type: ignore[no-untyped-def]
    _walk_all(tokio_app, words)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.data_too_large])
@given(words=_words)
def test_adversarial_memory_under_combinators(combinators, words) -> None:  # type: ignore[no-untyped-def]
    _walk_all(combinators, words)
