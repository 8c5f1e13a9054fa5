"""Decode a coroutine local from target memory, by its DWARF type name.

Scalars are decoded from the type *name* and the member's size: integers of
every width, bool, char, f32/f64, thin pointers and references, ``&str`` and
``String``. A struct whose layout the analysis kept (``Inventory.types``: the
types reflection walks, tokio's guards, Arcs and cells among them) is shown
as ``{field: value, ...}`` down to ``MAX_DEPTH`` levels, zero-sized fields
left out, and a one-field wrapper (``UnsafeCell``, ``NonNull``, ``Arc``'s
``ptr``) as its field's value. Anything else is shown as hex bytes with its
type name, and buffers larger than ``MAX_HEX`` by their length only. Nothing
is evaluated: memory is data. Strings are read bounded by ``MAX_STR`` bytes.

``String`` (= ``Vec<u8>``) changed its field order between compilers
(checked here with pyelftools on the corpus binaries): rustc 1.63 lays out
``RawVec`` as ptr@0, cap@8; rustc 1.95's ``RawVecInner`` as cap@0, ptr@8;
``len`` is at 16 in both. The pointer is told from the capacity by value.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping

from proxy.analysis.model import TypeInfo

ReadMemory = Callable[[int, int], bytes | None]

MAX_HEX = 64
MAX_STR = 256
MAX_DEPTH = 3
Types = Mapping[str, TypeInfo]
_INTS = {
    "u8": (1, False), "u16": (2, False), "u32": (4, False), "u64": (8, False),
    "u128": (16, False), "usize": (8, False),
    "i8": (1, True), "i16": (2, True), "i32": (4, True), "i64": (8, True),
    "i128": (16, True), "isize": (8, True),
}
_POINTER_PREFIXES = ("*const ", "*mut ", "&", "core::ptr::non_null::NonNull<",
                     "alloc::boxed::Box<", "core::ptr::unique::Unique<")
_STRING_TYPES = ("alloc::string::String", "String")
_STR_REF_TYPES = ("&str", "&mut str")


def decode_value(type_name: str, size: int, addr: int, read: ReadMemory, types: Types | None = None) -> str:
    if size > MAX_HEX and not _is_struct(types, type_name):
        return f"<{size} bytes at 0x{addr:x}>"
    data = read(addr, size) if size > 0 else b""
    if data is None or len(data) < size:
        return f"<unreadable at 0x{addr:x}>"
    return decode_bytes(type_name, data, read, types)


def _is_struct(types: Types | None, type_name: str) -> bool:
    t = types.get(type_name.strip()) if types else None
    return t is not None and t.kind == "struct" and bool(t.fields)


def decode_bytes(type_name: str, data: bytes, read: ReadMemory, types: Types | None = None, depth: int = 0) -> str:
    t = type_name.strip()
    size = len(data)
    if t in _INTS and _INTS[t][0] == size:
        return str(int.from_bytes(data, "little", signed=_INTS[t][1]))
    if t == "bool" and size == 1:
        return {0: "false", 1: "true"}.get(data[0], f"<invalid bool 0x{data[0]:02x}>")
    if t == "char" and size == 4:
        return _char(int.from_bytes(data, "little"))
    if t in ("f32", "f64") and size in (4, 8) and size == (4 if t == "f32" else 8):
        return _float(struct.unpack("<f" if size == 4 else "<d", data)[0])
    if t in _STR_REF_TYPES and size == 16:
        return _str_at(_word(data, 0), _word(data, 8), read)
    if t in _STRING_TYPES and size == 24:
        return _string(data, read)
    if t.startswith(_POINTER_PREFIXES) and size == 8:
        return f"0x{_word(data, 0):x}"
    if t.startswith(_POINTER_PREFIXES) and size == 16:
        return f"(0x{_word(data, 0):x}, 0x{_word(data, 8):x})"  # fat pointer: data, meta
    if _is_struct(types, t) and depth < MAX_DEPTH:
        return _struct(types[t], data, read, types, depth)  # type: ignore[index]
    return f"<{t}: {data.hex(' ')}>" if data else f"<{t}: zero-sized>"


def _struct(ti: TypeInfo, data: bytes, read: ReadMemory, types: Types | None, depth: int) -> str:
    fields = [f for f in ti.fields if f.size > 0]
    parts = []
    for f in fields:
        size = f.size
        raw = data[f.offset:f.offset + size]
        if len(raw) < size:
            parts.append((f.name, "<outside the value>"))
            continue
        parts.append((f.name, decode_bytes(f.type_name, raw, read, types, depth + 1)))
    if len(parts) == 1 and parts[0][0] in ("value", "pointer", "ptr", "__0", "inner"):
        return parts[0][1]  # a one-field wrapper: its field's value
    return "{" + ", ".join(f"{n}: {v}" for n, v in parts) + "}"


def _word(data: bytes, at: int) -> int:
    return int.from_bytes(data[at:at + 8], "little")


def _char(v: int) -> str:
    if v > 0x10FFFF or 0xD800 <= v <= 0xDFFF:
        return f"<invalid char 0x{v:x}>"
    return repr(chr(v))


def _float(v: float) -> str:
    return repr(v) if math.isfinite(v) else str(v)


def _string(data: bytes, read: ReadMemory) -> str:
    w0, w1, length = _word(data, 0), _word(data, 8), _word(data, 16)
    ptr = _pick_pointer(w0, w1, length)
    if ptr is None:
        return f"<String: {data.hex(' ')}>"
    return _str_at(ptr, length, read)


def _pick_pointer(w0: int, w1: int, length: int) -> int | None:
    """Which of the first two words of a Vec<u8> is the pointer (the other is cap)."""
    if w0 == 0 and w1 != 0:
        return w1  # empty, 1.95: cap 0, dangling ptr
    if w1 == 0 and w0 != 0:
        return w0  # empty, 1.63
    big0, big1 = w0 > 0xFFFF_FFFF, w1 > 0xFFFF_FFFF
    if big0 != big1:
        return w0 if big0 else w1
    fits0, fits1 = w1 >= length, w0 >= length  # the other word must be a capacity >= len
    if fits0 != fits1:
        return w0 if fits0 else w1
    return None


def _str_at(ptr: int, length: int, read: ReadMemory) -> str:
    if length == 0:
        return '""'
    if length > 1 << 40:
        return f"<bad str: len {length}>"
    take = min(length, MAX_STR)
    raw = read(ptr, take)
    if raw is None:
        return f"<str at 0x{ptr:x}, {length} bytes, unreadable>"
    text = raw.decode("utf-8", errors="replace")
    more = f"... ({length} bytes)" if length > take else ""
    return _quote(text) + more


def _quote(text: str) -> str:
    out = text.replace("\\", "\\\\").replace('"', '\\"')
    out = "".join(c if c.isprintable() else f"\\u{{{ord(c):x}}}" for c in out)
    return f'"{out}"'
