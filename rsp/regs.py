"""Register blocks: the layout of a ``g`` reply, from a target description.

A target description (``qXfer:features:read:target.xml``) lists registers in
features; ``<xi:include href="...">`` pulls in other annexes. Registers are
numbered in document order from 0; a ``regnum`` attribute moves the counter.
The ``g`` packet holds every register in register-number order, back to
back, each in target byte order (little-endian here) - which is how gdb
computes the ``g/G Offset`` column of ``maint print remote-registers``.
A register the stub cannot read is sent as ``xx`` per byte.

`AMD64_LINUX_NOXML` is the 560-byte block gdbserver 13.1 sends on x86-64
when the client did *not* offer ``xmlRegisters=i386`` (DESIGN.md §3 rule 11:
the proxy never offers it to gdbserver). `amd64_linux_target_xml` describes
exactly that block, with the same register numbers, for clients that ask
the proxy for a target description. `AARCH64_LINUX` and
`aarch64_linux_target_xml` are gdb's AArch64 block (core and fpu features),
in which the core stub serves an AArch64 core's registers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

from rsp.errors import MalformedPacket
from rsp.framing import hex_decode, rle_expand

if TYPE_CHECKING:
    import xml.etree.ElementTree as ET

    import construct  # type: ignore[import-untyped]

# construct and ElementTree are imported where a layout is built from a
# target description: every proxy imports this module for the target
# description it serves, and the two cost ~20 ms of each start.

_XI_INCLUDE = "{http://www.w3.org/2001/XInclude}include"

RegisterValue = int | bytes | None


@dataclass(frozen=True, slots=True)
class Register:
    name: str
    regnum: int
    bitsize: int
    offset: int  # byte offset in the g block
    type: str = "int"
    feature: str = ""
    group: str | None = None

    @property
    def size(self) -> int:
        return self.bitsize // 8


class TargetDescriptionError(ValueError):
    """A target description that cannot be turned into a layout."""


class RegisterLayout:
    """The registers of one target, with their place in the ``g`` block."""

    def __init__(self, registers: Iterable[Register], *, architecture: str | None = None) -> None:
        self.registers = tuple(sorted(registers, key=lambda r: r.regnum))
        self.architecture = architecture
        self._by_name = {r.name: r for r in self.registers}
        self._by_regnum = {r.regnum: r for r in self.registers}
        self.size = sum(r.size for r in self.registers)

    # -- building -----------------------------------------------------------

    @classmethod
    def from_specs(
        cls, specs: Iterable[tuple[str, int, str]], *, architecture: str | None = None
    ) -> RegisterLayout:
        """From (name, bitsize, type) in register-number order from 0."""
        registers = []
        offset = 0
        for regnum, (name, bitsize, type_) in enumerate(specs):
            registers.append(Register(name, regnum, bitsize, offset, type_))
            offset += bitsize // 8
        return cls(registers, architecture=architecture)

    @classmethod
    def from_target_xml(
        cls,
        xml: str | bytes,
        includes: Mapping[str, str | bytes] | None = None,
    ) -> RegisterLayout:
        """Parse ``target.xml``; `includes` maps annex names to their text."""
        root = _parse_xml(xml, "target.xml")
        arch = root.findtext("architecture")
        found: list[tuple[str, int | None, int, str, str, str | None]] = []
        _collect(root, includes or {}, "", found, depth=0)
        return cls(_number(found), architecture=arch)

    # -- queries ------------------------------------------------------------

    def register(self, name: str) -> Register:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no register named {name!r} in this layout") from None

    def by_regnum(self, regnum: int) -> Register:
        return self._by_regnum[regnum]

    def offset_of(self, name: str) -> int:
        return self.register(name).offset

    def regnum_of(self, name: str) -> int:
        return self.register(name).regnum

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.registers)

    # -- decoding -----------------------------------------------------------

    def to_bytes(self, g: bytes | str) -> tuple[bytes, bytes | None]:
        """(raw bytes, availability mask or None) of a ``g`` block.

        `g` is the hex text of a ``g`` reply (run-length encoded or not,
        ``xx`` for unavailable bytes) as `bytes` or `str`, or the raw block
        itself: a `bytes` value exactly `size` long is taken as raw."""
        if isinstance(g, str):
            text = g.encode("ascii")
        elif len(g) == self.size:
            return bytes(g), None
        else:
            text = rle_expand(bytes(g))
        if b"x" not in text:
            return hex_decode(text), None
        mask = hex_decode(text.replace(b"0", b"1").replace(b"x", b"0").translate(_NONZERO))
        return hex_decode(text.replace(b"x", b"0")), mask

    def read(self, g: bytes | str, name: str) -> RegisterValue:
        """One register from a ``g`` block: the fast path (no construct,
        only the register's own hex digits are decoded)."""
        reg = self._by_name.get(name) or self.register(name)
        if isinstance(g, str):
            text = g.encode("ascii")
        elif len(g) == self.size:
            return _value(reg, bytes(g), None)
        else:
            text = rle_expand(bytes(g))
        chunk = text[2 * reg.offset : 2 * (reg.offset + reg.size)]
        if len(chunk) < 2 * reg.size or b"x" in chunk:
            return None
        data = hex_decode(chunk)
        return int.from_bytes(data, "little") if reg.size <= 8 else data

    def decode(self, g: bytes | str) -> dict[str, RegisterValue]:
        """Every register in the block: an int (little-endian) for registers
        of 64 bits or fewer, bytes for wider ones, None where unavailable
        (``xx``) or past the end of a short block."""
        data, mask = self.to_bytes(g)
        fitting = self._fitting(len(data))
        parsed: Any = self._struct(fitting).parse(data)
        out: dict[str, RegisterValue] = {r.name: None for r in self.registers}
        for reg in self.registers[:fitting]:
            if mask is None or _available(reg, mask):
                out[reg.name] = parsed[reg.name]
        return out

    def _fitting(self, length: int) -> int:
        count = 0
        for reg in self.registers:
            if reg.offset + reg.size > length:
                break
            count += 1
        return count

    def _struct(self, count: int) -> construct.Struct:
        import construct  # noqa: F811 - see the module's imports

        cache = self._structs
        if count not in cache:
            fields = [reg.name / _field(reg) for reg in self.registers[:count]]
            cache[count] = construct.Struct(*fields)
        return cache[count]

    @cached_property
    def _structs(self) -> dict[int, construct.Struct]:
        return {}

    def __repr__(self) -> str:
        return f"RegisterLayout({len(self.registers)} registers, {self.size} bytes)"


_NONZERO = bytes.maketrans(b"23456789abcdefABCDEF", b"1" * 20)


def _field(reg: Register) -> construct.Construct:
    import construct  # noqa: F811

    if reg.size <= 8:
        return construct.BytesInteger(reg.size, swapped=True)
    return construct.Bytes(reg.size)


def _available(reg: Register, mask: bytes) -> bool:
    return all(mask[reg.offset : reg.offset + reg.size])


def _value(reg: Register, data: bytes, mask: bytes | None) -> RegisterValue:
    end = reg.offset + reg.size
    if end > len(data) or (mask is not None and not _available(reg, mask)):
        return None
    chunk = data[reg.offset : end]
    return int.from_bytes(chunk, "little") if reg.size <= 8 else chunk


# -- target.xml parsing -----------------------------------------------------


def _parse_xml(xml: str | bytes, annex: str) -> ET.Element:
    import xml.etree.ElementTree as ET  # noqa: F811

    try:
        return ET.fromstring(xml)
    except ET.ParseError as exc:
        raise TargetDescriptionError(f"{annex}: not well-formed XML ({exc})") from None


def _collect(
    element: ET.Element,
    includes: Mapping[str, str | bytes],
    feature: str,
    out: list[tuple[str, int | None, int, str, str, str | None]],
    depth: int,
) -> None:
    if depth > 16:
        raise TargetDescriptionError("xi:include nesting deeper than 16 (a cycle?)")
    for child in element:
        if child.tag == _XI_INCLUDE:
            href = child.get("href", "")
            if href not in includes:
                raise TargetDescriptionError(f"target description includes {href!r}, not given")
            _collect_root(_parse_xml(includes[href], href), includes, feature, out, depth + 1)
        elif child.tag == "feature":
            _collect(child, includes, child.get("name", ""), out, depth)
        elif child.tag == "reg":
            out.append(_reg_spec(child, feature))


def _collect_root(
    root: ET.Element,
    includes: Mapping[str, str | bytes],
    feature: str,
    out: list[tuple[str, int | None, int, str, str, str | None]],
    depth: int,
) -> None:
    if root.tag == "feature":
        _collect(root, includes, root.get("name", ""), out, depth)
    else:
        _collect(root, includes, feature, out, depth)


def _reg_spec(el: ET.Element, feature: str) -> tuple[str, int | None, int, str, str, str | None]:
    name = el.get("name")
    bits = el.get("bitsize")
    if not name or not bits or not bits.isdigit():
        raise TargetDescriptionError(f"<reg> needs a name and a numeric bitsize: {el.attrib}")
    regnum = el.get("regnum")
    if regnum is not None and not regnum.isdigit():
        raise TargetDescriptionError(f"register {name}: regnum {regnum!r} is not a number")
    number = int(regnum) if regnum is not None else None
    return (name, number, int(bits), el.get("type", "int"), feature, el.get("group"))


def _number(found: list[tuple[str, int | None, int, str, str, str | None]]) -> list[Register]:
    numbered = []
    next_num = 0
    for name, regnum, bits, type_, feature, group in found:
        if regnum is not None:
            next_num = regnum
        numbered.append((next_num, name, bits, type_, feature, group))
        next_num += 1
    numbered.sort()
    registers = []
    offset = 0
    seen: set[int] = set()
    for regnum, name, bits, type_, feature, group in numbered:
        if regnum in seen:
            raise TargetDescriptionError(f"register number {regnum} is used twice ({name})")
        seen.add(regnum)
        registers.append(Register(name, regnum, bits, offset, type_, feature, group))
        offset += bits // 8
    return registers


# -- amd64 GNU/Linux without XML registers ----------------------------------

_GPRS = ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp") + tuple(
    f"r{i}" for i in range(8, 16)
)
_GPR_TYPES = {"rbp": "data_ptr", "rsp": "data_ptr"}
_SEGS = ("cs", "ss", "ds", "es", "fs", "gs")
_FPU = ("fctrl", "fstat", "ftag", "fiseg", "fioff", "foseg", "fooff", "fop")

