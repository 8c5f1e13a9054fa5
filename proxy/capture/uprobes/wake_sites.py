"""Where spawns and wakes are probed: the runtime's own functions, found by name (pure).

Theory of operation. Every spawn of a runtime goes through one function that
knows nothing of the future's type, and every wake through the runtime's waker
vtable, whose functions take the task as their first argument:

* **tokio**: ``task::Id::next`` is called once per task by every spawn path
  (``spawn``, ``spawn_local``, ``spawn_blocking``, ``JoinSet::spawn``,
  ``Runtime::spawn``, ``Handle::spawn``, ``LocalSet``; also ``block_on`` under
  tracing, which makes no task). At its entry its counter ``NEXT_ID`` (a static
  of the function, a symbol of its own) holds the id the new task gets, which
  the task's cell keeps (``Core.task_id``): the spawn record's key. The waker
  vtable's ``clone_waker``, ``wake_by_val``, ``wake_by_ref`` and ``drop_waker``
  and each task type's ``raw::poll<T, S>`` take the task's header in rdi.
* **async-task** (smol's async-executor, async-std): ``RawTask<F, T, S,
  M>::wake``, ``wake_by_ref``, ``clone_waker``, ``drop_waker`` and ``run``, one
  of each per task type, take the task's pointer in rdi; the spawn is the
  allocation in ``allocate`` (inlined in release builds), right after which rax
  holds the new task's pointer: found in the code (task_allocs.py), the record
  keyed by it; ``allocate``'s entry (no key) where that is not found.

A probe stands on the function's first instruction the kernel emulates when
the prologue before it keeps rdi and the return address (emulated.py), else on
its entry. Nothing is version-specific: a program whose runtime has none of
these names gets no such site, and the plan says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from proxy.analysis.elf import ElfImage
from proxy.analysis.model import Inventory

from .bpf import KIND_SPAWN, KIND_WAKE, REG_RDI, REG_RSP, SiteSpec
from .decode import SiteInfo
from .emulated import moved_entry
from .sites import Site, file_offset, insn_length
from .task_allocs import alloc_spawn_sites, got_slots

OP_WAKE, OP_WAKE_BY_REF, OP_CLONE, OP_DROP, OP_POLL = 0, 1, 2, 3, 4
OPS = {"wake_by_val": OP_WAKE, "wake": OP_WAKE, "wake_by_ref": OP_WAKE_BY_REF, "clone_waker": OP_CLONE,
       "drop_waker": OP_DROP}

_TOKIO_NEXT = re.compile(r"^tokio::runtime::task::(?:id::)?Id::next$")
_TOKIO_COUNTER = re.compile(r"^tokio::runtime::task::(?:id::)?Id::next::NEXT_ID$")
_TOKIO_WAKER = re.compile(r"^tokio::runtime::task::waker::(clone_waker|wake_by_val|wake_by_ref|drop_waker)(?:<.*>)?$")
_AT_FN = re.compile(r"^<?async_task::raw::RawTask<.*>>?::(wake|wake_by_ref|clone_waker|drop_waker|allocate)$")
# parts every name above holds (legacy and v0 mangling keep identifiers whole)
_PARTS = (b"next", b"waker", b"wake", b"allocate")


@dataclass(slots=True)
class WakePlan:
    sites: list[Site]
    counter: int | None  # link address of tokio's NEXT_ID (the next task id), None: not found
    notes: list[str]
    # task types whose poll is seen at their future's root entry (task_roots.py), their task-poll
    # site not planted: resume function -> (offset from the header, the header's vtable field,
    # the vtables' link addresses)
    roots: dict[int, tuple[int, int, list[int]]] = field(default_factory=dict)

    @property
    def spawns(self) -> bool:
        return any(s.spec.kind == KIND_SPAWN for s in self.sites)

    @property
    def wakes(self) -> bool:
        return any(s.spec.kind == KIND_WAKE and s.spec.state_off != OP_POLL for s in self.sites)


def plan_wake_sites(elf: ElfImage, inv: Inventory, bias: int, *, wakes: bool = True,
                    wakers: bool = True) -> WakePlan:
    """Spawn sites always (cheap: one hit a spawn), waker and task-poll sites with `wakes`; the
    waker clone and drop sites only with `wakers` too (they feed only the lost-waker warning and
    are the most hit: on the axum service 3 of the 9 spawn and wake hits a request)."""
    from proxy.analysis.demangle import demangle_or_raw

    named: list[tuple[str, int]] = []
    for addr in sorted(elf.function_addresses(lambda n: _wanted(demangle_or_raw(n)), _PARTS)):
        sym = elf.symbol_at(addr)
        if sym is not None and sym.addr == addr:
            named.append((demangle_or_raw(sym.name), addr))
    sites: list[Site] = []
    notes: list[str] = []
    seen: set[int] = set()

    def add(name: str, link: int, kind: int, op: int = 0) -> None:
        if link in seen:
            return
        seen.add(link)
        site = _site(elf, name, link, bias, kind, op)
        if site is None:
            notes.append(f"{name}: 0x{link:x} is not in the file")
        else:
            sites.append(site)

    # async-task's spawns where the task's pointer is known (task_allocs.py): they replace
    # allocate's entry (no key) in the functions they are found in
    allocs, alloc_notes = alloc_spawn_sites(elf, inv, bias)
    notes += alloc_notes
    covered = set()
    for site in allocs:
        sym = elf.symbol_at(site.addr - bias)
        covered.add(sym.addr if sym is not None else site.addr - bias)
        seen.add(site.addr - bias)
        sites.append(site)
    for name, addr in named:
        if _TOKIO_NEXT.match(name) or name.endswith("::allocate"):
            if addr not in covered:
                add(name, addr, KIND_SPAWN)
        elif wakes:
            m = _TOKIO_WAKER.match(name) or _AT_FN.match(name)
            if m is not None and (wakers or OPS[m.group(1)] not in (OP_CLONE, OP_DROP)):
                add(name, addr, KIND_WAKE, OPS[m.group(1)])
    roots: dict[int, tuple[int, int, list[int]]] = {}
    if wakes:
        from .task_roots import task_roots

        at_root = task_roots(inv)
        for addr, cell in sorted({**inv.task_polls, **inv.task_runs}.items()):
            tr = at_root.get(addr) if addr in inv.task_polls else None
            if tr is not None and (tr.fn not in roots or roots[tr.fn][:2] == (tr.offset, tr.vt_off)):
                got = roots.setdefault(tr.fn, (tr.offset, tr.vt_off, []))[2]
                if len(got) < 4:
                    got.append(tr.vtable)
                    continue
            add(f"task poll {cell}"[:200], addr, KIND_WAKE, OP_POLL)
    counter = _tokio_counter(elf)
    if counter is not None and not any(_TOKIO_NEXT.match(n) for n, _ in named):
        # Id::next inlined into its callers (release builds): after each increment of the counter
        for at in counter_sites(elf, counter):
            site = _after_increment(elf, at, bias)
            if site is not None and site.addr - bias not in seen:
                seen.add(site.addr - bias)
                sites.append(site)
    if any(_TOKIO_NEXT.match(n) for n, _ in named) and counter is None:
        notes.append("tokio's task id counter (Id::next::NEXT_ID) is not in the symbol table: spawns are "
                     "recorded without the task's id")
    if not any(s.spec.kind == KIND_SPAWN for s in sites):
        notes.append("no spawn function of a known runtime in this program (tokio's task::Id::next, "
                     "async-task's RawTask::allocate): no spawn is recorded")
    return WakePlan(sites, counter, notes, roots)


# lock xadd qword [rip + disp32], reg: F0 REX.W(+R) 0F C1 modrm(mod 00, rm 101); and the
# GOT load of the counter's address, mov reg, qword [rip + disp32]: REX.W(+R) 8B modrm(00, 101)
_XADD_RIP = re.compile(rb"\xf0[\x48\x4c]\x0f\xc1[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]", re.S)
_LOAD_RIP = re.compile(rb"[\x48\x4c]\x8b[\x05\x0d\x15\x1d\x25\x2d\x35\x3d]", re.S)


def counter_sites(elf: ElfImage, counter: int) -> list[int]:
    """Link addresses of the instructions right after each ``lock xadd`` on the counter: a
    byte search of the code (no disassembly of the whole text) for ``lock xadd [rip+d], reg``
    on it, or for the load of its address from a GOT slot (``mov reg, [rip+d]``: a static of
    another crate, in a PIE) followed within a few instructions by ``lock xadd [reg], reg2``."""
    import struct

    from .emulated import _md

    slots = set(got_slots(elf, {counter}))
    out: list[int] = []
    for seg in elf.segments:
        if not seg.flags & 1 or not seg.filesz:
            continue
        code = elf.read(seg.vaddr, seg.filesz)
        if not code:
            continue
        for m in _XADD_RIP.finditer(code):
            end = seg.vaddr + m.start() + 9
            if end + struct.unpack_from("<i", code, m.start() + 5)[0] == counter:
                out.append(end)
        for m in _LOAD_RIP.finditer(code) if slots else ():
            end = seg.vaddr + m.start() + 7
            if end + struct.unpack_from("<i", code, m.start() + 3)[0] not in slots:
                continue
            reg = None
            for k, i in enumerate(_md.disasm(code[m.start():m.start() + 64], end - 7)):
                if k == 0:
                    reg = i.op_str.split(",", 1)[0].strip()
                elif i.mnemonic.endswith("xadd") and f"[{reg}]" in i.op_str.replace(" ", ""):
                    out.append(i.address + i.size)
                    break
                elif k > 6 or i.mnemonic.startswith(("j", "call", "ret")):
                    break
    return out


def _after_increment(elf: ElfImage, at: int, bias: int) -> Site | None:
    """A spawn site on the first instruction the kernel emulates within a few straight-line
    instructions after the counter's increment (``test; je``: the ``je``), else right after it."""
    from .emulated import _md, emulated

    code = elf.read(at, 48) or b""
    site = at
    for k, i in enumerate(_md.disasm(code, at)):
        if emulated(i):
            site = i.address
            break
        if k >= 3 or i.mnemonic.startswith(("j", "call", "ret")):
            break
    off = file_offset(elf, site)
    if off is None:
        return None
    original = elf.read(site, insn_length(elf, site)) or b""
    sym = elf.symbol_at(at)
    name = f"tokio task id increment in {sym.demangled if sym is not None else hex(at)}"[:200]
    return Site(name, site + bias, off, original, SiteSpec(KIND_SPAWN, state_size=1),
                SiteInfo(KIND_SPAWN, site + bias, site + bias))


