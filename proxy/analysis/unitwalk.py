"""The units' DIE walks in a second process, while this one scans the units already walked.

Theory of operation: a cold analysis of a big debug build spends a third of its time
walking the selected units' DIEs into ``dies.walk``'s four arrays, and most of the rest
scanning them (names, origins, layouts). The walk needs nothing but ``.debug_info``,
``.debug_abbrev`` and the unit list, so a lean child (``python -S -E``: the standard
library and ``dies.py``, about 13 MB) walks the units in the order the scan asks for
them, reading each unit with ``pread`` from the same open file, and writes each unit's
arrays down a pipe; the scan takes unit k while the child walks unit k+1. On two cores
the walk then costs no wall time of its own, and the arrays cross the pipe once (16
bytes a kept DIE: they would be in this process anyway).

Anything unusual falls back to walking here: no child (cannot start), a child that
dies, a unit the child could not walk (this process walks it again and reports the
same error it would have), a unit asked for out of order is read from the pipe after
the ones before it (they are asked for next). ``ASYNCRSP_WALK_PROCESS=0`` turns the
child off.

Child protocol. stdin: ``<QQQQI`` (.debug_info's and .debug_abbrev's file offset and
size, number of kept tags or 0xFFFFFFFF for all), the kept tags (``<I`` each), ``<I``
number of units, then per unit ``<IIBII`` (unit offset, abbreviation table offset,
address size, unit DIE offset, end). stdout, per unit in that order: ``<IIi`` (unit
offset, kept DIEs n, status: 0 ok, else not walked) and, when ok, the four arrays
(4n bytes each; DIE offsets relative to the unit's); after the last one, ``<IIi``
(0xFFFFFFFF, the child's peak resident set in kB, 0).
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Any

from . import dies as D

_JOB = struct.Struct("<QQQQI")
_UNIT = struct.Struct("<IIBII")
_REPLY = struct.Struct("<IIi")
_TRAILER = 0xFFFFFFFF  # after the last unit: (_TRAILER, the child's peak RSS in kB, 0)
MIN_BYTES = 4 << 20  # fewer bytes of units to walk: the child's start (~50 ms) is not worth it


def child_main(fd: int) -> None:
    """The child: walk the units of the job on stdin, reply on stdout."""
    inp = sys.stdin.buffer
    out = sys.stdout.buffer
    info_off, _info_size, abbrev_off, abbrev_size, nkeep = _JOB.unpack(inp.read(_JOB.size))
    keep = None if nkeep == 0xFFFFFFFF else frozenset(struct.unpack(f"<{nkeep}I", inp.read(4 * nkeep)))
    (nunits,) = struct.unpack("<I", inp.read(4))
    units = [_UNIT.unpack(inp.read(_UNIT.size)) for _ in range(nunits)]
    abbrev = os.pread(fd, abbrev_size, abbrev_off)
    tables: dict[tuple[int, int], Any] = {}
    try:
        for unit_off, table_off, addr_size, pos, end in units:
            try:
                skips = tables.get((table_off, addr_size))
                if skips is None:
                    skips = tables[(table_off, addr_size)] = D.skip_table(
                        D.parse_abbrevs(abbrev, table_off), addr_size, keep)
                buf = os.pread(fd, end - unit_off, info_off + unit_off)
                if len(buf) != end - unit_off:
                    raise ValueError("short read")
                walked = D.walk(buf, pos - unit_off, end - unit_off, skips, unit_off)
            except Exception:  # noqa: BLE001 - the parent walks it again and says why
                out.write(_REPLY.pack(unit_off, 0, 1))
                out.flush()
                continue
            out.write(_REPLY.pack(unit_off, len(walked[0]), 0))
            for arr in walked:
                out.write(arr.tobytes())
            out.flush()
        out.write(_REPLY.pack(_TRAILER, _peak_kb(), 0))
        out.flush()
    except BrokenPipeError:  # the parent is gone or stopped listening
        pass


def _peak_kb() -> int:
    """This process's own peak resident set (VmHWM): getrusage's ru_maxrss of a child
    started by vfork and exec also counts the parent's pages at the vfork."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


# the walker's own peak resident set in kB (_peak_kb) of the last Prefetch that ran to the
# end: what bench/bench_analysis.py adds to the analysing process's peak
last_peak_kb = 0


