"""The units' DIE walks shared with a second process, while this one scans the units walked.

Theory of operation: a cold analysis of a big debug build spends a third of its time
walking the selected units' DIEs into ``dies.walk``'s four arrays, and most of the rest
scanning them (names, origins, layouts). The walk needs nothing but ``.debug_info``,
``.debug_abbrev`` and the unit list, so a lean child (``python -S -E``: the standard
library's ``array`` and ``dwarfwalk.py``, about 9 MB) walks the units from the first on, in the order
the scan asks for them, reading each with ``pread`` from the same open file, and writes
each unit's arrays down a pipe (1 MB: it can run a few units ahead). The scan takes the
units from the pipe; when the next one is not there yet, this process claims the next
unit the child has not started (the child skips it) and walks it itself, so neither
process waits for the other while there is work: on two cores the walk then costs
little wall time, and a loaded machine's share goes where the work is. The units this
process walks are scanned soon after (they are next in the scan's order): it took units
from the end before, and then sieved and scanned them alone after the child had ended
(the axum debug build: 109 of 191 units, a third of the scan on one core).

Anything unusual falls back to walking here: no child (cannot start), a child that
dies, a unit the child could not walk (this process walks it again and reports the
same error it would have). ``ASYNCRSP_WALK_PROCESS=0`` turns the child off.

The inventory also has the child sieve each unit it walks (``proxy.analysis.sieve``: which
DIEs the scan must decode, judged from names and addresses in place): a scan that
takes a unit from the child only decodes its picks, and the sieve's cost is on the
second core too.

Child protocol. stdin: ``<QQQQI`` (.debug_info's and .debug_abbrev's file offset and
size, number of kept tags or 0xFFFFFFFF for all), the kept tags (``<I`` each), ``<I``
number of units, then per unit ``<IIBII`` (unit offset, abbreviation table offset,
address size, unit DIE offset, end); then (written while the child walks the first
units, read by it once it is there: the units walked before go unsieved) ``<QQII`` (.debug_str's file offset and size, the
numbers of the sieve's two symbol address tables, ``sieve.named_by_symbols``) and the
two tables (``<Q`` each), or ``<QQII`` of zeros and 0xFFFFFFFF: no sieve. Later, any
number of ``<I``: with the high bit (``_CLAIM``), the parent walks the unit at this index
(skip it); without, walk no unit from this index on. stdout, per unit, in order:
``<IIiI`` (unit offset, kept DIEs n, status: 0 ok, 2 skipped (claimed), else not walked,
picks k or 0xFFFFFFFF without a sieve) and, when ok, the four arrays (4n bytes each; DIE offsets
relative to the unit's) and the picks (4k bytes: indices into the arrays); at the end
``<IIiI`` (0xFFFFFFFF, the child's peak resident set in kB, 0, 0).
"""

from __future__ import annotations

import os
import struct
import sys
from . import dwarfwalk as W  # the child imports nothing heavier (not even typing)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .dies import DieReader

_JOB = struct.Struct("<QQQQI")
_UNIT = struct.Struct("<IIBII")
_SIEVE = struct.Struct("<QQII")
_REPLY = struct.Struct("<IIiI")
_TRAILER = 0xFFFFFFFF  # after the last unit: (_TRAILER, the child's peak RSS in kB, 0, 0)
_NO_SIEVE = 0xFFFFFFFF
_CLAIM = 0x80000000  # a message's high bit: the parent walks the unit at this index
_SKIPPED = 2  # a reply's status: the unit was claimed by the parent (no arrays)
MIN_BYTES = 4 << 20  # fewer bytes of units to walk: the child's start (~50 ms) is not worth it


