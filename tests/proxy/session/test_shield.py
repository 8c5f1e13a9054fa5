"""shield.py: which client packets the stub never gets.

KILLERS (integration/harness/killers.py): packets that killed gdbserver 13.1;
integration/test_shield.py shows a few of them live. GDB_PACKETS: packets
real gdb 13 and lldb send; they all pass."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from integration.harness.killers import KILLERS
from proxy.session.shield import refuse

PACKET_SIZE = 0x47FF  # gdbserver 13.1's

GDB_PACKETS = [
    b"m555555554000,40", b"M7ffff000,2:9090", b"X7ffff000,0:", b"X7ffff000,2:}\x03a", b"g", b"G" + b"00" * 560,
    b"Gxxxx", b"p10", b"P10=0000000000000000", b"Z0,555555555169,1", b"z0,555555555169,1", b"Z2,7fffffffe000,4",
    b"Z0,555555555169,1;X3,220027", b"Hgp1234.1234", b"Hc-1", b"Hg0", b"Hcp1234.-1", b"Tp1.1", b"T1", b"vCont;c",
    b"vCont;s:p1.1;c", b"vCont;r5555,5560:p1.1;c", b"vCont;C05:p1.1", b"vCont;c:-1", b"c", b"s", b"C05", b"S05;5555",
    b"qXfer:features:read:target.xml:0,ffb", b"qXfer:auxv:read::0,1000", b"qXfer:exec-file:read:1:0,fff",
    b"qXfer:threads:read::0,fff", b"qRcmd,6173796e63207461736b73", b"QPassSignals:e;10;14;17;1a;1b;1c;21;24;25;2c;4c;97;",
    b"QProgramSignals:0;1;3;4;6;7;8;9;a;b;c;d;e;f;10;11;12;13;14;97;", b"QCatchSyscalls:1;3c", b"QCatchSyscalls:0",
    b"vFile:open:6a7573742070726f6f66,0,0", b"vFile:pread:5,3fff,0", b"vFile:close:5", b"vFile:setfs:0",
    b"vFile:pwrite:5,0,\x00}]", b"qSearch:memory:555555554000;100;abcd", b"QTDV:1:0:0:6e616d65", b"D", b"D;1234",
    b"vKill;1234", b"k", b"qSupported:multiprocess+;swbreak+;hwbreak+;qRelocInsn+;fork-events+;vContSupported+",
    b"QNonStop:0", b"QDisableRandomization:1", b"QEnvironmentHexEncoded:413d31", b"QSetWorkingDir:",
    b"QStartupWithShell:1", b"vMustReplyEmpty", b"qTStatus", b"qTfV", b"QTinit", b"QTDP:1:555555555169:E:0:0",
    b"QTFrame:-1", b"QTFrame:pc:5555", b"qTBuffer:0,1f4", b"QTBuffer:size:-1", b"QTro:5555,5560:6000,6010",
    b"qL1200000000000000000", b"qC", b"qAttached:1234", b"qThreadExtraInfo,p1.1", b"qGetTLSAddr:p1.1,0,7ffff7fc1000",
    b"vCont?", b"?", b"qOffsets", b"qSymbol::", b"qSymbol:6d61696e", b"qfThreadInfo", b"qsThreadInfo",
    b"QStartNoAckMode", b"x555555554000,40", b"g;thread:1234;", b"p10;thread:1234;", b"qCRC:5555,100",
]


def test_every_packet_that_killed_gdbserver_is_refused() -> None:
    for body in KILLERS:
        assert refuse(body, packet_size=PACKET_SIZE) is not None, body


def test_packets_gdb_and_lldb_send_pass() -> None:
    for body in GDB_PACKETS:
        assert refuse(body, packet_size=PACKET_SIZE) is None, (body, refuse(body))


def test_vcont_t_passes_in_non_stop_mode() -> None:
    assert refuse(b"vCont;t:p1.1", non_stop=True) is None
    assert refuse(b"QNonStop:1") is not None  # when the proxy does not show QNonStop to the client
    assert refuse(b"QNonStop:1", non_stop_offered=True) is None


def test_g_of_the_wrong_size_is_refused_once_the_size_is_known() -> None:
    assert refuse(b"G" + b"00" * 4, g_size=8) is None
    assert "2 bytes" in (refuse(b"G" + b"00" * 2, g_size=8) or "")


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=80))
def test_refuse_never_raises_on_any_bytes(body: bytes) -> None:
    why = refuse(body, g_size=16)
    assert why is None or isinstance(why, str) and "\n" not in why


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from(GDB_PACKETS), st.integers(0, 200), st.sampled_from(b"zZ-;:,#$g\x00"))
def test_a_non_hex_digit_in_a_hex_field_is_refused(body: bytes, at: int, ch: int) -> None:
    """A digit replaced by a non-hex character in a packet of a shielded family:
    refused (gdbserver's fatal hex reader never sees it)."""
    start = 2 if body[:1] == b"H" else 1  # after the packet's letters
    hexy = [i for i, c in enumerate(body) if chr(c) in "0123456789abcdef" and i >= start]
    if not hexy or body[:1] not in b"mMgGpPZzH" or body.startswith((b"Z0,555555555169,1;", b"Gxx")):
        return
    i = hexy[at % len(hexy)]
    mutant = body[:i] + bytes([ch]) + body[i + 1:]
    if body[:1] in b"Zz" and ch in b";":
        return  # a ';' starts the conditions: a valid (shorter) packet
    if body[:1] in b"GP" and body.endswith(b";") and i > body.find(b";"):
        return
    if body[:1] == b"g" or body.startswith(b"p10;"):
        return  # the thread suffix is matched loosely
    assert refuse(mutant) is not None, mutant


def test_inside_the_stubs_symbol_look_up_only_its_answers_and_reads_pass() -> None:
    """gdbserver's look_up_one_symbol reads only `m` (and `v`) between its
    `qSymbol:NAME` question and the answer: any other packet is a malformed answer
    (its reply is the next question, every reply after it one packet late), and a
    `vCont;c` runs the program inside the look-up (it ran to its end)."""
    for body in (b"qSymbol::6d61696e", b"qSymbol:1234:6d61696e", b"qSymbol::", b"m1000,8",
                 b"vFile:close:5"):
        assert refuse(body, symbol_lookup=True) is None, body
    for body in (b"g", b"qC", b"?", b"vCont;c", b"c", b"Z0,1000,1", b"qfThreadInfo", b"vKill;1", b"D",
                 b"qRcmd,6173796e63207461736b73", b""):
        why = refuse(body, symbol_lookup=True)
        assert why is not None and "qSymbol" in why, body
        assert refuse(body) is None or body == b"", body  # refused only because of the look-up
