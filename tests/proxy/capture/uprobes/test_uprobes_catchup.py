"""When full mode samples (proxy/capture/uprobes/catchup.py): the marks, the switches, what stats says."""

from __future__ import annotations

from proxy.capture.uprobes.catchup import CatchUp


def test_samples_past_the_high_mark_and_records_again_at_the_low_one() -> None:
    cu = CatchUp(every=64, marks=(1000, 100))
    assert cu.step(500, 0.0) is None and cu.step(1000, 0.1) is None  # at the mark: not past it
    assert cu.step(1001, 0.2) == 64
    cu.switched(64, 0.2, hits=10_000)
    assert cu.sampling and cu.switches == 1
    assert cu.step(5000, 0.3) is None and cu.step(101, 0.4) is None  # between the marks: stays
    assert cu.step(100, 1.2) == 1
    cu.switched(1, 1.2, hits=14_000)
    assert not cu.sampling and cu.sampled_s == 1.0 and cu.hits_sampled == 4000
    assert cu.step(0, 2.2) is None
    s, total, h = cu.totals(2.2, 20_000)
    assert (round(s, 6), round(total, 6), h) == (1.0, 2.2, 4000)
    line = cu.line(2.2, 20_000)
    assert "sampled 1 times" in line and "45.5% of the time" in line and "4,000 of 20,000 probe hits = 20.0%" in line
    assert "at most 5,000 unread" in line
    note = cu.note(recorded=10, polls=100)
    assert note is not None and "POLLS and BUSY are exact" in note


def test_the_marks_follow_the_measured_cost_of_a_record() -> None:
    cu = CatchUp(high_s=0.25, low_s=0.05)
    assert cu.marks() == (25_000, 5_000)  # 10 µs a record before any fold is measured
    for _ in range(50):
        cu.measured(10_000, 0.05)  # 5 µs a record
    high, low = cu.marks()
    assert 49_000 <= high <= 50_000 and 9_800 <= low <= 10_000
    cu.measured(10, 1.0)  # too few records to say
    assert cu.marks() == (high, low)


def test_never_behind_says_so_and_top_says_nothing() -> None:
    cu = CatchUp(marks=(1000, 100))
    assert cu.step(20, 0.0) is None
    assert cu.line(1.0, 500).endswith("never behind (at most 20 unread)")
    assert cu.note(5, 5) is None


def test_the_cpu_budget_paces_the_fold_by_the_process_clock() -> None:
    """10% of a core: 5 ms of folding a 50 ms tick; what the process spent is paid,
    an overspend is repaid before the next fold, savings are capped (BURST_S)."""
    from proxy.capture.uprobes.catchup import BURST_S

    cu = CatchUp(marks=(1000, 100), budget=0.10)
    assert cu.allowance(0.0, 0.0) == 0.0  # the first look: nothing earned yet
    allow = cu.allowance(0.05, 0.0)
    assert allow is not None and abs(allow - 0.005) < 1e-9
    assert cu.allowance(0.10, 0.030) == 0.0  # 30 ms spent against 10 ms earned: overspent
    assert cu.allowance(0.20, 0.030) == 0.0  # -20 + 10 ms: still repaying
    allow = cu.allowance(0.40, 0.030)
    assert allow is not None and abs(allow - 0.010) < 1e-9  # -10 + 20 ms
    assert cu.held == 3
    allow = cu.allowance(60.0, 0.030)  # a quiet minute saves BURST_S at most
    assert allow == BURST_S
    assert abs(cu.run_s - 60.0) < 1e-9 and abs(cu.cpu_s - 0.030) < 1e-9
    assert "CPU budget 10% of a core while the program runs: the proxy took 0.03 s of CPU in 60.0 s running = " \
        "0.1% of a core (folding held 3 times)" in cu.line(60.0, 100)


def test_a_stop_is_not_paid_from_the_budget() -> None:
    """The fold at a stop (the program does not run) takes what it needs: the clock
    starts again at the first look after it."""
    cu = CatchUp(marks=(1000, 100), budget=0.10)
    cu.allowance(0.0, 0.0)
    cu.allowance(0.1, 0.0)  # 10 ms earned
    cu.stopped()
    allow = cu.allowance(5.0, 2.0)  # 2 s of CPU at the stop, 4.9 s stopped: neither counted
    assert allow is not None and abs(allow - 0.01) < 1e-9
    assert abs(cu.run_s - 0.1) < 1e-9 and cu.cpu_s == 0.0


def test_no_budget() -> None:
    for budget in (None, 0.0, 1.0):
        cu = CatchUp(marks=(1000, 100), budget=budget)
        assert cu.allowance(0.0, 0.0) is None and cu.allowance(1.0, 5.0) is None
        assert "no CPU budget" in cu.line(1.0, 10)


