"""Register safety: when must the proxy hide XML registers from gdbserver?

Theory of operation
-------------------
gdbserver 13.1 (and older) writes a thread's whole XSAVE area back on every
resume of a thread it has stopped, locating the AVX-512 and PKRU components at
Intel's fixed offsets.  CPUs that put those components elsewhere (AMD Zen 3/4
leave no gap for MPX: opmask at 832, not 1088) get zmm16-zmm19 zeroed on every
such write-back, and programs that keep data there (glibc's AVX-512 memcpy)
crash or compute wrong results.  gdbserver only touches the XSAVE regset when
the client's ``qSupported`` lists ``xmlRegisters=i386``; without it, it moves
registers with FXSAVE (x87, SSE) and serves the 560-byte no-XML ``g`` block.
Evidence and mechanism: research/gdbserver-xsave-corruption.md; the rule is
DESIGN.md §3 rule 11.

This module decides, once per session and before the first ``qSupported``
goes upstream, whether the session runs in *safe* mode (strip ``i386`` from
``xmlRegisters=``) or *full* mode (forward the client's qSupported as is):

  1. ``--registers safe|full`` wins.
  2. A stub known not to be gdbserver (lldb-server, QEMU, rr) -> full: none of
     them has this write-back (lldb-server and rr use the CPU's own layout,
     QEMU emulates the registers and ignores ``xmlRegisters``).
  3. gdbserver >= 14 -> full: GDB 14 reads the offsets from CPUID 0xD.
  4. gdbserver < 14 or an unknown stub on this host -> full if this host's
     XSAVE layout (CPUID leaf 0xD) is the one gdbserver 13 assumes, else safe.
  5. Anything else (a stub on another host, or a host layout we could not
     read) -> safe: "stay safe unless told otherwise".

Everything here is pure except ``read_host_xsave_layout`` (executes ``cpuid``
and ``xgetbv`` through ctypes) and ``probe_stub_version`` (runs
``<stub> --version``).

Why ctypes and not a library: PyPI's CPUID packages are either unmaintained
(``cpuid-py`` 2017, ``pycpuid`` 2012), tiny single-author projects, or
(``py-cpuinfo``, last release 2022) keep their CPUID runner private and do not
expose sub-leaves.  Leaf 0xD needs a sub-leaf (ECX) per component, so ~20 bytes
of machine code in an mmap'd executable page are the smallest well-understood
thing; the tests disassemble those bytes with capstone to pin them.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import re
import subprocess
from dataclasses import dataclass
from typing import Callable, Iterable, Literal, Sequence

# ---------------------------------------------------------------------------
# XSAVE layout
# ---------------------------------------------------------------------------

COMPONENT_NAMES: dict[int, str] = {
    2: "AVX",        # YMM_Hi128: upper halves of ymm0-15
    3: "MPX BNDREGS",
    4: "MPX BNDCSR",
    5: "opmask",     # k0-k7
    6: "ZMM_Hi256",  # upper halves of zmm0-15
    7: "Hi16_ZMM",   # zmm16-31
    9: "PKRU",
}

GDBSERVER13_ASSUMED: dict[int, int] = {2: 576, 3: 960, 4: 1024, 5: 1088, 6: 1152, 7: 1664, 9: 2688}
"""XCR0 component bit -> the standard-format XSAVE offset gdbserver 13.1
hard-codes (``struct i387_xsave``, gdbserver/i387-fp.cc l.129-139): Intel's."""

FIRST_EXTENDED_COMPONENT = 2
"""Bits 0 (x87) and 1 (SSE) live in the legacy 512-byte area at fixed offsets."""


@dataclass(frozen=True)
class XsaveLayout:
    """The host's standard-format XSAVE layout for the components in XCR0."""

    offsets: dict[int, int]  # XCR0 component bit -> offset (CPUID 0xD sub-leaf i, EBX)
    sizes: dict[int, int]    # XCR0 component bit -> size in bytes (CPUID 0xD sub-leaf i, EAX)
    xcr0: int                # the components the OS enabled (xgetbv 0)
    total_size: int = 0      # XSAVE area size for XCR0 (CPUID 0xD sub-leaf 0, EBX)

    def enabled(self) -> list[int]:
        """The extended components (bit >= 2) enabled in XCR0, in bit order."""
        return [b for b in range(FIRST_EXTENDED_COMPONENT, 64) if self.xcr0 >> b & 1]


