"""The transparency matrix: scenarios x clients x stubs, and the pairs that
do not work even without the proxy (each with the reason found here).

Every scenario runs the program's ``probed`` function under a hidden probe
(``--probe ^probed$``) on the proxy route, so the proxy really stops, hides
and resumes while the client works.
"""

from __future__ import annotations

from .scenarios import INTERRUPT, STATS, C, R, Scenario

# (client, stub, scenario or "*") that fail straight against the stub,
# checked on this machine (test_transparency.py::test_fails_directly
# re-checks each one, so an entry that starts working is noticed).
BROKEN_DIRECT: dict[tuple[str, str, str], str] = {
    ("gdb", "lldb-server", "*"): "gdb 13 cannot use lldb-server 14: 'Target description specified "
                                 "unknown architecture \"x86_64\"' then 'Remote register badly "
                                 "formatted' on the first stop reply",
    ("mi", "lldb-server", "*"): "gdb/MI is gdb: same target description failure as the CLI",
    ("lldb", "gdbserver", "*"): "lldb 14 never asks gdbserver for swbreak+, so gdbserver reports a "
                                "breakpoint stop with the pc one byte past the int3 (SIGTRAP at "
                                "_start+1 for lldb's own loader breakpoint) and the batch session aborts",
    ("gdb", "qemu", "interrupt"): "QEMU 7.2's user-mode gdbstub ignores the 0x03 interrupt while the "
                                  "program runs: the only stop is the program's exit",
    ("mi", "qemu", "interrupt"): "QEMU 7.2's user-mode gdbstub ignores -exec-interrupt's 0x03",
    ("lldb", "qemu", "interrupt"): "QEMU 7.2's user-mode gdbstub ignores lldb's interrupt",
}


def broken_reason(client: str, stub: str, scenario: str) -> str | None:
    return BROKEN_DIRECT.get((client, stub, scenario)) or BROKEN_DIRECT.get((client, stub, "*"))


CLIENTS = ("gdb", "mi", "lldb")
STUBS = ("gdbserver", "lldb-server", "qemu")
# The proxy's --capture backends the matrix runs under (the probe is a hidden
# breakpoint with `breakpoints`, a kernel uprobe with `uprobes`).
CAPTURES = ("breakpoints", "uprobes")


def capture_reason(capture: str, client: str, stub: str) -> str | None:
    """Why `capture` is not run with this pair (None: it is)."""
    if capture != "uprobes":
        return None
    if stub == "qemu":
        return "QEMU runs the program in its emulator: no native process for a uprobe to attach to"
    if stub != "gdbserver" or client == "lldb":
        return "uprobe capture is checked with gdb and gdb/MI against gdbserver (the pairs that work directly)"
    return None

INSPECT = Scenario(
    name="inspect", program="watch", args=(),
    scripts={
        "gdb": (
            C("break main"), C("continue"),
            C("x/8xb probed"),             # only the proxy has a breakpoint here
            C("print counter"), C("print table"), C("print greeting"),
            C("break probed"), C("continue"), C("bt"),
            C("x/8xb probed"),             # client and proxy both own it now
            C("finish"), C("next"), C("step"), C("bt"), C("next"), C("stepi"), C("stepi"),
            C("until"), C("until"),
            C("tbreak *probed"), C("continue"),  # same address as the proxy's probe
            C("x/8xb probed"), C("stepi"), C("info breakpoints"),
            C("delete"), C("watch counter"), C("continue"), C("continue"),
            C("delete"), C("until 15"), C("print counter"), STATS, C("continue"),
        ),
        "mi": (
            C("-break-insert main"), R("-exec-continue"),
            C("-data-read-memory-bytes probed 8"),
            C("-data-evaluate-expression counter"), C("-data-evaluate-expression table"),
            C("-break-insert probed"), R("-exec-continue"), C("-stack-list-frames"),
            C("-data-read-memory-bytes probed 8"),
            R("-exec-finish"), R("-exec-next"), R("-exec-step"), C("-stack-list-frames"),
            R("-exec-next"), R("-exec-step-instruction"), R("-exec-next-instruction"),
            R("-exec-until"), C("-break-insert -t *probed"), R("-exec-continue"),
            C("-data-read-memory-bytes probed 8"), R("-exec-step-instruction"), C("-break-list"),
            C("-break-delete"), C("-break-watch counter"), R("-exec-continue"), R("-exec-continue"),
            C("-break-delete"), R("-exec-until 15"), C("-data-evaluate-expression counter"),
            STATS, R("-exec-continue"),
        ),
        "lldb": (
            C("b main"), C("c"),
            C("x/8xb probed"),
            C("p counter"), C("p table"), C("p greeting"),
            C("b probed"), C("c"), C("bt"),
            C("x/8xb probed"),
            C("finish"), C("next"), C("step"), C("bt"), C("next"), C("si"), C("ni"),
            C("breakpoint set --one-shot true --address probed"), C("c"),
            C("x/8xb probed"), C("si"), C("breakpoint list"),
            C("breakpoint delete"), C("watchpoint set variable counter"), C("c"), C("c"),
            C("watchpoint delete"), C("thread until 15"), C("p counter"), STATS, C("c"),
        ),
    },
    evidence={
        "gdb": (r"Breakpoint 2, probed \(x=0\)", r"0x55", r"Run till exit", r"\$1 = 0",
                r"Hardware watchpoint \d+: counter", r"exited normally"),
        "mi": (r'reason="breakpoint-hit"', r'reason="function-finished"',
               r'reason="end-stepping-range"', r'reason="watchpoint-trigger"|wpt',
               r'reason="exited-normally"'),
        "lldb": (r"stop reason = breakpoint 2\.1", r"probed\(x=", r"exited with status = 0"),
    },
    program_output=r"counter=25",
    # QEMU 7.2 rejects lldb's watchpoint packet and lldb --batch stops there
    evidence_limited={("lldb", "qemu"): (r"stop reason = breakpoint 2\.1", r"probed\(x=",
                                         r"Watchpoint creation failed")},
)

