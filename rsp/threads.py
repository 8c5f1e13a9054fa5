"""Thread ids as the protocol writes them.

Forms (hex numbers): ``tid``, ``-1`` (all threads), ``0`` (any thread), and
with the multiprocess extension ``p<pid>.<tid>``, ``p<pid>.-1`` (all threads
of a process) and ``p<pid>`` (same as ``p<pid>.-1``). ``p-1`` means all
processes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rsp.errors import LocalProtocolError, MalformedPacket
from rsp.memo import kept

ALL = -1
ANY = 0


def _parse_number(text: bytes, whole: bytes) -> int:
    if text == b"-1":
        return ALL
    if not text or text.translate(None, b"0123456789abcdefABCDEF"):
        raise MalformedPacket(whole, f"thread id part {text!r} is not hex or -1")
    return int(text, 16)


def _format_number(value: int) -> bytes:
    if value == ALL:
        return b"-1"
    if value < 0:
        raise LocalProtocolError(f"thread/process id {value} is negative and not -1 (all)")
    return b"%x" % value


@dataclass(frozen=True, slots=True)
class ThreadId:
    """`pid` is None when the id was written without the ``p`` prefix."""

    pid: int | None
    tid: int

    ALL: ClassVar[int] = ALL
    ANY: ClassVar[int] = ANY

    @staticmethod
    @kept
    def parse(text: bytes) -> ThreadId:
        if text.startswith(b"p"):
            pid_text, dot, tid_text = text[1:].partition(b".")
            pid = _parse_number(pid_text, text)
            tid = _parse_number(tid_text, text) if dot else ALL
            return ThreadId(pid, tid)
        return ThreadId(None, _parse_number(text, text))

    def format(self, multiprocess: bool) -> bytes:
        """The wire form. Without multiprocess the pid is dropped; with it and
        no pid known, the bare tid is written (gdb does the same)."""
        if multiprocess and self.pid is not None:
            return b"p%b.%b" % (_format_number(self.pid), _format_number(self.tid))
        return _format_number(self.tid)

    def matches(self, other: ThreadId) -> bool:
        """Does this id (possibly a wildcard: -1 all, 0 any, no pid) cover
        the concrete thread `other`?"""
        if self.pid is not None and other.pid is not None and self.pid not in (ALL, other.pid):
            return False
        return self.tid in (ALL, ANY) or self.tid == other.tid

    @property
    def is_all(self) -> bool:
        return self.tid == ALL

    def __str__(self) -> str:
        return self.format(multiprocess=True).decode()
