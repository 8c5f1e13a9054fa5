"""The tracepoint capture's residue (TraceVeil), sans-IO: after the session drops
tracepoint capture, the client's trace packets are answered as if no experiment ever
ran, until the client starts its own. The end-to-end case (exec, gdb's `tstatus`
compared with gdb straight on gdbserver) is integration/test_tracepoints.py."""

from __future__ import annotations

from proxy.capture.tracepoints import TraceVeil
from proxy.procedure import Reply
from rsp.packets.trace import NOT_RUN_STATUS


def test_the_veil_answers_until_the_client_starts_its_own_experiment() -> None:
    veil = TraceVeil()
    assert veil.client_request(b"qTStatus") == Reply(NOT_RUN_STATUS)
    assert veil.client_request(b"qTfP") == Reply(b"l")
    assert veil.client_request(b"m1000,4") is None  # not a trace packet: the stub answers
    assert not veil.done
    assert veil.client_request(b"QTinit") is None  # the client's own experiment: forwarded
    assert veil.done
    assert veil.client_request(b"qTStatus") is None  # from now on gdbserver's status is the client's
