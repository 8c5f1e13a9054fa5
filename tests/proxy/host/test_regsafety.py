"""proxy.host.regsafety: the decision table, qSupported stripping, CPUID reading."""

from __future__ import annotations

import shutil

import capstone
import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.host import regsafety as rs
from proxy.host.regsafety import (
    GDBSERVER13_ASSUMED,
    RegisterPolicy,
    XsaveLayout,
    decide_policy,
    layout_matches_gdbserver13,
    strip_xml_registers,
    strip_xml_registers_body,
)

# The layout of this project's VM (AMD EPYC with AVX-512; research §1.1) and
# the Intel standard layout gdbserver 13.1 assumes.
AMD_ZEN4 = XsaveLayout(offsets={2: 576, 5: 832, 6: 896, 7: 1408},
                       sizes={2: 256, 5: 64, 6: 512, 7: 1024}, xcr0=0xE7, total_size=2432)
INTEL_AVX512 = XsaveLayout(offsets={2: 576, 5: 1088, 6: 1152, 7: 1664, 9: 2688},
                           sizes={2: 256, 5: 64, 6: 512, 7: 1024, 9: 8}, xcr0=0x2E7, total_size=2696)
AVX2_ONLY = XsaveLayout(offsets={2: 576}, sizes={2: 256}, xcr0=0x7, total_size=832)


# -- layout comparison -------------------------------------------------------

def test_amd_layout_does_not_match_gdbserver13() -> None:
    assert not layout_matches_gdbserver13(AMD_ZEN4)
    assert [m.component for m in rs.layout_mismatches(AMD_ZEN4)] == [5, 6, 7]


def test_intel_and_avx2_layouts_match_gdbserver13() -> None:
    assert layout_matches_gdbserver13(INTEL_AVX512)
    # AVX is at 576 on every vendor, so AVX2-only CPUs are never affected.
    assert layout_matches_gdbserver13(AVX2_ONLY)


def test_pkru_alone_at_a_different_offset_is_a_mismatch() -> None:
    # AMD Zen 3 without AVX-512 but with PKRU: PKRU at 832, not 2688.
    zen3 = XsaveLayout(offsets={2: 576, 9: 832}, sizes={2: 256, 9: 8}, xcr0=0x207, total_size=840)
    assert [(m.component, m.actual) for m in rs.layout_mismatches(zen3)] == [(9, 832)]


def test_components_gdbserver13_does_not_know_are_ignored() -> None:
    # AMX tile config/data (bits 17, 18): gdbserver 13 never touches them.
    amx = XsaveLayout(offsets={**INTEL_AVX512.offsets, 17: 2752, 18: 2816},
                      sizes={**INTEL_AVX512.sizes, 17: 64, 18: 8192},
                      xcr0=INTEL_AVX512.xcr0 | 3 << 17, total_size=11008)
    assert layout_matches_gdbserver13(amx)


def test_enabled_component_without_offset_is_a_mismatch() -> None:
    broken = XsaveLayout(offsets={2: 576}, sizes={2: 256}, xcr0=0x27)  # opmask enabled, no offset
    assert [m.describe() for m in rs.layout_mismatches(broken)] == ["opmask missing not 1088"]


# -- the decision table -------------------------------------------------------

