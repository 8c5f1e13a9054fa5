"""Layouts of the non-coroutine types reachable from awaitees (for ``proxy.reflect``).

The inventory's coroutine ``Layout``s say where each ``__awaitee`` lies and
its type *name*; walking an await tree in memory also needs the shape of
what is awaited: ``MaybeDone<F>`` (an enum), ``PollFn<closure>`` (a closure
env holding ``&mut`` to a tuple of ``MaybeDone``s), ``Pin<Box<dyn Future>>``
(data pointer + vtable), tokio's ``Sleep`` and ``JoinHandle``... This module
records, from the DIEs the collector already reads, a ``TypeInfo`` per type
reachable from an awaitee: by value (members, enum variants) and through
pointers, up to ``MAX_DEPTH`` hops and ``MAX_TYPES`` types in all.

Facts (rustc 1.95 and 1.63, checked with this collector on the corpus):

* A Rust enum is a ``DW_TAG_structure_type`` with a ``DW_TAG_variant_part``
  whose ``DW_AT_discr`` names the discriminant member; each variant holds one
  member (named after the variant) whose type is ``Enum::Variant`` with the
  fields ``__0``, ``__1``... A niche-encoded enum's dataful variant has no
  ``DW_AT_discr_value`` (it is the default); the discriminant member then
  lies inside that variant's payload.
* Fat pointers (``&dyn Trait``, ``*mut dyn Trait``, ``Box<dyn Trait>``'s
  pointer) are structures with members ``pointer`` and ``vtable``.
* Coroutine state machines met on the way are not recorded here: they are
  ``Layout``s; the collector is asked to build their layout instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from . import dies as D
from .model import Field, TypeInfo, Variant

if TYPE_CHECKING:
    from .inventory import _Collector

# hops from an awaitee type (a JoinHandle's vtable is 6 away). axum's request handler sits
# 13 below its connection task's select! (hyper-util's auto connection, hyper's dispatcher,
# tower's Oneshot, the Router's RouteFuture, then a dyn Future); measured at 16 against 8:
# axum_svc 1119 -> 1603 types, tokio_app 463 -> 667, the cold analysis within its noise.
MAX_DEPTH = 16
MAX_TYPES = 40_000
# Holders that add no hop of their own (the pointer inside a Box still counts one): hyper's
# server Connection keeps the handler's future 5 structs and a Pin<Box<Option<F>>> down.
PLUMBING = ("core::pin::Pin<", "alloc::boxed::Box<", "core::ptr::unique::Unique<", "core::ptr::non_null::NonNull<",
            "core::option::Option<", "core::cell::UnsafeCell<", "core::mem::manually_drop::ManuallyDrop<")


class TypeCollector:
    def __init__(self, coll: _Collector, is_env: Callable[[D.Die], bool]) -> None:
        self.coll = coll
        self.dwarf = coll.dwarf
        self.out: dict[str, TypeInfo] = coll.inv.types
        self.is_env = is_env
        self.envs: list[D.Die] = []  # coroutine envs met inside other types (layouts to build)
        self._depth: dict[int, int] = {}  # die offset -> smallest depth it was expanded at
        self._name_depth: dict[str, int] = {}  # type name -> the same, over all its copies
        self.truncated = False
        self._fd_cache: dict[int, int | None] = {}  # pointee die offset -> fd offset (fd_offset)

    def add(self, type_off: int | None, depth: int = 0) -> None:
        t = self.coll._strip_typedefs(self.dwarf.die(type_off))
        if t is None or depth > MAX_DEPTH:
            return
        seen = self._depth.get(t.offset)
        if seen is not None and seen <= depth:
            return
        self._depth[t.offset] = depth
        if len(self.out) >= MAX_TYPES:
            self.truncated = True
            return
        if self.is_env(t):
            self.envs.append(t)
            return
        name = self.coll.type_name(t.offset)
        # each unit has its own copy of a type (Option<Arc<..>> in 100 units): a name already
        # expanded at this depth or shallower has given every type its copies can reach
        named = self._name_depth.get(name)
        if named is not None and named <= depth:
            return
        self._name_depth[name] = depth
        info = self._info(t, name, depth)
        if info is not None and name not in self.out:
            self.out[name] = info

    def _fields(self, struct_die: D.Die, base: int, depth: int) -> list[Field]:
        unit = self.dwarf.unit_of(struct_die)
        out: list[Field] = []
        for c in struct_die.children if unit is not None else ():
            m = unit.dies[c]  # type: ignore[union-attr]
            if m.tag != D.TAG_MEMBER:
                continue
            ft = m.get(D.AT_TYPE)
            tname = self.coll.type_name(ft)
            out.append(Field(m.get(D.AT_NAME) or "?", base + _offset(m), self.coll._size(ft), tname))
            self.add(ft, depth + (0 if tname.startswith(PLUMBING) else 1))
        return out

    def _info(self, t: D.Die, name: str, depth: int) -> TypeInfo | None:
        size = int(t.get(D.AT_BYTE_SIZE, 0) or 0)
        if t.tag == D.TAG_POINTER:
            pointee = t.get(D.AT_TYPE)
            self.add(pointee, depth + 1)
            return TypeInfo(name, "pointer", size or 8, pointee=self.coll.type_name(pointee))
        if t.tag == D.TAG_BASE_TYPE or t.tag == D.TAG_ENUMERATION:
            return TypeInfo(name, "base", size)
        if t.tag == D.TAG_ARRAY:
            el = t.get(D.AT_TYPE)
            self.add(el, depth + 1)
            return TypeInfo(name, "array", self.coll._size(t.offset), pointee=self.coll.type_name(el))
        if t.tag not in (D.TAG_STRUCTURE, D.TAG_UNION):
            return TypeInfo(name, "other", size)
        unit = self.dwarf.unit_of(t)
        if unit is None:
            return None
        vp = next((unit.dies[c] for c in t.children if unit.dies[c].tag == D.TAG_VARIANT_PART), None)
        fields = self._fields(t, 0, depth)
        if name.startswith("core::marker::PhantomData<"):  # a Vec's element type is named only here
            for c in t.children:
                if unit.dies[c].tag == D.TAG_TEMPLATE_TYPE_PARAM:
                    self.add(unit.dies[c].get(D.AT_TYPE), depth + 1)
        align = int(t.get(D.AT_ALIGNMENT, 0) or 0)
        if vp is None:
            return TypeInfo(name, "union" if t.tag == D.TAG_UNION else "struct", size, tuple(fields), align=align)
        discr_die = self.dwarf.die(vp.get(D.AT_DISCR))
        discr = None
        if discr_die is not None:
            dt = discr_die.get(D.AT_TYPE)
            discr = Field(discr_die.get(D.AT_NAME) or "<discr>", _offset(discr_die), self.coll._size(dt) or 1,
                          self.coll.type_name(dt))
        variants: list[Variant] = []
        for c in vp.children:
            v = unit.dies[c]
            if v.tag != D.TAG_VARIANT:
                continue
            members = [unit.dies[x] for x in v.children if unit.dies[x].tag == D.TAG_MEMBER]
            if not members:
                continue
            m = members[0]
            vt = self.coll._strip_typedefs(self.dwarf.die(m.get(D.AT_TYPE)))
            vfields = tuple(self._fields(vt, _offset(m), depth)) if vt is not None else ()
            value = v.get(D.AT_DISCR_VALUE)
            if value is not None and discr is not None:
                value &= (1 << (8 * discr.size)) - 1
            variants.append(Variant(m.get(D.AT_NAME) or "?", value, vfields))
        return TypeInfo(name, "enum", size, tuple(fields), discr=discr, variants=tuple(variants), align=align)


    def fd_offset(self, ptr_off: int | None) -> int | None:
        """Where the OS fd lies inside what a ``&T`` points at: the ``fd`` of a ``OwnedFd``
        reached through members *by value* only (``TcpStream -> PollEvented -> Option<mio
        TcpStream> -> IoSource -> std TcpStream -> Socket -> FileDesc -> OwnedFd``, 10
        levels: deeper than the type table goes, so searched here, bounded)."""
        p = self.coll._strip_typedefs(self.dwarf.die(ptr_off))
        if p is None or p.tag != D.TAG_POINTER:
            return None
        t = self.coll._strip_typedefs(self.dwarf.die(p.get(D.AT_TYPE)))
        if t is None:
            return None
        if t.offset not in self._fd_cache:
            self._fd_cache[t.offset] = self._fd_search(t, 0, [FD_SEARCH_NODES])
        return self._fd_cache[t.offset]

    def _fd_search(self, t: D.Die, depth: int, budget: list[int]) -> int | None:
        budget[0] -= 1
        if depth > FD_SEARCH_DEPTH or budget[0] <= 0 or t.tag not in (D.TAG_STRUCTURE, D.TAG_UNION):
            return None
        unit = self.dwarf.unit_of(t)
        if unit is None:
            return None
        members: list[D.Die] = []
        for c in t.children:
            d = unit.dies[c]
            if d.tag == D.TAG_MEMBER:
                members.append(d)
            elif d.tag == D.TAG_VARIANT_PART:  # an enum: every variant's payload (Option<E>'s Some)
                for v in d.children:
                    members += [unit.dies[x] for x in unit.dies[v].children if unit.dies[x].tag == D.TAG_MEMBER]
        if (t.get(D.AT_NAME) or "") == "OwnedFd":
            for m in members:
                if m.get(D.AT_NAME) == "fd":
                    return _offset(m)
            return None
        for m in members:
            mt = self.coll._strip_typedefs(self.dwarf.die(m.get(D.AT_TYPE)))
            if mt is None:
                continue
            got = self._fd_search(mt, depth + 1, budget)
            if got is not None:
                return _offset(m) + got
        return None


FD_SEARCH_DEPTH = 16
FD_SEARCH_NODES = 400


def _offset(m: D.Die) -> int:
    v = m.get(D.AT_DATA_MEMBER_LOCATION, 0)
    if isinstance(v, bytes):  # an expression: DW_OP_plus_uconst N
        return D._uleb(v, 1)[0] if v[:1] == b"\x23" else 0
    return int(v)
