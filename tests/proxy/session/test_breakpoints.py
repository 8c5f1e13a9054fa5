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

