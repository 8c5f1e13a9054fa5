"""The session's side of task threads: when to ask for the tasks, and what to forward.

Small on purpose: ``TaskThreads`` is a part the session holds (``session.task_threads``)
with two entry points, ``request`` (every client packet, before the session's own
routing) and ``resume`` (a client resume). The
answers themselves come from ``view.TaskThreadView``; the tasks from the
session's ``config.task_threads`` (``adapter.from_snapshot`` composed in
``proxy.app``). Nothing naming a task thread or the synthetic region is ever
forwarded to the stub (DESIGN.md §3 rule 13).

The stop's task list is read at the first thread query after a stop (the
stub's threads' registers when asked for, then the snapshot, its memory read as it
asks, like a monitor command) and kept until the client resumes.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any

from rsp.framing import unescape_binary
from rsp.packets.qxfer import QXferRead, build_qxfer_reply, parse_qxfer
from rsp.packets.resume import Resume
from rsp.errors import MalformedPacket

from proxy.procedure import Exchange, Procedure
from proxy.session.actions import Notice
from proxy.threads.view import TaskThreadView

if TYPE_CHECKING:
    from .core import Session




class TaskThreads:
    """The session's part for task threads. It owns their state between packets (the view
    of the stop's tasks, the client's paging through the thread list, whether its ``Hc``
    named a task thread, the threads document); it uses the session only to run its
    procedures and to reply or forward (``session``: ``running``, ``non_stop``, whether a
    stop was seen, ``config.task_threads``, ``current_thread``, ``queries.with_reads``,
    ``start_proc``/``end_proc``, ``reply``, ``forward``, ``emit``)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.view: TaskThreadView | None = None
        self._listing = False  # the client pages through our qfThreadInfo answer
        self._hc_task = False  # the client's last Hc named a task thread
        self.doc: bytes | None = None  # the stop's qXfer:threads document (its chunks: one document)

    def refused(self) -> str | None:
        """Why task threads cannot be shown for this program: their `g` blocks and synthetic
        frames are x86-64's (threads/view.py, threads/stack.py)."""
        arch = self.session.arch
        return arch.unsupported("task threads") if arch.name != "x86-64" else None

    @property
    def shown(self) -> bool:
        """Task threads may be in the client's view: `request` may answer a packet."""
        view = self.view
        return view is not None and view.enabled and self.session.config.task_threads is not None

    def request(self, body: bytes) -> bool:
        """Answer a client packet about task threads; False: not ours, route it as usual."""
        view = self.view
        if view is None or not view.enabled or self.session.running or self.session.config.task_threads is None:
            return False
        if self.refused() is not None:
            return False
        if self.session.non_stop:
            # Non-stop: other threads run while the client looks at one, so no moment holds
            # every task still; task threads are all-stop only (never listed, never named).
            return False
        if self.session.stopped is None:
            # No stop seen yet (lldb lists threads before its `?`): the program's pid,
            # file and threads are not known, so there are no tasks to read yet.
            return False
        if body in (b"qfThreadInfo", b"jThreadsInfo") or body.startswith(b"qXfer:threads:read:"):
            self.session.start_proc(self._proc_thread_query(body))
            return True
        if body == b"qsThreadInfo" and self._listing:
            self.session.reply(view.next_page())
            return True
        if body[:2] == b"Hc":
            self._hc_task = view.names_task(body)
        if not view.fresh:
            if view.names_task(body):
                self.session.start_proc(self._proc_thread_query(body))
                return True
            return False
        reply = view.answer(body)
        if reply is None:
            return False
        self.session.reply(reply)
        return True

    def resume(self, resume: Resume) -> tuple[str, bytes]:
        """("same", b""), ("forward", new body) or ("refuse", reply); the stop's tasks go stale."""
        view = self.view
        if view is None or not view.enabled or self.refused() is not None:
            return "same", b""
        verdict = view.resume(resume, self._hc_task)
        if verdict[0] != "refuse":
            self.stale()
        return verdict

    def stale(self) -> None:
        """The program resumes: the stop's task threads no longer hold."""
        if self.view is not None:
            self.view.stale()
        self._listing = False
        self.doc = None

    # -- procedures ----------------------------------------------------------------------
    def _proc_thread_query(self, body: bytes) -> Procedure:
        view = self.view
        assert view is not None
        if not view.fresh:
            yield from self._read_tasks(view)
        if body == b"qfThreadInfo":
            ids = yield from self._stub_thread_ids()
            view.learn_format(ids)
            self._listing = True
            self.session.end_proc()
            self.session.reply(view.thread_pages(ids)[0])
            return
        if body == b"jThreadsInfo":
            (rep,) = yield Exchange((body,))
            self.session.end_proc()
            self.session.reply(view.threads_json(rep) if view.all_tids() else rep)
            return
        if body.startswith(b"qXfer:threads:read:"):
            try:
                req = parse_qxfer(body)
            except MalformedPacket:
                req = None
            if not isinstance(req, QXferRead):
                self.session.end_proc()
                self.session.reply(b"E00")
                return
            if req.offset == 0 or self.doc is None:
                doc = yield from self._stub_threads_doc()
                if doc is None:  # the stub has no such object: its reply, as it gave it
                    self.session.end_proc()
                    self.session.reply(b"E00")
                    return
                self.doc = view.threads_xml(doc)
            self.session.end_proc()
            self.session.reply(build_qxfer_reply(self.doc, req.offset, req.length))
            return
        self.session.end_proc()
        reply = view.answer(body)
        if reply is not None:
            self.session.reply(reply)
        else:
            self.session.forward(body, None)

    def _stub_thread_ids(self) -> Generator[Exchange, list[bytes], list[bytes]]:
        ids: list[bytes] = []
        ask = b"qfThreadInfo"
        for _ in range(4096):
            (rep,) = yield Exchange((ask,))
            if not rep.startswith(b"m"):
                break
            ids += [t for t in rep[1:].split(b",") if t]
            ask = b"qsThreadInfo"
        return ids

    def _stub_threads_doc(self) -> Generator[Exchange, list[bytes], bytes | None]:
        doc = b""
        for _ in range(4096):
            (rep,) = yield Exchange((b"qXfer:threads:read::%x,%x" % (len(doc), 0x3FFF),))
            if rep[:1] not in (b"m", b"l"):
                return None
            doc += unescape_binary(rep[1:])
            if rep[:1] == b"l":
                break
        return doc

    def _read_tasks(self, view: TaskThreadView) -> Generator[Exchange, list[bytes], None]:
        """The live tasks at this stop, read like a monitor command (``queries.with_reads``: memory
        read as it is asked for; the threads' registers only when the tasks are looked for, so a
        program without coroutines costs nothing more at a stop: the matrix's C programs
        under lldb met their interrupt at another moment when each stop took 0.2 s longer)."""
        fn = self.session.config.task_threads
        assert fn is not None
        seen: dict[int, bytes] = {}

        def answer(read: Callable[[int, int], bytes | None]) -> tuple[list[Any], Any, int, int]:
            got = fn(self.session, read)
            if got[0] and self.session.queries.monitor_threads is not None:  # tasks: the registers were read
                seen.update(self.session.queries.monitor_threads() or {})
            return got  # type: ignore[no-any-return]

        try:
            tasks, shape, end_ra, unread = yield from self.session.queries.with_reads(answer)
        except Exception as err:  # noqa: BLE001 - a reflection bug must not end the session
            self.session.emit(Notice(f"task threads: reading the tasks failed: {err!r}"))
            tasks, shape, end_ra, unread = [], None, 0, 0
        stop = self.session.current_thread()
        template = seen.get(stop) if stop is not None else None
        template = template or next(iter(seen.values()), b"")
        view.set_tasks(tasks, template, shape, end_ra, unread)
