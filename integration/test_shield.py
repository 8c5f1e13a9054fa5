"""The proxy shields the stub (proxy/session/shield.py), real gdbserver 13.1:

* straight, one malformed packet kills gdbserver and the program with it
  (a bad hex digit, the all-stop vCont;t assertion);
* through the proxy, every packet of tests/proxy/session/test_shield.py's
  KILLERS gets E01 from the proxy; gdbserver and the program live on, and
  after the client detaches the program runs to its normal exit with its
  right result;
* a packet the proxy does not parse passes unchanged (the same reply as
  straight).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from integration.corpus import build
from integration.harness.killers import KILLERS
from integration.harness.rawrsp import RawPeer
from integration.harness.stubs import gone_within, start_proxy, start_stub
from integration.harness.tools import require_tool

SUPPORTED = b"qSupported:multiprocess+;swbreak+;hwbreak+;vContSupported+"


def _monitor(peer: RawPeer, command: str) -> bytes:
    """qRcmd: the console output (O packets) up to the final reply."""
    peer.send_packet(b"qRcmd," + command.encode().hex().encode())
    assert peer.read_ack() == b"+"
    text = b""
    while True:
        reply, _ = peer.read_packet()
        peer.send(b"+")
        if not reply.startswith(b"O") or reply == b"OK":
            return text
        text += bytes.fromhex(reply[1:].decode())


def _bench() -> Path:
    got = build.build(configs=["debug"], programs=["tokio_bench"]).get(("debug", "tokio_bench"))
    if not isinstance(got, Path):
        pytest.skip(f"tokio_bench (debug) not built: {got}")
    return got


# Valid packets that resume no thread gdbserver has: in all-stop it then waits
# with nothing resumed and aborts (wait_1: Assertion `target_options &
# TARGET_WNOHANG' failed). The proxy asks the stub (`T`) whether a named
# thread is there (core._named_threads).
NO_THREAD_RESUMES = [b"vCont;c:p1.1", b"vCont;s:p1.1;c:p1.2", b"vCont;c:p1.-1"]


@pytest.mark.parametrize("packet", [b"m1,zz", b"vCont;t", b"vCont;c:p1.1"])
def test_straight_one_malformed_packet_kills_gdbserver_and_the_program(packet: bytes) -> None:
    require_tool("gdbserver")
    with start_stub("gdbserver", _bench(), ["50", "mt"]) as stub:
        pid = stub.find_inferior()
        peer = RawPeer.connect(stub.address)
        peer.request(SUPPORTED)
        peer.request(b"?")
        peer.send_packet(packet)
        # gdbserver may answer E01 first (its error() unwinds to the packet loop),
        # then drops the link and kills the program at the next packet
        peer.send(b"+")
        peer.send_packet(b"qC")
        assert peer.closed(timeout=10), "gdbserver kept the connection"
        stub.wait(timeout=10)
        stub.output.join(5)
        assert pid is None or gone_within(pid, 10), "the program outlived gdbserver"
        assert re.search(r"Invalid hex digit|Assertion", stub.output_text()), stub.output_text()


def test_through_the_proxy_the_same_packets_get_e01_and_the_program_finishes() -> None:
    require_tool("gdbserver")
    with start_stub("gdbserver", _bench(), ["50", "mt"]) as stub:
        with start_proxy(stub.address) as px:
            peer = RawPeer.connect(px.address)
            peer.request(SUPPORTED)
            peer.request(b"?")
            for packet in [*KILLERS, *NO_THREAD_RESUMES]:
                assert peer.request(packet) == b"E01", packet
            qc = peer.request(b"qC")
            assert qc.startswith(b"QCp"), qc
            pid = qc[3:].split(b".")[0]
            straight_like = peer.request(b"qTStatus")  # not parsed by the proxy: the stub's reply
            assert straight_like.startswith(b"T0"), straight_like
            stats = _monitor(peer, "async stats")
            assert peer.request(b"D;" + pid) == b"OK"  # multiprocess: gdbserver wants the pid
            peer.close()
            px.wait(timeout=15)
            assert "Traceback" not in px.stderr_text()
        stub.wait(timeout=60)
        out = stub.output_text()
        assert "bench done n=50 mode=mt leaves=150" in out and "check=ok" in out, out
    assert stats, "no stats"


def test_proxy_stats_count_the_refused_packets() -> None:
    require_tool("gdbserver")
    with start_stub("gdbserver", _bench(), ["5", "ct"]) as stub, start_proxy(stub.address) as px:
        peer = RawPeer.connect(px.address)
        peer.request(SUPPORTED)
        peer.request(b"?")
        assert peer.request(b"Gzz") == b"E01"
        assert peer.request(b"vCont;t") == b"E01"
        text = _monitor(peer, "async stats --all")
        assert re.search(rb"client packets answered E01, not forwarded .*: 2; last: vCont;t is a non-stop "
                         rb"request", text), text
        peer.send_packet(b"k")


def _hostile_symbol_look_up(peer: RawPeer) -> list[bytes]:
    """`qSymbol::`, then, while the stub waits for the answer to its question, a
    `g`, a `vCont;c` and a `qC`; returns their replies."""
    peer.request(SUPPORTED)
    peer.request(b"?")
    asked = peer.request(b"qSymbol::")
    assert asked.startswith(b"qSymbol:") and len(asked) > 8, asked
    return [peer.request(p) for p in (b"g", b"vCont;c", b"qC")]


def test_straight_a_packet_inside_the_symbol_look_up_is_taken_for_its_answer() -> None:
    """gdbserver 13.1 straight: the look-up takes `g` for a malformed answer (its
    reply is the next question) and runs `vCont;c` inside it: the program runs to
    its end while the client believes it stopped."""
    require_tool("gdbserver")
    with start_stub("gdbserver", _bench(), ["5", "ct"]) as stub:
        peer = RawPeer.connect(stub.address)
        try:
            replies = _hostile_symbol_look_up(peer)
        except EOFError:  # the program ended inside the look-up; gdbserver --once with it
            replies = []
        peer.close()
        stub.wait(timeout=30)
        out = stub.output_text()
        assert "Malformed response to qSymbol, ignoring: g" in out and "check=ok" in out, (replies, out)


def test_through_the_proxy_the_symbol_look_up_takes_only_its_answers() -> None:
    """Through the proxy the same packets get E01 and never reach the look-up; the
    client answers, the look-up ends, and the program is whole: it runs to its
    normal end only after the detach."""
    require_tool("gdbserver")
    with start_stub("gdbserver", _bench(), ["5", "ct"]) as stub, start_proxy(stub.address) as px:
        peer = RawPeer.connect(px.address)
        assert _hostile_symbol_look_up(peer) == [b"E01", b"E01", b"E01"]
        assert "check=ok" not in stub.output_text()  # the vCont;c ran nothing
        for _ in range(64):  # the client answers "unknown" to every question
            asked = peer.request(b"qSymbol::")
            if not asked.startswith(b"qSymbol:"):
                break
        assert asked == b"OK", asked
        qc = peer.request(b"qC")
        assert qc.startswith(b"QCp"), qc
        assert peer.request(b"D;" + qc[3:].split(b".")[0]) == b"OK"
        peer.close()
        px.wait(timeout=15)
        stub.wait(timeout=60)
        out = stub.output_text()
        assert "Malformed response to qSymbol" not in out and "check=ok" in out, out