THREADS = Scenario(
    name="threads", program="threads", args=(),
    scripts={
        "gdb": (C("break parked"), C("continue"), C("info threads"),
                C("thread 2"), C("bt 3"), C("thread 4"), C("bt 3"), C("thread 1"), C("bt"),
                C("thread apply all print $_thread"), STATS, C("continue")),
        "mi": (C("-break-insert parked"), R("-exec-continue"), C("-thread-info"),
               C("-thread-select 2"), C("-stack-list-frames 0 2"), C("-thread-select 1"),
               C("-stack-list-frames"), STATS, R("-exec-continue")),
        # lldb stops at parked's first byte (one-line function), where `id` is
        # still garbage: stop on the line after the call instead
        # lldb prints `thread select`'s result from its event thread, at a
        # random place in the batch output: name threads in `thread backtrace`
        "lldb": (C("b threads.c:48"), C("c"), C("thread list"), C("thread backtrace -c 3 2"),
                 C("thread backtrace -c 3 4"), C("thread backtrace 1"), STATS, C("c")),
    },
    # (QEMU does not report thread names: count threads instead)
    evidence={"gdb": (r"\n\s+4\s+Thread ", r"\* 1 ", r"parked \(id=0\)", r"exited normally"),
              "mi": (r'id="4"', r'func="parked"', r'reason="exited-normally"'),
              "lldb": (r"thread #4", r"threads.c:48", r"exited with status = 0")},
    program_output=r"threads done 108",
)

SIGNALS = Scenario(
    name="signals", program="signals", args=("3",),
    scripts={
        "gdb": (C("handle SIGUSR1 stop print pass"), C("continue"), C("continue"), C("continue"),
                STATS, C("continue")),
        "mi": (C('-interpreter-exec console "handle SIGUSR1 stop print pass"'),
               R("-exec-continue"), R("-exec-continue"), R("-exec-continue"), STATS,
               R("-exec-continue")),
        # lldb --batch aborts the script at a signal stop: pass without stopping
        "lldb": (C("process handle SIGUSR1 -s false -p true -n true"), C("b signals.c:25"), C("c"),
                 STATS, C("c")),
    },
    evidence={"gdb": (r"Program received signal SIGUSR1", r"exited normally"),
              "mi": (r'signal-name="SIGUSR1"', r'reason="exited-normally"'),
              "lldb": (r"exited with status = 0",)},
    program_output=r"got 3 of 3",
)

INTERRUPTS = Scenario(
    name="interrupt", program="spin", args=("30",),
    scripts={
        "gdb": (INTERRUPT, C("print keep_going"), C("set var keep_going = 0"), STATS,
                C("continue")),
        "mi": (INTERRUPT, C("-data-evaluate-expression keep_going"),
               C("-gdb-set var keep_going=0"), STATS, R("-exec-continue")),
        "lldb": (INTERRUPT, C("p keep_going"), C("expr keep_going = 0"), STATS, C("c")),
    },
    evidence={"gdb": (r"stopped by SIGINT", r"\$1 = 1", r"exited normally"),
              "mi": (r"stopped: signal-received SIGINT", r'reason="exited-normally"'),
              "lldb": (r"stop reason = signal SIG(INT|STOP)", r"exited with status = 0")},
    program_output=r"spun ok",
)

EXITCODE = Scenario(
    name="exitcode", program="exitcode", args=("7",),
    scripts={"gdb": (C("continue"),), "mi": (R("-exec-continue"),), "lldb": (C("c"),)},
    evidence={"gdb": (r"exited with code 07",), "mi": (r'exit-code="07"',),
              "lldb": (r"exited with status = 7",)},
)

DETACH = Scenario(
    name="detach", program="probe_count", args=("3000",),
    scripts={"gdb": (C("break main"), C("continue"), C("delete"), C("detach")),
             "mi": (C("-break-insert main"), R("-exec-continue"), C("-break-delete"),
                    C("-target-detach")),
             "lldb": (C("b main"), C("c"), C("breakpoint delete"), C("detach"))},
    evidence={"gdb": (r"Detaching from program",), "mi": (r"\^done",),
              "lldb": (r"Detaching from process|detached",)},
    program_output=r"sum=9000000 calls=3000",
    # after a detach, lldb-server's pty (the program's stdout) closes with it:
    # the output is lost, the exit status (read as subreaper) still tells
    output_lost_on=("lldb-server",),
)

KILL = Scenario(
    name="kill", program="probe_count", args=("1000",),
    scripts={"gdb": (C("break probed"), C("continue"), C("continue"), STATS, C("kill")),
             "mi": (C("-break-insert probed"), R("-exec-continue"), R("-exec-continue"), STATS,
                    C('-interpreter-exec console "kill"')),
             "lldb": (C("b probed"), C("c"), C("c"), STATS, C("kill"))},
    evidence={"gdb": (r"Breakpoint 1, probed \(x=1\)", r"killed"),
              "mi": (r'bkptno="1"', r"\^done"),
              # QEMU reports a kill as exit status 0, lldb-server as 9
              "lldb": (r"stop reason = breakpoint 1\.1", r"Process \d+ exited with status")},
)

SCENARIOS = (INSPECT, THREADS, SIGNALS, INTERRUPTS, EXITCODE, DETACH, KILL)