_CORE: list[tuple[str, int, str]] = (
    [(n, 64, _GPR_TYPES.get(n, "int64")) for n in _GPRS]
    + [("rip", 64, "code_ptr"), ("eflags", 32, "i386_eflags")]
    + [(n, 32, "int32") for n in _SEGS]
    + [(f"st{i}", 80, "i387_ext") for i in range(8)]
    + [(n, 32, "int") for n in _FPU]
)
_SSE: list[tuple[str, int, str]] = [(f"xmm{i}", 128, "vec128") for i in range(16)] + [
    ("mxcsr", 32, "i386_mxcsr")
]
_LINUX: list[tuple[str, int, str]] = [("orig_rax", 64, "int")]
_SEGMENTS: list[tuple[str, int, str]] = [("fs_base", 64, "int"), ("gs_base", 64, "int")]

AMD64_LINUX_NOXML = RegisterLayout.from_specs(
    _CORE + _SSE + _LINUX + _SEGMENTS, architecture="i386:x86-64"
)
"""gdbserver 13.1's x86-64 ``g`` block without ``xmlRegisters=i386``:
560 bytes, registers 0-59 (rip 16, eflags 17, orig_rax 57 @536, fs_base 58
@544, gs_base 59 @552). Checked against ``maint print remote-registers``
of gdb 13.1 connected to gdbserver 13.1 (tests/rsp/test_regs_real.py)."""