DECISIONS = [
    # requested, local, kind, version, layout -> safe
    ("safe", True, "gdbserver", (14, 2), INTEL_AVX512, True),
    ("safe", True, "lldb-server", None, INTEL_AVX512, True),
    ("full", True, "gdbserver", (13, 1), AMD_ZEN4, False),
    ("full", False, None, None, None, False),
    (None, True, "gdbserver", (13, 1), AMD_ZEN4, True),
    (None, True, "gdbserver", (12, 1), AMD_ZEN4, True),
    (None, True, "gdbserver", None, AMD_ZEN4, True),
    (None, True, "gdbserver", (13, 1), INTEL_AVX512, False),
    (None, True, "gdbserver", (13, 1), AVX2_ONLY, False),
    (None, True, "gdbserver", (13, 1), None, True),
    (None, True, "gdbserver", (14, 0), AMD_ZEN4, False),
    (None, False, "gdbserver", (14, 1), None, False),
    (None, False, "gdbserver", (13, 1), INTEL_AVX512, True),  # remote: host layout says nothing
    (None, False, "gdbserver", None, None, True),
    (None, False, None, None, AMD_ZEN4, True),
    (None, True, None, None, AMD_ZEN4, True),
    (None, True, None, None, INTEL_AVX512, False),
    (None, True, None, None, None, True),
    (None, True, "lldb-server", None, AMD_ZEN4, False),
    (None, False, "qemu", None, None, False),
    (None, True, "rr", None, AMD_ZEN4, False),
]


@pytest.mark.parametrize("requested,local,kind,version,layout,safe", DECISIONS)
def test_decision_table(requested: str | None, local: bool, kind: str | None,
                        version: tuple[int, int] | None, layout: XsaveLayout | None, safe: bool) -> None:
    policy = decide_policy(requested=requested, stub_is_local=local, stub_kind=kind,
                           stub_version=version, host_layout=layout)
    assert policy.safe is safe
    assert policy.reason and "\n" not in policy.reason
    assert policy.notice().startswith(f"asyncrsp: registers: {'safe' if safe else 'full'} (")


def test_safe_notice_names_the_moved_components_and_the_opt_out() -> None:
    policy = decide_policy(requested=None, stub_is_local=True, stub_kind="gdbserver",
                           stub_version=(13, 1), host_layout=AMD_ZEN4)
    print(policy.notice())
    assert "opmask at 832 not 1088" in policy.reason
    assert "gdbserver 13.1" in policy.reason
    assert "--registers full" in policy.reason
    assert "ymm/zmm/k" in policy.reason


def test_bad_requested_mode_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="--registers must be 'safe' or 'full'"):
        decide_policy(requested="fast", stub_is_local=True, stub_kind=None,
                      stub_version=None, host_layout=None)


def test_policy_is_a_frozen_value() -> None:
    assert RegisterPolicy(True, "x") == RegisterPolicy(True, "x")
    assert RegisterPolicy(True, "x").mode == "safe"
    assert RegisterPolicy(False, "x").mode == "full"


# -- qSupported stripping --------------------------------------------------------

GDB13_QSUPPORTED = (b"qSupported:multiprocess+;swbreak+;hwbreak+;qRelocInsn+;fork-events+;"
                    b"vfork-events+;exec-events+;vContSupported+;QThreadEvents+;no-resumed+;"
                    b"memory-tagging+;xmlRegisters=i386")
LLDB14_QSUPPORTED = b"qSupported:xmlRegisters=i386,arm,mips,arc;multiprocess+;fork-events+;vfork-events+"


def test_strip_gdb_qsupported() -> None:
    out = strip_xml_registers_body(GDB13_QSUPPORTED)
    assert out == GDB13_QSUPPORTED.removesuffix(b";xmlRegisters=i386")


def test_strip_lldb_qsupported_keeps_other_arches() -> None:
    assert strip_xml_registers_body(LLDB14_QSUPPORTED) == (
        b"qSupported:xmlRegisters=arm,mips,arc;multiprocess+;fork-events+;vfork-events+")


def test_strip_leaves_other_bodies_alone() -> None:
    assert strip_xml_registers_body(b"qSupported") == b"qSupported"
    assert strip_xml_registers_body(b"qSupported:swbreak+") == b"qSupported:swbreak+"
    assert strip_xml_registers_body(b"qSupported:xmlRegisters=i386") == b"qSupported"
    assert strip_xml_registers(["xmlRegisters=arm", "swbreak+"]) == ["xmlRegisters=arm", "swbreak+"]


