"""I/O: what a leaf polling an I/O handle waits for. tokio's Readiness and the io::util futures
that borrow a handle, async-io's Source: the driver's entry (ScheduledIo), its interest,
readiness and waker slots, and the fd it is for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..node import missing_or_unreadable, Node, short_type, type_fact
from .fields import _enum_variant, _field, _find_field, _futurish, _NOT_WRAPPERS, _path, _vec_items
from .objects import OBJECTS

if TYPE_CHECKING:
    from ..walker import Reflector


_INTEREST = ((1, "READABLE"), (2, "WRITABLE"), (4, "AIO"), (8, "LIO"), (16, "PRIORITY"))  # mio 0.8


_READY = ((1, "readable"), (2, "writable"), (4, "read closed"), (8, "write closed"))  # tokio 1.24


def readiness(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``Readiness { scheduled_io: &ScheduledIo, state: Init|Waiting|Done, waiter:
    UnsafeCell<Waiter { interest, .. }> }``.

    The fd is not in the Readiness: ``ScheduledIo`` is the I/O driver's slab entry (readiness
    bits and waiters; mio identifies it by a token, not by fd). It is in the handle the
    enclosing coroutine borrows as ``self`` (``TcpStream::ready(&self)`` ->
    ``PollEvented -> mio TcpStream -> .. -> OwnedFd``): the walker keeps that as
    ``io_handle`` (``Inventory.fd_offsets``). A Readiness awaited with no such coroutine
    around it (a hand-written future polling ``Registration`` directly) has no fd to show."""
    sio = _field(r, type_name, "scheduled_io")
    if sio is None:
        return None
    node = Node("leaf", "tokio::io::Readiness", addr, type_name)
    ptr = r.mem.word(addr + sio.offset)
    if ptr is None:
        return missing_or_unreadable(r, addr, type_name, "Readiness")
    at = _path(r, addr, type_name, "waiter", "value", "interest")
    bits = r.mem.u(at, 1) if at is not None else None
    what = "|".join(n for b, n in _INTEREST if bits & b) if bits else "readiness"
    if r.io_handle is not None:
        fd, handle = r.io_handle
        what += f" on fd {fd} ({handle})" if fd >= 0 else f" on a closed {handle}"
    st = _field(r, type_name, "state")
    state = r.mem.u(addr + st.offset, 1) if st is not None else None
    node.detail = f"{'waits for' if state in (None, 0, 1) else 'got'} {what}, ScheduledIo 0x{ptr:x}{_ready_now(r, ptr)}"
    return node


def _ready_now(r: Reflector, sio: int) -> str:
    ready = r.mem.word(sio)  # ScheduledIo { readiness: AtomicUsize, .. }: bits 0..16
    return "" if ready is None else ", ready now: " + (", ".join(n for b, n in _READY if ready & b) or "none")


_WAKER_SLOTS = (("reader", "READABLE"), ("writer", "WRITABLE"))  # ScheduledIo's Waiters


