"""Spawns and wakes under uprobe capture: the sites, the spawn records' ring, the wakes map.

The uprobe capture owns one ``SpawnsAndWakes`` (``UprobeCapture.origins``) and
calls it at four points: ``plan`` (the spawn and wake sites join the capture's
own, so the client's view of them, m masking and Z0 -> Z1, is the poll sites'),
``configure`` (the BPF program loaded: where tokio's next task id is, how much
stack a spawn keeps), ``drain`` (while the program runs and at stops: the spawn
records go raw into the ``SpawnLog``) and ``wakes`` (at a command: the tasks'
wake statistics from the kernel's map). Resolving a record (unwind, symbols,
lines) is ``proxy.origins.resolve``'s, when a command shows it.
"""

from __future__ import annotations

import time
from typing import Any

from proxy.analysis.elf import ElfImage
from proxy.analysis.model import Inventory
from proxy.origins.log import SpawnLog
from proxy.origins.records import SPAWN_PATH, SpawnRecord, WakeStats, decode_spawn, decode_wakes
from proxy.origins.resolve import Resolver

from . import bpf as B
from .decode import EntryCapture
from .sites import Site
from .wake_sites import WakePlan, plan_wake_sites

# bytes of stack a spawning path's first record keeps (debug builds: the spawn functions' frames hold
# copies of the future; async-std's connection spawn in the gauntlet's a-chat needs more than 8 KiB);
# later records of the path keep what its first one showed they need (SpawnsAndWakes._learn)
SPAWN_STACK = B.SPAWN_MAX
SPAWN_MARGIN = 256  # bytes kept past the spawning line's frame (its caller's frame starts there)
WAKE_TASKS = 65536  # tasks the kernel folds wakes for (an LRU map: the least recently woken go first)
SIDE_BYTES = 32 << 20  # the spawn records' ring: ~4,000 spawns of 8 KiB between two drains (5-50 ms)


