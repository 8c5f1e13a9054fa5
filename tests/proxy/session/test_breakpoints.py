from __future__ import annotations

from proxy.session.breakpoints import BreakpointTable

KEY = (0, 0x401000, 1)


def _union(t: BreakpointTable) -> set[tuple[int, int, int]]:
    return set(t.client) | t.proxy | set(t.lingering)


def test_the_version_changes_with_the_union_only() -> None:
    """The keeper's plan (the union the stub holds) is rebuilt when `version` changes:
    gdb's z0 and Z0 of the same breakpoint around each step change the owner, not the union."""
    t = BreakpointTable()
    assert t.client_insert(KEY)  # new in the union: the stub is told
    v, union = t.version, _union(t)
    t.linger(KEY)
    assert t.back_in(KEY, b"")
    t.linger(KEY)
    assert (t.version, _union(t)) == (v, union)
    assert t.take_lingering() == [KEY]
    assert t.version != v and _union(t) == set()



def test_a_quiet_client_has_its_removed_breakpoints_leave_the_stub() -> None:
    """The shell says the client is quiet at a stop (session.client_idle): a remove kept
    in the stub goes to it then, not at the next resume (a program killed from outside
    meanwhile met it there: gdbserver 13.1 failed an assertion)."""
    from proxy.session.actions import ToStub

    from .test_lane import THREAD, _run, _stub_reply

    _, s, _ = _run([b"qSupported:multiprocess+", b"QStartNoAckMode", b"?", b"Hg" + THREAD,
                    b"Z0,401000,1", b"vCont;c:" + THREAD, b"z0,401000,1", b"m401000,4"], lane=True)
    assert s.lingering  # gdb's remove at the stop was answered here, kept in the stub
    assert s.client_idle()
    acts = s.take_actions()
    assert [a.body for a in acts if isinstance(a, ToStub)] == [b"z0,401000,1"]
    assert not s.client_idle()  # one procedure at a time; nothing more to send once it is out
    reply = _stub_reply(b"z0,401000,1", {})
    assert reply is not None
    s.stub_packet(reply, b"$OK#9a")
    assert not s.lingering and not s.client_idle()
    s.client_packet(b"vCont;c:" + THREAD, b"$vCont;c:" + THREAD + b"#00")
    assert not s.client_idle()  # nothing lingers; and never while the program runs


def test_a_client_that_hangs_up_while_its_removes_go_out_is_still_let_go() -> None:
    """gdb's `disconnect` right after a stop: the quiet client's removes are on their way
    (client_idle) when it hangs up; the session goes on with the hang-up once they are out."""
    from proxy.session.actions import Close

    from .test_lane import THREAD, _run

    _, s, _ = _run([b"qSupported:multiprocess+", b"QStartNoAckMode", b"?", b"Hg" + THREAD,
                    b"Z0,401000,1", b"vCont;c:" + THREAD, b"z0,401000,1"], lane=True)
    assert s.client_idle()
    s.take_actions()
    s.client_closed(keep_stub=True)  # the program is kept for the next client
    assert not [a for a in s.take_actions() if isinstance(a, Close)]  # the z0's reply is due first
    s.stub_packet(b"OK", b"$OK#9a")
    assert [a for a in s.take_actions() if isinstance(a, Close)] == [Close("client disconnected", keep_stub=True)]


def test_target_side_conditions_never_hold_back_a_proxy_breakpoint() -> None:
    """gdbserver keeps one breakpoint an address, with the last `Z`'s conditions: the
    client's conditions go to the stub only where the proxy has no breakpoint."""
    t = BreakpointTable()
    key = (0, 0x1000, 1)
    assert t.client_insert(key, b";X3,220701")  # new: the stub evaluates it
    assert not t.strip_conditions(key)
    assert not t.client_insert(key, b";X3,220701")  # the same again: nothing for the stub
    assert t.client_insert(key, b";X3,220801")  # changed: the stub must have the new list
    assert t.proxy_insert(key)  # the proxy's plain Z0 replaces the client's conditions
    assert t.strip_conditions(key)
    assert not t.client_insert(key, b";X3,220901")  # kept plain in the stub: answered here
    other = (0, 0x2000, 1)
    assert t.proxy_insert(other)
    assert not t.client_insert(other, b";X3,220701")
    plain = (0, 0x3000, 1)
    assert t.client_insert(plain)
    assert not t.proxy_insert(plain)  # no conditions in the stub to replace


def test_lost_commands_are_said_once_an_address() -> None:
    t = BreakpointTable()
    key = (0, 0x1000, 1)
    t.proxy_insert(key)
    t.client_insert(key, b";X3,220701")
    assert not t.commands_lost(key)  # a condition: gdb evaluates it again itself
    t.client_insert(key, b";cmds:1,X3,220701")
    assert t.commands_lost(key)
    t.client_remove(key)
    t.client_insert(key, b";cmds:1,X3,220701")  # gdb's insert again at the next stop
    assert not t.commands_lost(key)