def _wanted(name: str) -> bool:
    return bool(_TOKIO_NEXT.match(name) or _TOKIO_WAKER.match(name) or _AT_FN.match(name))


def _tokio_counter(elf: ElfImage) -> int | None:
    from proxy.analysis.demangle import demangle_or_raw

    for s in elf.symbols:
        if not s.is_func and "NEXT_ID" in s.name and _TOKIO_COUNTER.match(demangle_or_raw(s.name)):
            return s.addr
    return None


def _site(elf: ElfImage, name: str, link: int, bias: int, kind: int, op: int) -> Site | None:
    """A probe on the function at `link`: on its first emulated instruction that keeps rdi and
    the return address where there is one (a trap, not a single step: ~1 us, not ~10); else,
    for a wake site, on the first emulated instruction after the prologue stored rdi in its
    frame (the task then read from that slot: ``slot_entry``); else on its entry."""
    sym = elf.symbol_at(link)
    high = link + sym.size if sym is not None and sym.size else link + 64
    code = elf.read(link, high - link)
    moved = moved_entry(code, link, high, "rdi", elf.read) if code else "no code"
    at, adjust, slot = (moved.addr, moved.adjust, None) if not isinstance(moved, str) else (link, 0, None)
    if isinstance(moved, str) and kind == KIND_WAKE and code:
        got = slot_entry(code, link)
        if got is not None:
            at, adjust, slot = got
        else:
            line = straight_entry(code, link)
            if line is not None:
                at, adjust = line
    off = file_offset(elf, at)
    if off is None:
        return None
    original = elf.read(at, insn_length(elf, at)) or b""
    spec = SiteSpec(kind, REG_RDI if slot is None else REG_RSP, cfa_off=slot or 0, state_off=op, sp_adjust=adjust)
    return Site(name, at + bias, off, original, spec, SiteInfo(kind, link + bias, at + bias, adjust))


