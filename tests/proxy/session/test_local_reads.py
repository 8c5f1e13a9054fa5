"""The read loop of a monitor command with a local memory reader (proxy/host/localmem.py).

The reader is the session's config hook; here it is a small stand-in with three kinds of
address (the real reader is tested against a real process in
tests/proxy/reflect/test_localmem.py): data it reads, an address no mapping holds, and code
(refused: the stub's `m` hides its breakpoints, /proc/PID/mem does not).
"""

from __future__ import annotations

from proxy.session.actions import ToClient, ToStub
from proxy.session.core import Session

from .test_core import Driver, bodies, stop_at

DATA, UNMAPPED, CODE = 0x7000, 0x10, 0x5000


class _Local:
    def __init__(self) -> None:
        self.closed = 0
        self.bytes_read = 0

    def read(self, addr: int, size: int) -> bytes | None:
        if addr == DATA:
            self.bytes_read += size
            return b"\x2a" * size
        return None

    def unmapped(self, addr: int) -> bool:
        return addr == UNMAPPED

    def close(self) -> None:
        self.closed += 1


def test_local_reads_skip_the_stub_and_code_still_goes_to_it() -> None:
    local = _Local()
    seen: list[object] = []

    def monitor(text: str, s: Session, read) -> str:  # type: ignore[no-untyped-def]
        got = (read(DATA, 4), read(UNMAPPED, 4), read(CODE, 4))
        seen.append(got)
        return "ok\n"

    d = Driver(probes=[], monitor=monitor, local_memory=lambda s: local)
    d.client(b"?")
    d.stub(stop_at(0x1000, reason=b""))
    acts = d.client(b"qRcmd," + b"async tree".hex().encode())
    assert bodies(acts, ToStub) == [b"m5000,4"]  # only the code: one packet
    acts = d.stub(b"90909090")
    assert bodies(acts, ToClient)[-1] == b"OK"
    assert seen == [(b"****", None, b"\x90" * 4)]  # the command ran once, its read answered
    assert local.closed == 1 and d.s.stats.local_read_bytes == 4
    assert any("/proc/PID/mem" in line and " 4 bytes" in line for line in d.s.queries.stats_lines())


def test_without_a_local_reader_every_read_is_an_m_packet() -> None:
    def monitor(text: str, s: Session, read) -> str:  # type: ignore[no-untyped-def]
        read(DATA, 4)
        read(UNMAPPED, 4)
        return "ok\n"

    d = Driver(probes=[], monitor=monitor, local_memory=lambda s: None)
    d.client(b"?")
    d.stub(stop_at(0x1000, reason=b""))
    acts = d.client(b"qRcmd," + b"async tree".hex().encode())
    assert bodies(acts, ToStub) == [b"m7000,4"]  # asked as the command reads it
    assert bodies(d.stub(b"2a2a2a2a"), ToStub) == [b"m10,4"]
    assert bodies(d.stub(b"E14"), ToClient)[-1] == b"OK"
    assert not any("/proc/PID/mem" in line for line in d.s.queries.stats_lines())


def _asked(monitor):  # type: ignore[no-untyped-def]
    """A stopped session whose `monitor async tree` runs `monitor` over a local reader: (driver,
    the command's actions). The reader is opened for the session (app.local_memory reads its
    identity and target), not for one of its parts."""
    given: list[object] = []
    d = Driver(probes=[], monitor=monitor, local_memory=lambda s: (given.append(s), _Local())[1])
    d.client(b"?")
    d.stub(stop_at(0x1000, reason=b""))
    acts = d.client(b"qRcmd," + b"async tree".hex().encode())
    assert given == [d.s]
    return d, acts


def test_peek_reads_what_is_known_and_never_asks_the_stub() -> None:
    """monitor_peek (task threads compare the last stop's bytes with it): a remote program's
    bytes not read yet are None, and nothing is asked for them."""
    seen: list[object] = []

    def monitor(text: str, s: Session, read) -> str:  # type: ignore[no-untyped-def]
        assert s.queries.monitor_peek is not None
        seen.append((s.queries.monitor_peek(DATA, 4), s.queries.monitor_peek(CODE, 4)))
        read(CODE, 4)
        seen.append((s.queries.monitor_peek(DATA, 4), s.queries.monitor_peek(CODE, 4)))
        return "ok\n"

    d, acts = _asked(monitor)
    assert bodies(acts, ToStub) == [b"m5000,4"]  # the read's, not the peek's
    d.stub(b"90909090")
    assert seen == [(b"****", None), (b"****", b"\x90" * 4)]  # known once read
    assert d.s.queries.monitor_peek is None  # only during a pass


def test_many_reads_at_once_ask_the_stub_for_the_unknown_ones_back_to_back() -> None:
    """``read.many`` (a runtime adapter's heap scan: proxy.reflect.memory.BlockReader.prefetch):
    what the local reader holds is not asked; the rest goes in one exchange, not a round trip
    each; later reads of the same ranges ask nothing."""
    seen: list[object] = []

    def monitor(text: str, s: Session, read) -> str:  # type: ignore[no-untyped-def]
        seen.append(read.many([(DATA, 4), (CODE, 4), (0x6000, 4), (UNMAPPED, 4)]))
        seen.append((read(CODE, 4), read(0x6000, 4)))
        return "ok\n"

    d, acts = _asked(monitor)
    assert bodies(acts, ToStub) == [b"m5000,4", b"m6000,4"]  # sent at once
    assert d.stub(b"90909090") == []
    assert bodies(d.stub(b"E14"), ToClient)[-1] == b"OK"
    assert seen == [[b"****", b"\x90" * 4, None, None], (b"\x90" * 4, None)]
