"""``Hg<thread>`` / ``Hc<thread>``: select the thread for later register
(``g``) or resume (``c``) operations."""

from __future__ import annotations

from dataclasses import dataclass

from rsp.errors import LocalProtocolError, MalformedPacket
from rsp.threads import ThreadId


@dataclass(frozen=True, slots=True)
class SetThread:
    op: str  # 'g' or 'c'
    thread: ThreadId

    def build(self, multiprocess: bool = True) -> bytes:
        if self.op not in ("g", "c"):
            raise LocalProtocolError(f"H operation must be 'g' or 'c', not {self.op!r}")
        return b"H" + self.op.encode() + self.thread.format(multiprocess)


def parse_set_thread(body: bytes) -> SetThread:
    if len(body) < 3 or body[:1] != b"H" or body[1:2] not in (b"g", b"c"):
        raise MalformedPacket(body, "expected Hg<thread> or Hc<thread>")
    return SetThread(body[1:2].decode(), ThreadId.parse(body[2:]))
