"""Stable task ids across stops.

A task the poll observation knows keeps the engine's id (``#N``, also used by
``edges`` and ``top``). A task found only in memory (a thread's stack, a
runtime adapter, an earlier stop) gets the next free id here, keyed by its
address and type, and keeps it while it lives. The engine is told which ids
are taken (``Engine.reserve_ids``) so that it never hands one out again; with
no engine (mode off from the start, core files, ``asyncrsp ps``) ids count from 1.
"""

from __future__ import annotations

from typing import Protocol


class _Reserving(Protocol):
    def reserve_ids(self, ids: set[int]) -> None: ...


class TaskIds:
    def __init__(self) -> None:
        self._by_key: dict[tuple[int, str], int] = {}
        self._taken: set[int] = set()  # shared with the engine (Engine.reserve_ids)
        self._next = 1
        self._engine: object | None = None

    def attach(self, engine: _Reserving | None, highest: int) -> None:
        """Before a build: the engine in use and the highest id it has given."""
        if engine is not None and engine is not self._engine:
            engine.reserve_ids(self._taken)
            self._engine = engine
        self._next = max(self._next, highest + 1)

    def of(self, addr: int, type_name: str) -> int:
        key = (addr, type_name)
        got = self._by_key.get(key)
        if got is None:
            got = self._next
            self._next += 1
            self._by_key[key] = got
            self._taken.add(got)
        return got

    def forget(self, addr: int, type_name: str) -> None:
        self._by_key.pop((addr, type_name), None)
