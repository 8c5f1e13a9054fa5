"""Connecting to the stub: TCP, a Unix socket, or a stub spawned on a pipe."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import trio

# trio is imported where a stub is connected: `serve` parses --upstream before
# it imports anything heavy (listen.py).


class UpstreamError(Exception):
    """The stub could not be reached; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    kind: str  # "tcp" | "unix" | "spawn" | "core"
    host: str = ""
    port: int = 0
    path: str = ""
    argv: tuple[str, ...] = ()
    image: object | None = field(default=None, compare=False)  # core: the opened ProgramImage

    @classmethod
    def parse(cls, text: str) -> UpstreamSpec:
        if text.startswith("|"):
            argv = tuple(shlex.split(text[1:]))
            if not argv:
                raise UpstreamError("empty command after '|'")
            return cls("spawn", argv=argv)
        if text.startswith("unix:"):
            return cls("unix", path=text[5:])
        host, sep, port = text.rpartition(":")
        if not sep or not port.isdigit():
            raise UpstreamError(f"upstream '{text}': expected HOST:PORT, unix:PATH or '|COMMAND'")
        return cls("tcp", host=host or "127.0.0.1", port=int(port))

    @property
    def is_local(self) -> bool:
        # A core's pid is no process of this host: nothing may be read from /proc (rule 14).
        return self.kind in ("unix", "spawn") or self.host in ("127.0.0.1", "localhost", "::1")

    def describe(self) -> str:
        if self.kind == "spawn":
            return "|" + shlex.join(self.argv)
        if self.kind == "unix":
            return f"unix:{self.path}"
        if self.kind == "core":
            return f"core:{self.path}"
        return f"{self.host}:{self.port}"


class Upstream:
    """A connected stub: a trio stream, plus the process when we spawned it."""

    def __init__(self, stream: trio.abc.Stream, process: trio.Process | None) -> None:
        self.stream = stream
        self.process = process

    async def aclose(self) -> None:
        import trio

        with trio.CancelScope(shield=True):
            try:
                await self.stream.aclose()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            if self.process is not None:
                await _reap(self.process)


async def _reap(proc: trio.Process) -> None:
    """A spawned stub dies with the session: no orphans (its program neither)."""
    import trio

    with trio.move_on_after(2):
        await proc.wait()
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        pass
    with trio.move_on_after(2):
        await proc.wait()
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    await proc.wait()


async def connect(spec: UpstreamSpec) -> Upstream:
    import trio

    if spec.kind == "core":
        from proxy.shell.corestub import CoreStubStream

        return Upstream(CoreStubStream(spec.image), None)  # type: ignore[arg-type]
    if spec.kind == "tcp":
        try:
            stream = await trio.open_tcp_stream(spec.host, spec.port)
        except OSError as err:
            raise UpstreamError(f"cannot reach the stub at {spec.host}:{spec.port}: {err.strerror or err}") from None
        stream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return Upstream(stream, None)
    if spec.kind == "unix":
        try:
            return Upstream(await trio.open_unix_socket(spec.path), None)
        except OSError as err:
            raise UpstreamError(f"cannot reach the stub at unix:{spec.path}: {err.strerror or err}") from None
    try:
        proc = await trio.lowlevel.open_process(
            list(spec.argv),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sys.stderr.fileno(),
            start_new_session=True,  # its own process group, so it can be taken down whole
        )
    except OSError as err:
        raise UpstreamError(f"cannot start the stub '{spec.argv[0]}': {err.strerror or err}") from None
    assert proc.stdin is not None and proc.stdout is not None
    return Upstream(trio.StapledStream(proc.stdin, proc.stdout), proc)
