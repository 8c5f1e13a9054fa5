"""Restore code bytes in a local process through /proc/PID/mem.

A fork child inherits the parent's memory, the capture's breakpoints
included (tracepoints' int3s, uprobes' int3s). Backends that run on the
program's host put the file's bytes back in the child with this.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from collections.abc import Iterable
from typing import Any


def host_pid_of(target: Any, stub_pid: int) -> int | None:
    """The host pid of a process of the program's the stub numbers `stub_pid`
    (a fork child), proven by proxy/host/identity.py; None when it is not this
    host's: nothing may be written then. A target without an identity (a
    backend driven directly, as the backend tests do) takes the pid as is."""
    ident = getattr(target, "identity", None)
    if ident is None:
        return stub_pid if getattr(target, "local", False) else None
    return ident.host_pid_of(stub_pid)


def restore_code(pid: int, originals: Iterable[tuple[int, bytes]]) -> int:
    """Write each (address, bytes) back where memory differs; return how many
    could not be written. Raises OSError when the process's memory cannot be
    opened at all."""
    failed = 0
    fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
    try:
        for addr, orig in originals:
            if not orig:
                continue
            try:
                if os.pread(fd, len(orig), addr) != orig:
                    os.pwrite(fd, orig, addr)
            except OSError:
                failed += 1
    finally:
        os.close(fd)
    return failed


@dataclass(slots=True)
class Mapping:
    start: int
    end: int
    perms: str
    offset: int
    path: str


def read_maps(pid: int) -> list[Mapping]:
    with open(f"/proc/{pid}/maps") as fh:
        return parse_maps(fh.read())


def parse_maps(text: str) -> list[Mapping]:
    """A /proc/PID/maps text (read here, or through a stub's vFile); a malformed line is skipped."""
    out = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        try:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append(Mapping(lo, hi, parts[1], int(parts[2], 16), parts[5].strip() if len(parts) > 5 else ""))
        except (ValueError, IndexError):
            continue
    return out


def sigint_pending(pid: int) -> bool:
    """A SIGINT waits in the kernel for local process `pid`: the process's
    shared pending set or one of its threads' (/proc/PID[/task/TID]/status,
    ShdPnd and SigPnd; SIGINT is bit 1). Raises OSError when it is gone."""
    paths = [f"/proc/{pid}/status"] + [f"/proc/{pid}/task/{t}/status" for t in os.listdir(f"/proc/{pid}/task")]
    for path in paths:
        try:
            text = open(path).read()
        except OSError:
            continue  # a thread that just exited
        if sigint_in_status(text):
            return True
    return False


def sigint_in_status(text: str) -> bool:
    """A SIGINT waits in a /proc/PID/status (ShdPnd: the process's shared
    pending set; SigPnd: the thread's; SIGINT is bit 1)."""
    for line in text.splitlines():
        if line.startswith(("ShdPnd:", "SigPnd:")):
            try:
                if int(line.split()[1], 16) & (1 << (signal.SIGINT - 1)):
                    return True
            except (IndexError, ValueError):
                continue
    return False
