"""The interface between the session core and a capture backend.

Theory of operation: a backend turns the program's poll entries and exits
into `proxy.graph.events` for the target's one engine. The session calls it
at fixed points of a session's life, and the backend answers with data or
with *procedures* (generators yielding `Exchange`s, see
`proxy.procedure`) that the session runs against the stub:

* `plan(target)`: the hidden breakpoints to plant (the breakpoints backend
  plants one per entry and ret; tracepoints and uprobes plant none).
* `reads` / `hit`: at a hidden-breakpoint hit, the packets to read in the
  same exchange as the step-over, then their replies.
* `install_early()` (backends with `installs_early`, when
  `may_install_early(target)` holds): at the client's
  first stop of a process proven this host's, after `plan` and
  `count_probes`: start the install now (True), ahead of the first resume,
  which then calls `install` to finish it;
* `install()` after planting, before the program first runs;
  `sync()` at a stop, before the proxy answers any graph question (drain);
  `uninstall()` at a stop, before detach / kill / hang-up / a backend switch.
* `client_request(body)` sees every client packet first (hide the proxy's
  own use of a facility, rewrite a packet, hand over to the client);
  `client_reply(request, reply)` rewrites a forwarded request's reply.
* `stop(sr)`: a stop reply during the client's resume that the backend
  caused; the session runs the returned procedure and resumes, hidden.
* `wants_interrupt(now)`: while running, the backend needs a hidden stop.
* `before_resume()`: the client resumes; the backend may change what it has
  in the program first.
* `relocate_request(body)`: the stub asks its client to move an instruction
  (``qRelocInsn``) while it handles one of the backend's requests.
* `poll()` / `wakeup_fd()`: a continuous consumer the shell drives while the
  program runs.
* `count_probes(probes)` (after `plan`, before `install`): the `--probe`
  functions the backend counts itself (uprobes), by address; the session
  plants hidden breakpoints for the others. `probe_counts()` gives their hits;
  `counting()` (after `install`) False gives them back to the session.

Everything here is sync and pure; backends never talk to the stub
themselves. `CaptureBase` gives every hook a do-nothing default.
"""

from __future__ import annotations

from typing import Protocol

from proxy.capture.target import Target
from proxy.graph.engine import Engine
from proxy.probes import Probe
from proxy.procedure import Forward, Handover, Procedure, Reply, Verdict
from rsp.packets.stop import StopReply


class Residue(Protocol):
    """See `CaptureBase.residue`: consulted for every client packet after the
    current backend; `done` once it has nothing left to hide."""

    done: bool

    def client_request(self, body: bytes) -> Verdict | None: ...


