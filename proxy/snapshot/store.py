"""At most one snapshot per stop.

The first question at a stop builds the snapshot with its ``read``; the
build is kept for the stop: every later command and every chunk of the JSON
document at the same stop gets the same object. The key is what changes the answer: the stop's
serial, the last poll event folded, the engine and the capture mode.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from .model import Snapshot


class SnapshotStore:
    def __init__(self) -> None:
        self._key: Hashable | None = None
        self._snap: Snapshot | None = None

    def get(self, key: Hashable, build: Callable[[], Snapshot]) -> Snapshot:
        if self._snap is not None and self._key == key:
            return self._snap
        self._key = self._snap = None  # the old stop's snapshot is not kept while the new one is built (peak memory)
        snap = build()
        self._key, self._snap = key, snap
        return snap

    def clear(self) -> None:
        self._key = self._snap = None

    def held(self, key: Hashable) -> Snapshot | None:
        """The complete snapshot kept for ``key`` (None: none built yet at this stop)."""
        return self._snap if self._snap is not None and self._key == key else None