def child_main(fd: int) -> None:
    """The child: walk the units of the job on stdin, reply on stdout."""
    import select

    inp = sys.stdin.buffer.raw  # type: ignore[attr-defined]
    out = sys.stdout.buffer

    def need(n: int) -> bytes:
        got = b""
        while len(got) < n:
            more = inp.read(n - len(got))
            if not more:
                raise EOFError
            got += more
        return got

    info_off, _info_size, abbrev_off, abbrev_size, nkeep = _JOB.unpack(need(_JOB.size))
    keep = None if nkeep == 0xFFFFFFFF else frozenset(struct.unpack(f"<{nkeep}I", need(4 * nkeep)))
    (nunits,) = struct.unpack("<I", need(4))
    units = [_UNIT.unpack(need(_UNIT.size)) for _ in range(nunits)]
    from array import array

    def read_sieve() -> Any:  # the job's sieve part: it comes while the first units are walked
        str_off, str_size, nmaybe, nevery = _SIEVE.unpack(need(_SIEVE.size))
        if nevery == _NO_SIEVE:
            return None
        from . import sieve as S

        maybe, every = array("Q"), array("Q")
        maybe.frombytes(need(8 * nmaybe))
        every.frombytes(need(8 * nevery))
        return S.Sieve(S.FileStrings(fd, str_off, str_size).prefix, S.named_by_symbols(maybe, every))

    sieve, sieve_read = None, False
    abbrev = os.pread(fd, abbrev_size, abbrev_off)
    tables: dict[tuple[int, int], Any] = {}
    limit, pending, listening = nunits, b"", True
    claimed: set[int] = set()
    try:
        for i, (unit_off, table_off, addr_size, pos, end) in enumerate(units):
            while sieve_read and listening and select.select([inp], [], [], 0)[0]:  # claims, or stop
                more = inp.read(4096)
                if not more:
                    listening = False
                    break
                pending += more
                while len(pending) >= 4:
                    (msg,) = struct.unpack_from("<I", pending)
                    if msg & _CLAIM:
                        claimed.add(msg & ~_CLAIM)
                    else:
                        limit = min(limit, msg)
                    pending = pending[4:]
            if i >= limit:
                break
            if i in claimed:
                out.write(_REPLY.pack(unit_off, 0, _SKIPPED, 0))
                out.flush()
                continue
            try:
                key = (table_off, addr_size)
                got = tables.get(key)
                if got is None:
                    if len(tables) >= 4:  # rustc gives each unit its own table: a few kept (~45 KB each)
                        del tables[next(iter(tables))]
                    table = W.parse_abbrevs(abbrev, table_off)
                    got = tables[key] = (table, W.skip_table(table, addr_size, keep))
                buf = os.pread(fd, end - unit_off, info_off + unit_off)
                if len(buf) != end - unit_off:
                    raise ValueError("short read")
                walked = W.walk(buf, pos - unit_off, end - unit_off, got[1], unit_off)
                if not sieve_read and select.select([inp], [], [], 0)[0]:
                    # the parent makes the symbol tables after starting this process (~0.1 s
                    # on a debug build): the units walked before they came go unsieved
                    sieve, sieve_read = read_sieve(), True
                picks = None
                if sieve is not None:
                    picks = array("I", sieve.unit(buf, unit_off, walked[0], walked[1], key, got[0], addr_size,
                                                  unit_off, end))
            except Exception:  # noqa: BLE001 - the parent walks it again and says why
                out.write(_REPLY.pack(unit_off, 0, 1, 0))
                out.flush()
                continue
            out.write(_REPLY.pack(unit_off, len(walked[0]), 0, _NO_SIEVE if picks is None else len(picks)))
            for arr in walked:
                out.write(arr.tobytes())
            if picks is not None:
                out.write(picks.tobytes())
            out.flush()
        out.write(_REPLY.pack(_TRAILER, _peak_kb(), 0, 0))
        out.flush()
    except BrokenPipeError:  # the parent is gone or stopped listening
        pass


