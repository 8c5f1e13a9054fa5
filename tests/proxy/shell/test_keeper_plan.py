"""The keeper's leave plan in shared memory (proxy/shell/keeper.py `SharedPlan`):
the newest whole plan is read back, a write cut short by the proxy's death
leaves the one before it readable, and a plan too large for a slot is refused
(the proxy then writes it on the pipe, with its seq, and the keeper takes the
newer of the two)."""

from __future__ import annotations

import json
import os
import socket

from proxy.shell.keeper import SharedPlan, main


def test_the_newest_plan_is_read_back() -> None:
    sp = SharedPlan()
    assert sp.read() == (0, None)
    for n in range(1, 6):
        assert sp.write(json.dumps({"z": ["z0,%x,1" % a for a in range(n)]}).encode())
        assert sp.read() == (n, {"z": ["z0,%x,1" % a for a in range(n)]})


def test_a_write_cut_short_leaves_the_plan_before_it() -> None:
    buf = bytearray(2 * SharedPlan.SLOT)
    sp = SharedPlan(buf)
    sp.write(b'{"z": ["z0,1000,1"]}')
    sp.write(b'{"z": ["z0,2000,1"]}')
    # the third write goes to slot 0 (the older): killed after its JSON, before its seqs
    before = bytes(buf)
    sp.write(b'{"z": ["z0,3000,1", "z0,4000,1"]}')
    torn = bytearray(before)
    torn[:SharedPlan.SLOT] = buf[:SharedPlan.SLOT]
    torn[0:8] = (0).to_bytes(8, "little")  # the first seq is written last
    assert SharedPlan(torn).read() == (2, {"z": ["z0,2000,1"]})
    assert SharedPlan(buf).read() == (3, {"z": ["z0,3000,1", "z0,4000,1"]})


def test_a_plan_too_large_goes_on_the_pipe_and_the_keeper_takes_the_newer() -> None:
    sp = SharedPlan(bytearray(2 * SharedPlan.SLOT))
    sp.write(b'{"z": []}')  # seq 1: nothing to take out
    big = json.dumps({"z": ["z0,%x,1" % a for a in range(SharedPlan.SLOT // 10)]}).encode()
    assert not sp.write(big) and sp.seq == 2
    r, w = os.pipe()
    os.write(w, b"%d " % sp.seq + b'{"z": []}\n')  # what Keeper.update writes for a large plan
    os.close(w)
    a, b = socket.socketpair()  # the stub's socket: the keeper must not talk on it
    with a, b:
        assert main([str(os.dup(a.fileno())), str(r)], sp) == 0  # the pipe's plan (seq 2) is newer
        b.setblocking(False)
        assert _nothing(b), "the keeper acted on the older plan in shared memory"
    sp.write(b'{"z": ["z0,1000,1"]}')  # seq 3, newer than the pipe's: it would be acted on
    assert sp.read() == (3, {"z": ["z0,1000,1"]})


def _nothing(sock: socket.socket) -> bool:
    try:
        return not sock.recv(100)
    except BlockingIOError:
        return True
