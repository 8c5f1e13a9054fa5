"""The core stub behind a trio stream: the proxy's upstream when it serves a
core file (`asyncrsp serve --core`). No socket, no thread: `send_all` feeds
the sans-IO `CoreStub` and its replies wait for `receive_some`."""

from __future__ import annotations

import trio

from proxy.corefile.image import ProgramImage
from proxy.corefile.stub import CoreStub


class CoreStubStream(trio.abc.Stream):
    def __init__(self, image: ProgramImage) -> None:
        self.stub = CoreStub(image)
        self._out = bytearray()
        self._ready = trio.Event()
        self._closed = False

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the core stub is closed")
        self.stub.receive_data(bytes(data))
        out = self.stub.data_to_send()
        if out:
            self._out += out
            self._ready.set()
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while not self._out:
            if self._closed:
                return b""
            self._ready = trio.Event()
            await self._ready.wait()
        n = len(self._out) if max_bytes is None else min(max_bytes, len(self._out))
        data = bytes(self._out[:n])
        del self._out[:n]
        return data

    async def aclose(self) -> None:
        self._closed = True
        self._ready.set()
        await trio.lowlevel.checkpoint()