def test_strip_rejects_other_packets() -> None:
    with pytest.raises(ValueError, match="not a qSupported packet"):
        strip_xml_registers_body(b"qXfer:features:read:target.xml:0,fff")


def test_has_xml_registers_i386() -> None:
    assert rs.has_xml_registers_i386(GDB13_QSUPPORTED)
    assert rs.has_xml_registers_i386(LLDB14_QSUPPORTED)
    assert not rs.has_xml_registers_i386(strip_xml_registers_body(GDB13_QSUPPORTED))
    assert not rs.has_xml_registers_i386(b"qSupported:xmlRegisters=")


feature = st.from_regex(r"[A-Za-z][A-Za-z0-9:.-]{0,12}[+\-?]?", fullmatch=True)
xml_feature = st.lists(st.sampled_from(["i386", "arm", "mips", "arc", "i386"]), min_size=1,
                       max_size=4).map(lambda a: "xmlRegisters=" + ",".join(a))


@given(st.lists(st.one_of(feature, xml_feature), max_size=8))
def test_strip_property(features: list[str]) -> None:
    out = strip_xml_registers(features)
    joined = ";".join(out)
    assert "i386" not in joined or "xmlRegisters" not in joined
    # Everything else survives, in order.
    assert [f for f in out if not f.startswith("xmlRegisters=")] == [
        f for f in features if not f.startswith("xmlRegisters=")]
    assert strip_xml_registers(out) == out  # idempotent
    body = b"qSupported:" + ";".join(features).encode()
    if features:
        assert strip_xml_registers_body(body) == (
            b"qSupported" + (b":" + joined.encode() if out else b""))


# -- stub detection ------------------------------------------------------------

@pytest.mark.parametrize("text,version", [
    ("GNU gdbserver (Debian 13.1-3) 13.1\nCopyright (C) 2023 Free Software Foundation, Inc.\n", (13, 1)),
    ("GNU gdbserver (GDB) 14.2\n", (14, 2)),
    ("GNU gdbserver (GDB) 15.0.50.20240403-git\n", (15, 0)),
    ("GNU gdbserver (Ubuntu 12.1-0ubuntu1~22.04) 12.1\n", (12, 1)),
    ("lldb-server version 14.0.6\n", None),
    ("", None),
])
def test_parse_gdbserver_version(text: str, version: tuple[int, int] | None) -> None:
    assert rs.parse_gdbserver_version(text) == version


@pytest.mark.parametrize("argv,kind", [
    (["gdbserver", "-", "prog"], "gdbserver"),
    (["/usr/bin/gdbserver", "--multi", ":0"], "gdbserver"),
    (["lldb-server", "gdbserver", "127.0.0.1:0", "--", "prog"], "lldb-server"),
    (["lldb-server-14", "g", "127.0.0.1:0"], "lldb-server"),
    (["qemu-x86_64", "-g", "1234", "prog"], "qemu"),
    (["rr", "replay", "-s", "1234"], "rr"),
    (["./my-stub"], None),
    ([], None),
])
def test_stub_kind_from_command(argv: list[str], kind: str | None) -> None:
    assert rs.stub_kind_from_command(argv) == kind


@pytest.mark.skipif(shutil.which("gdbserver") is None, reason="gdbserver is not installed")
def test_detect_installed_gdbserver() -> None:
    info = rs.detect_stub_from_command([shutil.which("gdbserver") or "gdbserver", "-", "prog"])
    print(info)
    assert info.kind == "gdbserver"
    assert info.version is not None and info.version >= (7, 0)


def test_probe_version_of_missing_binary_is_none() -> None:
    assert rs.probe_stub_version("/nonexistent/gdbserver") is None


# The gdbserver reply is the real one from /usr/bin/gdbserver 13.1 (abridged).
GDBSERVER_REPLY = (b"PacketSize=47ff;QPassSignals+;QProgramSignals+;QStartupWithShell+;"
                   b"QEnvironmentHexEncoded+;qXfer:features:read+;QStartNoAckMode+;swbreak+")


