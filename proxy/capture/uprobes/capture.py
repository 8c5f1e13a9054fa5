"""Capture through Linux uprobes: the program is never stopped to observe a poll.

Theory of operation (../shared/research/linux-uprobes.md has the measured facts):

* ``plan`` plants no hidden breakpoint; it works out the sites (``sites.py``).
* ``install`` (program stopped, before the first resume) loads the BPF
  object, writes the site table and the pid, converts the client's software
  breakpoints already at sites into hardware ones (a uprobe swallows a
  ``Z0`` at its address), then attaches one uprobe_multi link on the
  program's file, filtered by its pid.
* While the program runs, the shell calls ``poll`` every few ms: the ring
  buffer is drained, the records decoded (``decode.py``) and fed to the
  engine in order (``fold.py``), so the graph is current at every stop; ``sync``
  folds whatever is left. Drops (ring full) are read from the BPF counters and fed
  as ``EventsLost``; the threads are then resynchronised from their next
  entry's unwound stack.
* A share of each poll's time goes to the deferred unwinder
  (``unwind.py``): entries' stacks are unwound from the captured slices,
  counted full/partial, and their parent checked against the engine's.
* The client must see the program as without probes: ``m`` replies over a
  site get the file's bytes back, a ``Z0``/``z0`` at a site goes to the stub
  as ``Z1``/``z1`` (and its ``hwbreak`` stop is reported as ``swbreak``), and
  a client write over a site or a fifth hardware breakpoint hands the session
  over to the breakpoints backend (``client_view.py``; whether this host can
  load the BPF program at all, and which file the process runs: ``host.py``).
* ``uninstall`` closes the links: the kernel restores the bytes. If the
  proxy dies, the kernel closes them too.
* Sampling (``--sample N``, ``sample_every``): the BPF program folds every
  poll into its coroutine instance's totals in a kernel map (polls, raw ns,
  hits inside) and records one root poll in N of each instance, with the
  polls nested in it, and every first poll of a new instance. ``sync`` reads
  the map and gives the engine's timing the exact totals of every instance it
  knows (``PollTiming.set_totals``); an instance's address starting a new
  life sends its totals in the stream first (``InstanceTotals``). What the
  recorded polls alone give (the graph's edges and states, the histograms,
  the longest poll) is a sample, and ``stats`` and ``top`` say so.
* Recording only what changes the graph (``record_changes``, full mode,
  ``--uprobe-changes``; not the default: on the axum server benchmark it cut
  the records 40% but not the proxy's CPU, and the BPF program costs ~120 ns
  a hit more, docs/history/2026-speed.md; ``set_changes``): the kernel folds every poll into its instance's totals
  as above, and a poll goes out as records only when it tells the graph
  something new (a new instance or life, another state, parent or thread, a
  completion, whose exit carries the totals), its entry naming the poll it
  runs inside (``PollEnter.parent``: that poll's own entry may be no record;
  uprobes.bpf.c). Repeat polls (the same instance, state,
  parent and thread) write nothing; ``sync`` gives the engine the exact
  totals and the entries of the polls in progress at the stop (read from
  each thread's scope stack, ``pending_entries``), so the graph at a stop is
  the one every poll recorded would give, with POLLS and BUSY exact; the
  histograms and LONGEST see the recorded polls only. The engine's event log
  then holds only the changes: it cannot refold the repeat polls, and needs
  none of them (a rewind needs a stub that executes in reverse, rr, and
  uprobes capture runs on a live process only). By default every poll is
  recorded (the kernel folds nothing, ``set_nofold``: the engine counts each
  one), except the coroutines created and completed inside one poll of their
  parent (``elide_nested``, ``set_elide``; ``--uprobe-every`` turns it off):
  such a poll writes no record, it is counted per entry site in the kernel
  (``site_elided``, read for ``stats``) and per thread, and the next record of
  the thread carries that count, which the engine takes as finished tasks
  (``Engine.elided``: their task ids skipped, the finished count kept). Their
  entries are held back in their scopes and go out late when anything else
  happens inside them or they do not complete; at a stop ``sync`` reads the
  held-back ones out of the threads' scope stacks (``pending_entries``), so the
  graph at any stop is the one every poll recorded gives. Not there: the
  elided coroutines' own rows in ``top`` and ``tasks --all`` (finished, never
  graph tasks) and their polls in the histograms.
* Return sites (``returns.py``): a resume function polled through a
  vtable starts with its exits on its rets (single-stepped by the kernel, a
  link of their own) while the BPF side notes each poll's return address;
  every ``learn_s`` the new ones are checked (``caller_exits.return_site``)
  and probed on the emulated instruction after them, and once all of a
  function's are, its entries check theirs and its rets' link is closed. A
  poll returning elsewhere is counted at its entry (``uncovered`` in stats)
  and its return site probed at the next step; a return address that fails
  the check gives the function its rets back. Not under ``--mode tasks`` or
  time slices (their links are swapped whole). ``--uprobe-rets`` turns it off.
* The user's ``--probe`` functions (count probes): whenever this backend
  runs (``--capture uprobes``, or ``auto`` where uprobes can: root, the
  program a live process of this host) the session hands them over
  (``count_probes``) and they become uprobe sites that only count
  (``KIND_COUNT``, no record, no stop), also on a program with no async
  code at all (a C program: then they are the only sites): the client's
  breakpoints, steps and reads over them take the same path as over a poll
  site, and ``probe_counts`` gives the session the hits for ``stats``. A
  hidden breakpoint costs a stop per call (~245 us on GDB's testsuite
  programs, docs/gdb-testsuite.md); a uprobe hit 1-10 us in the kernel
  (docs/uprobes.md, "Where the probes stand").
  Where the plan or the attach fails, the session keeps them as hidden
  breakpoints (``counting``).

``UprobeCapture`` attaches, detaches and answers the session; its parts own their
state, each in a module: the consumer that folds the records (``fold.py``,
``cap.fold``), the kernel's counts given to the engine at stops (``totals.py``,
``cap.totals``), the client's view (``client_view.py``, ``cap.view``), and what
changes the links while the program runs: the time slices (``slices.py``), the
tasks-mode swap (``tasks_mode.py``), the learned return sites (``returns.py``) and
full mode's nested link under the CPU budget (``nested.py``; when: ``catchup.py``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

from proxy.analysis.elf import ElfImage, open_elf
from proxy.analysis.model import Inventory
from proxy.capture.base import CaptureBase
from proxy.capture.target import Target
from proxy.probes import Probe
from proxy.procedure import Exchange, Procedure

from . import bpf as B
from .decode import Decoder
from .catchup import CatchUp, NestedProbes
from .client_view import DEBUG_REGISTERS, ClientView
from .nested import NestedLinks
from .returns import LearnedReturns
from .slices import TimeSlices
from .tasks_mode import TasksMode
from .host import host_check, running_file
from .sites import Site, SitePlan, count_site, plan_sites
from .unwind import StackUnwinder
from .fold import RingFold
from .totals import KernelTotals
from .wakes import SpawnsAndWakes

_REC_BYTES = 116  # a record's mean size in the ring (entries 152 with the header, exits 80)
RETSITE_ROOM = 256  # room in the site table for learned return sites
# blocked in install_early's thread: they are the session's, taken in its main thread
_ASYNC_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD, signal.SIGPIPE,
                  signal.SIGALRM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH}


class UprobeCapture(CaptureBase):
    name = "uprobes"
    filters_replies = True  # m replies masked, hwbreak -> swbreak
    # `m` replies are masked at the sites (client_view.py): what is known answers an `m` on
    # the lane (a read holding no 0xcc: no site in it), a forwarded one's reply is masked
    lane_reads = frozenset(b"gpHq")
    swallows_breakpoints = True  # a Z0 at a site is lost under its uprobe: the proxy's own go as Z1
    installs_early = True  # count sites only: attached from the client's first `?` on (install_early)

    def __init__(
        self,
        load_inventory: Callable[[str], Inventory] | None = None,
        *,
        only: str | None = None,
        exclude: str | None = None,
        entry_only: bool = False,
        stack_bytes: int = 8192,
        ring_bytes: int = 64 << 20,
        unwind_share: float = 0.1,
        stop_unwind_s: float | None = 0.02,
        unwind_queue: int = 512,
        poll_budget_s: float = 0.02,
        max_backlog: int = 2_000_000,
        object_path: os.PathLike[str] | None = None,
        move_entries: bool = True,
        sample_every: int = 1,
        move_exits: bool = True,
        slice_duty: float = 1.0,
        slice_on_s: float = 0.05,
        tasks_only: bool = False,
        learn_s: float = 0.5,
        learn_entries: int = 300,
        learn_returns: bool = True,
        record_changes: bool = False,
        elide_nested: bool = True,
        catch_up: bool = True,
        catchup_every: int = 64,
        catchup_marks: tuple[int, int] | None = None,
        cpu_budget: float | None = None,
        nested_out: bool = True,
        spawns: bool = False,
        wakes: bool = True,
        wakers: bool = False,
    ) -> None:
        super().__init__()
        # spawn records and the tasks' wakes (wakes.py; `--wakes`). Off by default: on a server
        # every request's spawn and wakes are probed too (docs/wakes.md, Cost); `wakers`: the waker
        # clones and drops too (`--lost-wakers`: the lost-waker warning)
        self.origins = SpawnsAndWakes(wakes=wakes, wakers=wakers) if spawns else None
        self._load = load_inventory
        self.only, self.exclude, self.entry_only = only, exclude, entry_only
        self.stack_bytes = stack_bytes
        self.ring_bytes = ring_bytes
        self.unwind_share = unwind_share
        # Unwinding at a stop is for the stats' sample, not for the graph: a
        # full queue (4096 entries, ~0.1 ms each) kept every stop ~0.5 s long.
        self.stop_unwind_s = stop_unwind_s
        self.poll_budget_s = poll_budget_s
        self.object_path = object_path
        self.move_entries = move_entries  # entry probes on the first emulated instruction (emulated.py)
        self.sample_every = max(int(sample_every), 1)
        self.move_exits = move_exits  # exit probes in the callers where every return goes (caller_exits.py)
        self._fn_site: dict[int, int] = {}  # resume function index -> runtime low_pc (the engine's site)
        self.inventory: Inventory | None = None
        self.plan_: SitePlan | None = None
        self.decoder: Decoder | None = None
        self.unwinder: StackUnwinder | None = None
        self.lost = 0
        self._prog: B.Program | None = None
        self._ring: B.Ring | None = None
        self._pid = 0
        self._path: str | None = None
        self._given_path: str | None = None  # the target's path (self._path: what is attached)
        self._elf: ElfImage | None = None
        self._sites_by_addr: dict[int, Any] = {}
        self._mask: list[tuple[int, bytes]] = []  # (runtime addr, original bytes), sorted
        # the consumer: ring, backlog, resynchronisation, the unwinder's queue (fold.py)
        self.totals = KernelTotals(self)  # the kernel's counts, given to the engine at stops (totals.py)
        self.fold = RingFold(self, unwind_queue, unwind_queue > 0 and unwind_share > 0 and self.sample_every <= 1,
                             max_backlog)
        # what the client sees: its breakpoints (at sites: made hardware), masked reads, fork and exec
        self.view = ClientView(self)
        self._lazy_close = False  # the links closed without waiting (a kill: leaving; exited)
        self._count_only_loaded = False  # the BPF program loaded is asyncrsp_count (count sites only)
        self._table: Any = None  # the session's BreakpointTable (target.extra)
        self._count: dict[int, Probe] = {}  # the session's count probes we count (runtime addr)
        self._cookies: dict[int, int] = {}  # runtime addr -> cookie (index) of the attached sites
        self._final_hits: dict[int, int] = {}  # count-probe hits when the links closed
        self.attach_s: float | None = None
        # install_early: the attach's thread, its (program, sites, error), when it started;
        # how long the first resume waited for it, and how long it had run before
        self._attaching: Any = None
        self._early_result: tuple[B.Program | None, list[Site], BaseException | None] | None = None
        self._attach_t0 = 0.0
        self.attach_wait_s: float | None = None
        self.attach_lead_s: float | None = None
        self.detach_s: float | None = None
        self.notices: list[str] = []
        self.attach_retries = 0  # links re-created because the first one did not arm the probes
        self.attach_retries_max = 2
        # time-sliced capture (`--sample-time PCT`, `slice_duty` < 1): see _slice_step
        self.slice_duty = min(max(float(slice_duty), 0.01), 1.0)
        self._link: int | None = None
        self._offsets: list[int] = []
        self._sliced_out = False  # the links are closed for the off part of a slice
        self._closing: Any = None  # the thread closing the last slice's link
        self._stopped_at: float | None = None  # the program stopped (sync) and not resumed yet
        self._stopped_cpu = 0.0  # the proxy's CPU clock then
        self.slicing = TimeSlices(self, slice_on_s, cpu_budget)  # `--sample-time` (slices.py)
        self._cookie_list: list[int] | None = None  # the attached offsets' cookies (None: their indices)
        self.learn_s = learn_s  # how often tasks mode and the learned returns look again
        self._att_sites: list[Site] = []
        self.tasks = TasksMode(self, tasks_only, learn_entries)  # `--mode tasks` (tasks_mode.py)
        # exits at learned return sites (functions polled through a vtable): returns.py
        self.learn_returns = learn_returns
        self.returns = LearnedReturns(self)
        # full mode: only what changes the graph recorded (not with sampling, time
        # slices, tasks mode or entries only: their records are chosen otherwise)
        self.changes = (record_changes and self.sample_every <= 1 and self.slice_duty >= 1.0
                        and not tasks_only and not entry_only)
        # full mode with every other poll recorded: coroutines created and completed inside one poll
        # of their parent write no record (CFG_ELIDE; exits needed: not in entry-only mode)
        self.elide = (elide_nested and not self.changes and self.sample_every <= 1 and self.slice_duty >= 1.0
                      and not tasks_only and not entry_only)
        # full mode: sampling while the proxy is behind (catchup.py; `--uprobe-strict` turns it off)
        # and (cpu_budget, a share of one core) paced by the process's CPU while the program runs
        self.catchup = (CatchUp(catchup_every, marks=catchup_marks, budget=cpu_budget)
                        if catch_up and self.sample_every <= 1 and not self.changes and self.slice_duty >= 1.0
                        and not tasks_only and not entry_only else None)
        # full mode under a CPU budget: the nested-only probes out while the kernel samples (nested.py);
        # `--uprobe-budget 0` (no budget) keeps every probe in
        self.nested = (NestedProbes() if nested_out and self.catchup is not None and self.catchup.budget is not None
                       else None)
        self.nested_links = NestedLinks(self)  # the nested probes' link (nested.py)
        self._running = True  # the program runs (from the install on; false from a stop to the next resume)
        self._site_cap = 0  # the BPF site table's size
        self._final_counters: dict[str, int] = {}  # the kernel's counters when the links closed

    # ------------------------------------------------------------------ the client's view (client_view.py)
    def client_request(self, body: bytes) -> Any:
        return self.view.client_request(body)

    def client_reply(self, request: bytes, reply: bytes) -> bytes:
        return self.view.client_reply(request, reply)

    def forked(self, child: object) -> Procedure | None:
        return self.view.forked(child)

    def exec_happened(self, path: str | None) -> None:
        self.view.exec_happened(path)

    # ------------------------------------------------------------------ availability
    @staticmethod
    def available(target: Any = None) -> tuple[bool, str]:
        """(can run, why not in one line) for ``--capture auto`` and the error of ``--capture uprobes``."""
        if target is not None and not getattr(target, "local", True):
            ident = getattr(target, "identity", None)
            return False, "uprobes: the program is not a process of the proxy's host" + (
                f" ({ident.reason})" if ident is not None else "")
        return host_check()

    # ------------------------------------------------------------------ planning
    def plan(self, target: Target) -> list[Any]:
        self.target = target
        self._pid = int(getattr(target, "pid", 0) or 0)
        self._path = getattr(target, "path", None)
        inv = getattr(target, "inventory", None)
        bias = int(getattr(target, "bias", 0) or 0)
        if inv is None and self._path is not None and self._load is not None:
            inv = self._load(self._path)
        self.inventory = inv
        if inv is None or self._path is None or self.engine is None:
            self.note = getattr(target, "note", None) or "the program's file is unknown"
            return []
        self._table = target.extra.get("client_breakpoints")
        ok, why = self.available(target)
        if not ok:
            self.note = why
            return []
        if not self._pid:
            self.note = "uprobes: the program's pid is unknown"
            return []
        self._given_path = self._path
        self._path, replaced = running_file(self._pid, self._path)
        if replaced:
            self.notices.append(replaced)
        try:
            self._elf = open_elf(self._path)
        except Exception as err:  # noqa: BLE001 - AnalysisError and OS errors: one line
            self.note = f"uprobes: {err}"
            return []
        # Only resume functions' entries are unwound: a program without any (a C
        # program's --probe sites) skips the CFI parse (~1.7 ms of each such session).
        # (and the spawn records' slices, --wakes: a build whose coroutines were all inlined
        # into the runtime's task functions has no resume function, yet its spawns are probed)
        self.unwinder = StackUnwinder(self._elf, inv, bias) if inv.resume_fns or self.origins is not None else None
        cfa = _cfa_rule(self.unwinder) if self.unwinder is not None else None
        self.plan_ = plan_sites(self._elf, inv, bias, only=self.only, exclude=self.exclude,
                                entry_only=self.entry_only, cfa_at=cfa, move_entries=self.move_entries,
                                move_exits=self.move_exits,
                                learn_returns=self.learn_returns and self.slice_duty >= 1.0 and not self.tasks.tasks_only)
        if self.origins is not None and not self.entry_only:
            self.plan_.sites += self.origins.plan_sites(self._elf, inv, bias, self.unwinder)
        self._sites_by_addr = self.plan_.by_addr()
        self._mask = sorted((s.addr, s.original) for s in self.plan_.sites)
        if not inv.resume_fns:
            self.note = "no async resume functions found"
        return []

    def count_probes(self, probes: list[Probe]) -> list[int]:
        """The session's count probes (``--probe``) this backend counts itself: their addresses.

        All of them, under ``auto`` as when uprobes were asked for by name
        (a probe at a poll site must be ours anyway: the session's hidden Z0
        there would be swallowed by the uprobe). None when the plan found no
        way to probe (not root, not this host's process: then ``_elf`` is
        None). Called after ``plan``, before ``install``."""
        if self.plan_ is None or self._elf is None or self._prog is not None:
            return []
        bias = int(getattr(self.target, "bias", 0) or 0)
        for p in probes:
            if p.addr in self._count:
                continue
            if p.addr not in self._sites_by_addr:
                site = count_site(self._elf, p.name, p.addr, bias)
                if site is None:
                    continue
                self.plan_.sites.append(site)
                self._sites_by_addr[p.addr] = site
            self._count[p.addr] = p
        # a count probe under a client Z0 that gets no debug register stays the session's
        _, leave_out = self._split_conflicts()
        for a in leave_out & set(self._count):
            del self._count[a]
            if self._sites_by_addr[a].spec.kind == B.KIND_COUNT:
                del self._sites_by_addr[a]
                self.plan_.sites = [s for s in self.plan_.sites if s.addr != a]
        self._mask = sorted((s.addr, s.original) for s in self.plan_.sites)
        return sorted(self._count)

    def _counts_only(self) -> bool:
        """Every site only counts (the --probe functions of a program without
        resume functions): the small BPF program, no records, nothing to poll."""
        return (self.plan_ is not None and not self.tasks.tasks_only and self.slice_duty >= 1.0
                and all(s.spec.kind == B.KIND_COUNT for s in self.plan_.sites))

    def ticks(self) -> bool:
        # count sites only: the hits are read at stops (stats), no record to fold while running
        return not self._counts_only()

    def counting(self) -> bool:
        self._settle()
        return self._prog is not None  # else the attach failed (``note`` says why)

    def probe_counts(self) -> dict[int, int]:
        """Hits of the count probes we took (runtime address -> executions so far)."""
        self._settle()
        if self._prog is None:
            return dict(self._final_hits)
        return self._read_hits()

    def _read_hits(self) -> dict[int, int]:
        assert self._prog is not None
        want = {self._cookies[a]: a for a in self._count if a in self._cookies}
        got = self._prog.site_hits(list(want))
        return {a: got.get(c, 0) for c, a in want.items()}

    # ------------------------------------------------------------------ lifecycle
    def install(self) -> Procedure | None:
        """Attach (program stopped). A procedure first turns the client's Z0s at sites into Z1s.
        After `install_early`: waits for its attach."""
        if self._attaching is not None:
            self._settle()
            return None
        if self.plan_ is None or not self.plan_.sites or self._prog is not None:
            return None
        convert, leave_out = self._split_conflicts()
        if not convert:
            self._attach(leave_out)
            return None
        return self._proc_install(convert, leave_out)

    def may_install_early(self, target: object) -> bool:
        # only a plan of count sites starts early (_counts_only): a program with
        # resume functions has poll sites, and its plan (CFI parse, the sites of
        # every resume function: 0.1-1 s on a big Rust binary) would be dropped
        inv = getattr(target, "inventory", None)
        return inv is not None and not inv.resume_fns and not self.tasks.tasks_only and self.slice_duty >= 1.0

    def install_early(self) -> bool:
        """The program is stopped at the client's first `?` and proven this host's,
        the plan counts sites only and no client breakpoint is at one: the attach
        starts now, in a thread, while the client goes on with its own start
        (qXfer, qSymbol, its breakpoints; on GDB's testsuite ~30 ms before the
        first resume), and the first resume only waits for what is left of it
        (`install`). The link's attach waits 10-24 ms for the kernel's grace
        periods, paid at every first resume before (~0.9 s over the testsuite's
        63 uprobe sessions). From here on the capture answers as installed: m
        replies over the sites are masked (their bytes may be int3s any moment
        now) and the client's Z0 at a site becomes a Z1 (`attached`).

        The thread blocks the process's signals (the session's handlers run in
        its main thread), never touches the engine (`_take_links` runs in the
        session's thread, at `_settle`), and is joined before anything reads or
        closes the links (`_settle`); a session that ends before the first
        resume closes them as at any leave. The keeper forks only once the
        first resume has joined it (shell/keeper.py: its plan is empty until
        the plant), and a fork of a process while this thread runs keeps no
        link (the keeper closes every descriptor but two)."""
        if self.plan_ is None or not self.plan_.sites or self._prog is not None or self._attaching is not None \
                or not self._counts_only():
            return False
        convert, leave_out = self._split_conflicts()
        if convert or leave_out or self._path is None:
            return False
        import _thread

        sites = list(self.plan_.sites)
        self._early_result = None
        done = _thread.allocate_lock()
        done.acquire()  # released by the thread when it is through

        def run() -> None:
            try:
                signal.pthread_sigmask(signal.SIG_BLOCK, _ASYNC_SIGNALS)
                self._early_result = (self._attach_bpf(sites), sites, None)
            except BaseException as err:  # noqa: BLE001 - raised again in the session's thread (_settle)
                self._early_result = (None, sites, err)
            finally:
                done.release()

        self._attaching = done
        self._attach_t0 = time.perf_counter()
        # Not threading.Thread: its start() waits until the new thread runs, and
        # the new thread then holds the GIL into the BPF object's open (0.3-6.6 ms
        # of the client's wait at its first stop on GDB's testsuite, load ~2).
        # Like a daemon thread, nobody waits for it at the interpreter's exit.
        _thread.start_new_thread(run, ())
        return True

    def _settle(self) -> None:
        """Wait for `install_early`'s attach and take its links (or its failure)."""
        done = self._attaching
        if done is None:
            return
        t0 = time.perf_counter()
        done.acquire()
        self.attach_wait_s = time.perf_counter() - t0
        self.attach_lead_s = t0 - self._attach_t0
        self._attaching = None
        result, self._early_result = self._early_result, None
        assert result is not None
        prog, sites, err = result
        if err is not None:
            raise err
        if prog is not None:
            self._take_links(prog, sites)

    def _split_conflicts(self) -> tuple[list[int], set[int]]:
        """The client's Z0s already at sites: (made Z1 at install, sites left unprobed).

        Only 4 debug registers: past them a site stays unprobed while the
        client's Z0 is there, count-only sites first (the session counts
        those with its hidden breakpoint instead: nothing is lost)."""
        table = self._table
        if table is not None:
            for t, a, _k in table.client:
                (self.view.client_sw.add(a) if t == 0 else self.view.client_hw.add((t, a, _k)))
        conflicts = sorted((a for a in self.view.client_sw if a in self._sites_by_addr),
                           key=lambda a: (self._sites_by_addr[a].spec.kind == B.KIND_COUNT, a))
        free = max(DEBUG_REGISTERS - len(self.view.client_hw) - len(self.view.hw_converted), 0)
        return conflicts[:free], set(conflicts[free:])

    def _proc_install(self, convert: list[int], leave_out: set[int]) -> Procedure:
        """The client's Z0s already at sites (gdb inserts before the first resume).

        Order matters (research §3.3): z0 first, so gdbserver puts back the
        byte it saved; then attach; then the same breakpoint as Z1. A Z0 left
        under a uprobe would be swallowed, and its z0 would later write the
        original byte over the uprobe's int3 and silently disable it.
        """
        yield Exchange(tuple(b"z0,%x,1" % a for a in convert))
        self._attach(leave_out)
        if convert:
            # with the client's target-side conditions and commands, as its Z0 had them
            table = self._table
            kept = table.client if table is not None else {}
            replies = yield Exchange(tuple(b"Z1,%x,1" % a + kept.get((0, a, 1), b"") for a in convert))
            for a, rep in zip(convert, replies):
                self.view.client_sw.discard(a)
                if rep == b"OK":
                    self.view.hw_converted.add(a)
                    self._retype(a, 0, 1)
                else:
                    self.notices.append(f"uprobes: the client's breakpoint at 0x{a:x} could not be "
                                        f"made a hardware breakpoint ({rep.decode(errors='replace')})")

    def _retype(self, addr: int, old: int, new: int) -> None:
        """Keep the session's breakpoint table true to what the stub holds."""
        table = self._table
        if table is None:
            return
        for key in [k for k in table.client if k[0] == old and k[1] == addr]:
            table.client[(new, addr, key[2])] = table.client.pop(key)

    def _attach(self, leave_out: set[int]) -> None:
        assert self.plan_ is not None and self._path is not None
        sites = [s for s in self.plan_.sites if s.addr not in leave_out]
        if leave_out:
            self.notices.append(f"uprobes: {len(leave_out)} sites left unprobed: the client has "
                                "software breakpoints there and no debug register is free")
        prog = self._attach_bpf(sites)
        if prog is None and self.origins is not None and self.origins.active:
            # the kernel refused the link: without the spawn and wake sites, today's capture (seen:
            # 524, a site on a CS-prefixed nop the kernel cannot probe: emulated.BAD_PREFIXES)
            sites = self._without_origins(sites)
            prog = self._attach_bpf(sites)
        if prog is not None:
            self._take_links(prog, sites)

    def _without_origins(self, sites: list[Site]) -> list[Site]:
        assert self.origins is not None and self.origins.plan is not None and self.plan_ is not None
        gone = {s.addr for s in self.origins.plan.sites}
        self.notices.append(f"uprobes: spawn and wake probes left out, the link with them failed: {self.note}")
        self.origins.plan.sites = []
        self.note = None
        self.plan_.sites = [s for s in self.plan_.sites if s.addr not in gone]
        self._sites_by_addr = self.plan_.by_addr()
        self._mask = sorted((s.addr, s.original) for s in self.plan_.sites)
        return [s for s in sites if s.addr not in gone]

    def _attach_bpf(self, sites: list[Site]) -> B.Program | None:
        """Load the BPF program, write its tables, attach the links (the kernel's
        part: the attach waits 10-24 ms for grace periods). Runs in a thread
        under `install_early`: touches no engine, decoder or mask (`_take_links`
        does, in the session's thread); None when it failed (``note`` says why)."""
        count_only = self._counts_only()
        try:
            self._site_cap = len(sites) + (0 if count_only else RETSITE_ROOM)
            prog = B.Program.open(ring_bytes=self.ring_bytes, max_sites=self._site_cap, count_only=count_only,
                                  **({"path": self.object_path} if self.object_path else {}),
                                  **(self.origins.open_args() if self.origins is not None else {}))
        except B.BpfError as err:
            self.note = str(err)
            return None
        try:
            prog.set_config(self._pid, self.stack_bytes, self.fold.credits_wanted(), self.sample_every)
            # every poll recorded: the engine counts them, the kernel's instance totals
            # (and a KIND_STATS record per new life: ~2 a request on the axum service) are not read
            prog.set_nofold(not self._folded)
            prog.set_changes(self.changes)
            prog.set_elide(self.elide)
            prog.set_adapt(self.catchup is not None)
            prog.set_hold_new(self.catchup is not None and self.elide)
            prog.set_sites([s.spec for s in sites])
            if self.origins is not None:
                self.origins.configure(prog)
            t0 = time.perf_counter()
            offsets = [s.file_offset for s in sites]
            if self._path == self._given_path:
                # replaced between the plan (which read the file the program runs)
                # and now: the running file is only reachable through /proc/PID/exe
                self._path, replaced = running_file(self._pid, self._path or "")
                if replaced:
                    self.notices.append(replaced)
            # a vtable-polled function's rets: a link of their own (_returns_step closes it)
            main = [i for i, s in enumerate(sites) if not s.group]
            if len(main) < len(sites):
                offsets = [sites[i].file_offset for i in main]
                self._cookie_list = main
            link = prog.attach(self._path or "", offsets, self._pid, self._cookie_list)
            # The kernel writes the int3s before the link is returned: check it did.
            # In 2 of 100 regsafety runs a link came back with no probe ever hit.
            # The cause found since: the corpus builder replaces binaries by rename
            # while programs run, and a link on the path then probes the new file,
            # not the one the process maps (running_file() now attaches through
            # /proc/PID/exe then). The check stays as a guard.
            for _ in range(self.attach_retries_max):
                if self._armed(sites) is not False:
                    break
                self.attach_retries += 1
                prog.detach(link)
                link = prog.attach(self._path or "", offsets, self._pid, self._cookie_list)
            else:
                if self._armed(sites) is False:
                    self.notices.append(f"uprobes: the kernel did not write the probes into process "
                                        f"{self._pid} (checked in /proc/{self._pid}/mem): nothing is captured")
            for g in sorted({s.group for s in sites if s.group}):
                mine = [i for i, s in enumerate(sites) if s.group == g]
                self.returns.links[g - 1] = prog.attach(self._path or "", [sites[i].file_offset for i in mine],
                                                     self._pid, mine)
                self.returns.fns[g - 1] = [i for i, s in enumerate(sites)
                                        if s.spec.kind == B.KIND_ENTRY and s.spec.fn == g - 1]
            self.attach_s = time.perf_counter() - t0
            self._link, self._offsets = link, offsets
            self.returns.t0 = time.monotonic()
            self.slicing.t0 = self.tasks.learn_t0 = time.monotonic()
            self.slicing.clock = (self.slicing.t0, time.process_time())
            self._att_sites = sites
        except B.BpfError as err:
            prog.close()
            self.note = str(err)
            return None
        except BaseException:
            prog.close()  # a bug: no link of ours stays in the program (the session counts the error)
            raise
        return prog

    def _take_links(self, prog: B.Program, sites: list[Site]) -> None:
        """The attached program becomes the capture's (the session's thread)."""
        self._prog = prog
        self._count_only_loaded = prog.count_only
        self._ring = prog.ring()
        if self.engine is not None:
            # Nothing rewinds a uprobe capture (a live process, no stub that
            # executes in reverse): the engine's event log and its checkpoints
            # (a copy of the task table every 25,000 events) were pure cost,
            # 17-25% of the consumer's time per record on the axum bench.
            self.engine.stop_log()
        self._cookies = {s.addr: i for i, s in enumerate(sites)}
        self._fn_site = {s.spec.fn: s.info.site for s in sites if s.spec.kind in (B.KIND_ENTRY, B.KIND_EXIT, B.KIND_UNWIND)}
        self.decoder = Decoder([s.info for s in sites], first_seq=self._next_seq(), fn_sites=self._fn_site)
        self._mask = sorted((s.addr, s.original) for s in sites)

    def _armed(self, sites: list[Site]) -> bool | None:
        """Does the program's memory hold the kernel's int3 at a site? (None: unreadable)"""
        try:
            fd = os.open(f"/proc/{self._pid}/mem", os.O_RDONLY)
        except OSError:
            return None
        try:
            for s in sites[:16]:
                try:
                    if os.pread(fd, 1, s.addr) == b"\xcc":
                        return True
                except OSError:
                    return None
            return False
        finally:
            os.close(fd)

    def _next_seq(self) -> int:
        last = self.engine.cursor_seq if self.engine is not None else None
        return (last or 0) + 1

    @property
    def attached(self) -> bool:
        """The probes are the capture's: in, or out for the off part of a time slice
        (a client Z0 at a site must still become a Z1: the next slice puts the
        int3 back, and the kernel would take a breakpoint byte there for its own),
        or being attached (install_early: the int3s may be there any moment)."""
        if self._attaching is not None:
            return True
        return self._prog is not None and (bool(self._prog.links) or self._sliced_out)


    def _fn_name(self, fn: int) -> str:
        inv = self.inventory
        return inv.resume_fns[fn].name if inv is not None and fn < len(inv.resume_fns) else f"#{fn}"

    def _kept_sites(self) -> list[Site]:
        """The sites the current link holds, in its order."""
        if self._cookie_list is None:
            return list(self._att_sites)
        return [self._att_sites[i] for i in self._cookie_list]


    def uninstall(self) -> Procedure | None:
        """Close the links (the kernel restores the bytes), fold what is left, and give
        the client's breakpoints we made hardware back to the stub as software ones
        (detach first, then Z0: the order research §3.3 found correct)."""
        self._close_links()
        converted = sorted(self.view.hw_converted)
        self.view.hw_converted.clear()
        if not converted:
            return None
        return self._proc_restore(converted)

    def _proc_restore(self, addrs: list[int]) -> Procedure:
        yield Exchange(tuple(b"z1,%x,1" % a for a in addrs))
        replies = yield Exchange(tuple(b"Z0,%x,1" % a for a in addrs))
        for a, rep in zip(addrs, replies):
            self._retype(a, 1, 0)
            if rep != b"OK":
                self.notices.append(f"uprobes: could not put back the client's breakpoint at 0x{a:x}")

    def leaving(self) -> None:
        # the client's breakpoints made hardware go back as Z0s: only after the links are out
        self._lazy_close = not self.view.hw_converted

    def dropped(self) -> None:
        # the process is gone: nothing to restore, nobody waits for the close
        self._lazy_close = True
        self._close_links()

    def exited(self, sr: Any) -> Procedure | None:
        """The process is gone (W, X): nothing to restore, the links are closed
        without waiting. Not at an exec (T05exec): the links would probe the
        new image if it maps the same file, and a breakpoint the stub puts
        there before the close is done would save the kernel's int3 as the
        original byte (exec_happened closes them, waiting)."""
        if getattr(sr, "kind", None) in ("W", "X"):
            self._lazy_close = True
            self._close_links()
        return None

    def _close_links(self) -> None:
        self._settle()
        if self._prog is None:
            return
        t0 = time.perf_counter()
        for th in (self._closing, self.tasks.swap, *self.returns.closing, *self.nested_links.closing):
            if th is not None:
                th.join()
        self._closing = self.tasks.swap = None
        self.returns.closing = []
        self.nested_links.closing = []
        self.nested_links.link, self.nested_links.extra = None, []
        self.returns.links = {}
        if self._lazy_close:
            # The program dies (a kill) or is gone: its hits are final now, and
            # the kernel may take the int3s out after we go on. A link's close
            # waits ~40 ms for grace periods (measured on spin, kernel 6.18): a
            # daemon thread closes it, which nobody waits for (the kernel closes
            # what is left when the proxy exits).
            if self._count:
                self._final_hits = self._read_hits()
            for link in list(self._prog.links):
                self._prog.detach_later(link)
        self._prog.detach_all()
        self._link, self._offsets, self._sliced_out = None, [], False
        self.detach_s = time.perf_counter() - t0
        if self._count and not self._lazy_close:
            self._final_hits = self._read_hits()  # no more hits: the links are closed
        self._final_counters = self._prog.counters()
        self.fold.run(budget_s=None)
        if self.origins is not None:
            self.origins.close(self._prog)
        assert self._ring is not None
        self._ring.close()
        self._prog.close()
        self._prog = None
        self._ring = None

    # ------------------------------------------------------------------ the consumer
    def wakeup_fd(self) -> int | None:
        return None  # records are submitted without wakeups: the shell polls on a timer

    def poll(self) -> bool:
        """Fold for up to ``poll_budget_s``; True when records already seen are
        still waiting (the shell then polls again at once instead of after its
        tick: at one poll per 50 ms tick the consumer kept up with ~70k events/s
        only, and the rest was folded at the next stop, inside the client's wait).

        Not when the ring merely holds new records (it nearly always does while
        the program runs): the loop then spun, and each poll gave the unwinder
        its share again, so unwinding (and the stack slices it asks for, 8 KiB
        each, copied on the program's own time) took the consumer's whole CPU."""
        self._settle()
        self.slicing.step()
        self.tasks.step()
        self.returns.step()
        budget_s = self.poll_budget_s
        cu = self.catchup
        allow = cu.allowance(time.monotonic(), time.process_time()) if cu is not None and self._running else None
        if allow is not None and allow <= 0:
            # the CPU budget is spent (catchup.py): no fold until the next tick, the
            # unread records grow (past the high mark the kernel samples); the ring is
            # only emptied into the backlog when it fills
            ring = self._ring
            if ring is not None and ring.pending() > self.ring_bytes // 2:
                self.fold.drain_ring()
            if self.origins is not None:
                self.origins.drain()  # raw copies only (no symbol is read): spawns must not be lost
            self._catchup_step()
            self.nested_links.step()
            return False
        if allow is not None:
            budget_s = min(budget_s, allow)
        behind = self.fold.run(budget_s=budget_s)
        if self.origins is not None:
            self.origins.drain()
        self._catchup_step()
        self.nested_links.step()
        return behind and (allow is None or allow > budget_s)  # paced: the next tick, not at once

    def before_resume(self) -> Procedure | None:
        """Time slices count the program's running time only: a stop's length is taken out.
        The nested probes taken out while behind come back before the program runs (the
        stop folded everything: the catch-up records every poll again)."""
        self._running = True
        ns, prog = self.nested, self._prog
        if ns is not None and prog is not None:
            now = time.monotonic()
            ns.resume(now)
            if ns.out and ns.want(False, now, stopped=True) is False:
                if self.nested_links.closing:
                    for th in self.nested_links.closing:
                        th.join()  # ~30 ms at most: the close was decided before the stop
                self.nested_links.put_back(prog, now)
        if self._stopped_at is not None:
            self.slicing.t0 += time.monotonic() - self._stopped_at
            if self.slicing.clock is not None:  # nor does the proxy's CPU at the stop count against the budget
                w, c = self.slicing.clock
                self.slicing.clock = (w + time.monotonic() - self._stopped_at, c + time.process_time() - self._stopped_cpu)
            self._stopped_at = None
        return None

    def sync(self) -> Procedure | None:
        self._settle()
        self._running = False  # the CPU budget paces the fold while the program runs only
        if self.catchup is not None:
            self.catchup.stopped()
        if self.slice_duty < 1.0 and self._stopped_at is None:
            self._stopped_at, self._stopped_cpu = time.monotonic(), time.process_time()
        if self._sliced_out and self._prog is not None:
            # a stop between two slices: the polls the engine holds open ended unseen
            if self._closing is not None:
                self._closing.join()
                self._closing = None
            self.fold.run(budget_s=None)
            self.slicing.end_slice(self._prog)
        self.fold.run(budget_s=None)
        if self.origins is not None:
            self.origins.drain()
        self._catchup_step(stopped=True)
        if self.nested is not None:
            self.nested.stop(time.monotonic())
            if self.nested.out:
                self.nested_links.forget_inner()  # what the graph knew of them is stale: the tree comes from memory
        if self.changes or self.elide:
            self.totals.feed_pending()
        if self._folded:
            self.totals.apply()
        line = self.slicing.line()
        if line is not None and self.engine is not None:
            self.engine.timing.sampled = line
        return None

    @property
    def _folded(self) -> bool:
        """Polls are counted in the kernel (sampling, only changes recorded, or full mode
        that samples while behind)."""
        return self.sample_every > 1 or self.changes or self.catchup is not None

    def unread(self) -> int:
        """Records not folded yet: the backlog's, and the ring's (by their bytes)."""
        ring = self._ring
        return self.fold.backlog_n + (ring.pending() // _REC_BYTES if ring is not None else 0)

    def _catchup_step(self, stopped: bool = False) -> None:
        """Full mode: the kernel samples while the proxy is behind, and records every
        poll again once it caught up (catchup.py); at a stop (all folded) at once."""
        cu, prog = self.catchup, self._prog
        if cu is None or prog is None:
            return
        now = time.monotonic()
        every = cu.step(0 if stopped else self.unread(), now)
        if every is None:
            return
        prog.set_sample_every(every)
        cu.switched(every, now, prog.counters().get("hits", 0))



    # ------------------------------------------------------------------ stats
    def counters(self) -> dict[str, int]:
        self._settle()
        return self._prog.counters() if self._prog is not None else dict(self._final_counters)

    def stats_lines(self) -> list[str]:
        n = len(self.plan_.sites) if self.plan_ is not None else 0
        lines = [f"capture: {self.name} ({self.events} poll events, {n} sites, "
                 f"{'attached' if self.attached else 'not attached'})" + (f" - {self.why}" if self.why else "")]
        c = self.counters()
        if self._count_only_loaded:
            lines.append("uprobes: count sites only (the BPF program asyncrsp_count): hits per site, no records"
                         + (f"; attached in {1e3 * self.attach_s:.1f} ms" if self.attach_s is not None else "")
                         + (f", from the client's first stop on: the first resume came "
                            f"{1e3 * (self.attach_lead_s or 0.0):.1f} ms later and waited "
                            f"{1e3 * self.attach_wait_s:.1f} ms for it" if self.attach_wait_s is not None else "")
                         + (f"; other processes: {c['other pid']}" if c.get("other pid") else ""))
        elif c:
            lines.append(f"uprobe hits: {c.get('hits', 0)}; records: {c.get('records', 0)}; "
                         f"dropped: {c.get('drops', 0)} (ring retries {c.get('retries', 0)}"
                         + (f"; lost with the ring at most half full: {c['lost with room']}" if c.get("lost with room") else "")
                         + f"); entries with a stack slice: {c.get('slices', 0)}"
                         f"; exits without their entry: {c.get('scope misses', 0)}"
                         + (f"; other processes: {c['other pid']}" if c.get("other pid") else "")
                         + (f"; links re-created (not armed): {self.attach_retries}" if self.attach_retries else ""))
            if not c.get("hits") and self.plan_ is not None:
                armed = self._armed(self.plan_.sites)
                lines.append("uprobe sites in the program's memory: " + {
                    True: "armed (int3)", False: "NOT armed (the file's bytes: the kernel took the probes out)",
                    None: "unreadable"}[armed])
        elif self.lost:
            lines.append(f"uprobe events dropped: {self.lost}")
        if self.changes:
            lines.append(f"recorded: only the polls that changed the graph (a new instance, state, parent or "
                         f"thread, a completion; {c.get('flushed', 0):,} entries sent late, at a state change, "
                         f"{self.totals.pending_fed:,} read at stops); repeat polls counted in the kernel: "
                         f"{c.get('skipped', 0):,} hits")
            if self.totals.kernel is not None:
                n, polls, rec, unseen = self.totals.kernel
                lines.append(f"kernel's poll counts: {polls:,} polls of {n:,} live instances, {rec:,} recorded; "
                             f"{self.totals.closed_polls:,} of completed or dropped ones; {unseen:,} polls of instances "
                             "the graph never saw (not in top)")
        if self.elide and c.get("elided"):  # (a count-only program elides nothing)
            lines.append(self.totals.elided_line(c))
        if self.catchup is not None and c and not self._count_only_loaded:
            lines.append(self.catchup.line(time.monotonic(), c.get("hits", 0)))
        if self.sample_every > 1:
            lines.append(f"sampling: one root poll in {self.sample_every} per coroutine instance recorded (at random), "
                         f"with the polls nested in it, and every new instance's first; hits not recorded: "
                         f"{c.get('skipped', 0):,}; the graph's edges and states and the poll histograms "
                         "come from the recorded polls only")
            if self.totals.kernel is not None:
                n, polls, rec, unseen = self.totals.kernel
                lines.append(f"kernel's poll counts: {polls:,} polls of {n:,} live instances, {rec:,} recorded; "
                             f"{unseen:,} polls of instances the graph never saw (not in top)"
                             + (f"; instance totals lost (ring full): {c['stats lost']}" if c.get("stats lost") else ""))
        sl = self.slicing.line()
        if sl is not None:
            lines.append(sl)
        tl = self.tasks.line()
        if tl is not None:
            lines.append(tl)
        rl = self.returns.line()
        if rl is not None:
            lines.append(rl)
        nl = self.nested_links.line() if self.catchup is not None and not self._count_only_loaded else None
        if nl is not None:
            lines.append(nl)
        if c.get("duplicates"):
            lines.append(f"hits run twice while a link was swapped (dropped): {c['duplicates']}")
        if self.decoder is not None and self.decoder.stats.bad:
            lines.append(f"bad uprobe records: {self.decoder.stats.bad}")
        if self.view.hw_converted:
            lines.append(f"client breakpoints at uprobe sites (as hardware): {len(self.view.hw_converted)}")
        if self.view.children_cleaned:
            lines.append(f"forked children cleaned of the probes: {self.view.children_cleaned}")
        if self.unwinder is not None:
            lines += self.unwinder.stats.lines()
        if self.origins is not None:
            lines += self.origins.lines()
        lines += [f"capture note: {n}" for n in self.notices if n != self.note]
        if self.note:
            lines.append(f"capture note: {self.note}")
        if self.plan_ is not None:
            lines += [f"capture note: {n}" for n in self.plan_.notes]
        return lines


def _cfa_rule(u: StackUnwinder) -> Callable[[int], tuple[int, int] | None]:
    return u.cfa_at
