"""Drive an interactive debugger console (gdb CLI, lldb) through a pty.

Theory of operation: the debugger runs on the slave side of a pseudo
terminal, exactly as a user's terminal would run it, so Ctrl-C is the real
thing (the byte 0x03 written to the master becomes SIGINT for the debugger,
which then sends the RSP interrupt). A command is written with a newline;
its output is everything up to the next prompt. ``TERM=dumb`` and the
caller's settings keep line editing and colours out of the output; the echo
of the command itself is dropped.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]")


def _controlling_tty() -> None:
    """In the child: new session, and the pty (fd 0) as controlling terminal,
    so that a 0x03 typed on the master is SIGINT for the debugger's group."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class ConsoleTimeout(RuntimeError):
    """The prompt did not come back in time; carries the transcript so far."""


class PtyConsole:
    """One interactive debugger on a pty; ``cmd()`` returns a command's output."""

    def __init__(self, argv: Sequence[str], prompt: str,
                 env: Mapping[str, str] | None = None, timeout: float = 30.0) -> None:
        self.prompt = prompt
        self.timeout = timeout
        self.transcript: list[tuple[str, str]] = []
        master, slave = pty.openpty()
        full_env = {**os.environ, "TERM": "dumb", "COLUMNS": "500", "LINES": "10000", **(env or {})}
        self.proc = subprocess.Popen(list(argv), stdin=slave, stdout=slave, stderr=slave,
                                     env=full_env, preexec_fn=_controlling_tty, close_fds=True)
        os.close(slave)
        self.master = master
        self._buf = b""
        self.banner = self._read_until_prompt(timeout)

    # ---------------------------------------------------------------- reading

    def _read_some(self, timeout: float) -> bytes:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return b""
        try:
            return os.read(self.master, 65536)
        except OSError:  # EIO: the slave side closed (debugger exited)
            raise EOFError from None

    def _read_until_prompt(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        marker = self.prompt.encode()
        while True:
            idx = self._buf.find(marker)
            if idx >= 0:
                out, self._buf = self._buf[:idx], self._buf[idx + len(marker):]
                return self._clean(out)
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConsoleTimeout(f"no prompt {self.prompt!r} after {timeout}s; got {self._buf!r}")
            try:
                self._buf += self._read_some(min(left, 0.2))
            except EOFError:
                out, self._buf = self._buf, b""
                return self._clean(out)

    @staticmethod
    def _clean(raw: bytes) -> str:
        text = ANSI.sub("", raw.decode(errors="replace")).replace("\r\n", "\n").replace("\r", "")
        return text

    # ---------------------------------------------------------------- writing

    def cmd(self, line: str, timeout: float | None = None) -> str:
        """Run ``line`` and return its output (without the echoed command)."""
        os.write(self.master, line.encode() + b"\n")
        out = self._read_until_prompt(timeout or self.timeout)
        first, _, rest = out.partition("\n")
        if first.strip() == line.strip():
            out = rest
        self.transcript.append((line, out))
        return out

    def send_raw(self, data: bytes) -> None:
        os.write(self.master, data)

    def interrupt(self, timeout: float | None = None) -> str:
        """Type Ctrl-C and return the output up to the next prompt."""
        os.write(self.master, b"\x03")
        out = self._read_until_prompt(timeout or self.timeout)
        self.transcript.append(("<Ctrl-C>", out))
        return out

    def start(self, line: str) -> None:
        """Write ``line`` without waiting for the prompt (e.g. ``continue``)."""
        os.write(self.master, line.encode() + b"\n")
        self.transcript.append((line, "<started>"))

    def wait_prompt(self, timeout: float | None = None) -> str:
        out = self._read_until_prompt(timeout or self.timeout)
        first, _, rest = out.partition("\n")
        return rest if self.transcript and first.strip() == self.transcript[-1][0] else out

    def close(self) -> int | None:
        try:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            code = None
        try:
            os.close(self.master)
        except OSError:
            pass
        return code

    def __enter__(self) -> PtyConsole:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