@pytest.mark.parametrize("reply,kind", [
    (GDBSERVER_REPLY, "gdbserver"),
    (b"PacketSize=20000;QStartNoAckMode+;QThreadSuffixSupported+;QListThreadsInStopReply+", "lldb-server"),
    (b"PacketSize=1000;qXfer:features:read+;multiprocess+", None),  # QEMU: nothing specific
    (b"", None),
])
def test_stub_kind_from_qsupported_reply(reply: bytes, kind: str | None) -> None:
    assert rs.stub_kind_from_qsupported_reply(reply) == kind


# Real replies to STUB_PROBE_QSUPPORTED (abridged, the order kept): gdbserver
# 16.3 of Debian trixie and 18.1 of sid end with these features; 13.1 (this
# host) has no QThreadOptions.
GDBSERVER16_REPLY = (b"PacketSize=2001f;QPassSignals+;QStartupWithShell+;QEnvironmentHexEncoded+;"
                     b"binary-upload+;qXfer:features:read+;QStartNoAckMode+;swbreak+;hwbreak+;"
                     b"qXfer:exec-file:read+;vContSupported+;QThreadOptions=3;QThreadEvents+;no-resumed+")
LLDB_SERVER_REPLY = b"PacketSize=20000;QStartNoAckMode+;QThreadSuffixSupported+;QListThreadsInStopReply+"


@pytest.mark.parametrize("reply,floor", [
    (GDBSERVER16_REPLY, (14, 0)),
    (GDBSERVER_REPLY, None),
    (b"QThreadOptions+", None),   # not the reply's form: value is the option bits
    (b"xQThreadOptions=3", None),
    (b"", None),
])
def test_gdbserver_floor_from_reply(reply: bytes, floor: tuple[int, int] | None) -> None:
    assert rs.gdbserver_floor_from_reply(reply) == floor


@pytest.mark.parametrize("reply,layout,safe,says", [
    # gdbserver >= 14 on this VM's CPU: full, and the notice says how it was told
    (GDBSERVER16_REPLY, AMD_ZEN4, False, "gdbserver >= 14 (it answers QThreadOptions) reads the XSAVE layout"),
    # gdbserver 13.1 on the same CPU: safe
    (GDBSERVER_REPLY, AMD_ZEN4, True, "gdbserver of unknown version would corrupt AVX-512"),
    (GDBSERVER_REPLY, INTEL_AVX512, False, "layout is the one gdbserver 13 assumes"),
    (LLDB_SERVER_REPLY, AMD_ZEN4, False, "stub is lldb-server"),
    (b"PacketSize=1000;qXfer:features:read+;multiprocess+", AMD_ZEN4, False, "not gdbserver's"),
])
def test_stub_reply_policy(reply: bytes, layout: XsaveLayout, safe: bool, says: str) -> None:
    policy = rs.stub_reply_policy(reply, stub_is_local=True, host_layout=layout)
    print(policy.notice())
    assert policy.safe is safe
    assert says in policy.reason


def test_stub_probe_offers_thread_options_and_no_xml_registers() -> None:
    """The proxy's own probe must not turn gdbserver 13's XSAVE write-back on."""
    assert rs.STUB_PROBE_QSUPPORTED.startswith(b"qSupported:")
    assert b"QThreadOptions=5" in rs.STUB_PROBE_QSUPPORTED
    assert not rs.has_xml_registers_i386(rs.STUB_PROBE_QSUPPORTED)


@pytest.mark.parametrize("spec,local", [
    ("|gdbserver - prog", True), ("127.0.0.1:1234", True), ("localhost:1", True),
    ("[::1]:1234", True), ("/tmp/stub.sock", True), ("10.0.0.7:1234", False),
    ("board.lan:3333", False),
])
def test_upstream_is_local(spec: str, local: bool) -> None:
    assert rs.upstream_is_local(spec) is local


