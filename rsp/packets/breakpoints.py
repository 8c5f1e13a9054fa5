"""``Z``/``z`` packets: insert or remove a breakpoint or watchpoint.

``Ztype,addr,kind[;cond_list...][;cmds:persist,cmd_list...]`` with type 0
software breakpoint, 1 hardware breakpoint, 2 write, 3 read, 4 access
watchpoint. `conditions` keeps everything after `kind` (starting with
``;``) verbatim: agent-expression conditions and commands.
"""

from __future__ import annotations

from dataclasses import dataclass

from rsp.errors import LocalProtocolError, MalformedPacket
from rsp.framing import parse_hex_int
from rsp.memo import kept

SOFTWARE, HARDWARE, WRITE_WATCH, READ_WATCH, ACCESS_WATCH = range(5)


@dataclass(frozen=True, slots=True)
class BreakpointPacket:
    insert: bool
    type: int
    addr: int
    kind: int
    conditions: bytes = b""

    @property
    def key(self) -> tuple[int, int, int]:
        """What identifies the breakpoint: (type, addr, kind)."""
        return (self.type, self.addr, self.kind)

    def build(self) -> bytes:
        if not 0 <= self.type <= 9 or self.addr < 0 or self.kind < 0:
            raise LocalProtocolError(f"bad breakpoint {self!r}")
        if self.conditions and not self.conditions.startswith(b";"):
            raise LocalProtocolError("breakpoint conditions must start with ';'")
        letter = b"Z" if self.insert else b"z"
        return b"%b%d,%x,%x%b" % (letter, self.type, self.addr, self.kind, self.conditions)

    def removal(self) -> BreakpointPacket:
        """The ``z`` packet that removes this breakpoint."""
        return BreakpointPacket(False, self.type, self.addr, self.kind)


@kept
def parse_breakpoint(body: bytes) -> BreakpointPacket:
    if body[:1] not in (b"Z", b"z"):
        raise MalformedPacket(body, "expected Z or z")
    head, semi, tail = body[1:].partition(b";")
    fields = head.split(b",")
    if len(fields) != 3 or len(fields[0]) != 1 or not fields[0].isdigit():
        raise MalformedPacket(body, "expected Ztype,addr,kind")
    return BreakpointPacket(
        insert=body[:1] == b"Z",
        type=int(fields[0]),
        addr=parse_hex_int(fields[1], body, "address"),
        kind=parse_hex_int(fields[2], body, "kind"),
        conditions=semi + tail,
    )
