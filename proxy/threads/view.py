"""What the client sees of task threads: the proxy's answers to its thread queries.

Theory of operation: at a stop the session hands ``TaskThreadView.set_tasks``
the live tasks (``adapter.from_snapshot``) and one real thread's ``g``
reply (the register block's format). From then until the next resume the
view answers, without the stub:

* the thread list (``qfThreadInfo``/``qsThreadInfo`` pages after the stub's
  own ids; ``qXfer:threads:read``: the stub's document plus one ``<thread>``
  per task, ``name`` = the task, text = its extra info);
* ``qThreadExtraInfo``, ``T`` (alive), ``qThreadStopInfo`` for task ids;
* ``Hg``/``Hc`` of a task id (the stub keeps its own selection), then ``g``/``p``
  from the task's synthetic stack (``stack.lay_out``, built when first read)
  and ``m`` inside the synthetic region; ``G``/``P``/``M``/``X`` there are refused;
* resumes: ``vCont`` actions naming a task are dropped (a ``continue`` with a
  task selected resumes the program as before), a step of a task thread is
  refused with a clear error (its pc would never move: gdb would step forever).

Tasks past the cap are grouped into one extra thread that says how many.
Pure: ``answer`` returns the reply bytes, or None for "not mine, forward".
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from rsp.errors import MalformedPacket
from rsp.framing import escape_binary
from rsp.packets.resume import Resume, ResumeAction
from rsp.threads import ThreadId

from .ids import TaskIds
from .model import DEFAULT_CAP, TID_BASE, TaskThread, is_task_tid, region_of, tid_of_region
from .stack import FrameShape, SyntheticStack, lay_out

# gdb's amd64 `g` block: 16 GPRs and rip (8 bytes), eflags and 6 segment registers (4),
# st0-7 (10), 8 x87 control registers (4), xmm0-15 (16), mxcsr (4)
_SIZES = [8] * 17 + [4] * 7 + [10] * 8 + [4] * 8 + [16] * 16 + [4]
_G_NAMES = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
            "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rip")
PAGE = 128  # thread ids per qfThreadInfo/qsThreadInfo reply
STEP_REFUSED = b"E.asyncrsp: a task thread cannot be stepped or resumed alone; select a real thread"
WRITE_REFUSED = b"E.asyncrsp: task threads are read-only"

Shape = Callable[[int, bool], "FrameShape | None"]  # (runtime pc, outer frame) -> shape


class TaskThreadView:
    def __init__(self, cap: int = DEFAULT_CAP, enabled: bool = True, pattern: str | None = None) -> None:
        self.enabled = enabled
        self.off_at_resume = False  # `monitor async threads off` while task threads are listed
        self.cap = cap
        self.pattern = pattern
        self.ids = TaskIds()
        self.fresh = False
        self.tasks: dict[int, TaskThread] = {}
        self.running: dict[int, TaskThread] = {}  # LWP -> the task it runs
        self.hidden = 0  # tasks past the cap
        self.group_tid: int | None = None
        self.shape: Shape | None = None
        self.end_ra = 0
        self.template_g = b""
        self._template = bytes(sum(_SIZES))  # template_g decoded once per stop (gdb reads 1,000s of blocks)
        self.stacks: dict[int, SyntheticStack] = {}
        self.selected: int | None = None  # the task thread of the client's Hg
        self.pid: int | None = None
        self.multiprocess = False
        self._pages: list[bytes] = []

    # -- the stop's tasks --------------------------------------------------------------
    def set_tasks(self, tasks: list[TaskThread], template_g: bytes, shape: Shape | None, end_ra: int = 0,
                  unread: int = 0) -> None:
        """end_ra: where the outermost frame returns (the program's ``_start``: stack.py);
        unread: tasks past the cap that were counted, not read (listing.py)."""
        self.fresh = True
        self.end_ra = end_ra
        self.template_g = template_g
        self._template = bytes.fromhex(template_g.replace(b"x", b"0").decode()) if template_g else bytes(sum(_SIZES))
        self.shape = shape
        self.stacks = {}
        self.tasks = {}
        self.running = {t.running_on: t for t in tasks if t.running_on is not None}
        listed = [t for t in tasks if t.running_on is None]
        if self.pattern:
            rx = re.compile(self.pattern)
            listed = [t for t in listed if rx.search(t.name) or rx.search(t.extra)]
        for t in listed[:self.cap]:
            self.tasks[self.ids.id_for(t.key)] = t
        self.hidden = max(0, len(listed) - self.cap) + unread
        self.group_tid = self.ids.id_for((0, "asyncrsp: tasks past the cap")) if self.hidden else None

    def stale(self) -> None:
        """The program resumes: nothing listed holds any more."""
        if self.off_at_resume:
            self.enabled, self.off_at_resume = False, False
        self.fresh = False
        self.selected = None
        self.stacks = {}

    def all_tids(self) -> list[int]:
        return list(self.tasks) + ([self.group_tid] if self.group_tid is not None else [])

    def knows(self, tid: int) -> bool:
        return tid in self.tasks or (tid == self.group_tid and tid is not None)

    # -- ids on the wire ---------------------------------------------------------------
    def learn_format(self, stub_ids: list[bytes]) -> None:
        for raw in stub_ids:
            try:
                t = ThreadId.parse(raw)
            except MalformedPacket:
                continue
            if t.pid is not None and t.pid > 0:
                self.pid, self.multiprocess = t.pid, True
                return

    def wire(self, tid: int) -> bytes:
        return ThreadId(self.pid, tid).format(self.multiprocess)

    def names_task(self, body: bytes) -> bool:
        """Does this client packet name a task thread (so the stop's list is needed)?"""
        tid = _named_tid(body)
        return tid is not None and is_task_tid(tid)

    # -- lists -------------------------------------------------------------------------
    def thread_pages(self, stub_ids: list[bytes]) -> list[bytes]:
        ids = stub_ids + [self.wire(t) for t in self.all_tids()]
        pages = [b"m" + b",".join(ids[i:i + PAGE]) for i in range(0, len(ids), PAGE)]
        self._pages = pages[1:] + [b"l"]
        return pages[:1] or [b"l"]

    def next_page(self) -> bytes:
        return self._pages.pop(0) if self._pages else b"l"

    def threads_xml(self, stub_doc: bytes) -> bytes:
        # gdb files a <thread id> without a pid under a made-up inferior (pid 42000, its
        # magic null ptid): write task ids with the program's pid, as the stub writes its own
        self.learn_format(re.findall(rb'<thread id="([^"]+)"', stub_doc))
        end = stub_doc.rfind(b"</threads>")
        if end < 0:
            return stub_doc
        doc = stub_doc[:end]
        for lwp, t in self.running.items():  # a running task shows on its real thread
            doc = _name_real_thread(doc, lwp, t.name)
        from xml.sax.saxutils import escape, quoteattr  # (it imports urllib: only when needed)

        extra = []
        for tid in self.all_tids():
            name, text = self._name_extra(tid)
            extra.append(f'<thread id="{self.wire(tid).decode()}" name={quoteattr(name)}>{escape(text)}</thread>\n')
        return doc + "".join(extra).encode() + stub_doc[end:]

    def threads_json(self, stub_reply: bytes) -> bytes:
        """lldb's ``jThreadsInfo`` (its only source of thread names with a stub that has no
        ``qThreadStopInfo`` names): the stub's array, or none, plus one entry per task."""
        try:
            items = json.loads(stub_reply) if stub_reply.startswith(b"[") else []
        except ValueError:
            items = []
        for tid in self.all_tids():
            items.append({"tid": tid, "name": self._name_extra(tid)[0], "reason": "none"})
        return escape_binary(json.dumps(items, separators=(",", ":")).encode())

    def _name_extra(self, tid: int) -> tuple[str, str]:
        t = self.tasks.get(tid)
        if t is not None:
            return t.name, t.extra
        return (f"{self.hidden} more tasks",
                f"{self.hidden} tasks past the cap of {self.cap} (monitor async threads N raises it)")

    # -- one packet --------------------------------------------------------------------
    def answer(self, body: bytes) -> bytes | None:
        head = body[:1]
        if head == b"H" and body[1:2] in (b"g", b"c"):
            tid = _tid(body[2:])
            if tid is None or not is_task_tid(tid):
                if body[1:2] == b"g":
                    self.selected = None
                return None
            if not self.knows(tid):
                return b"E01"
            if body[1:2] == b"g":
                self.selected = tid
            return b"OK"
        if head == b"T" and body[1:2] != b"":
            tid = _tid(body[1:])
            if tid is not None and is_task_tid(tid):
                return b"OK" if self.knows(tid) else b"E01"
            return None
        if body.startswith(b"qThreadExtraInfo,"):
            tid = _tid(body[17:])
            if tid is not None and is_task_tid(tid):
                return self._name_extra(tid)[1].encode().hex().encode() if self.knows(tid) else b"E01"
            return None
        if body.startswith(b"qThreadStopInfo"):
            tid = _tid(body[15:])
            if tid is not None and is_task_tid(tid):
                if not self.knows(tid):
                    return b"E01"
                # lldb takes a thread's name from its stop info (`hexname:`), not from qXfer:threads
                name = self._name_extra(tid)[0].encode().hex().encode()
                return b"T00thread:%b;hexname:%b;" % (self.wire(tid), name)
            return None
        if head in (b"m", b"M", b"X"):
            return self._memory(body)
        if self.selected is not None:
            if body == b"g":
                return self._g(self.selected)
            if head == b"p":
                return self._p(self.selected, body)
            if head in (b"G", b"P"):
                return WRITE_REFUSED
        return None

    def _memory(self, body: bytes) -> bytes | None:
        try:
            addr_text, _, rest = body[1:].partition(b",")
            addr = int(addr_text, 16)
            size = int(rest.split(b":", 1)[0], 16)
        except ValueError:
            return None
        tid = tid_of_region(addr)
        if tid is None:
            return None
        if body[:1] != b"m":
            return WRITE_REFUSED
        stack = self._stack(tid) if self.knows(tid) else None
        data = stack.read(addr, size) if stack is not None else None
        return data.hex().encode() if data is not None else b"E14"

    # -- registers ---------------------------------------------------------------------
    def _stack(self, tid: int) -> SyntheticStack:
        st = self.stacks.get(tid)
        if st is None:
            t = self.tasks.get(tid)
            frames = []
            for i, f in enumerate(t.frames if t is not None else ()):
                shape = self.shape(f.pc - (1 if i else 0), i > 0) if self.shape is not None else None
                frames.append((f.pc, f.self_addr, shape))
            st = self.stacks[tid] = lay_out(frames, region_of(tid), self.end_ra)
        return st

    def _block(self, tid: int) -> bytes:
        regs = self._stack(tid).regs
        data = bytearray(self._template)
        for i, name in enumerate(_G_NAMES):
            if 8 * i + 8 <= len(data):
                data[8 * i:8 * i + 8] = (regs.get(name, 0) & ((1 << 64) - 1)).to_bytes(8, "little")
        return bytes(data)

    def _g(self, tid: int) -> bytes:
        return self._block(tid).hex().encode()

    def _p(self, tid: int, body: bytes) -> bytes:
        try:
            n = int(body[1:].split(b";", 1)[0], 16)
        except ValueError:
            return b"E01"
        data = self._block(tid)
        off = sum(_SIZES[:n]) if n < len(_SIZES) else None
        if off is None or off + _SIZES[n] > len(data):
            return b"E01"
        return data[off:off + _SIZES[n]].hex().encode()

    # -- resuming ----------------------------------------------------------------------
    def resume(self, resume: Resume, hc_task: bool) -> tuple[str, bytes]:
        """("forward", body) with the task actions dropped, ("refuse", error reply), or
        ("same", b"") when the packet names no task thread."""
        if resume.legacy is not None:
            if hc_task and resume.is_step:
                return "refuse", STEP_REFUSED
            return "same", b""
        task_actions = [a for a in resume.actions if a.thread is not None and is_task_tid(a.thread.tid)]
        if not task_actions:
            return "same", b""
        if any(a.is_step for a in task_actions):
            return "refuse", STEP_REFUSED
        kept = [a for a in resume.actions if a not in task_actions]
        if not kept:
            kept = [ResumeAction("c")]
        return "forward", Resume(tuple(kept)).build()


def _tid(text: bytes) -> int | None:
    try:
        t = ThreadId.parse(text.split(b";", 1)[0])
    except MalformedPacket:
        return None
    return t.tid


def _named_tid(body: bytes) -> int | None:
    if body[:1] == b"H" and body[1:2] in (b"g", b"c"):
        return _tid(body[2:])
    if body[:1] == b"T" and len(body) > 1:
        return _tid(body[1:])
    if body.startswith(b"qThreadExtraInfo,"):
        return _tid(body[17:])
    if body.startswith(b"qThreadStopInfo"):
        return _tid(body[15:])
    if body[:1] in (b"m", b"M", b"X"):
        try:
            return tid_of_region(int(body[1:].split(b",", 1)[0], 16))
        except ValueError:
            return None
    if body.startswith(b"vCont;"):
        for m in re.finditer(rb":(p[0-9a-f]+\.)?([0-9a-f]+)", body):
            if int(m.group(2), 16) >= TID_BASE:
                return int(m.group(2), 16)
    return None


def _name_real_thread(doc: bytes, lwp: int, name: str) -> bytes:
    """Add the running task to a real thread's name attribute (or give it one)."""
    from xml.sax.saxutils import quoteattr

    rx = re.compile(rb'<thread id="(?:p[0-9a-f]+\.)?%x"([^>]*?)(/?)>' % lwp)
    m = rx.search(doc)
    if m is None:
        return doc
    attrs = m.group(1)
    nm = re.search(rb'name="([^"]*)"', attrs)
    label = f"[{name}]"
    if nm is not None:
        new_attrs = attrs[:nm.start()] + b'name=' + quoteattr(nm.group(1).decode() + " " + label).encode() \
            + attrs[nm.end():]
    else:
        new_attrs = attrs + b" name=" + quoteattr(label).encode()
    return doc[:m.start(1)] + new_attrs + doc[m.end(1):]
