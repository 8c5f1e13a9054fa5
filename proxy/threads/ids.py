"""Stable task thread ids: one per task key for the whole session.

A task keeps its id from stop to stop while its key (address and type of its
outermost coroutine) stays; a new task, or a reused address holding another
type, gets a new id. Ids are never reused, so a client's stale id names no
other task.
"""

from __future__ import annotations

from .model import TID_BASE


class TaskIds:
    def __init__(self) -> None:
        self._ids: dict[tuple[int, str], int] = {}

    def id_for(self, key: tuple[int, str]) -> int:
        tid = self._ids.get(key)
        if tid is None:
            tid = self._ids[key] = TID_BASE + len(self._ids) + 1
        return tid
