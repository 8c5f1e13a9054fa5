"""The expected-tree matcher and the task-dump oracle's comparison can fail (pure parts of
integration/harness/expected_tree.py and integration/harness/task_dump.py)."""

from __future__ import annotations

from integration.harness import expected_tree
from integration.harness.task_dump import compare

TREE = """task #2 0x1  t::foo::{async_fn_env#0}  (root)
╼ t::foo at /x/t.rs:29
└╼ t::bar at /x/t.rs:33
   └╼ tokio::join!
      ├╼ [branch 0] tokio::time::Sleep (5.0 min left)
      └╼ [branch 1] tokio::sync::mutex::{impl#10}::lock<u64> at /y/mutex.rs:455 (waits on Mutex 0x1, held by task #3 t::h)
         └╼ tokio::sync::Semaphore::acquire (waits on semaphore 0x1)
"""
LINES = {("foo", "bar"): [29], ("bar", "join"): [33], ("bar", "other"): [40]}


def _expect(text: str):  # type: ignore[no-untyped-def]
    return expected_tree.parse_expected(text, lambda p, c: LINES.get((p, c), []))


def test_a_tree_that_holds_the_expected_one_matches() -> None:
    want = _expect("task t::foo\n  t::foo @ foo -> bar\n    t::bar @ bar -> join\n      tokio::join!\n"
                   "        tokio::time::Sleep ~ min left\n        * ~ held by task\n"
                   "        ... tokio::sync::Semaphore::acquire\n")
    assert expected_tree.missing(want, TREE) == []


def test_a_wrong_line_a_missing_leaf_or_detail_fails() -> None:
    assert expected_tree.missing(_expect("task t::foo\n  t::foo @ foo -> bar\n    t::bar @ bar -> other\n"), TREE)
    assert expected_tree.missing(_expect("task t::foo\n  t::foo\n    t::bar\n      tokio::join!\n"
                                         "        tokio::sync::oneshot::Receiver\n"), TREE)
    assert expected_tree.missing(_expect("task t::foo\n  t::foo\n    ... tokio::time::Sleep ~ h left\n"), TREE)
    # two expected children cannot both match the one actual Sleep
    assert expected_tree.missing(_expect("task t::foo\n  ... tokio::join!\n    tokio::time::Sleep\n"
                                         "    tokio::time::Sleep\n"), TREE)


DUMP = """==dump==
TASK
╼\xa0t::foo::{{closure}} at /x/t.rs:29:11
  └╼\xa0t::bar::{{closure}} at /x/t.rs:33:5
     └╼\xa0<tokio::time::sleep::Sleep as core::future::future::Future>::poll at /y/sleep.rs:448:36
==end==
"""


def test_the_oracle_fails_on_a_frame_or_leaf_tokio_has_and_the_tree_lacks() -> None:
    full = "task #2 0x1  t::foo::{async_fn_env#0}\n╼ t::foo at /x/t.rs:29\n└╼ t::bar at /x/t.rs:33\n" \
           "   └╼ tokio::time::Sleep (5 min left)\n"
    assert compare(DUMP, full) == ([], ["task t::foo: tokio::time::Sleep (5 min left)"])
    no_bar = "task #2 0x1  t::foo::{async_fn_env#0}\n╼ t::foo at /x/t.rs:29\n└╼ tokio::time::Sleep (5 min left)\n"
    assert compare(DUMP, no_bar)[0] == ["task t::foo: frame t::bar::{{closure}} at t.rs:33"]
    no_leaf = "task #2 0x1  t::foo::{async_fn_env#0}\n╼ t::foo at /x/t.rs:29\n└╼ t::bar at /x/t.rs:33\n" \
              "   └╼ core::future::poll_fn::PollFn\n"
    assert compare(DUMP, no_leaf)[0] == ["task t::foo: leaf tokio::time::sleep::Sleep"]
    assert compare(DUMP, "")[0] == ["task t::foo: not in the tree"]