def straight_entry(code: bytes, low: int, budget: int = 12) -> tuple[int, int] | None:
    """(site, entry sp - rsp there) for a release build's waker function: its first emulated
    instruction on the straight line from the entry (tokio's drop_waker: ``mov rax, imm; lock
    xadd [rdi], rax; cmp; jne``: the ``jne``), when nothing before it writes rdi or moves rsp
    but by ``sub rsp, imm`` / ``push``. Unlike a poll site's (emulated.py) the line may write
    memory (the task's reference count): a wake site reads only rdi and the return address."""
    from .emulated import _md, emulated

    adjust = 0
    for k, i in enumerate(_md.disasm(code, low)):
        if k >= budget:
            return None
        if k and emulated(i):
            return i.address, adjust
        m = i.mnemonic
        if m.startswith(("j", "call", "ret", "loop")):
            return None
        _reads, writes = i.regs_access()
        names = {i.reg_name(r) for r in writes}
        if names & {"rdi", "edi", "di", "dil"}:
            return None
        if names & {"rsp", "esp"}:
            if m == "push":
                adjust += 8
            elif m == "sub" and i.operands[1].type == 2:  # CS_OP_IMM
                adjust += i.operands[1].imm
            else:
                return None
    return None


def slot_entry(code: bytes, low: int, budget: int = 16) -> tuple[int, int, int] | None:
    """(site, entry sp - rsp there, the slot holding rdi at rsp + that) for a debug build's
    waker function: ``sub rsp, N; mov [rsp + d], rdi; ...; call rel32`` (rustc 1.95 debug:
    tokio's clone_waker, wake_by_ref ... start with a single-stepped ``sub rsp`` and reach
    no emulated instruction before an indirect call). The line from the entry to the site
    may call (a call returns to the next instruction) but not jump or return, moves rsp
    only by ``sub rsp, imm`` / ``push``, and writes the slot only once; nothing branches
    into the line (the function is entered at its start: a leaf of the waker vtable)."""
    from .emulated import _md, emulated

    adjust, slot = 0, None
    for k, i in enumerate(_md.disasm(code, low)):
        if k >= budget:
            return None
        if k and emulated(i) and slot is not None and i.mnemonic == "call":
            return i.address, adjust, slot
        m, ops = i.mnemonic, i.op_str.replace(" ", "")
        if m == "sub" and ops.startswith("rsp,") and i.operands[1].type == 2:  # CS_OP_IMM
            adjust += i.operands[1].imm
        elif m == "push":
            adjust += 8
        elif m in ("ret", "jmp") or m.startswith("j") or m in ("add", "pop", "leave") and "rsp" in ops:
            return None
        elif m == "mov" and ops.startswith("qwordptr[rsp") and ops.endswith(",rdi") and slot is None:
            mem = i.operands[0].mem
            slot = mem.disp
        elif slot is not None and ops.startswith(f"qwordptr[rsp+{hex(slot)}]"):
            return None  # the slot written again
    return None