AMD64_PC_REGNUM = 16
AMD64_SP_REGNUM = 7
AMD64_FP_REGNUM = 6


def _reg_xml(name: str, bits: int, type_: str, regnum: int, extra: str = "") -> str:
    return f'    <reg name="{name}" bitsize="{bits}" type="{type_}" regnum="{regnum}"{extra}/>\n'


_EFLAGS_BITS = (
    ("CF", 0), ("", 1), ("PF", 2), ("AF", 4), ("ZF", 6), ("SF", 7), ("TF", 8),
    ("IF", 9), ("DF", 10), ("OF", 11), ("NT", 14), ("RF", 16), ("VM", 17),
    ("AC", 18), ("VIF", 19), ("VIP", 20), ("ID", 21),
)  # fmt: skip
_MXCSR_BITS = (
    ("IE", 0), ("DE", 1), ("ZE", 2), ("OE", 3), ("UE", 4), ("PE", 5), ("DAZ", 6),
    ("IM", 7), ("DM", 8), ("ZM", 9), ("OM", 10), ("UM", 11), ("PM", 12), ("FZ", 15),
)  # fmt: skip


def _flags_xml(type_id: str, bits: tuple[tuple[str, int], ...]) -> str:
    fields = "".join(
        f'    <field name="{n}" start="{b}" end="{b}" type="bool"/>\n' for n, b in bits
    )
    return f'  <flags id="{type_id}" size="4">\n{fields}  </flags>\n'


