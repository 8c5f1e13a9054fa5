"""The BPF side of the uprobe capture, through libbpf (``libbpf.so.1``) and ctypes.

Theory of operation: ``Program.open()`` opens the prebuilt object
(``uprobes-<source hash>.bpf.o``, build.py; checked against prebuilt.py) with libbpf, sizes its maps (ring buffer, site table),
marks the program for ``BPF_TRACE_UPROBE_MULTI`` and loads it. ``attach()``
creates one uprobe_multi link per binary with the raw ``bpf(BPF_LINK_CREATE)``
syscall (libbpf 1.1, Debian bookworm's, cannot create it), filtered by pid,
one cookie per site = the site's index in the ``sites`` map. ``Ring`` reads
the ring buffer through ``mmap`` without any wakeup: the BPF side submits
with ``BPF_RB_NO_WAKEUP`` (a wakeup per event tripled the program's cost per
event, ../shared/research/linux-uprobes.md), so the consumer polls on a timer.

No maintained Python binding of libbpf qualifies: ``pylibbpf`` attaches
uprobes without a pid or an offset and has no ring buffer, ``bpfmaps`` only
reads maps. BCC needs kernel headers and bpftrace cannot probe ``ret``
sites. So this module wraps the ~15 libbpf functions it needs.

Everything here is I/O with the kernel; the decoding of records is in
``decode.py`` (pure).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from . import prebuilt

HERE = Path(__file__).resolve().parent
OBJECT = HERE / prebuilt.OBJECT_NAME
PROGRAM_NAME = b"asyncrsp_poll"
# Count sites only (every site KIND_COUNT: --probe on a program with no resume
# functions): loaded alone, the verifier's ~0.55 s over asyncrsp_poll is not paid.
COUNT_PROGRAM_NAME = b"asyncrsp_count"
PROGRAMS = (PROGRAM_NAME, COUNT_PROGRAM_NAME)

SYS_BPF = 321  # x86-64
BPF_LINK_CREATE = 28
BPF_TRACE_UPROBE_MULTI = 48
PAGE = mmap.PAGESIZE

# struct site in uprobes.bpf.c: kind, self_reg, state_size, cfa_reg, cfa_off, state_off, sp_adjust, fn, ret_back
SITE = struct.Struct("<BBBBiIiII")
CONFIG = struct.Struct("<IIqIIII")  # tgid, stack_max, stack credits, sample_every, flags, epoch, pad
CFG_DEDUPE = 1  # drop a hit that repeats the thread's last (ip, sp): two links on one site
CFG_OFF = 2  # the program returns at once (the benchmark's floor: the traps alone)
CFG_NOFOLD = 4  # every poll recorded: no instance totals in the kernel, no KIND_STATS records
CFG_CHANGES = 8  # only what changes the graph recorded, every poll folded in the kernel
CFG_ELIDE = 16  # full mode: coroutines created and completed inside one poll of their parent write no record
CFG_ADAPT = 32  # full mode sampling while the proxy is behind: every poll folded, no KIND_STATS for a life recorded whole
CFG_ROOTS = 1 << 12  # task_roots holds a task type: its future's root entry is its task's poll (task_roots.py)
CFG_HOLD_NEW = 64  # with CFG_ADAPT + CFG_ELIDE, while sampling: a new task's first poll held back, elided if done in it
INST_KEY = struct.Struct("<QII")  # struct inst_key: self, fn, pad
# struct inst_stats: polls, raw ns, hits, recorded polls, then (CFG_CHANGES) its last poll's parent, thread, state
INST_STATS = struct.Struct("<QQQQQIIQ")
INST_BATCH = 4096  # instances read a syscall at a stop (BPF_MAP_LOOKUP_BATCH)
# struct thread_state (a thread's task-local storage): hits, depth, recording, last ip, last sp, epoch, elided,
# then MAX_DEPTH scopes: sp self ts hits ret state fn recorded state_off state_size cookie flags elided_before ip
THREAD_HEAD = struct.Struct("<QIIQQII")
SCOPE = struct.Struct("<QQQQQQIIIIIHHQ")
MAX_DEPTH = 32
PIDFD_THREAD = os.O_EXCL  # pidfd_open(2): a pidfd of a thread, not of a process
KIND_ENTRY, KIND_EXIT, KIND_UNWIND, KIND_COUNT, KIND_STATS, KIND_RETSITE = 0, 1, 2, 3, 4, 5
REG_RDI, REG_RSI, REG_RSP, REG_RBP = 0, 1, 2, 3
REG_RAX = 4  # a spawn site's task pointer: rax (an allocation's return value, task_allocs.py)
# an entry site's cfa_reg: the function is polled through a vtable, its return addresses
REG_LEARN = 8  # are learned (rets_seen), its exits are its rets
REG_RETSITES = 9  # are probed return sites (retsites), its exits are there
RET_KEY = struct.Struct("<QII")  # struct ret_key: return address, fn, pad
CHUNK = 256
STACK_MAX = 16384

COUNTERS = ("hits", "records", "drops", "scope misses", "other pid", "scope table full", "retries",
            "skipped", "stats lost", "duplicates", "uncovered", "retsite other", "flushed", "elided", "slices", "lost with room",
            "spawns lost")
KIND_SPAWN, KIND_WAKE = 6, 7  # spawn and wake sites (proxy/capture/uprobes/wake_sites.py)
AUX = struct.Struct("<QII")  # struct aux: the next task id's address, spawn stack bytes, pad
SPAWN_MAX = 16384  # a spawning path's first record; later ones what the proxy learnt (set_spawn_size)
SPAWN_PATH = struct.Struct("<QII")  # struct spawn_path: the site's frame's return address, cookie, fn + 1
WAKE_STATS_SIZE = 13 * 8 + 20 * 4 + 8 + 4 * 32  # struct wake_stats (proxy/origins/wakes.py decodes it)
THREAD_TAIL = 24  # struct thread_state after its scopes: cur_task, cur_sp, cur_unbound (KIND_WAKE)


class BpfError(Exception):
    """BPF could not be used; the message is one line and says why."""


@dataclass(frozen=True, slots=True)
class SiteSpec:
    """One probe site as the BPF program sees it (index = cookie)."""

    kind: int
    self_reg: int = REG_RDI
    state_off: int = 0
    state_size: int = 0  # 0: no layout, the state is not read
    cfa_reg: int = REG_RSP
    cfa_off: int = 8  # a ret: CFA = rsp + 8, so the entry's sp = rsp
    sp_adjust: int = 0  # an entry probed after its prologue: the entry's sp = rsp + sp_adjust
    fn: int = 0  # the resume function's index: instances are keyed (self, fn)
    ret_back: int = 0  # KIND_RETSITE: the return address is the probe's address - ret_back

    def pack(self) -> bytes:
        return SITE.pack(self.kind, self.self_reg, self.state_size, self.cfa_reg, self.cfa_off,
                         self.state_off, self.sp_adjust, self.fn, self.ret_back)


# ---- libbpf -------------------------------------------------------------------------------------

_PRINT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)


class _Libbpf:
    """The libbpf functions used, with their C signatures."""

    def __init__(self) -> None:
        name = ctypes.util.find_library("bpf") or "libbpf.so.1"
        try:
            lib = ctypes.CDLL("libbpf.so.1", use_errno=True)
        except OSError:
            try:
                lib = ctypes.CDLL(name, use_errno=True)
            except OSError as err:
                raise BpfError(f"libbpf is not installed (Debian package libbpf1): {err}") from None
        self.lib = lib
        self.libc = ctypes.CDLL(None, use_errno=True)
        vp, cp, i, u32, u64 = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
        sig = {
            "bpf_object__open_file": (vp, [cp, vp]),
            "bpf_object__find_map_by_name": (vp, [vp, cp]),
            "bpf_object__find_program_by_name": (vp, [vp, cp]),
            "bpf_map__set_max_entries": (i, [vp, u32]),
            "bpf_program__set_expected_attach_type": (i, [vp, i]),
            "bpf_program__set_autoload": (i, [vp, ctypes.c_bool]),
            "bpf_object__load": (i, [vp]),
            "bpf_object__close": (None, [vp]),
            "bpf_program__fd": (i, [vp]),
            "bpf_map__fd": (i, [vp]),
            "bpf_map_update_elem": (i, [i, vp, vp, u64]),
            "bpf_map_lookup_elem": (i, [i, vp, vp]),
            "bpf_map_get_next_key": (i, [i, vp, vp]),
            "bpf_map_delete_elem": (i, [i, vp]),
            "bpf_map_lookup_batch": (i, [i, vp, vp, vp, vp, ctypes.POINTER(u32), vp]),
            "libbpf_num_possible_cpus": (i, []),
            "libbpf_set_print": (vp, [vp]),
        }
        for fname, (res, args) in sig.items():
            fn = getattr(lib, fname)
            fn.restype = res
            fn.argtypes = args
        self.libc.syscall.restype = ctypes.c_long
        self.libc.vsnprintf.restype = ctypes.c_int
        self.libc.vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
        self.messages: list[str] = []
        self._print = _PRINT_FN(self._on_print)  # kept alive: libbpf holds the pointer
        lib.libbpf_set_print(ctypes.cast(self._print, ctypes.c_void_p))

    def _on_print(self, level: int, fmt: bytes, va: int) -> int:
        # x86-64 passes a va_list as a pointer: vsnprintf formats it for us
        buf = ctypes.create_string_buffer(65536)
        n = self.libc.vsnprintf(buf, len(buf), fmt, va)
        text = buf.value.decode("utf-8", "replace").rstrip()
        if text:
            self.messages.append(text)
            del self.messages[:-200]
        return n

    def take_messages(self) -> list[str]:
        out, self.messages = self.messages, []
        return out


_LIB: _Libbpf | None = None


def libbpf() -> _Libbpf:
    global _LIB
    if _LIB is None:
        _LIB = _Libbpf()
    return _LIB


def _errno_text(code: int) -> str:
    return f"{errno.errorcode.get(code, code)}: {os.strerror(code)}"


def object_problem(path: Path = OBJECT) -> str | None:
    """Why `path` is not the BPF object this version of the package was built
    with (None: it is). Its name carries its source's hash and its bytes must
    hash to prebuilt.OBJECT_SHA256: an object left by another installed
    version, or a copy of one under this name, is refused here rather than
    loaded with maps this code would misread. Another path is a variant given
    on purpose (bench/bench_bpf_cost.py --object): only its presence counts."""
    import hashlib

    if path != OBJECT:
        return None if path.is_file() else f"the BPF object {path} is missing"
    if not path.is_file():
        others = sorted(p.name for p in path.parent.glob("uprobes-*.bpf.o"))
        found = f" (found {', '.join(others)}: another version's)" if others else ""
        return (f"the BPF object {path.name} is missing from {path.parent}{found}: "
                f"reinstall asyncrsp, or in a checkout run python -m proxy.capture.uprobes.build")
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as err:
        return f"the BPF object {path} cannot be read: {err.strerror}"
    if digest != prebuilt.OBJECT_SHA256:
        return (f"the BPF object {path} is not the one this asyncrsp was built with "
                f"(sha256 {digest[:12]}, want {prebuilt.OBJECT_SHA256[:12]}): reinstall asyncrsp")
    return None


# ---- the program ------------------------------------------------------------------------------

class Program:
    """The loaded BPF object: maps, program fd, links."""

    def __init__(self, obj: int, lib: _Libbpf, name: bytes = PROGRAM_NAME) -> None:
        self._obj: int | None = obj
        self._lib = lib
        self.count_only = name == COUNT_PROGRAM_NAME
        self.prog_fd = lib.lib.bpf_program__fd(lib.lib.bpf_object__find_program_by_name(obj, name))
        self.fds = {
            name: lib.lib.bpf_map__fd(lib.lib.bpf_object__find_map_by_name(obj, name.encode()))
            for name in ("events", "sites", "config", "counters", "site_hits", "site_elided", "site_nested",
                         "instances",
                         "retsites", "rets_seen", "tstate", "side", "aux", "wakes", "spawn_sizes", "task_roots")
        }
        self.ncpus = max(lib.lib.libbpf_num_possible_cpus(), 1)
        self.links: list[int] = []

    @classmethod
    def open(cls, *, ring_bytes: int = 16 << 20, max_sites: int = 1024, path: Path = OBJECT,
             count_only: bool = False, side_bytes: int = 4 << 20, wake_tasks: int = 0) -> Program:
        """Open and load the object (needs root: CAP_BPF + CAP_PERFMON). `count_only`:
        the program that only counts hits per site (no records: the ring, the
        instances and return-address maps at their smallest), ~1 ms to load. `wake_tasks`:
        the tasks the `wakes` map folds (0: no spawn or wake site, its ring and map at their
        smallest), `side_bytes` the spawn records' ring (wakes.py)."""
        why = object_problem(path)
        if why is not None:
            raise BpfError(why)
        lib = libbpf()
        lib.take_messages()
        ctypes.set_errno(0)
        obj = lib.lib.bpf_object__open_file(str(path).encode(), None)
        if not obj:
            raise BpfError(f"libbpf could not open {path.name}: {_errno_text(ctypes.get_errno())}")
        ok = False
        try:
            ring = PAGE if count_only else _pow2_pages(ring_bytes)
            sizes = [("events", ring), ("sites", max(max_sites, 1)), ("site_hits", max(max_sites, 1)),
                     ("site_elided", max(max_sites, 1)), ("site_nested", max(max_sites, 1))]
            if count_only:  # the LRU map's 262144 entries are preallocated: ~0.1 s
                sizes += [("instances", 1), ("retsites", 1), ("rets_seen", 1)]
            # spawns and wakes (KIND_SPAWN, KIND_WAKE sites): their ring and the tasks' map
            sizes += [("side", PAGE if count_only or not wake_tasks else _pow2_pages(side_bytes)),
                      ("wakes", max(wake_tasks, 1))]
            for name, n in sizes:
                m = lib.lib.bpf_object__find_map_by_name(obj, name.encode())
                if not m or lib.lib.bpf_map__set_max_entries(m, n) != 0:
                    raise BpfError(f"the BPF object has no usable map {name!r}")
            want = COUNT_PROGRAM_NAME if count_only else PROGRAM_NAME
            for name in PROGRAMS:
                prog = lib.lib.bpf_object__find_program_by_name(obj, name)
                if not prog:
                    raise BpfError(f"the BPF object has no program {name.decode()}")
                lib.lib.bpf_program__set_autoload(prog, name == want)  # only the one used is verified
                lib.lib.bpf_program__set_expected_attach_type(prog, BPF_TRACE_UPROBE_MULTI)
            rc = lib.lib.bpf_object__load(obj)
            if rc != 0:
                code = -rc if rc < 0 else ctypes.get_errno()
                raise BpfError(_load_failure(code, lib.take_messages()))
            ok = True
            return cls(obj, lib, want)
        finally:
            if not ok:
                lib.lib.bpf_object__close(obj)

    # -- maps
    def set_config(self, tgid: int, stack_max: int, credits: int = 1 << 62, sample_every: int = 1) -> None:
        """`credits`: how many entries may still carry a stack slice (the unwinder's sample);
        `sample_every` N > 1: one root poll in N of each coroutine instance is recorded."""
        stack_max = max(0, min(STACK_MAX, stack_max // CHUNK * CHUNK))
        self._config = (tgid, stack_max, max(sample_every, 1))
        self._credits = credits
        self._flags = 0
        self._write_config()

    def _write_config(self) -> None:
        tgid, stack_max, every = getattr(self, "_config", (0, 0, 1))
        self._update("config", 0, CONFIG.pack(tgid, stack_max, getattr(self, "_credits", 0), every,
                                              getattr(self, "_flags", 0), getattr(self, "_epoch", 0), 0))

    def set_credits(self, credits: int) -> None:
        self._credits = credits
        self._write_config()

    def new_epoch(self) -> None:
        """Every thread's poll scopes (in its task-local storage, out of user space's
        reach) are emptied at its next hit: the polls in progress are forgotten."""
        self._epoch = (getattr(self, "_epoch", 0) + 1) & 0xFFFFFFFF
        self._write_config()

    def set_dedupe(self, on: bool) -> None:
        """While two links hold the same sites (a swap): each hit counted once."""
        self._set_flag(CFG_DEDUPE, on)

    def set_off(self, on: bool) -> None:
        """The program returns at once, counting nothing (a benchmark's floor)."""
        self._set_flag(CFG_OFF, on)

    def set_nofold(self, on: bool) -> None:
        """Every poll is recorded: the kernel folds no instance totals (the engine counts)."""
        self._set_flag(CFG_NOFOLD, on)

    def set_changes(self, on: bool) -> None:
        """Only what changes the graph is recorded; every poll folded in `instances`."""
        self._set_flag(CFG_CHANGES, on)

    def set_elide(self, on: bool) -> None:
        """Full mode: coroutines created and completed inside one poll of their parent
        write no record (counted per site in `site_elided`, per thread for the engine's ids)."""
        self._set_flag(CFG_ELIDE, on)

    def set_adapt(self, on: bool) -> None:
        """Full mode that samples while the proxy is behind (the proxy moves
        `sample_every` itself): every poll folded, no totals of a life recorded whole."""
        self._set_flag(CFG_ADAPT, on)

    def set_hold_new(self, on: bool) -> None:
        """Catch-up sampling: a new task's first poll is held back like a nested new
        coroutine's (CFG_ELIDE): nothing written when it completes in that poll."""
        self._set_flag(CFG_HOLD_NEW, on)

    def set_sample_every(self, n: int) -> None:
        """One root poll in `n` per instance recorded from the threads' next root polls
        on (1: every poll); the flags, credits and epoch stay."""
        tgid, stack_max, _every = getattr(self, "_config", (0, 0, 1))
        self._config = (tgid, stack_max, max(int(n), 1))
        self._write_config()

    def pending_entries(self, tid: int) -> tuple[list[tuple[tuple[int, ...], tuple[int, int] | None]], int]:
        """CFG_CHANGES or CFG_ELIDE, the program stopped: the entries of thread `tid`'s
        polls in progress that went out as no record (its scope stack in its task
        storage, read through a pidfd of the thread), bottom first, as SCOPE tuples
        with the (self, fn) of the poll each runs inside; they are marked recorded, so
        their exits go out. With them, the coroutines elided on the thread since its
        last record (CFG_ELIDE; taken: set to 0)."""
        try:
            pidfd = os.pidfd_open(tid, PIDFD_THREAD)
        except OSError:
            return [], 0  # gone, or a kernel without thread pidfds
        try:
            lib = self._lib.lib
            key = ctypes.c_int(pidfd)
            size = THREAD_HEAD.size + MAX_DEPTH * SCOPE.size + THREAD_TAIL
            val = ctypes.create_string_buffer(size)
            if lib.bpf_map_lookup_elem(self.fds["tstate"], ctypes.byref(key), val) != 0:
                return [], 0  # no hit on this thread yet
            head = THREAD_HEAD.unpack_from(val.raw)
            depth, epoch, elided = head[1], head[5], head[6]
            if epoch != getattr(self, "_epoch", 0):
                return [], 0  # stale: emptied at the thread's next hit
            raw = bytearray(val.raw)
            if elided:
                struct.pack_into("<I", raw, THREAD_HEAD.size - 4, 0)
            out: list[tuple[tuple[int, ...], tuple[int, int] | None]] = []
            below: tuple[int, int] | None = None
            for i in range(min(depth, MAX_DEPTH)):
                off = THREAD_HEAD.size + i * SCOPE.size
                sc = SCOPE.unpack_from(raw, off)
                if not sc[7]:  # recorded
                    out.append((sc, below))
                    struct.pack_into("<I", raw, off + 52, 1)
                    struct.pack_into("<H", raw, off + 70, 0)  # elided_before: taken
                below = (sc[1], sc[6])  # self, fn
            if out or elided:
                buf = ctypes.create_string_buffer(bytes(raw), size)
                lib.bpf_map_update_elem(self.fds["tstate"], ctypes.byref(key), buf, 2)  # BPF_EXIST
            return out, elided
        finally:
            os.close(pidfd)

    def _set_flag(self, flag: int, on: bool) -> None:
        self._flags = (getattr(self, "_flags", 0) & ~flag) | (flag if on else 0)
        self._write_config()

    def instances(self) -> dict[tuple[int, int], tuple[int, int, int, int]]:
        """Every coroutine instance's totals folded in the kernel:
        (self, fn) -> (polls, raw ns, hits, recorded polls). Read in batches
        (BPF_MAP_LOOKUP_BATCH, INST_BATCH a syscall) rather than two syscalls an
        instance (next key, lookup): a stop reads the whole map (full mode)."""
        try:
            return self._instances_batched()
        except OSError:
            return self._instances_one_by_one()  # a kernel without batch ops on this map type

    def _instances_batched(self) -> dict[tuple[int, int], tuple[int, int, int, int]]:
        fd = self.fds["instances"]
        lib = self._lib.lib
        n = INST_BATCH
        keys = ctypes.create_string_buffer(INST_KEY.size * n)
        vals = ctypes.create_string_buffer(INST_STATS.size * n)
        token_in = ctypes.create_string_buffer(INST_KEY.size)  # a hash map's token: a bucket index
        token_out = ctypes.create_string_buffer(INST_KEY.size)
        count = ctypes.c_uint32()
        out: dict[tuple[int, int], tuple[int, int, int, int]] = {}
        first = True
        while True:
            count.value = n
            ctypes.set_errno(0)
            rc = lib.bpf_map_lookup_batch(fd, None if first else token_in, token_out, keys, vals,
                                          ctypes.byref(count), None)
            err = ctypes.get_errno() if rc else 0
            got = count.value if rc == 0 or err == errno.ENOENT else 0
            if got:
                out.update((k[:2], v[:4]) for k, v in zip(INST_KEY.iter_unpack(keys.raw[:got * INST_KEY.size]),
                                                          INST_STATS.iter_unpack(vals.raw[:got * INST_STATS.size]))
                           if v[0])  # polls 0: emptied (an elided coroutine's), not an instance
            if rc != 0:
                if err == errno.ENOENT:  # the last batch (possibly empty)
                    return out
                raise OSError(err, f"BPF_MAP_LOOKUP_BATCH on instances: {_errno_text(err)}")
            ctypes.memmove(token_in, token_out, INST_KEY.size)
            first = False

    def _instances_one_by_one(self) -> dict[tuple[int, int], tuple[int, int, int, int]]:
        fd = self.fds["instances"]
        lib = self._lib.lib
        key = ctypes.create_string_buffer(INST_KEY.size)
        nxt = ctypes.create_string_buffer(INST_KEY.size)
        val = ctypes.create_string_buffer(INST_STATS.size)
        out: dict[tuple[int, int], tuple[int, int, int, int]] = {}
        prev = None
        while lib.bpf_map_get_next_key(fd, prev, nxt) == 0:
            ctypes.memmove(key, nxt, INST_KEY.size)
            prev = key
            if lib.bpf_map_lookup_elem(fd, key, val) == 0:
                self_ptr, fn, _ = INST_KEY.unpack(key.raw)
                polls, raw, hits, recorded = INST_STATS.unpack(val.raw)[:4]
                if polls:  # 0: emptied (an elided coroutine's), not an instance
                    out[(self_ptr, fn)] = (polls, raw, hits, recorded)
        return out

    def set_aux(self, id_addr: int, spawn_stack: int) -> None:
        """Spawn sites: where the runtime's next task id is (0: none), the stack bytes a spawn keeps."""
        self._update("aux", 0, AUX.pack(id_addr, max(0, min(spawn_stack, SPAWN_MAX)), 0))

    def set_spawn_size(self, path: bytes, size: int) -> None:
        """The stack bytes the records of one spawning path keep (`spawn_sizes`; SPAWN_PATH key)."""
        k = ctypes.create_string_buffer(path, len(path))
        v = ctypes.c_uint32(max(0, min(size, SPAWN_MAX)))
        if self._lib.lib.bpf_map_update_elem(self.fds["spawn_sizes"], k, ctypes.byref(v), 0) != 0:
            raise BpfError(f"cannot write the BPF map spawn_sizes: {_errno_text(ctypes.get_errno())}")

    def set_task_roots(self, roots: dict[int, tuple[int, int, list[int]]]) -> None:
        """Resume function -> (the future's offset from its task's header, the header's vtable
        field, the vtables: runtime addresses, at most 4) (`task_roots`; task_roots.py), and
        CFG_ROOTS on when there is one."""
        for fn, (off, vt_off, vts) in roots.items():
            k = ctypes.c_uint32(fn)
            v = struct.pack("<II4Q", off, vt_off, *(list(vts[:4]) + [0] * (4 - len(vts[:4]))))
            buf = ctypes.create_string_buffer(v, len(v))
            if self._lib.lib.bpf_map_update_elem(self.fds["task_roots"], ctypes.byref(k), buf, 0) != 0:
                raise BpfError(f"cannot write the BPF map task_roots: {_errno_text(ctypes.get_errno())}")
        self._set_flag(CFG_ROOTS, bool(roots))

    def side_ring(self) -> Ring:
        """The spawn records' ring (KIND_SPAWN)."""
        return Ring(self.fds["side"])

    def wake_table(self) -> dict[int, bytes]:
        """The `wakes` map: task (header or raw pointer) -> its struct wake_stats, raw."""
        fd = self.fds["wakes"]
        lib = self._lib.lib
        key = ctypes.create_string_buffer(8)
        nxt = ctypes.create_string_buffer(8)
        val = ctypes.create_string_buffer(WAKE_STATS_SIZE)
        out: dict[int, bytes] = {}
        prev = None
        while lib.bpf_map_get_next_key(fd, prev, nxt) == 0 and len(out) < 1 << 20:
            ctypes.memmove(key, nxt, 8)
            prev = key
            if lib.bpf_map_lookup_elem(fd, key, val) == 0:
                out[struct.unpack("<Q", key.raw)[0]] = val.raw
        return out

    def set_sites(self, sites: list[SiteSpec], first: int = 0) -> None:
        for i, s in enumerate(sites, first):
            self._update("sites", i, s.pack())

    def add_retsites(self, addrs: list[int]) -> None:
        """Return addresses whose return site is probed (the polls returning there are covered)."""
        fd = self.fds["retsites"]
        one = ctypes.c_uint32(1)
        for a in addrs:
            k = ctypes.c_uint64(a)
            if self._lib.lib.bpf_map_update_elem(fd, ctypes.byref(k), ctypes.byref(one), 0) != 0:
                raise BpfError(f"cannot write the BPF map retsites: {_errno_text(ctypes.get_errno())}")

    def rets_seen(self) -> dict[tuple[int, int], int]:
        """(return address, fn) -> entries seen, of the functions whose return sites are learned."""
        fd = self.fds["rets_seen"]
        lib = self._lib.lib
        key = ctypes.create_string_buffer(RET_KEY.size)
        nxt = ctypes.create_string_buffer(RET_KEY.size)
        val = ctypes.c_uint64()
        out: dict[tuple[int, int], int] = {}
        prev = None
        while lib.bpf_map_get_next_key(fd, prev, nxt) == 0 and len(out) < 4096:
            ctypes.memmove(key, nxt, RET_KEY.size)
            prev = key
            if lib.bpf_map_lookup_elem(fd, key, ctypes.byref(val)) == 0:
                ret, fn, _ = RET_KEY.unpack(key.raw)
                out[(ret, fn)] = val.value
        return out

    def _update(self, name: str, key: int, value: bytes) -> None:
        k = ctypes.c_uint32(key)
        v = ctypes.create_string_buffer(value, len(value))
        if self._lib.lib.bpf_map_update_elem(self.fds[name], ctypes.byref(k), v, 0) != 0:
            raise BpfError(f"cannot write the BPF map {name}[{key}]: {_errno_text(ctypes.get_errno())}")

    def counters(self) -> dict[str, int]:
        """The per-CPU counters summed over CPUs."""
        out: dict[str, int] = {}
        buf = ctypes.create_string_buffer(8 * self.ncpus)
        for i, name in enumerate(COUNTERS):
            k = ctypes.c_uint32(i)
            if self._lib.lib.bpf_map_lookup_elem(self.fds["counters"], ctypes.byref(k), buf) != 0:
                continue
            out[name] = sum(struct.unpack_from(f"<{self.ncpus}Q", buf.raw))
        return out

    def site_hits(self, cookies: list[int], which: str = "site_hits") -> dict[int, int]:
        """Hits of each site (cookie = its index), summed over CPUs (`which`="site_elided":
        the polls elided there, CFG_ELIDE; "site_nested": the entries with a poll in
        progress on their thread)."""
        out: dict[int, int] = {}
        buf = ctypes.create_string_buffer(8 * self.ncpus)
        for c in cookies:
            k = ctypes.c_uint32(c)
            if self._lib.lib.bpf_map_lookup_elem(self.fds[which], ctypes.byref(k), buf) == 0:
                out[c] = sum(struct.unpack_from(f"<{self.ncpus}Q", buf.raw))
        return out

    # -- links
    def attach(self, binary: str, offsets: list[int], pid: int, cookies: list[int] | None = None) -> int:
        """One uprobe_multi link on `binary` at file offsets, cookie = the site's index in
        the table (by default the offset's index), pid-filtered."""
        n = len(offsets)
        if n == 0:
            raise BpfError("no probe sites to attach")
        path = ctypes.create_string_buffer(os.fsencode(binary))
        offs = (ctypes.c_uint64 * n)(*offsets)
        cookies = (ctypes.c_uint64 * n)(*(range(n) if cookies is None else cookies))  # type: ignore[assignment]
        attr = ctypes.create_string_buffer(128)
        struct.pack_into("<IIIIQQQQIII", attr, 0, self.prog_fd, 0, BPF_TRACE_UPROBE_MULTI, 0,
                         ctypes.addressof(path), ctypes.addressof(offs), 0,
                         ctypes.addressof(cookies), n, 0, pid)
        libc = self._lib.libc
        ctypes.set_errno(0)
        fd = libc.syscall(ctypes.c_long(SYS_BPF), ctypes.c_long(BPF_LINK_CREATE), attr, ctypes.c_long(128))
        if fd < 0:
            code = ctypes.get_errno()
            raise BpfError(_attach_failure(code, binary, pid))
        self.links.append(fd)
        return int(fd)

    def detach(self, link: int) -> None:
        """Close one link: the kernel restores the original bytes (~0.5 ms, close takes ~30 ms)."""
        if link in self.links:
            self.links.remove(link)
            os.close(link)

    def detach_later(self, link: int) -> "threading.Thread":
        """Close one link in a thread (the close waits ~30 ms for the kernel): join it
        before relying on the int3s being out."""
        import threading

        if link in self.links:
            self.links.remove(link)
        th = threading.Thread(target=os.close, args=(link,), name="uprobe-detach", daemon=True)
        th.start()
        return th

    def detach_all(self) -> None:
        for link in list(self.links):
            self.detach(link)

    def ring(self) -> Ring:
        return Ring(self.fds["events"])

    def close(self) -> None:
        self.detach_all()
        if self._obj is not None:
            self._lib.lib.bpf_object__close(self._obj)
            self._obj = None


def _pow2_pages(n: int) -> int:
    size = PAGE
    while size < n:
        size *= 2
    return size


def _load_failure(code: int, log: list[str]) -> str:
    text = "\n".join(log)
    if "-- END PROG LOAD LOG --" in text:
        # the verifier said no (EACCES is its answer too): its last words before the summary
        lines = [ln for ln in text.split("\n") if ln and not ln.startswith(("libbpf:", "processed", "--"))]
        detail = lines[-1] if lines else ""
        return f"the kernel's verifier refused the BPF program ({_errno_text(code)}): {detail}"
    if code in (errno.EPERM, errno.EACCES):
        return f"loading BPF is not permitted ({_errno_text(code)}): run as root (CAP_BPF and CAP_PERFMON)"
    return f"the kernel refused the BPF program ({_errno_text(code)})"


def _attach_failure(code: int, binary: str, pid: int) -> str:
    if code == errno.EINVAL:
        return (f"the kernel refused a uprobe_multi link on {binary} for pid {pid} "
                f"({_errno_text(code)}): needs Linux >= 6.6 with CONFIG_UPROBES")
    if code == errno.ESRCH:
        return f"process {pid} is gone"
    if code in (errno.EPERM, errno.EACCES):
        return f"attaching uprobes is not permitted ({_errno_text(code)}): run as root"
    return f"attaching uprobes to {binary} failed ({_errno_text(code)})"


# ---- ring buffer consumer ---------------------------------------------------------------------

_BUSY = 1 << 31
_DISCARD = 1 << 30


class Ring:
    """A BPF ring buffer read through mmap: records read in place, or copied out in one piece.

    Page 0 of the map holds ``consumer_pos`` (ours, writable), page 1
    ``producer_pos``; the data pages follow, mapped twice by the kernel, so a
    record never wraps. Each record: u32 length (bit 31 busy, bit 30
    discarded), u32 page offset, then the data, padded to 8 bytes.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        info = _map_info(fd)
        self.size = info
        self.mask = info - 1
        self._cons = mmap.mmap(fd, PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._prod = mmap.mmap(fd, PAGE + 2 * info, mmap.MAP_SHARED, mmap.PROT_READ, offset=PAGE)
        self._view = memoryview(self._prod)

    def pending(self) -> int:
        prod = struct.unpack_from("<Q", self._prod, 0)[0]
        cons = struct.unpack_from("<Q", self._cons, 0)[0]
        return int(prod - cons)

    @property
    def view(self) -> memoryview:
        """The ring's pages: the offsets `spans` gives are offsets in here."""
        return self._view

    def spans(self, max_records: int = 1 << 30, limit: int = 1 << 30) -> tuple[int, list[tuple[int, int]]]:
        """The committed records from the consumer position on, in place:
        (the position after them, [(offset in `view`, length)]), at most
        `max_records` of them over at most `limit` bytes of ring. Nothing is
        freed until `release(position)`: read them first. Discarded records are
        skipped; a reserved, not yet committed one ends the list."""
        unpack = struct.unpack_from
        cons = unpack("<Q", self._cons, 0)[0]
        prod = unpack("<Q", self._prod, 0)[0]
        view, mask = self._view, self.mask
        out: list[tuple[int, int]] = []
        start = cons
        # The data pages are mapped twice: from the first record's place on, the
        # next `size` bytes are contiguous in `view`, so the offsets count from
        # there (and a chunk copied out from there keeps them: copy_out).
        base = PAGE + (start & mask)
        while cons < prod and len(out) < max_records and cons - start < limit:
            off = base + (cons - start)
            (hdr,) = unpack("<I", view, off)
            if hdr & _BUSY:
                break  # reserved, not yet committed: next time
            length = hdr & ~(_BUSY | _DISCARD)
            if not hdr & _DISCARD:
                out.append((off + 8, length))
            cons += (length + 8 + 7) & ~7
        return cons, out

    def release(self, position: int) -> None:
        """Give the ring's space up to `position` back to the kernel."""
        if position != struct.unpack_from("<Q", self._cons, 0)[0]:
            struct.pack_into("<Q", self._cons, 0, position)

    def copy_out(self, limit: int = 1 << 30) -> tuple[bytes, list[tuple[int, int]]] | None:
        """Copy the committed records (up to `limit` bytes of ring) out in one piece
        and free their space: (chunk, [(offset in chunk, length)]), None when
        there are none. The data pages are mapped twice, so the span is contiguous."""
        start = struct.unpack_from("<Q", self._cons, 0)[0]
        end, spans = self.spans(limit=limit)
        if end == start:
            return None
        base = PAGE + (start & self.mask)
        chunk = bytes(self._view[base:base + (end - start)])
        self.release(end)
        if not spans:
            return None
        return chunk, [(off - base, n) for off, n in spans]

    def close(self) -> None:
        self._view.release()
        self._prod.close()
        self._cons.close()


def _map_info(fd: int) -> int:
    """max_entries of a map (its ring size) through BPF_OBJ_GET_INFO_BY_FD."""
    info = ctypes.create_string_buffer(96)
    attr = ctypes.create_string_buffer(16)
    struct.pack_into("<IIQ", attr, 0, fd, len(info), ctypes.addressof(info))
    libc = libbpf().libc
    rc = libc.syscall(ctypes.c_long(SYS_BPF), ctypes.c_long(15), attr, ctypes.c_long(16))  # BPF_OBJ_GET_INFO_BY_FD
    if rc != 0:
        raise BpfError(f"cannot read the ring buffer's size: {_errno_text(ctypes.get_errno())}")
    # struct bpf_map_info: type, id, key_size, value_size, max_entries, ...
    return int(struct.unpack_from("<IIIII", info, 0)[4])