def _write_all(pipe: Any, data: bytes | bytearray) -> None:
    """All of ``data`` down the pipe: the job is ~1 MB with the sieve's symbol tables, and a
    write to a pipe can come back short (a signal; seen under py-spy); a child left waiting
    for the rest of its job would never reply."""
    view = memoryview(data)
    while view:
        view = view[pipe.write(view) or 0:]


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
    """The child walking ``units`` in order, but for the ones this process claims."""

    def __init__(self, proc: Any, units: list[int], walk_here: Callable[[int], object]) -> None:
        self._proc = proc
        self._order = list(units)
        self._index = {u: i for i, u in enumerate(units)}
        self._got = 0  # replies read: the child's walks of _order[:_got]
        self._claimed: set[int] = set()  # indices of _order walked here (the child skips them)
        self._next_claim = 1
        self._ready: dict[int, tuple[Any, ...] | None] = {}
        self._walk_here = walk_here
        self._alive = True
        self.stolen = 0  # units walked here

    @staticmethod
    def start(fd: int, sections: dict[str, tuple[int, int, int]], reader: DieReader, units: list[int],
              keep_tags: frozenset[int] | None, walk_here: Callable[[int], object],
              sieve: Callable[[], tuple[Any, Any]] | None = None) -> Prefetch | None:
        """A child walking ``units``, or None (turned off, not worth it, cannot start).
        ``walk_here(offset)`` walks a unit in this process (and keeps it). ``sieve``: makes
        the symbol address tables of ``sieve.named_by_symbols`` (arrays of ``Q``), called
        once the child has started: the child sieves each unit too (``take`` gives the
        picks)."""
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
            except W.DwarfFormatError:
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
        proc = None
        try:
            proc = subprocess.Popen([sys.executable, "-S", "-E", "-c", code], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, pass_fds=(fd,),
                                    bufsize=0)
            try:  # room for a few units' arrays: the child walks on while this process scans;
                import fcntl  # and for the job: this process goes on while the child starts

                fcntl.fcntl(proc.stdout.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
                fcntl.fcntl(proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)
            except (OSError, AttributeError):
                pass
            _write_all(proc.stdin, job)
        except (OSError, ValueError):
            if proc is not None:
                proc.kill()
                proc.wait()
            return None
        # the sieve part once the child walks: the symbol tables (and the image's symbol
        # list) are made meanwhile (~0.15 s on a debug build that were before the child's
        # start); the units it walks before they come go unsieved (this process sieves them)
        tables = sieve() if sieve is not None else None
        strs = sections.get(".debug_str")
        if tables is not None and strs is not None:
            maybe, every = tables
            part = _SIEVE.pack(strs[1], strs[2], len(maybe), len(every)) + maybe.tobytes() + every.tobytes()
        else:
            part = _SIEVE.pack(0, 0, 0, _NO_SIEVE)
        try:
            _write_all(proc.stdin, part)
        except (OSError, ValueError):  # it has walked every unit and ended
            pass
        return Prefetch(proc, [j[0] for j in jobs], walk_here)

    def take(self, off: int) -> tuple[Any, ...] | None:
        """The walk of the unit at ``off`` (four arrays, and the sieve's picks or None), or
        None: walk it here (or it has been: ``walk_here`` kept it)."""
        i = self._index.get(off)
        if i is None or i in self._claimed:
            return None
        while self._alive and self._got <= i:
            if not self._waiting() and self._claim(i):
                continue  # nothing from the child yet: a later unit walked here meanwhile
            if not self._read_one():
                self.close()
                return None
        return self._ready.pop(off, None)

    def _waiting(self) -> bool:
        import select

        return bool(select.select([self._proc.stdout], [], [], 0)[0])

    def _claim(self, i: int) -> bool:
        """Walk here the first unit after ``i`` that the child has not started (it works on
        the unit after its last reply: ``_got``) and nobody has claimed; False: none left.
        The child skips it when it comes to it (it walks it too when the claim comes late:
        that walk is dropped)."""
        j = max(self._next_claim, i + 1, self._got + 1)
        while j in self._claimed:
            j += 1
        if j >= len(self._order):
            return False
        self._claimed.add(j)
        self._next_claim = j + 1
        self.stolen += 1
        self._tell(_CLAIM | j)
        self._walk_here(self._order[j])
        return True

    def _tell(self, msg: int) -> None:
        try:
            self._proc.stdin.write(struct.pack("<I", msg))
        except OSError:  # it has ended
            pass

    def _read_one(self) -> bool:
        """Read the next reply into _ready (None: the child could not walk it); False:
        the child failed."""
        import numpy as np
        from array import array

        try:
            head = self._need(_REPLY.size)
            got_off, n, status, k = _REPLY.unpack(head)
            if self._got >= len(self._order) or got_off != self._order[self._got]:
                return False
            raw = self._need(16 * n) if status == 0 else b""
            raw_picks = self._need(4 * k) if status == 0 and k != _NO_SIEVE else None
        except (OSError, ValueError, EOFError):
            return False
        k = self._got
        self._got += 1
        if k in self._claimed:
            return True  # walked here (skipped by the child, or walked by both)
        if status != 0:
            self._ready[got_off] = None
            return True
        offs = array("I")
        offs.frombytes((np.frombuffer(raw, dtype="<u4", count=n) + np.uint32(got_off)).astype("<u4").tobytes())
        codes, pars, ends = array("I"), array("i"), array("I")
        codes.frombytes(raw[4 * n:8 * n])
        pars.frombytes(raw[8 * n:12 * n])
        ends.frombytes(raw[12 * n:])
        picks = None
        if raw_picks is not None:
            picks = array("I")
            picks.frombytes(raw_picks)
        self._ready[got_off] = (offs, codes, pars, ends, picks)
        return True

    def _need(self, n: int) -> bytes:
        pipe = self._proc.stdout
        parts, left = [], n
        while left:
            more = pipe.read(left)
            if not more:
                raise EOFError
            parts.append(more)
            left -= len(more)
        return b"".join(parts)

    def close(self) -> None:
        """Stop the child (after its current unit) and keep its peak (``last_peak_kb``)."""
        global last_peak_kb
        if not self._alive:
            return
        self._alive = False
        self._ready.clear()
        proc = self._proc
        self._tell(0)
        try:
            proc.stdin.close()
        except OSError:  # it has ended
            pass
        try:
            while True:  # what it walked past our last need, then its peak
                head = self._need(_REPLY.size)
                got_off, n, status, k = _REPLY.unpack(head)
                if got_off == _TRAILER:
                    last_peak_kb = n
                    break
                if status == 0:
                    self._need(16 * n + (4 * k if k != _NO_SIEVE else 0))
        except (OSError, ValueError, EOFError):
            pass
        if proc.poll() is None:
            proc.kill()
        try:
            proc.stdout.close()
        except OSError:
            pass
        proc.wait()
