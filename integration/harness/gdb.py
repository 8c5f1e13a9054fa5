"""Drive a real gdb: the CLI on a pty, gdb/MI on pipes, and batch mode.

* :func:`gdb_cli` starts an interactive gdb on a pty (:class:`PtyConsole`),
  so that Ctrl-C is a real terminal interrupt.
* :class:`MiSession` runs ``gdb --interpreter=mi3`` on pipes with a small MI
  record parser: ``cmd()`` waits for the command's ``^result`` and
  ``wait_stopped()`` for the next ``*stopped`` record.
* :func:`gdb_batch` runs ``gdb -nx -batch -ex ...`` and returns its output.

All of them start gdb with ``-nx`` (no ~/.gdbinit) and the same settings, so
output does not depend on the terminal, the pager or the sysroot transfer.
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import debuggers
from .console import PtyConsole

INIT = ("set pagination off", "set confirm off", "set style enabled off", "set width 0",
        "set height 0", "set sysroot /", "set print thread-events off")


def _init_args(init: Sequence[str]) -> list[str]:
    out: list[str] = []
    for line in (*INIT, *init):
        out += ["-iex", line]
    return out


def gdb_cli(program: Path, init: Sequence[str] = (), timeout: float = 30.0) -> PtyConsole:
    """An interactive gdb on ``program``; connect with ``cmd('target remote ...')``."""
    return PtyConsole(debuggers.argv("gdb", "-nx", "-q", *_init_args(init), str(program)), "(gdb) ",
                      timeout=timeout)


@dataclass(frozen=True)
class GdbRun:
    returncode: int
    output: str


def gdb_batch(program: Path, commands: Sequence[str], init: Sequence[str] = (),
              timeout: float = 60.0) -> GdbRun:
    """``gdb -nx -batch -ex C1 -ex C2 ... PROGRAM`` (stdout and stderr merged)."""
    argv = debuggers.argv("gdb", "-nx", "-batch", *_init_args(init))
    for c in commands:
        argv += ["-ex", c]
    res = subprocess.run([*argv, str(program)], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=timeout, check=False)
    return GdbRun(res.returncode, res.stdout + res.stderr)


# ----------------------------------------------------------------- gdb/MI

MiValue = str | dict[str, "MiValue"] | list["MiValue"]


class MiParseError(ValueError):
    """An MI record that does not follow the grammar."""


def _parse_cstring(s: str, i: int) -> tuple[str, int]:
    assert s[i] == '"'
    out: list[str] = []
    i += 1
    while s[i] != '"':
        if s[i] == "\\":
            i += 1
            out.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\"}.get(s[i], "\\" + s[i]))
        else:
            out.append(s[i])
        i += 1
    return "".join(out), i + 1


def _parse_value(s: str, i: int) -> tuple[MiValue, int]:
    c = s[i]
    if c == '"':
        return _parse_cstring(s, i)
    close = "}" if c == "{" else "]"
    if c not in "{[":
        raise MiParseError(f"unexpected {c!r} at {i} in {s!r}")
    i += 1
    items: list[MiValue] = []
    named: dict[str, MiValue] = {}
    while s[i] != close:
        m = re.compile(r"([\w-]+)=").match(s, i)
        if m:
            value, i = _parse_value(s, m.end())
            named[m.group(1)] = value
            items.append({m.group(1): value})
        else:
            value, i = _parse_value(s, i)
            items.append(value)
        if s[i] == ",":
            i += 1
    if c == "{":
        return named, i + 1
    return items, i + 1


def parse_results(s: str) -> dict[str, MiValue]:
    """Parse ``a=1,b={c="2"},d=[...]`` (the tail of an MI record)."""
    value, _ = _parse_value("{" + s + "}", 0)
    assert isinstance(value, dict)
    return value


@dataclass(frozen=True)
class MiRecord:
    """One MI output line: kind is one of ``^ * + = ~ @ &``."""

    kind: str
    token: str
    cls: str          # result/async class (done, running, stopped, ...), or "" for streams
    results: dict[str, MiValue]
    text: str         # stream text for ~ @ &
    raw: str


RECORD = re.compile(r"^(\d*)([\^*+=])([\w-]+),?(.*)$")


def parse_record(line: str) -> MiRecord:
    if line[:1] in "~@&":
        text, _ = _parse_cstring(line, 1)
        return MiRecord(line[0], "", "", {}, text, line)
    m = RECORD.match(line)
    if not m:
        raise MiParseError(f"not an MI record: {line!r}")
    results = parse_results(m.group(4)) if m.group(4) else {}
    return MiRecord(m.group(2), m.group(1), m.group(3), results, "", line)


@dataclass
class MiSession:
    """``gdb --interpreter=mi3`` on pipes."""

    program: Path
    init: Sequence[str] = ()
    timeout: float = 30.0
    log: list[MiRecord] = field(default_factory=list)
    gdb: str = "gdb"  # or gdb-multiarch (another architecture's program)

    def __post_init__(self) -> None:
        argv = debuggers.argv(self.gdb, "-nx", "-q", "--interpreter=mi3", *_init_args(self.init), str(self.program))
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, bufsize=1,
                                     start_new_session=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        self._token = 100
        self._pending: list[MiRecord] = []
        self._read_until(None, prompt=True)
        # Without mi-async, gdb on a pipe does not read the next command until
        # the target stops, so -exec-interrupt would wait for the program's end.
        self.cmd("-gdb-set mi-async on")

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _next_line(self, deadline: float) -> str | None:
        try:
            return self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"gdb/MI silent; last records: {[r.raw for r in self.log[-8:]]}") from None

    def _read_until(self, done: object, prompt: bool = False,
                    timeout: float | None = None) -> list[MiRecord]:
        """Collect records until ``done(record)`` is true (``done=None``: none
        needed), then, if ``prompt``, until the following ``(gdb)`` line."""
        deadline = time.monotonic() + (timeout or self.timeout)
        got: list[MiRecord] = []
        matched = done is None
        while True:
            line = self._next_line(deadline)
            if line is None:
                return got
            if line.strip() == "(gdb)":
                if matched and prompt:
                    return got
                continue
            try:
                rec = parse_record(line)
            except MiParseError:
                rec = MiRecord("?", "", "", {}, line, line)  # inferior/stub noise
            self.log.append(rec)
            got.append(rec)
            if not matched and done(rec):  # type: ignore[operator]
                matched = True
                if not prompt:
                    return got

    def cmd(self, command: str, timeout: float | None = None) -> list[MiRecord]:
        """Send ``command``; return every record up to its ``^result`` and prompt.

        Marks the log so that :meth:`wait_stopped` only accepts a ``*stopped``
        that arrived after this command was sent."""
        self._token += 1
        tok = str(self._token)
        self._mark = len(self.log)
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{tok}{command}\n")
        self.proc.stdin.flush()
        return self._read_until(lambda r: r.kind == "^" and r.token == tok,
                                prompt=True, timeout=timeout)

    _mark: int = 0

    def wait_stopped(self, timeout: float | None = None, or_error: bool = False) -> MiRecord:
        """The first ``*stopped`` record since the last command was sent (with
        ``or_error``, a late ``^error`` also ends the wait: gdb answers
        ``^running`` and then ``^error`` when it cannot insert a breakpoint)."""
        def done(r: MiRecord) -> bool:
            return (r.kind == "*" and r.cls == "stopped") or (or_error and r.kind == "^" and r.cls == "error")
        for rec in self.log[self._mark:]:
            if done(rec):
                self._mark = self.log.index(rec) + 1
                return rec
        recs = self._read_until(done, timeout=timeout)
        self._mark = len(self.log)
        if not recs or not done(recs[-1]):
            raise TimeoutError("gdb/MI ended before *stopped")
        return recs[-1]

    def console(self, command: str, timeout: float | None = None) -> str:
        """Run a CLI command through MI; return its console and target stream
        text (``monitor`` output arrives as ``@`` target records)."""
        recs = self.cmd(f'-interpreter-exec console "{command}"', timeout)
        return "".join(r.text for r in recs if r.kind in "~@")

    def close(self) -> int | None:
        try:
            if self.proc.poll() is None:
                assert self.proc.stdin is not None
                self.proc.stdin.write("-gdb-exit\n")
                self.proc.stdin.flush()
                return self.proc.wait(timeout=5)
            return self.proc.returncode
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, 9)
            return self.proc.wait(timeout=5)

    def __enter__(self) -> MiSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