def test_uprobe_budget_option() -> None:
    """`--uprobe-budget PCT` reaches the capture's CatchUp (default 10%, 0: none)."""
    import pytest

    from proxy.capture.uprobes import make
    from proxy.capture.uprobes.catchup import BUDGET
    from proxy.cli import build_parser

    def budget(*extra: str) -> float | None:
        args = build_parser().parse_args(["serve", "--upstream", "127.0.0.1:1", *extra])
        cap = make(options=vars(args))
        assert cap.catchup is not None
        return cap.catchup.budget

    assert budget() == BUDGET == 0.10
    assert budget("--uprobe-budget", "25") == 0.25
    assert budget("--uprobe-budget", "0") is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--upstream", "x:1", "--uprobe-budget", "100"])


def test_lost_events_ask_for_a_few_stack_slices_a_thread_not_every_one() -> None:
    """After lost events each thread waiting to be resynchronised needs one entry with
    its stack. The credits were unbounded then: behind by seconds (--uprobe-strict),
    every entry carried an 8 KiB slice until the proxy reached one, which doubled the
    BPF program's cost a hit and filled the ring, losing more (docs/history/2026-speed.md)."""
    from proxy.capture.uprobes.capture import UprobeCapture
    from proxy.capture.uprobes.fold import RESYNC_CREDITS

    cap = UprobeCapture(catch_up=False)
    room = cap.fold.credits_wanted()
    assert room == 512  # the unwinder's queue
    cap.fold.backlog_n = 2_000_000  # far behind: no room for the unwinder's sample
    assert cap.fold.credits_wanted() == 0
    cap.fold.resync = {101, 102}
    assert cap.fold.credits_wanted() == 2 * RESYNC_CREDITS
    cap.fold.backlog_n = 0
    assert cap.fold.credits_wanted() == room  # the queue's room covers the resync's need


def test_nested_probes_out_while_sampling_back_after_the_minimum_out_time() -> None:
    """Full mode's nested-only probes (catchup.py NestedProbes): out as soon as the
    catch-up samples; back once it records every poll again and they were out at
    least min_out_s (hysteresis: a close and an attach each time), whatever the
    catch-up does in between; the out time counts the running time only."""
    from proxy.capture.uprobes.catchup import NestedProbes

    ns = NestedProbes(min_out_s=0.5)
    assert ns.want(False, 0.0) is None  # keeps up: they stay in
    assert ns.want(True, 1.0) is True  # sampling: out
    ns.moved(True, 1.0)
    assert ns.out and ns.outs == 1
    assert ns.want(True, 1.2) is None  # still sampling
    assert ns.want(False, 1.3) is None  # caught up, but out 0.3 s only: they stay out
    assert ns.want(True, 1.4) is None
    assert ns.want(False, 1.5) is False  # caught up and out 0.5 s: back
    ns.moved(False, 1.5)
    assert not ns.out and abs(ns.out_s - 0.5) < 1e-9 and abs(ns.longest_s - 0.5) < 1e-9
    assert ns.want(False, 1.6) is None
    out, run = ns.totals(2.0)
    assert abs(out - 0.5) < 1e-9 and abs(run - 2.0) < 1e-9 and abs(ns.share(2.0) - 0.25) < 1e-9


def test_nested_probes_come_back_at_a_stop_and_a_stop_is_not_out_time() -> None:
    from proxy.capture.uprobes.catchup import NestedProbes

    ns = NestedProbes(min_out_s=10.0)
    assert ns.want(True, 0.0) is True
    ns.moved(True, 0.0)
    ns.stop(1.0)  # stopped after 1 s out, for 3 s
    assert ns.want(True, 4.0, stopped=True) is False  # at a stop: back whatever the minimum
    assert ns.want(True, 4.0) is None  # (running and sampling: they stay out)
    ns.resume(4.0)
    out, run = ns.totals(4.0)
    assert abs(out - 1.0) < 1e-9 and abs(run - 1.0) < 1e-9  # the stop is neither
    ns.moved(False, 4.0)
    assert abs(ns.out_s - 1.0) < 1e-9
    assert ns.want(True, 4.0, stopped=True) is None  # never taken out at a stop


def test_nested_probes_follow_the_budget_option() -> None:
    """Full mode under a budget takes the nested probes out while sampling; `--uprobe-budget 0`
    (no budget), `--uprobe-strict` and the other modes keep every probe in."""
    from proxy.capture.uprobes import make
    from proxy.cli import build_parser

    def nested(*extra: str, mode: str = "full") -> bool:
        args = build_parser().parse_args(["serve", "--upstream", "127.0.0.1:1", *extra])
        return make(mode=mode, options=vars(args)).nested is not None

    assert nested()
    assert nested("--uprobe-budget", "25")
    assert not nested("--uprobe-budget", "0")
    assert not nested("--uprobe-strict")
    assert not nested(mode="tasks")
    assert not nested("--sample", "8")