@dataclass(frozen=True)
class LayoutMismatch:
    component: int
    actual: int | None  # None: enabled in XCR0 but CPUID gave no offset
    assumed: int

    def describe(self) -> str:
        name = COMPONENT_NAMES.get(self.component, f"component {self.component}")
        where = "missing" if self.actual is None else f"at {self.actual}"
        return f"{name} {where} not {self.assumed}"


def layout_mismatches(layout: XsaveLayout) -> list[LayoutMismatch]:
    """Components enabled in XCR0 that are not where gdbserver 13 looks for them.

    Components gdbserver 13 does not know (AMX tiles, bits 17/18) are ignored:
    it never reads or writes them."""
    return [
        LayoutMismatch(bit, layout.offsets.get(bit), assumed)
        for bit, assumed in sorted(GDBSERVER13_ASSUMED.items())
        if layout.xcr0 >> bit & 1 and layout.offsets.get(bit) != assumed
    ]


def layout_matches_gdbserver13(layout: XsaveLayout) -> bool:
    """Every component enabled in XCR0 is at the offset gdbserver 13 assumes."""
    return not layout_mismatches(layout)


# ---------------------------------------------------------------------------
# CPUID / XGETBV through ctypes
# ---------------------------------------------------------------------------

# void cpuid(uint32_t leaf, uint32_t subleaf, uint32_t out[4])   (SysV x86-64)
CPUID_CODE = bytes.fromhex(
    "53"          # push rbx              (callee-saved, cpuid clobbers it)
    "4989d0"      # mov  r8, rdx          (out)
    "89f8"        # mov  eax, edi         (leaf)
    "89f1"        # mov  ecx, esi         (sub-leaf)
    "0fa2"        # cpuid
    "418900"      # mov  [r8], eax
    "41895804"    # mov  [r8+4], ebx
    "41894808"    # mov  [r8+8], ecx
    "4189500c"    # mov  [r8+12], edx
    "5b"          # pop  rbx
    "c3"          # ret
)
# uint64_t xgetbv(uint32_t xcr)
XGETBV_CODE = bytes.fromhex(
    "89f9"        # mov  ecx, edi
    "0f01d0"      # xgetbv               (edx:eax = XCR[ecx])
    "48c1e220"    # shl  rdx, 32
    "4809d0"      # or   rax, rdx
    "c3"          # ret
)

CpuidFn = Callable[[int, int], tuple[int, int, int, int]]


