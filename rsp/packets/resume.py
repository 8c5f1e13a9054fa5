"""Resume packets: ``vCont;...`` and the legacy single-letter forms.

* ``vCont[;action[:thread]]...`` with actions ``c``, ``Csig``, ``s``,
  ``Ssig``, ``rstart,end`` (step while pc is in [start, end)) and ``t``
  (stop, non-stop mode). For each thread the *first* action that matches it
  applies; an action without a thread is the default.
* legacy ``c[addr]``, ``Csig[;addr]``, ``s[addr]``, ``Ssig[;addr]`` resume
  with the thread chosen by ``Hc``; and rr's reverse ``bc`` / ``bs``.
  They are kept verbatim in `Resume.legacy` and also described as one
  default action, so callers can treat both forms alike.

``vCont?`` is a query (which actions the stub supports), not a resume:
`parse_resume` returns None for it and for any other packet.
"""

from __future__ import annotations

from dataclasses import dataclass

from rsp.errors import LocalProtocolError, MalformedPacket
from rsp.framing import is_hex, parse_hex_int
from rsp.threads import ThreadId

_OPS = frozenset("cCsSrt")


@dataclass(frozen=True, slots=True)
class ResumeAction:
    op: str  # 'c', 'C', 's', 'S', 'r', 't'
    signal: int | None = None
    thread: ThreadId | None = None
    range: tuple[int, int] | None = None

    @property
    def is_step(self) -> bool:
        return self.op in ("s", "S", "r")

    def applies_to(self, thread: ThreadId) -> bool:
        return self.thread is None or self.thread.matches(thread)

    def build(self, multiprocess: bool = True) -> bytes:
        if self.op not in _OPS:
            raise LocalProtocolError(f"unknown vCont action {self.op!r}")
        text = self.op.encode()
        if self.op in ("C", "S"):
            if self.signal is None:
                raise LocalProtocolError(f"vCont action {self.op} needs a signal")
            text += b"%02x" % self.signal
        elif self.op == "r":
            if self.range is None:
                raise LocalProtocolError("vCont action r needs a range")
            text += b"%x,%x" % self.range
        if self.thread is not None:
            text += b":" + self.thread.format(multiprocess)
        return text

    def without_signal(self) -> ResumeAction:
        """``C``/``S`` become ``c``/``s`` (the signal was already delivered)."""
        if self.op == "C":
            return ResumeAction("c", None, self.thread, self.range)
        if self.op == "S":
            return ResumeAction("s", None, self.thread, self.range)
        return self


@dataclass(frozen=True, slots=True)
class Resume:
    actions: tuple[ResumeAction, ...]
    legacy: bytes | None = None
    reverse: bool = False

    def build(self) -> bytes:
        if self.legacy is not None:
            return self.legacy
        if not self.actions:
            raise LocalProtocolError("vCont needs at least one action")
        return b"vCont;" + b";".join(a.build() for a in self.actions)

    def action_for(self, thread: ThreadId) -> ResumeAction | None:
        """The action that applies to `thread` (vCont: the first match)."""
        for action in self.actions:
            if action.applies_to(thread):
                return action
        return None

    @property
    def is_step(self) -> bool:
        """Does any action step?"""
        return any(a.is_step for a in self.actions)


def action_for(resume: Resume, thread: ThreadId) -> ResumeAction | None:
    return resume.action_for(thread)


def parse_resume(body: bytes) -> Resume | None:
    """The resume packet `body`, or None if it is not one. Raises
    `MalformedPacket` for a resume packet with bad syntax."""
    if body.startswith(b"vCont;"):
        return _parse_vcont(body)
    if not body:
        return None
    head = body[:1]
    if head in (b"c", b"s"):
        rest = body[1:]
        if rest:
            parse_hex_int(rest, body, "resume address")
        return Resume((ResumeAction(head.decode()),), legacy=body)
    if head in (b"C", b"S"):
        return _parse_legacy_signal(body)
    if body in (b"bc", b"bs"):
        return Resume((ResumeAction(body[1:2].decode()),), legacy=body, reverse=True)
    return None


def _parse_legacy_signal(body: bytes) -> Resume:
    sig_text, _, addr = body[1:].partition(b";")
    if len(sig_text) != 2 or not is_hex(sig_text):
        raise MalformedPacket(body, "expected two hex digits of signal")
    if addr:
        parse_hex_int(addr, body, "resume address")
    action = ResumeAction(body[:1].decode(), int(sig_text, 16))
    return Resume((action,), legacy=body)


def _parse_vcont(body: bytes) -> Resume:
    items = body[6:].split(b";")
    return Resume(tuple(_parse_action(item, body) for item in items))


def _parse_action(item: bytes, body: bytes) -> ResumeAction:
    what, colon, thread_text = item.partition(b":")
    thread = ThreadId.parse(thread_text) if colon else None
    if not what or chr(what[0]) not in _OPS:
        raise MalformedPacket(body, f"unknown vCont action {item!r}")
    op = chr(what[0])
    arg = what[1:]
    if op in ("C", "S"):
        if len(arg) != 2 or not is_hex(arg):
            raise MalformedPacket(body, f"vCont action {item!r} needs a two-digit signal")
        return ResumeAction(op, int(arg, 16), thread)
    if op == "r":
        start, comma, end = arg.partition(b",")
        if not comma:
            raise MalformedPacket(body, f"vCont range action {item!r} needs start,end")
        rng = (parse_hex_int(start, body, "range start"), parse_hex_int(end, body, "range end"))
        return ResumeAction(op, None, thread, rng)
    if arg:
        raise MalformedPacket(body, f"vCont action {item!r} has unexpected data")
    return ResumeAction(op, None, thread)