class SpawnsAndWakes:
    def __init__(self, *, wakes: bool = True, wakers: bool = False, spawn_stack: int = SPAWN_STACK,
                 wake_tasks: int = WAKE_TASKS) -> None:
        self.want_wakes = wakes
        self.want_wakers = wakes and wakers  # waker clones and drops (the lost-waker warning)
        self.spawn_stack = spawn_stack
        self.wake_tasks = wake_tasks
        self.plan: WakePlan | None = None
        self.log = SpawnLog()
        self.resolver: Resolver | None = None
        self.bias = 0
        self._ring: B.Ring | None = None
        self._prog: B.Program | None = None
        self._last_wakes: dict[int, WakeStats] = {}
        self.started_ns = 0
        self.learn = True  # size each spawning path's records from its first one (False: all keep spawn_stack)
        self.sized: dict[bytes, int] = {}  # spawning path -> the bytes its records keep

    def plan_sites(self, elf: ElfImage, inv: Inventory, bias: int, unwinder: Any) -> list[Site]:
        self.bias = bias
        self.plan = plan_wake_sites(elf, inv, bias, wakes=self.want_wakes, wakers=self.want_wakers)
        if unwinder is not None:
            self.resolver = Resolver(lambda rec: _unwind(unwinder, rec), _frames_of(elf), bias)
            # a spawn site's frame: where its return address is (the spawning path's key)
            self.plan.sites = [_with_frame(s, unwinder, bias) if s.spec.kind == B.KIND_SPAWN else s
                               for s in self.plan.sites]
        return list(self.plan.sites)

    @property
    def active(self) -> bool:
        return self.plan is not None and bool(self.plan.sites)

    def open_args(self) -> dict[str, int]:
        return {"wake_tasks": self.wake_tasks if self.active else 0, "side_bytes": SIDE_BYTES}

    def configure(self, prog: B.Program) -> None:
        if not self.active:
            return
        assert self.plan is not None
        counter = self.plan.counter + self.bias if self.plan.counter is not None else 0
        prog.set_aux(counter, self.spawn_stack)
        if self.plan.roots:  # task types whose poll is folded at their future's root entry
            prog.set_task_roots({fn: (off, vt_off, [v + self.bias for v in vts])
                                 for fn, (off, vt_off, vts) in self.plan.roots.items()})
        self._prog = prog
        self._ring = prog.side_ring()
        self.started_ns = time.monotonic_ns()
        self.log.since = self.started_ns

    def drain(self) -> None:
        ring = self._ring
        if ring is None:
            return
        got = ring.copy_out()
        if got is None:
            return
        chunk, spans = got
        for off, n in spans:
            # kept as written (decoded when a command asks: ~7 us of Python a record saved, a
            # record a request on a server); only a new spawning path's first record is decoded
            raw = bytes(chunk[off:off + n])
            self.log.add(raw)
            if self.learn and raw[SPAWN_PATH] not in self.sized:
                rec = decode_spawn(raw, 0, n)
                if rec is not None:
                    self._learn(rec)

    def _learn(self, rec: SpawnRecord) -> None:
        """The stack its path's later records keep: the first record unwound (not shown: not
        counted as symbolised) down to the spawning line's frame, plus SPAWN_MARGIN, in 64-byte
        steps. A record whose slice does not reach the line leaves the path at spawn_stack."""
        need = self.resolver.stack_needed(rec) if self.resolver is not None else None
        size = self.spawn_stack if need is None else min(self.spawn_stack, (need + SPAWN_MARGIN + 63) // 64 * 64)
        self.sized[rec.path] = size
        if self._prog is not None and size < self.spawn_stack:
            try:
                self._prog.set_spawn_size(rec.path, size)
            except B.BpfError:
                self.learn = False  # the map is full: later paths keep spawn_stack

    def wakes(self) -> dict[int, WakeStats]:
        """Each runtime task's wake statistics (by header / raw pointer); the last read once closed."""
        if self._prog is not None:
            self._last_wakes = {k: decode_wakes(k, v) for k, v in self._prog.wake_table().items()}
        return self._last_wakes

    def close(self, prog: B.Program) -> None:
        """Before the program's maps go: the last records, the last statistics."""
        if self._prog is None:
            return
        self.drain()
        self.wakes()
        self.log.lost = prog.counters().get("spawns lost", 0)
        if self._ring is not None:
            self._ring.close()
        self._ring = None
        self._prog = None

    def lines(self) -> list[str]:
        if self.plan is None:
            return []
        n_spawn = sum(1 for s in self.plan.sites if s.spec.kind == B.KIND_SPAWN)
        n_wake = len(self.plan.sites) - n_spawn
        out = [f"spawn sites: {n_spawn}, wake sites: {n_wake}" + ("" if self.want_wakes else " (spawns only)")
               + (f"; {len(self.plan.roots)} task types' polls seen at their future's root entry"
                  if self.plan.roots else "")
               + ("" if self.want_wakers or not self.want_wakes else " (no waker clones and drops: --lost-wakers)")]
        if n_spawn:
            out.append(self.log.line() + (f" ({self.resolver.symbolised} so far)" if self.resolver else ""))
            if self.sized:
                small = sorted(v for v in self.sized.values() if v < self.spawn_stack)
                out.append(f"spawning paths: {len(self.sized)} seen, {len(small)} keep less than the first record's "
                           f"{self.spawn_stack:,} bytes of stack (from its unwind"
                           + (f"; {small[0]:,}-{small[-1]:,} bytes)" if small else ")"))
        out += self.plan.notes
        return out


def _unwind(unwinder: Any, rec: SpawnRecord) -> tuple[tuple[int, ...], bool, tuple[int | None, ...]]:
    cap = EntryCapture(0, rec.thread, 0, rec.regs, rec.stack, None)
    res = unwinder.unwind(cap)
    return res.pcs, res.full, res.cfas


def _with_frame(site: Site, unwinder: Any, bias: int) -> Site:
    """A spawn site whose CFA is rsp + N (DWARF register 7) reads its frame's return address at
    rsp + N - 8: its spawning path's key (uprobes.bpf.c struct spawn_path); else none (0)."""
    import dataclasses

    rule = unwinder.cfa_at(site.addr - bias)
    off = rule[1] if rule is not None and rule[0] == 7 else 0
    return dataclasses.replace(site, spec=dataclasses.replace(site.spec, cfa_off=off))


def _frames_of(elf: ElfImage) -> Any:
    from proxy.analysis.lines import pc_to_frames

    return lambda pc: pc_to_frames(elf, pc)