class _MachineCode:
    """An executable anonymous page holding CPUID_CODE and XGETBV_CODE.

    Kept for the life of the process (a ctypes function pointer into an mmap
    forbids closing it)."""

    def __init__(self) -> None:
        self._page = mmap.mmap(-1, mmap.PAGESIZE,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        self._page.write(CPUID_CODE.ljust(64, b"\xcc") + XGETBV_CODE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(self._page))
        cpuid_t = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32,
                                   ctypes.POINTER(ctypes.c_uint32))
        self._cpuid = cpuid_t(base)
        self._xgetbv = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint32)(base + 64)

    def cpuid(self, leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
        out = (ctypes.c_uint32 * 4)()
        self._cpuid(leaf, subleaf, out)
        return out[0], out[1], out[2], out[3]

    def xgetbv(self, xcr: int) -> int:
        return int(self._xgetbv(xcr))


_machine_code: _MachineCode | None = None


def _get_machine_code() -> _MachineCode:
    global _machine_code
    if _machine_code is None:
        _machine_code = _MachineCode()
    return _machine_code


def host_is_x86_64() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64") and ctypes.sizeof(ctypes.c_void_p) == 8


OSXSAVE_BIT = 27  # CPUID.1:ECX; without it xgetbv raises #UD (SIGILL)


def xsave_layout_from_cpuid(cpuid: CpuidFn, xgetbv: Callable[[int], int]) -> XsaveLayout | None:
    """Build the layout from CPUID/XGETBV callables (pure given them; tests fake them)."""
    max_leaf = cpuid(0, 0)[0]
    if max_leaf < 0xD or not cpuid(1, 0)[2] >> OSXSAVE_BIT & 1:
        return None
    xcr0 = xgetbv(0)
    offsets: dict[int, int] = {}
    sizes: dict[int, int] = {}
    for bit in range(FIRST_EXTENDED_COMPONENT, 64):
        if xcr0 >> bit & 1:
            size, offset, _, _ = cpuid(0xD, bit)
            sizes[bit] = size
            offsets[bit] = offset
    return XsaveLayout(offsets=offsets, sizes=sizes, xcr0=xcr0, total_size=cpuid(0xD, 0)[1])


def read_host_xsave_layout() -> XsaveLayout | None:
    """This host's XSAVE layout, or None on a non-x86-64 host or any failure
    (no executable anonymous memory, no OSXSAVE, leaf 0xD absent)."""
    if not host_is_x86_64():
        return None
    try:
        code = _get_machine_code()
    except (OSError, ValueError, TypeError, AttributeError):
        return None  # W^X policy, no PROT_EXEC in this Python's mmap, ...
    return xsave_layout_from_cpuid(code.cpuid, code.xgetbv)


def format_layout(layout: XsaveLayout) -> str:
    """A small table: component, size, offset on this host, offset gdbserver 13 assumes."""
    rows = [f"XCR0 = {layout.xcr0:#x}, XSAVE size {layout.total_size}",
            f"{'bit':>3}  {'component':<20} {'size':>5} {'offset':>6} {'gdbserver13':>11}"]
    for bit in layout.enabled():
        assumed = GDBSERVER13_ASSUMED.get(bit)
        rows.append(f"{bit:>3}  {COMPONENT_NAMES.get(bit, '?'):<20} {layout.sizes.get(bit, 0):>5} "
                    f"{layout.offsets.get(bit, 0):>6} {'-' if assumed is None else assumed:>11}")
    return "\n".join(rows)


# ---------------------------------------------------------------------------
# The decision
# ---------------------------------------------------------------------------

RegistersMode = Literal["safe", "full"]
StubKind = Literal["gdbserver", "lldb-server", "qemu", "rr"]
STUB_KINDS: tuple[str, ...] = ("gdbserver", "lldb-server", "qemu", "rr")
FIXED_GDBSERVER = (14, 0)


@dataclass(frozen=True)
class RegisterPolicy:
    """The register mode of one session and why (``reason`` is the notice text)."""

    safe: bool
    reason: str

    @property
    def mode(self) -> RegistersMode:
        return "safe" if self.safe else "full"

    def notice(self) -> str:
        """The one-line notice printed at connect and shown by `monitor async stats`."""
        return f"asyncrsp: registers: {self.mode} ({self.reason})"


SAFE_HIDES = "ymm/zmm/k registers hidden"
OPT_OUT = "--registers full to override"


def decide_policy(*, requested: str | None, stub_is_local: bool, stub_kind: str | None,
                  stub_version: tuple[int, int] | None,
                  host_layout: XsaveLayout | None, version_how: str | None = None) -> RegisterPolicy:
    """The session's register mode; see the module docstring for the table.
    `version_how`: how `stub_version` was learned when it is only a lower
    bound (a feature of the stub's qSupported reply), for the notice."""
    if requested is not None and requested not in ("safe", "full"):
        raise ValueError(f"--registers must be 'safe' or 'full', not {requested!r}")
    if requested == "safe":
        return RegisterPolicy(True, f"--registers safe; {SAFE_HIDES}")
    if requested == "full":
        return RegisterPolicy(False, "--registers full: xmlRegisters forwarded as the client sent it")
    if stub_kind is not None and stub_kind != "gdbserver":
        return RegisterPolicy(False, f"stub is {stub_kind}, which does not have gdbserver 13's XSAVE bug")
    if stub_kind == "gdbserver" and stub_version is not None and stub_version >= FIXED_GDBSERVER:
        version = f"{_v(stub_version)}" if version_how is None else f">= {stub_version[0]} ({version_how})"
        return RegisterPolicy(False, f"gdbserver {version} reads the XSAVE layout from CPUID")
    who = _describe_stub(stub_kind, stub_version)
    if not stub_is_local:
        return RegisterPolicy(True, f"{who} on another host: staying safe; {SAFE_HIDES}; {OPT_OUT}")
    if host_layout is None:
        return RegisterPolicy(True, f"{who}, host XSAVE layout unknown: staying safe; {SAFE_HIDES}; {OPT_OUT}")
    mismatches = layout_mismatches(host_layout)
    if not mismatches:
        return RegisterPolicy(False, f"{who}; this CPU's XSAVE layout is the one gdbserver 13 assumes")
    where = ", ".join(m.describe() for m in mismatches)
    return RegisterPolicy(True, f"{who} would corrupt AVX-512 registers on this CPU ({where}); "
                                f"{SAFE_HIDES}; {OPT_OUT}")


def _v(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def _describe_stub(kind: str | None, version: tuple[int, int] | None) -> str:
    if kind is None:
        return "unknown stub"
    return f"{kind} {_v(version)}" if version is not None else f"{kind} of unknown version"


# ---------------------------------------------------------------------------
# qSupported: leave i386 out of xmlRegisters=
# ---------------------------------------------------------------------------

XML_REGISTERS = "xmlRegisters="


def strip_xml_registers(features: Iterable[str]) -> list[str]:
    """Remove ``i386`` from an ``xmlRegisters=`` feature; drop the feature if
    nothing is left.  gdbserver's x86 ``process_qsupported`` turns XML (and
    with it the XSAVE regset) on only when that list contains ``i386``;
    lldb sends ``xmlRegisters=i386,arm,mips,arc``, which becomes
    ``xmlRegisters=arm,mips,arc``."""
    out: list[str] = []
    for feature in features:
        if feature.startswith(XML_REGISTERS):
            arches = [a for a in feature[len(XML_REGISTERS):].split(",") if a and a != "i386"]
            if not arches:
                continue
            feature = XML_REGISTERS + ",".join(arches)
        out.append(feature)
    return out


def strip_xml_registers_body(body: bytes) -> bytes:
    """The same on a raw ``qSupported[:f1;f2...]`` packet body (already unescaped)."""
    head, sep, tail = body.partition(b":")
    if head != b"qSupported":
        raise ValueError(f"not a qSupported packet: {body[:40]!r}")
    if not sep:
        return body
    kept = strip_xml_registers(tail.decode("latin-1").split(";"))
    return head + (b":" + ";".join(kept).encode("latin-1") if kept else b"")


def has_xml_registers_i386(body: bytes) -> bool:
    """Whether a qSupported body would turn gdbserver's XSAVE write-back on."""
    return strip_xml_registers_body(body) != body and b"i386" in body


# ---------------------------------------------------------------------------
# Who is the stub?
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StubInfo:
    kind: str | None                  # one of STUB_KINDS, or None
    version: tuple[int, int] | None
    how: str                          # how it was learned, for the notice/stats


UNKNOWN_STUB = StubInfo(None, None, "not known")

_GDBSERVER_VERSION = re.compile(r"^GNU gdbserver\b.*?\s(\d+)\.(\d+)(?:\.\d+)?\S*\s*$", re.M)


def parse_gdbserver_version(text: str) -> tuple[int, int] | None:
    """The version in ``gdbserver --version`` output, e.g.
    ``GNU gdbserver (Debian 13.1-3) 13.1`` -> (13, 1); the last number on the
    first line counts, not the distribution's package version."""
    m = _GDBSERVER_VERSION.search(text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def stub_kind_from_command(argv: Sequence[str]) -> str | None:
    """Which stub a spawn command runs, from its program name."""
    if not argv:
        return None
    name = os.path.basename(argv[0])
    if name.startswith("gdbserver"):
        return "gdbserver"
    if name.startswith("lldb-server") or (name.startswith("lldb") and "gdbserver" in argv[1:2]):
        return "lldb-server"
    if name.startswith("qemu-"):
        return "qemu"
    if name == "rr":
        return "rr"
    return None


def probe_stub_version(executable: str, *, timeout: float = 10.0) -> tuple[int, int] | None:
    """Run ``<gdbserver> --version`` and parse it; None when that fails."""
    try:
        done = subprocess.run([executable, "--version"], capture_output=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return parse_gdbserver_version(done.stdout.decode(errors="replace"))


def detect_stub_from_command(argv: Sequence[str], *, probe_version: bool = True) -> StubInfo:
    """What the proxy learns about a stub it spawns itself (``|gdbserver - PROG``).

    For gdbserver the version comes from running the same binary with
    ``--version``: gdbserver has no in-protocol way to tell its version
    (no ``qGDBServerVersion``, and 13.1 has no ``monitor version``)."""
    kind = stub_kind_from_command(argv)
    if kind != "gdbserver":
        return StubInfo(kind, None, "spawn command" if kind else "not known")
    version = probe_stub_version(argv[0]) if probe_version else None
    return StubInfo(kind, version, f"{argv[0]} --version" if version else "spawn command")


# qSupported reply features only one kind of stub sends (gdbserver 13.1,
# lldb-server 14, QEMU 7.2, rr 5.x replies seen/read on this machine).
_REPLY_MARKERS: tuple[tuple[str, str], ...] = (
    ("QStartupWithShell+", "gdbserver"),
    ("QEnvironmentHexEncoded+", "gdbserver"),
    ("QThreadSuffixSupported+", "lldb-server"),
    ("QListThreadsInStopReply+", "lldb-server"),
    ("ReverseContinue+", "rr"),  # QEMU advertises it only in record/replay mode
)


def stub_kind_from_qsupported_reply(reply: bytes) -> str | None:
    """Guess the stub from its qSupported reply.  This comes too late to change
    the first qSupported (the decision must precede it), so it only labels the
    notice and stats; it never tells gdbserver's version."""
    features = set(reply.decode("latin-1").split(";"))
    for marker, kind in _REPLY_MARKERS:
        if marker in features:
            return kind
    return None


# The qSupported the proxy sends on its own, first, to a stub it did not start
# and that might be gdbserver < 14 (proxy/session/core.py); its reply goes
# to stub_reply_policy and never to the client, and the client's own
# qSupported follows (gdbserver re-decides its register mode at every
# qSupported, so this one leaves nothing behind). QThreadOptions=5 offers
# GDB 14's thread options (clone, exit events): see gdbserver_floor_from_reply.
STUB_PROBE_QSUPPORTED = b"qSupported:multiprocess+;swbreak+;QThreadOptions=5"

# The QThreadOptions packet came with GDB 14, the release that reads the
# XSAVE layout from CPUID. Measured here: gdbserver 16.3 (trixie) and 18
# (sid) answer `QThreadOptions=3` (to this probe and also to a qSupported
# that does not offer it); gdbserver 13.1 answers nothing of the kind.
THREAD_OPTIONS_SINCE = FIXED_GDBSERVER


def gdbserver_floor_from_reply(reply: bytes) -> tuple[int, int] | None:
    """The oldest gdbserver that sends this qSupported reply, when a feature
    tells: ``QThreadOptions=`` -> 14.0; None otherwise."""
    features = reply.decode("latin-1").split(";")
    if any(f.startswith("QThreadOptions=") for f in features):
        return THREAD_OPTIONS_SINCE
    return None


def stub_reply_policy(reply: bytes, *, stub_is_local: bool,
                      host_layout: XsaveLayout | None) -> RegisterPolicy:
    """The register mode for a stub the proxy did not start, from its reply
    to STUB_PROBE_QSUPPORTED."""
    kind = stub_kind_from_qsupported_reply(reply)
    if kind is None:
        # Only gdbserver has the bug, and its reply is recognisable
        # (QStartupWithShell+, QEnvironmentHexEncoded+): this is not it.
        return RegisterPolicy(False, "the stub's qSupported reply is not gdbserver's")
    floor = gdbserver_floor_from_reply(reply) if kind == "gdbserver" else None
    return decide_policy(requested=None, stub_is_local=stub_is_local, stub_kind=kind,
                         stub_version=floor, host_layout=host_layout,
                         version_how="it answers QThreadOptions" if floor else None)


def upstream_is_local(upstream: str) -> bool:
    """Whether an upstream spec (``|cmd ...``, ``host:port``, a Unix socket
    path) names a stub on this host: spawned, Unix socket, or a loopback TCP
    address."""
    if upstream.startswith("|") or upstream.startswith("/") or upstream.startswith("unix:"):
        return True
    host = upstream.rsplit(":", 1)[0].strip("[]").lower()
    return host in ("", "localhost", "::1") or host.startswith("127.")
