"""At most one snapshot per stop.

A command pass builds the snapshot with that pass's ``read``; a build during
which some read was not answered yet (the session reads it and runs the
command again) is used for that pass only. A complete build is kept for the
stop: every later command and every chunk of the JSON document at the same
stop gets the same object. The key is what changes the answer: the stop's
serial, the last poll event folded, the engine and the capture mode.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable

from .model import Snapshot


class SnapshotStore:
    def __init__(self) -> None:
        self._key: Hashable | None = None
        self._snap: Snapshot | None = None
        self.builds = 0  # complete builds kept (for tests and stats)

    def get(self, key: Hashable, build: Callable[[], Snapshot], missed: Callable[[], bool]) -> Snapshot:
        if self._snap is not None and self._key == key:
            return self._snap
        if self._key != key:  # the old stop's snapshot is not kept while the new one is built (peak memory)
            self._key = self._snap = None
        snap = build()
        if not missed():
            self._key, self._snap = key, snap
            self.builds += 1
        return snap

    def clear(self) -> None:
        self._key = self._snap = None

    def held(self, key: Hashable) -> Snapshot | None:
        """The complete snapshot kept for ``key`` (None: none built yet at this stop)."""
        return self._snap if self._snap is not None and self._key == key else None
