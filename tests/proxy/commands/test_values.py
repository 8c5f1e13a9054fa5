"""Decoding locals by type name."""

from __future__ import annotations

import struct

from proxy.snapshot.values import decode_bytes, decode_value

HEAP = {0x5555_0000_1000: "héllo wörld".encode(), 0x5555_0000_2000: b"x" * 1000}


def read(addr: int, size: int) -> bytes | None:
    for base, data in HEAP.items():
        if base <= addr and addr + size <= base + len(data):
            return data[addr - base: addr - base + size]
    return None


def dec(t: str, data: bytes) -> str:
    return decode_bytes(t, data, read)


def test_integers_of_every_width() -> None:
    assert dec("u8", b"\xff") == "255" and dec("i8", b"\xff") == "-1"
    assert dec("i16", struct.pack("<h", -300)) == "-300"
    assert dec("u64", struct.pack("<Q", 2**64 - 1)) == str(2**64 - 1)
    assert dec("isize", struct.pack("<q", -5)) == "-5"
    assert dec("i128", (-(2**100)).to_bytes(16, "little", signed=True)) == str(-(2**100))
    assert dec("u32", b"\x01\x02") == "<u32: 01 02>"  # wrong size: bytes, not a guess


def test_bool_char_float() -> None:
    assert dec("bool", b"\x00") == "false" and dec("bool", b"\x07") == "<invalid bool 0x07>"
    assert dec("char", struct.pack("<I", ord("é"))) == "'é'"
    assert dec("char", struct.pack("<I", 0xD800)) == "<invalid char 0xd800>"
    assert dec("f64", struct.pack("<d", 1.5)) == "1.5" and dec("f32", struct.pack("<f", 0.25)) == "0.25"
    assert dec("f64", struct.pack("<d", float("nan"))) == "nan"


def test_pointers_and_references() -> None:
    assert dec("*const u8", struct.pack("<Q", 0x1234)) == "0x1234"
    assert dec("&mut rt::Thing", struct.pack("<Q", 0xABC)) == "0xabc"
    assert dec("&[u8]", struct.pack("<QQ", 0x10, 3)) == "(0x10, 0x3)"


def test_str_and_string_in_both_compilers_layouts() -> None:
    ptr, n = 0x5555_0000_1000, len("héllo wörld".encode())
    assert dec("&str", struct.pack("<QQ", ptr, n)) == '"héllo wörld"'
    assert dec("alloc::string::String", struct.pack("<QQQ", 32, ptr, n)) == '"héllo wörld"'  # 1.95
    assert dec("alloc::string::String", struct.pack("<QQQ", ptr, 32, n)) == '"héllo wörld"'  # 1.63
    assert dec("alloc::string::String", struct.pack("<QQQ", 0, 1, 0)) == '""'
    long = dec("&str", struct.pack("<QQ", 0x5555_0000_2000, 1000))
    assert long == '"' + "x" * 256 + '"... (1000 bytes)'
    assert dec("&str", struct.pack("<QQ", 0xDEAD, 4)) == "<str at 0xdead, 4 bytes, unreadable>"
    assert dec("&str", struct.pack("<QQ", 1, 2**60)).startswith("<bad str")


def test_strings_are_quoted_not_interpreted() -> None:
    HEAP[0x6000_0000] = b'a"b\\c\n\x1b[31m'
    try:
        got = dec("&str", struct.pack("<QQ", 0x6000_0000, 11))
    finally:
        del HEAP[0x6000_0000]
    assert got == '"a\\"b\\\\c\\u{a}\\u{1b}[31m"'


def test_other_types_as_bytes_and_large_buffers_by_length() -> None:
    assert dec("core::option::Option<u8>", b"\x01\x05") == "<core::option::Option<u8>: 01 05>"
    assert dec("()", b"") == "<(): zero-sized>"
    assert decode_value("[u8; 4096]", 4096, 0x100, read) == "<4096 bytes at 0x100>"
    assert decode_value("u32", 4, 0x5555_0000_1000, read) == str(int.from_bytes(b'h' + 'é'.encode() + b'l', 'little'))


def test_structs_by_their_kept_layout() -> None:
    """Layouts as the analysis keeps them for the corpus program ``stuck`` (rustc 1.95): an
    Arc is its pointer, tokio's MutexGuard holds a reference (8 bytes: before analysis
    version 12 it was recorded with the Mutex's size, 48), and a cell is its value."""
    from proxy.analysis.model import Field, TypeInfo

    arc = "alloc::sync::Arc<tokio::sync::mutex::Mutex<u64>, alloc::alloc::Global>"
    types = {
        arc: TypeInfo(arc, "struct", 8, (
            Field("ptr", 0, 8, "core::ptr::non_null::NonNull<alloc::sync::ArcInner<tokio::sync::mutex::Mutex<u64>>>"),
            Field("phantom", 8, 0, "core::marker::PhantomData<alloc::sync::ArcInner<tokio::sync::mutex::Mutex<u64>>>"),
            Field("alloc", 8, 0, "alloc::alloc::Global"))),
        "tokio::sync::mutex::MutexGuard<u64>": TypeInfo("tokio::sync::mutex::MutexGuard<u64>", "struct", 8, (
            Field("lock", 0, 8, "&tokio::sync::mutex::Mutex<u64>"),)),
        "Pair": TypeInfo("Pair", "struct", 16, (Field("a", 0, 8, "u64"), Field("cell", 8, 8, "core::cell::UnsafeCell<u64>"))),
        "core::cell::UnsafeCell<u64>": TypeInfo("core::cell::UnsafeCell<u64>", "struct", 8, (Field("value", 0, 8, "u64"),)),
        "Loop": TypeInfo("Loop", "struct", 8, (Field("next", 0, 8, "Loop"),)),
    }
    word = struct.pack("<Q", 0x55B479E694D0)
    assert decode_bytes(arc, word, read, types) == "0x55b479e694d0"
    assert decode_bytes("tokio::sync::mutex::MutexGuard<u64>", word, read, types) == "{lock: 0x55b479e694d0}"
    assert decode_bytes("Pair", struct.pack("<QQ", 3, 7), read, types) == "{a: 3, cell: 7}"
    # a layout that names itself ends at the depth limit, in bytes
    assert decode_bytes("Loop", word, read, types) == "{next: {next: {next: <Loop: d0 94 e6 79 b4 55 00 00>}}}"
    # without the layouts: bytes, as before
    assert decode_bytes("Pair", struct.pack("<QQ", 3, 7), read).startswith("<Pair: 03 00")