class Prefetch:
    """The child walking ``units`` (in the order they will be asked for)."""

    def __init__(self, proc: Any, units: list[int]) -> None:
        self._proc = proc
        self._order = list(units)
        self._left = set(units)  # not replied yet
        self._next = 0  # index in _order of the next reply
        self._ready: dict[int, tuple[Any, ...] | None] = {}

    @staticmethod
    def start(fd: int, sections: dict[str, tuple[int, int, int]], reader: D.DieReader, units: list[int],
              keep_tags: frozenset[int] | None) -> Prefetch | None:
        """A child walking ``units``, or None (turned off, not worth it, cannot start)."""
        if os.environ.get("ASYNCRSP_WALK_PROCESS", "1") == "0":
            return None
        info, abbrev = sections.get(".debug_info"), sections.get(".debug_abbrev")
        if info is None or abbrev is None:
            return None
        jobs = []
        total = 0
        for off in units:
            try:
                table_off, addr_size, pos, end = reader.unit_job(off)
            except D.DwarfFormatError:
                continue  # read here, where the error is reported
            jobs.append((off, table_off, addr_size, pos, end))
            total += end - off
        if total < MIN_BYTES:
            return None
        import subprocess

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        code = (f"import sys; sys.path.insert(0, {root!r}); "
                f"from proxy.analysis.unitwalk import child_main; child_main({fd})")
        job = bytearray(_JOB.pack(info[1], info[2], abbrev[1], abbrev[2],
                                  0xFFFFFFFF if keep_tags is None else len(keep_tags)))
        if keep_tags is not None:
            job += struct.pack(f"<{len(keep_tags)}I", *sorted(keep_tags))
        job += struct.pack("<I", len(jobs))
        for j in jobs:
            job += _UNIT.pack(*j)
        try:
            proc = subprocess.Popen([sys.executable, "-S", "-E", "-c", code], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, pass_fds=(fd,))
            assert proc.stdin is not None
            proc.stdin.write(job)
            proc.stdin.close()
        except (OSError, ValueError):
            return None
        return Prefetch(proc, [j[0] for j in jobs])

    def take(self, off: int) -> tuple[Any, ...] | None:
        """The walk of the unit at ``off`` (four arrays), or None: walk it here."""
        if off in self._ready:
            return self._ready.pop(off)
        if off not in self._left:
            return None
        while self._next < len(self._order):
            uo = self._order[self._next]
            got = self._read_one(uo)
            if got is False:
                self.close()
                return None
            self._next += 1
            self._left.discard(uo)
            if uo == off:
                return got  # type: ignore[return-value]
            self._ready[uo] = got  # type: ignore[assignment]
        return None

    def _read_one(self, uo: int) -> tuple[Any, ...] | None | bool:
        """The next reply (None: the child could not walk it), or False (the child failed)."""
        import numpy as np
        from array import array

        pipe = self._proc.stdout
        try:
            head = pipe.read(_REPLY.size)
            if len(head) != _REPLY.size:
                return False
            got_off, n, status = _REPLY.unpack(head)
            if got_off != uo:
                return False
            if status != 0:
                return None
            raw = pipe.read(16 * n)
        except (OSError, ValueError):
            return False
        if len(raw) != 16 * n:
            return False
        offs = array("I")
        offs.frombytes((np.frombuffer(raw, dtype="<u4", count=n) + np.uint32(uo)).astype("<u4").tobytes())
        codes, pars, ends = array("I"), array("i"), array("I")
        codes.frombytes(raw[4 * n:8 * n])
        pars.frombytes(raw[8 * n:12 * n])
        ends.frombytes(raw[12 * n:])
        return offs, codes, pars, ends

    def close(self) -> None:
        """Stop the child (it may still be walking units nobody will ask for)."""
        global last_peak_kb
        if self._next == len(self._order) and self._proc.stdout is not None:
            try:
                head = self._proc.stdout.read(_REPLY.size)
                if len(head) == _REPLY.size and _REPLY.unpack(head)[0] == _TRAILER:
                    last_peak_kb = _REPLY.unpack(head)[1]
            except (OSError, ValueError):
                pass
        self._next = len(self._order)
        self._left.clear()
        self._ready.clear()
        proc = self._proc
        if proc.poll() is None:
            proc.kill()
        try:
            if proc.stdout is not None:
                proc.stdout.close()
        except OSError:
            pass
        proc.wait()