_VEC128_TYPES = """\
  <vector id="v8bf16" type="bfloat16" count="8"/>
  <vector id="v8h" type="ieee_half" count="8"/>
  <vector id="v4f" type="ieee_single" count="4"/>
  <vector id="v2d" type="ieee_double" count="2"/>
  <vector id="v16i8" type="int8" count="16"/>
  <vector id="v8i16" type="int16" count="8"/>
  <vector id="v4i32" type="int32" count="4"/>
  <vector id="v2i64" type="int64" count="2"/>
  <union id="vec128">
    <field name="v8_bfloat16" type="v8bf16"/>
    <field name="v8_half" type="v8h"/>
    <field name="v4_float" type="v4f"/>
    <field name="v2_double" type="v2d"/>
    <field name="v16_int8" type="v16i8"/>
    <field name="v8_int16" type="v8i16"/>
    <field name="v4_int32" type="v4i32"/>
    <field name="v2_int64" type="v2i64"/>
    <field name="uint128" type="uint128"/>
  </union>
"""

_LLDB_GENERIC = {"rip": "pc", "rsp": "sp", "rbp": "fp", "eflags": "flags",
                 "pc": "pc", "sp": "sp", "x29": "fp", "x30": "ra", "cpsr": "flags"}


def _feature_xml(name: str, types: str, regs: list[tuple[str, int, str]], first: int) -> str:
    body = types
    for i, (reg, bits, type_) in enumerate(regs):
        extra = ""
        if reg in _LLDB_GENERIC:
            extra += f' generic="{_LLDB_GENERIC[reg]}"'
        body += _reg_xml(reg, bits, type_, first + i, extra)
    return (
        '<?xml version="1.0"?>\n<!DOCTYPE feature SYSTEM "gdb-target.dtd">\n'
        f'<feature name="{name}">\n{body}</feature>\n'
    )


def amd64_linux_target_xml() -> dict[str, str]:
    """A target description of `AMD64_LINUX_NOXML`: ``target.xml`` plus the
    feature annexes it includes, keyed by annex name (serve each through
    ``qXfer:features:read:<name>``). Same names, sizes and numbers as gdb's
    built-in amd64-linux description, i.e. gdbserver 13.1's no-XML block."""
    core_types = _flags_xml("i386_eflags", _EFLAGS_BITS)
    sse_types = _VEC128_TYPES + _flags_xml("i386_mxcsr", _MXCSR_BITS)
    n_core, n_sse = len(_CORE), len(_SSE)
    files = {
        "64bit-core.xml": _feature_xml("org.gnu.gdb.i386.core", core_types, _CORE, 0),
        "64bit-sse.xml": _feature_xml("org.gnu.gdb.i386.sse", sse_types, _SSE, n_core),
        "64bit-linux.xml": _feature_xml("org.gnu.gdb.i386.linux", "", _LINUX, n_core + n_sse),
        "64bit-segments.xml": _feature_xml(
            "org.gnu.gdb.i386.segments", "", _SEGMENTS, n_core + n_sse + 1
        ),
    }
    return _with_target(files, "i386:x86-64")


