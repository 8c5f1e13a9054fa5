"""Capture through hidden breakpoints: works with any stub.

Theory of operation: one hidden probe on the entry of every resume function
(kind "entry") and one on each of its `ret`s (kind "exit"). At an entry the
backend reads the registers (`g`: the self pointer is in the function's
``self_in`` register: x86-64's rdi, or rsi when a large `Poll<T>` is returned
through memory; AArch64's x0) and the return address (x86-64: `m rsp,8`;
AArch64: the link register x30, in the same `g`), where the program's
architecture (proxy/arch, ``Target.arch``) puts them in the `g` block; at an
exit it reads the coroutine's `__state` through the self
pointer of the thread's innermost poll scope, which the engine knows. Those
reads ride in the same exchange as the step-over, so an event costs no extra
round trip. Engine events carry a sequence number in hit order.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from proxy.analysis.model import ResumeFn
from proxy.arch import X86_64, Arch
from proxy.capture.base import CaptureBase
from proxy.capture.target import Target
from proxy.graph.events import PollEnter, PollExit
from proxy.probes import Probe
from rsp.packets.memory import memory_bytes
from rsp.packets.stop import StopReply



class BreakpointCapture(CaptureBase):
    name = "breakpoints"

    def __init__(
        self,
        *,
        only: str | None = None,
        exclude: str | None = None,
        entry_only: bool = False,
    ) -> None:
        super().__init__()
        self._only = re.compile(only) if only else None
        self._exclude = re.compile(exclude) if exclude else None
        self._entry_only = entry_only
        self._seq = 0
        self.arch: Arch = X86_64

    # -- planning
    def _wanted(self, fn: ResumeFn) -> bool:
        if self._only is not None and not self._only.search(fn.name):
            return False
        return not (self._exclude is not None and self._exclude.search(fn.name))

    def plan(self, target: Target) -> list[Probe]:
        self.target = target
        self.note = target.note
        self.arch = target.arch
        inv, bias = target.inventory, target.bias
        if inv is None or target.engine is None:
            return []
        self._seq = target.engine.cursor_seq or 0
        code = _code_reader(target.path)
        probes = []
        for fn in inv.resume_fns:
            if not fn.low_pc or not self._wanted(fn):
                continue
            site = fn.low_pc + bias
            probes.append(Probe(fn.name, site, kind="entry", site=site, code=code(fn.low_pc)))
            if not self._entry_only:
                for r in fn.rets:
                    probes.append(Probe(fn.name + " (ret)", r + bias, kind="exit", site=site, code=code(r)))
                # A panic leaves through `call _Unwind_Resume` after the landing
                # pad wrote __state = 2 (Panicked): ret probes alone miss it.
                for x in fn.other_exits:
                    probes.append(Probe(fn.name + " (unwind)", x + bias, kind="unwind", site=site))
        return probes

    # -- at a hit
    def reads(self, probe: Probe, thread: int, stop: StopReply) -> tuple[bytes, ...]:
        if probe.kind == "entry":
            sp = stop.register_value(self.arch.regnum(self.arch.sp))
            # the return address: in the link register (in `g`), or the word at sp
            return (b"g",) if sp is None or self.arch.lr is not None else (b"g", b"m%x,8" % sp)
        if probe.kind in ("exit", "unwind") and self.engine is not None:
            self_ptr = self._scope_self(thread, probe.site)
            layout = self.engine.catalog.layout_for(probe.site)
            if self_ptr is not None and layout is not None:
                return (b"m%x,%x" % (self_ptr + layout.state_offset, layout.state_size),)
        return ()

    def _scope_self(self, thread: int, site: int) -> int | None:
        """The self pointer of the thread's innermost poll scope, if it is `site`'s."""
        assert self.engine is not None
        scope = self.engine.current_scope(thread)
        if scope is None or scope.site != site:
            return None
        task = self.engine.task(scope.task)
        return task.self_ptr if task is not None else None

    def hit(self, probe: Probe, thread: int, stop: StopReply, replies: list[bytes]) -> None:
        if self.engine is None or probe.kind not in ("entry", "exit", "unwind"):
            return
        self._seq += 1
        self.events += 1
        # No timestamp comes from the stub: the proxy's clock when it handles
        # the hit (CLOCK_MONOTONIC, like gdbserver's trace_timestamp).
        now = time.monotonic_ns()
        arch = self.arch
        sp = stop.register_value(arch.regnum(arch.sp)) or 0
        if probe.kind == "entry":
            regs = _bytes(replies[0]) if replies else None
            fn = self.engine.catalog.resume_fn(probe.site)
            reg = fn.self_in if fn is not None and fn.self_in in arch.args else arch.self_register(False)
            self_ptr = arch.read_g(regs, reg) if regs else None
            if arch.lr is not None:
                ret = arch.read_g(regs, arch.lr) if regs else None
            else:
                ret = _le(_bytes(replies[1]), 0, 8) if len(replies) > 1 else None
            if self_ptr is None:
                return
            self.engine.feed(PollEnter(self._seq, thread, probe.site, self_ptr, sp, ret, time_ns=now))
        else:
            state = None
            if replies:
                data = _bytes(replies[0])
                if data:
                    state = int.from_bytes(data, "little")
            self_ptr = self._scope_self(thread, probe.site)
            self.engine.feed(PollExit(self._seq, thread, probe.site, sp, state, self_ptr,
                                      panicked=probe.kind == "unwind", time_ns=now))


def make(*, mode: str = "full", only: str | None = None, exclude: str | None = None,
         options: dict[str, object] | None = None) -> BreakpointCapture:
    return BreakpointCapture(only=only, exclude=exclude, entry_only=mode == "entry")


def _code_reader(path: str | None) -> Callable[[int], bytes]:
    """link-time address -> the file's bytes there (what the session may emulate)."""
    try:
        from proxy.analysis.elf import open_elf

        image = open_elf(path) if path else None
    except Exception:  # noqa: BLE001 - without the bytes the session steps over instead
        image = None
    return lambda addr: (image.read(addr, 8) or b"") if image is not None else b""


def _bytes(reply: bytes) -> bytes | None:
    # gdbserver marks registers it cannot read as "xx": read them as zeros
    return memory_bytes(reply.replace(b"xx", b"00")) if reply else None


def _le(data: bytes | None, off: int, size: int) -> int | None:
    if data is None or len(data) < off + size:
        return None
    return int.from_bytes(data[off:off + size], "little")