# -- CPUID -----------------------------------------------------------------------

def test_machine_code_disassembles_to_what_the_comments_say() -> None:
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    cpuid = [f"{i.mnemonic} {i.op_str}".strip() for i in md.disasm(rs.CPUID_CODE, 0)]
    assert cpuid == ["push rbx", "mov r8, rdx", "mov eax, edi", "mov ecx, esi", "cpuid",
                     "mov dword ptr [r8], eax", "mov dword ptr [r8 + 4], ebx",
                     "mov dword ptr [r8 + 8], ecx", "mov dword ptr [r8 + 0xc], edx", "pop rbx", "ret"]
    xgetbv = [f"{i.mnemonic} {i.op_str}".strip() for i in md.disasm(rs.XGETBV_CODE, 0)]
    assert xgetbv == ["mov ecx, edi", "xgetbv", "shl rdx, 0x20", "or rax, rdx", "ret"]


def fake_cpu(leaves: dict[tuple[int, int], tuple[int, int, int, int]], xcr0: int) -> XsaveLayout | None:
    return rs.xsave_layout_from_cpuid(lambda leaf, sub: leaves.get((leaf, sub), (0, 0, 0, 0)),
                                      lambda xcr: xcr0)


def test_layout_from_fake_amd_cpuid() -> None:
    leaves = {(0, 0): (0x10, 0, 0, 0), (1, 0): (0, 0, 1 << 27, 0), (0xD, 0): (0xE7, 2432, 2440, 0),
              (0xD, 2): (256, 576, 0, 0), (0xD, 5): (64, 832, 0, 0), (0xD, 6): (512, 896, 0, 0),
              (0xD, 7): (1024, 1408, 0, 0)}
    assert fake_cpu(leaves, 0xE7) == AMD_ZEN4


def test_layout_needs_leaf_0xd_and_osxsave() -> None:
    assert fake_cpu({(0, 0): (0xB, 0, 0, 0), (1, 0): (0, 0, 1 << 27, 0)}, 0x7) is None
    assert fake_cpu({(0, 0): (0x10, 0, 0, 0), (1, 0): (0, 0, 0, 0)}, 0x7) is None


def test_read_host_layout_off_x86_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rs.platform, "machine", lambda: "aarch64")
    assert rs.read_host_xsave_layout() is None


@pytest.mark.skipif(not rs.host_is_x86_64(), reason="CPUID exists only on x86-64 hosts")
def test_read_host_layout_on_this_machine() -> None:
    layout = rs.read_host_xsave_layout()
    assert layout is not None, "CPUID leaf 0xD could not be read on an x86-64 host"
    print()
    print(rs.format_layout(layout))
    print("matches gdbserver 13:", layout_matches_gdbserver13(layout))
    # Self-consistency: x87 and SSE are always on; every extended component
    # lies after the 512-byte legacy area + 64-byte header, components do not
    # overlap, and all of them fit in the XSAVE area CPUID reports.
    assert layout.xcr0 & 0b11 == 0b11
    enabled = layout.enabled()
    assert set(layout.offsets) == set(enabled) == set(layout.sizes)
    spans = sorted((layout.offsets[b], layout.sizes[b]) for b in enabled)
    assert all(size > 0 for _, size in spans)
    assert all(off >= 576 for off, _ in spans)
    assert all(a_off + a_size <= b_off for (a_off, a_size), (b_off, _) in zip(spans, spans[1:]))
    if spans:
        assert spans[-1][0] + spans[-1][1] <= layout.total_size
        assert [layout.offsets[b] for b in enabled] == sorted(layout.offsets[b] for b in enabled)
    if 2 in enabled:
        assert layout.offsets[2] == GDBSERVER13_ASSUMED[2] == 576  # AVX is at 576 everywhere
    # Reading twice gives the same answer (the page is cached, not remapped).
    assert rs.read_host_xsave_layout() == layout