def _with_target(files: dict[str, str], architecture: str) -> dict[str, str]:
    """``files`` (feature annexes) and the ``target.xml`` that includes them."""
    includes = "".join(f'  <xi:include href="{name}"/>\n' for name in files)
    files["target.xml"] = (
        '<?xml version="1.0"?>\n<!DOCTYPE target SYSTEM "gdb-target.dtd">\n'
        '<target xmlns:xi="http://www.w3.org/2001/XInclude">\n'
        f"  <architecture>{architecture}</architecture>\n"
        "  <osabi>GNU/Linux</osabi>\n"
        f"{includes}</target>\n"
    )
    return files


def check_layout(layout: RegisterLayout, expected: RegisterLayout) -> list[str]:
    """Differences (name, number, size, offset) between two layouts."""
    problems = []
    mine = {r.regnum: r for r in layout.registers}
    for reg in expected.registers:
        got = mine.get(reg.regnum)
        if got is None:
            problems.append(f"register {reg.regnum} ({reg.name}) missing")
        elif (got.name, got.bitsize, got.offset) != (reg.name, reg.bitsize, reg.offset):
            problems.append(f"register {reg.regnum}: {got} != {reg}")
    if layout.size != expected.size:
        problems.append(f"size {layout.size} != {expected.size}")
    return problems


def parse_g_reply(body: bytes, layout: RegisterLayout) -> dict[str, RegisterValue]:
    """Decode a ``g`` reply body; an error reply raises `MalformedPacket`."""
    if body.startswith(b"E") and len(body) == 3:
        raise MalformedPacket(body, "g reply is an error")
    return layout.decode(body)


# -- AArch64 GNU/Linux --------------------------------------------------------

_A64_CORE: list[tuple[str, int, str]] = (
    [(f"x{i}", 64, "int") for i in range(31)]
    + [("sp", 64, "data_ptr"), ("pc", 64, "code_ptr"), ("cpsr", 32, "int")]
)
_A64_FPU: list[tuple[str, int, str]] = [(f"v{i}", 128, "aarch64v") for i in range(32)] + [
    ("fpsr", 32, "int"), ("fpcr", 32, "int")
]

AARCH64_LINUX = RegisterLayout.from_specs(_A64_CORE + _A64_FPU, architecture="aarch64")
"""gdb's aarch64 block (``org.gnu.gdb.aarch64.core`` and ``.fpu``, no SVE): 788 bytes,
x0-x30 (0-30), sp 31 @248, pc 32 @256, a 32-bit cpsr 33 @264, v0-v31 34-65 @268,
fpsr 66 @780, fpcr 67 @784. QEMU 7.2's gdbstub sends the core part (268 bytes) as its
`g` block and the rest through `p`; the offsets of x0-pc are the same in both."""

# gdb's aarch64-fpu.xml types: each v register is a union of its lanes' vectors
_A64_LANES = (("d", (("f", "ieee_double"), ("u", "uint64"), ("s", "int64")), 2),
              ("s", (("f", "ieee_single"), ("u", "uint32"), ("s", "int32")), 4),
              ("h", (("f", "ieee_half"), ("u", "uint16"), ("s", "int16")), 8),
              ("b", (("u", "uint8"), ("s", "int8")), 16),
              ("q", (("u", "uint128"), ("s", "int128")), 1))
_A64_VECTORS = "".join(
    "".join(f'  <vector id="v{n}{k}" type="{t}" count="{n}"/>\n' for k, t in kinds)
    + f'  <union id="vn{lane}">' + "".join(f'<field name="{k}" type="v{n}{k}"/>' for k, _ in kinds) + "</union>\n"
    for lane, kinds, n in _A64_LANES
) + '  <union id="aarch64v">' + "".join(f'<field name="{lane}" type="vn{lane}"/>' for lane, _, _ in _A64_LANES) \
    + "</union>\n"


def aarch64_linux_target_xml() -> dict[str, str]:
    """A target description of `AARCH64_LINUX` (annex name -> text), the features and
    types of gdb's aarch64-core.xml and aarch64-fpu.xml."""
    n_core = len(_A64_CORE)
    files = {
        "aarch64-core.xml": _feature_xml("org.gnu.gdb.aarch64.core", "", _A64_CORE, 0),
        "aarch64-fpu.xml": _feature_xml("org.gnu.gdb.aarch64.fpu", _A64_VECTORS, _A64_FPU, n_core),
    }
    return _with_target(files, "aarch64")
