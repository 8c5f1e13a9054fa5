"""What a stream or leaf future that reads an I/O handle itself waits for.

Such a leaf keeps no readiness future in memory: the handle's own ``poll_read`` /
``poll_write`` (or ``poll_readable``) registers the task's waker in the entry the handle
shares with the runtime's I/O driver, and the driver takes it out when it wakes:

* tokio: ``ScheduledIo { waiters: Mutex<Waiters { reader, writer, .. }> }``, behind the
  handle's ``Registration { shared: Arc<ScheduledIo> }``;
* async-io (smol, async-std): ``Source { registration: Registration { raw: fd }, state:
  Mutex<[Direction; 2]> }`` (0 read, 1 write), behind ``Async { source: Arc<Source> }``;
  ``Direction { waker }`` is what ``poll_readable`` stores, ``wakers`` (a slab) what the
  ``readable()`` futures store.

Met as: async-std's ``Lines<BufReader<&TcpStream>>`` (a connection's ``lines.next()``),
tokio-tungstenite's ``SplitStream<WebSocketStream<TcpStream>>`` (behind futures' ``BiLock``,
its ``AllowStd`` registering a waker proxy of its own) and its handshake's ``MidHandshake``.

The entry is found in the leaf's memory: its fields by value and its references, Boxes and
Arcs, only into types that can reach an entry (judged once per type, from the DWARF types);
exactly one entry, or nothing is said (a leaf holding two sockets, or a socket and a channel
end, waits on one of them, and memory does not say which).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .node import Node, _short, type_fact

if TYPE_CHECKING:
    from .walker import Reflector

TOKIO_ENTRY = "tokio::runtime::io::scheduled_io::ScheduledIo"
ASYNC_IO_ENTRY = "async_io::reactor::Source"
_DIRECTIONS = ("READABLE", "WRITABLE")  # async-io's Source.state, by index
MAX_VISITS = 400  # (address, type) pairs one search reads at most
MAX_POINTERS = 6  # pointers followed on one path
MAX_SLAB = 64  # a Direction's `wakers` entries read


def io_leaf(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """A leaf that polls an I/O handle it holds (by value or behind references): the set
    waker slots of the driver's entry say what its task waits for."""
    from .describers import _NOT_WRAPPERS, _futurish

    t = r.type(type_name)
    if t is None or t.kind not in ("struct", "enum") or type_name.startswith(_NOT_WRAPPERS) \
            or not reaches(r, type_name):
        return None  # a Pin or Box: the walker goes through it to what it holds
    if any(_futurish(r, f.type_name) for f in t.fields) or any(
            _futurish(r, f.type_name) for v in t.variants for f in v.fields):
        return None  # it holds a future of its own: what it awaits is that one's (the walk goes on)
    detail = io_detail(r, addr, type_name)
    return None if detail is None else Node("leaf", _short(type_name), addr, type_name, detail=detail)


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
    from .describers import OBJECTS

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
    from .describers import _enum_variant

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
    from .describers import _path

    at = _path(r, addr, type_name, "registration", "raw")
    fd = r.mem.u(at, 4) if at is not None else None
    return None if fd is None or fd >= 1 << 31 else fd


def waker_slots(r: Reflector, addr: int, type_name: str) -> list[str] | None:
    """The directions whose waker is set in a driver entry; None: its layout is not known."""
    from .describers import _waker_slots

    if type_name.startswith(TOKIO_ENTRY):
        return _waker_slots(r, (addr, type_name))
    return _async_io_slots(r, addr, type_name)


def _async_io_slots(r: Reflector, addr: int, type_name: str) -> list[str] | None:
    from .describers import _enum_variant, _find_field, _vec_items

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