def io_borrow(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """A leaf future that borrows an I/O handle and polls it (tokio's ``io::util`` futures:
    ``Read { reader: &mut TcpStream, .. }``, ``WriteAll``, ``ReadLine``...): no ``Readiness``
    future in memory, the handle's own ``poll_read``/``poll_write`` registers the task's waker
    in the ``ScheduledIo`` its ``Registration`` shares with the I/O driver, in the slot of its
    direction (``Waiters { reader, writer }``; the driver takes it out when it wakes). The set
    slots say what the task waits for; the fd is behind the pointer field
    (``Inventory.fd_offsets``)."""
    t = r.type(type_name)
    if t is None or t.kind != "struct" or not any(f.type_name in r.inv.fd_offsets for f in t.fields):
        return None
    if any(_futurish(r, f.type_name) for f in t.fields):
        return None  # it holds a future of its own: what it awaits is that one's (the walk goes on)
    for f in t.fields:
        fd_off = r.inv.fd_offsets.get(f.type_name)
        if fd_off is None:
            continue
        handle = r.mem.word(addr + f.offset)
        pointee = r.type(f.type_name)
        if not handle or pointee is None or not pointee.pointee:
            return missing_or_unreadable(r, addr, type_name, short_type(type_name))
        sio = _scheduled_io(r, handle, pointee.pointee)
        if sio is None:
            return None
        fd = r.mem.u(handle + fd_off, 4)
        on = "" if fd is None else f" on fd {fd - (1 << 32) if fd >= 1 << 31 else fd} ({short_type(pointee.pointee)})"
        slots = _waker_slots(r, sio)
        what = f"waits for {'|'.join(slots)}" if slots else "no waker registered (woken)"
        return Node("leaf", short_type(type_name), addr, type_name,
                    detail=f"{what}{on}, ScheduledIo 0x{sio[0]:x}{_ready_now(r, sio[0])}")
    return None


def _scheduled_io(r: Reflector, handle: int, type_name: str) -> tuple[int, str] | None:
    """(address, type) of the ``ScheduledIo`` an I/O handle's ``Registration { shared: Arc<..> }``
    points at."""
    found = _find_field(r, type_name, "registration")
    shared = _path(r, handle + found[0], found[1], "shared", "ptr") if found is not None else None
    arc = r.mem.word(shared) if shared is not None else None
    inner = _arc_inner_type(r, found[1]) if found is not None else None
    data = _field(r, inner, "data") if inner is not None else None
    if not arc or data is None:
        return None
    return arc + data.offset, data.type_name


def _arc_inner_type(r: Reflector, registration: str) -> str | None:
    t = r.type(registration)
    shared = t.field("shared") if t is not None else None
    return shared_inner_type(r, shared.type_name) if shared is not None else None


def shared_inner_type(r: Reflector, rc: str) -> str | None:
    """An ``Arc<T>``'s ``ArcInner<T>`` type (an ``Rc<T>``'s ``RcInner<T>``): the pointee of
    its ``ptr: NonNull<..>``."""
    arc = r.type(rc)
    ptr = arc.field("ptr") if arc is not None else None
    nn = r.type(ptr.type_name) if ptr is not None else None
    raw = r.type(nn.fields[0].type_name) if nn is not None and nn.fields else None
    return raw.pointee if raw is not None and raw.pointee else None


def _waker_slots(r: Reflector, sio: tuple[int, str]) -> list[str]:
    out = []
    for slot, what in _WAKER_SLOTS:
        found = _find_field(r, sio[1], slot, max_depth=6)
        if found is None:
            continue
        v, ok = _enum_variant(r, sio[0] + found[0], found[1])
        if ok and v is not None and v.name == "Some":
            out.append(what)
    return out


TOKIO_ENTRY = "tokio::runtime::io::scheduled_io::ScheduledIo"


ASYNC_IO_ENTRY = "async_io::reactor::Source"


_DIRECTIONS = ("READABLE", "WRITABLE")  # async-io's Source.state, by index


MAX_VISITS = 400  # (address, type) pairs one search reads at most


MAX_POINTERS = 6  # pointers followed on one path


MAX_SLAB = 64  # a Direction's `wakers` entries read


def io_leaf(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """A leaf that polls an I/O handle it holds (by value or behind references): the set
    waker slots of the driver's entry say what its task waits for."""

    t = r.type(type_name)
    if t is None or t.kind not in ("struct", "enum") or type_name.startswith(_NOT_WRAPPERS) \
            or not reaches(r, type_name):
        return None  # a Pin or Box: the walker goes through it to what it holds
    if any(_futurish(r, f.type_name) for f in t.fields) or any(
            _futurish(r, f.type_name) for v in t.variants for f in v.fields):
        return None  # it holds a future of its own: what it awaits is that one's (the walk goes on)
    detail = io_detail(r, addr, type_name)
    return None if detail is None else Node("leaf", short_type(type_name), addr, type_name, detail=detail)


def io_detail(r: Reflector, addr: int, type_name: str) -> str | None:
    """What the one driver entry a value leads to says its task waits for (None: no entry,
    several, or one whose layout is not known). Also asked of a ``poll_fn`` closure's
    captures (async-io's ``optimistic``: ``&mut Pin<&mut Readable>``, an accept's wait)."""
    if not reaches(r, type_name):
        return None
    found = find_entries(r, addr, type_name)
    if len(found) != 1:
        return None
    (entry, etype), fd = next(iter(found.items()))
    if _other_wait(etype):
        return None  # a channel end: what it waits on is said where the walk meets it
    slots = waker_slots(r, entry, etype)
    if slots is None:
        return None
    what = f"waits for {'|'.join(slots)}" if slots else "no waker registered (woken)"
    on = "" if fd is None else f" on fd {fd}"
    kind = "ScheduledIo" if etype.startswith(TOKIO_ENTRY) else "async-io Source"
    return f"{what}{on}, {kind} 0x{entry:x}"


def reaches(r: Reflector, type_name: str) -> bool:
    """Whether a value of this type can lead to an I/O driver entry (by type alone)."""
    return type_fact(r, "_reflect_io_reach", type_name, lambda: type_name.startswith((TOKIO_ENTRY, ASYNC_IO_ENTRY))
                     or _other_wait(type_name) or any(reaches(r, n) for _, n in _next_types(r, type_name)))


def _other_wait(type_name: str) -> bool:
    """A channel end (describers.OBJECTS): a value holding one may wait there, not on its socket."""

    return type_name.startswith(tuple(p for p, _ in OBJECTS))


def _next_types(r: Reflector, type_name: str) -> list[tuple[int | None, str]]:
    """(offset, type) of what a value leads to: its fields (every variant's, for an enum) by
    value, or (None, pointee) for a reference, a Box or an Arc's pointer."""
    t = r.type(type_name)
    if t is None:
        return []
    if t.kind == "pointer":
        if t.pointee and (type_name.startswith(("&", "alloc::boxed::Box<"))
                          or t.pointee.startswith("alloc::sync::ArcInner<")):
            return [(None, t.pointee)]
        return []
    out = [(f.offset, f.type_name) for f in t.fields]
    for v in t.variants:
        out += [(f.offset, f.type_name) for f in v.fields]
    return out


def find_entries(r: Reflector, addr: int, type_name: str) -> dict[tuple[int, str], int | None]:
    """The driver entries reachable in memory from a value -> the fd of each when found."""

    out: dict[tuple[int, str], int | None] = {}
    fd: int | None = None
    stack = [(addr, type_name, 0)]
    visited: set[tuple[int, str]] = set()
    while stack and len(visited) < MAX_VISITS:
        at, tn, hops = stack.pop()
        if (at, tn) in visited or not reaches(r, tn):
            continue
        visited.add((at, tn))
        handle_fd = _fd(r, at, tn)
        fd = handle_fd if handle_fd is not None else fd
        if _other_wait(tn):
            out[(at, tn)] = None
            continue
        if tn.startswith((TOKIO_ENTRY, ASYNC_IO_ENTRY)):
            out[(at, tn)] = _source_fd(r, at, tn) if tn.startswith(ASYNC_IO_ENTRY) else fd
            continue
        t = r.type(tn)
        if t is None:
            continue
        if t.kind == "pointer":
            if hops < MAX_POINTERS and (p := r.mem.word(at)) and p < 1 << 47:
                stack += [(p, n, hops + 1) for _, n in _next_types(r, tn)]
            continue
        fields = list(t.fields)
        if t.kind == "enum":  # only the variant in memory
            v, ok = _enum_variant(r, at, tn)
            fields += list(v.fields) if ok and v is not None else []
        stack += [(at + f.offset, f.type_name, hops) for f in reversed(fields)]
    return out


def _fd(r: Reflector, addr: int, type_name: str) -> int | None:
    """The OS fd of a tokio I/O handle met by value (``Inventory.fd_offsets`` of ``&T``)."""
    off = r.inv.fd_offsets.get("&" + type_name)
    fd = r.mem.u(addr + off, 4) if off is not None else None
    return None if fd is None or fd >= 1 << 31 else fd


def _source_fd(r: Reflector, addr: int, type_name: str) -> int | None:

    at = _path(r, addr, type_name, "registration", "raw")
    fd = r.mem.u(at, 4) if at is not None else None
    return None if fd is None or fd >= 1 << 31 else fd


def waker_slots(r: Reflector, addr: int, type_name: str) -> list[str] | None:
    """The directions whose waker is set in a driver entry; None: its layout is not known."""

    if type_name.startswith(TOKIO_ENTRY):
        return _waker_slots(r, (addr, type_name))
    return _async_io_slots(r, addr, type_name)


def _async_io_slots(r: Reflector, addr: int, type_name: str) -> list[str] | None:

    found = _find_field(r, type_name, "state")
    arr = _find_field(r, found[1], "value", max_depth=3) if found is not None else None
    at = r.type(arr[1]) if arr is not None else None
    d = r.type(at.pointee or "") if at is not None and at.kind == "array" else None
    if found is None or arr is None or d is None or d.size <= 0:
        return None
    out = []
    for i, what in enumerate(_DIRECTIONS):
        base = addr + found[0] + arr[0] + i * d.size
        waker = d.field("waker")
        v, ok = _enum_variant(r, base + waker.offset, waker.type_name) if waker is not None else (None, False)
        set_ = ok and v is not None and v.name == "Some"
        wakers = d.field("wakers")
        entries = _find_field(r, wakers.type_name, "entries") if wakers is not None and not set_ else None
        items = _vec_items(r, base + wakers.offset + entries[0], entries[1]) if entries is not None else None
        if items is not None and items[2] is not None:
            data, n, el = items
            for k in range(min(n, MAX_SLAB)):
                e, ok = _enum_variant(r, data + k * el.size, el.name)
                slot = e.fields[0] if ok and e is not None and e.name == "Occupied" and e.fields else None
                w, ok = _enum_variant(r, data + k * el.size + slot.offset, slot.type_name) if slot else (None, False)
                if ok and w is not None and w.name == "Some":
                    set_ = True
                    break
        if set_:
            out.append(what)
    return out