class CaptureBase:
    """A capture backend with every hook a no-op (override what you need)."""

    name = "none"
    # Why this backend was chosen (shown by `stats`), set by the chooser.
    why: str = ""
    # A software breakpoint the proxy plants at a probed site would be lost (uprobes):
    # the proxy's own breakpoints there go to the stub as hardware ones (session/stepping.py).
    swallows_breakpoints = False
    # The one line said when `--capture auto` passed over a cheaper backend (capture.fallback_line).
    fallback: str | None = None

    def __init__(self) -> None:
        self.target: Target | None = None
        self.note: str | None = None  # why nothing is captured, if so
        self.events = 0

    @property
    def engine(self) -> Engine | None:
        return self.target.engine if self.target is not None else None

    # -- planting
    def plan(self, target: Target) -> list[Probe]:
        self.target = target
        return []

    def install(self) -> Procedure | None:
        return None

    def uninstall(self) -> Procedure | None:
        return None

    # install_early may be asked (see the module docstring)
    installs_early = False

    def may_install_early(self, target: object) -> bool:
        """Before `plan`: could `install_early` start on this target? False
        spares the session a plan it would only drop (it keeps the target for
        the first resume instead). True says nothing yet: `install_early` decides."""
        return self.installs_early

    def install_early(self) -> bool:
        """Start installing before the first resume (the program stopped at the
        client's first `?`, proven this host's; `plan` gave no hidden breakpoint
        and `count_probes` took every --probe): True when started. The capture
        then answers the client as installed; the session's `install` at the
        first resume finishes it (its procedure, if any, runs then), and an
        `uninstall` before that takes out what was started. Never talks to the
        stub; False: nothing started, the first resume plans it all again."""
        return False

    def leaving(self) -> None:
        """The session ends by a kill (vKill, k): `uninstall` follows, the
        program dies, and nothing is planted again. A backend may take its
        things out without waiting for them to be out (uprobes: a link's close
        waits ~40 ms for the kernel's grace periods). Not called at a detach or
        a hang-up: the program runs on and must be whole when the proxy is gone."""
        return None

    # -- the session's count probes (--probe)
    def count_probes(self, probes: list[Probe]) -> list[int]:
        return []

    def probe_counts(self) -> dict[int, int]:
        return {}

    def counting(self) -> bool:
        """After `install`: are the probes `count_probes` took really counted?
        False when the backend could not put its probes in (uprobes: the BPF
        load or the attach failed): the session plants them as hidden
        breakpoints again."""
        return True

    def forked(self, child: object) -> Procedure | None:
        """The program forked; the stub's selected process is the child
        (`child` is its ThreadId): take whatever this backend put in the
        parent's memory out of the child's copy. Hidden breakpoints are
        already removed by the session."""
        return None

    def dropped(self) -> None:
        """The session drops this backend without an uninstall: its process is
        gone (extended-remote: vRun, vAttach or R start another). Free what it
        holds outside the stub without waiting (uprobes: the links, whose
        close waits for the kernel). Talk to no one."""
        return None

    def exec_happened(self, path: str | None) -> None:
        """The program exec'd `path`: the old image and the stub's breakpoints
        are gone and the session drops this backend without an uninstall.
        Take out what the backend holds in the process outside the stub
        (uprobes: kernel links on the file, which an exec of the same file
        keeps). Talk to no one: the session says why capture stopped."""
        return None

    def exited(self, sr: StopReply) -> Procedure | None:
        """The program exited (`sr` is the W/X reply) or exec'd (`sr` is the
        T05exec stop; the session stops capturing after this): nothing of
        the backend is left in the image, collect what it recorded since the
        last stop. After an exit only requests a stub answers without a
        process (no memory of the program)."""
        return None

    # -- hidden breakpoints
    def reads(self, probe: Probe, thread: int, stop: StopReply) -> tuple[bytes, ...]:
        return ()

    def hit(self, probe: Probe, thread: int, stop: StopReply, replies: list[bytes]) -> None:
        return None

    # -- at stops and while running
    def sync(self) -> Procedure | None:
        return None

    def stop(self, sr: StopReply) -> Procedure | None:
        return None

    def wants_interrupt(self, now: float) -> bool:
        return False

    def before_resume(self) -> Procedure | None:
        """The client resumes the program (stopped, capture installed): a
        procedure that changes what the backend has in the program first
        (tracepoints: the switch to fast tracepoints once the in-process
        agent is known loaded, done while no thread can have a trap hit of
        the old experiment pending). Must return None when nothing is due."""
        return None

    def held_breakpoints(self) -> tuple[bytes, ...]:
        """The `z` packets of breakpoints this backend planted itself, outside
        the session's breakpoint table (tracepoints: the fast tracepoints'
        guards): the keeper's leave plan takes them out too. Cheap: asked
        after every packet."""
        return ()

    def relocate_request(self, body: bytes) -> tuple[tuple[bytes, ...], bytes]:
        """The stub's ``qRelocInsn:FROM;TO`` in the middle of one of this
        backend's exchanges (gdbserver's fast tracepoints, during ``QTStart``):
        the writes to send (each answered by the stub), then the answer
        (``qRelocInsn:<len>``, or ``E01`` to refuse; no reply follows)."""
        return (), b"E01"

    def poll(self) -> bool | None:
        """Fold new events while the program runs; True: some are left (call again soon)."""
        return None

    def wakeup_fd(self) -> int | None:
        return None

    def ticks(self) -> bool:
        """Must the shell call `poll` and the session's tick (`wants_interrupt`)
        while the program runs? Not for a backend that keeps all three as
        they are here (breakpoints: its events come at hidden stops): the
        shell's capture loop then sleeps (proxy/shell/link.py)."""
        cls = type(self)
        return (cls.poll is not CaptureBase.poll or cls.wakeup_fd is not CaptureBase.wakeup_fd
                or cls.wants_interrupt is not CaptureBase.wants_interrupt)

    # -- the client's traffic
    def client_request(self, body: bytes) -> Verdict | None:
        return None

    def residue(self) -> Residue | None:
        """What keeps answering the client for this backend once the session
        drops it (an exec, a switch): the stub may still remember what the
        backend did (tracepoints: gdbserver's status of the stopped experiment)."""
        return None

    def client_reply(self, request: bytes, reply: bytes) -> bytes:
        return reply

    # True when client_reply may change something: the session then keeps
    # each forwarded request to hand it back with its reply.
    filters_replies = False

    # The client's reads (by their first byte; `q`: the thread list) client_request
    # passes (None): the session's fast lane (core.Session.lane_client) answers what
    # is known at the stop and forwards the rest without calling it.
    lane_answers: frozenset[int] = frozenset(b"mgpHq")
    # Of those, the ones whose replies client_reply leaves as they are: their replies
    # come back on the lane too; the others' by the usual path, through client_reply.
    lane_reads: frozenset[int] = frozenset(b"mgpHq")

    def stats_lines(self) -> list[str]:
        lines = [f"capture: {self.name} ({self.events} poll events)" + (f" - {self.why}" if self.why else "")]
        if self.note:
            lines.append(f"capture note: {self.note}")
        return lines


__all__ = ["CaptureBase", "Forward", "Handover", "Reply", "Verdict"]
