"""Run a question that reads the stopped program once, answering its reads as it asks.

A monitor command, a qXfer document or task threads build the stop's snapshot, which
reads memory and the threads' registers as it goes. ``Asker`` runs that question on a
helper thread and hands every read the question cannot answer itself (what a local
reader or an earlier read of this question does not hold) to the session's procedure,
which asks the stub and hands the reply back: the question blocks in the read until
then, and runs once. Only one of the two threads runs at a time (each waits for the
other's message), so the question sees the session exactly as a plain call would, and
the session stays sans-IO: its procedure yields ``Exchange``s as any other does.

Before, a question that met a read not yet answered got None, and the session read
what it missed and asked it again, whole (up to 32 times: one pass per pointer hop of
the deepest await tree); the first ``tree`` of a stop paid the whole snapshot at least
twice (the first pass without the threads' registers).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Abandoned(BaseException):
    """Raised inside the question when its procedure ended before it did (the session
    closed): it unwinds, nothing is answered. A BaseException: no ``except Exception``
    of a question swallows it."""


class Asker(Generic[T]):
    """``question(ask)`` on its own thread; ``ask(request)`` blocks it until ``answer``.

    The caller: ``next()`` returns ("ask", request), ("done", result) or ("raised",
    exception); after an "ask", ``answer(value)`` and ``next()`` again; ``abandon()`` when
    it stops before "done" or "raised"."""

    def __init__(self, question: Callable[[Callable[[Any], Any]], T], name: str = "asyncrsp-question") -> None:
        self._question = question
        self._to_question: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._to_caller: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._started = False
        self._ended = False

    def _run(self) -> None:
        try:
            result = self._question(self.ask)
        except Abandoned:
            self._to_caller.put(("abandoned", None))
        except BaseException as err:  # noqa: BLE001 - handed to the caller, raised there
            self._to_caller.put(("raised", err))
        else:
            self._to_caller.put(("done", result))

    def ask(self, request: Any) -> Any:
        """(On the question's thread.) The caller's answer to ``request``."""
        self._to_caller.put(("ask", request))
        kind, value = self._to_question.get()
        if kind == "abandon":
            raise Abandoned()
        return value

    def next(self) -> tuple[str, Any]:
        if not self._started:
            self._started = True
            self._thread.start()
        kind, value = self._to_caller.get()
        if kind != "ask":
            self._ended = True
            self._thread.join()
        return kind, value

    def answer(self, value: Any) -> None:
        self._to_question.put(("answer", value))

    def abandon(self) -> None:
        """Unwind a question still waiting for an answer (its thread ends)."""
        if self._started and not self._ended:
            self._ended = True
            self._to_question.put(("abandon", None))
            self._to_caller.get()  # its "abandoned" (or what it raised on the way out)
            self._thread.join()
