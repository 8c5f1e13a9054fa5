"""The Program's own rules: one snapshot per stop, what is kept across stops and when
it starts again, one rendering of a document per snapshot. The snapshot's builder is
counted here, not run (it is tested with real programs in tests/proxy/snapshot and by
integration/test_snapshot.py); the stops are small stand-ins of the `Stop` facts."""

from __future__ import annotations

from typing import Any

from proxy.program import Program


class _Source:
    """A reflection source as the Program sees it: an object with an inventory."""

    def __init__(self, name: str) -> None:
        self.inventory = name


class _Stop:
    def __init__(self, serial: int, source: Any, mode: str = "full") -> None:
        self.serial, self.source, self.mode = serial, source, mode
        self.engine = None

    def pcs(self) -> dict[int, int]:
        return {}

    def registers(self) -> dict[int, dict[str, int]]:
        return {}

    def peek(self) -> None:
        return None

    def find_source(self, current: Any, adapters: str) -> Any:
        return self.source


class _Snap:
    def __init__(self, n: int) -> None:
        self.n = n

    def bind(self, read: Any) -> None:
        pass


def _counted(p: Program) -> list[tuple[int, Any]]:
    built: list[tuple[int, Any]] = []

    def build(stop: Any, read: Any, src: Any, key: Any, adapters: Any = None, memory: bool = True) -> _Snap:
        built.append((stop.serial, src))
        return _Snap(len(built))

    p.build = build  # type: ignore[method-assign]
    return built


def _read(addr: int, size: int) -> bytes:
    return bytes(size)


def test_a_stop_is_built_once_and_the_next_stop_again() -> None:
    p = Program()
    built = _counted(p)
    src = _Source("a")
    first = p.snapshot(_Stop(1, src), _read)
    assert p.snapshot(_Stop(1, src), _read) is first  # every question at the stop: the same snapshot
    assert p.held(_Stop(1, src), src) is first
    second = p.snapshot(_Stop(2, src), _read)
    assert second is not first and [s for s, _ in built] == [1, 2]
    assert p.held(_Stop(1, src), src) is None  # the old stop's snapshot is not kept


def test_nothing_to_read_with_builds_nothing() -> None:
    p = Program()
    built = _counted(p)
    assert p.snapshot(_Stop(1, "no program file: a remote stub without vFile"), _read) is None
    assert built == [] and p.inventory is None


def test_what_is_kept_across_stops_starts_again_with_a_new_binary() -> None:
    p = Program()
    _counted(p)
    a = _Source("a")
    p.snapshot(_Stop(1, a), _read)
    ids, earlier = p.ids, p.earlier
    p.snapshot(_Stop(2, a), _read)
    assert p.ids is ids and p.earlier is earlier  # the same binary: ids kept
    p.snapshot(_Stop(3, _Source("b")), _read)  # an exec: another inventory
    assert p.ids is not ids and p.earlier is not earlier and p.inventory == "b"


def test_a_document_is_rendered_once_per_snapshot() -> None:
    p = Program()
    renders: list[int] = []
    s1, s2 = _Snap(1), _Snap(2)
    for snap in (s1, s1, s2, s2):
        p.document(snap, ("threads", ""), lambda: (renders.append(1), b"doc")[1])  # type: ignore[arg-type]
    assert len(renders) == 2  # every chunk of one document at one stop: the same bytes
