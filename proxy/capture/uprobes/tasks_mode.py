"""`--mode tasks`: after learning which resume functions are tasks' roots, only those stay probed."""

from __future__ import annotations

import time

from typing import TYPE_CHECKING, Any

from . import bpf as B

if TYPE_CHECKING:
    from .capture import UprobeCapture


class TasksMode:
    """`--mode tasks`, a part the capture holds (``capture.tasks``): what was learnt of which
    resume functions are tasks' roots, and the link swapped for one without the others. It
    owns that learning; the links, sites and the BPF program are the capture's (``c``)."""

    def __init__(self, capture: UprobeCapture, tasks_only: bool, learn_entries: int) -> None:
        self.c = capture
        self.tasks_only = tasks_only
        self.learning = tasks_only
        self.learn_t0 = 0.0
        self.root_fns: set[int] = set()  # resume functions (runtime low_pc) polled at a thread's root
        self.nested_fns: set[int] = set()  # ... polled inside another poll
        self.swap: Any = None  # the thread closing the learning link (both links in until then)
        self.tasks_left_out: list[str] = []  # resume functions no longer probed (seen only inside polls)
        self.learn_entries = learn_entries  # polls seen (recorded) before a swap
        self.entries_seen = 0
        self.swaps = 0

    # `--mode tasks`: every resume function is probed at first, and the engine's
    # scopes say which are polled at the root of a thread (tasks: their runtime
    # polls them) and which only inside another poll. Each time `learn_s` (0.5 s)
    # passed and `learn_entries` (300) more polls were recorded, the link is swapped
    # for one without the latter (when there are new ones): a request through axum then traps 4 times (its connection task's
    # entry and exit, twice), not 10. The new link is attached before the old one
    # is closed, so no poll goes unseen; meanwhile a hit at a site both hold runs
    # the BPF program twice, and the second run is dropped (CFG_DEDUPE, same ip
    # and sp on the thread). Functions never polled while learning stay probed
    # (a later task kind); polls nested in a task's poll then come only from the
    # coroutines still probed, and the await tree under a task is read from
    # memory at each stop (reflection), as in `--mode off`. The kernel keeps
    # every probed poll's count and time per instance (sampling's fold), so the
    # tasks' POLLS and BUSY in `top` stay exact.
    def step(self) -> None:
        prog = self.c._prog
        if self.swap is not None and not self.swap.is_alive():
            self.swap.join()
            self.swap = None
            if prog is not None:
                prog.set_dedupe(False)
        if not self.learning or prog is None or self.c._link is None or self.c._sliced_out or self.swap is not None:
            return
        if time.monotonic() - self.learn_t0 < self.c.learn_s or self.entries_seen < self.learn_entries:
            return
        nested_only = self.nested_fns - self.root_fns
        keep = [(i, st) for i, st in zip(self.c._cookie_list or range(len(self.c._att_sites)), self.c._kept_sites())
                if st.spec.kind == B.KIND_COUNT or st.info.site not in nested_only]
        self.learn_t0, self.entries_seen = time.monotonic(), 0
        if len(keep) == len(self.c._offsets) or not keep:
            return
        offsets, cookies = [st.file_offset for _, st in keep], [i for i, _ in keep]
        prog.set_dedupe(True)
        try:
            link = prog.attach(self.c._path or "", offsets, self.c._pid, cookies)
        except B.BpfError as err:
            prog.set_dedupe(False)
            self.learning = False
            self.c.notices.append(f"uprobes: task-level probes could not be attached, all stay: {err}")
            return
        old, self.c._link = self.c._link, link
        self.c._offsets, self.c._cookie_list = offsets, cookies
        self.swap = prog.detach_later(old)
        self.swaps += 1
        names = {st.info.site: st.name for st in self.c._att_sites if st.spec.kind == B.KIND_ENTRY}
        self.tasks_left_out = sorted(names.get(f, hex(f)) for f in nested_only)

    def line(self) -> str | None:
        if not self.tasks_only:
            return None
        if not self.swaps:
            return (f"tasks mode: learning which resume functions are tasks' roots ({len(self.root_fns)} so far, "
                    f"{len(self.nested_fns - self.root_fns)} only inside other polls); every one is probed")
        n_fn = len({st.info.site for st in self.c._att_sites if st.spec.kind == B.KIND_ENTRY})
        return (f"tasks mode: {n_fn - len(self.tasks_left_out)} of {n_fn} resume functions probed "
                f"({self.swaps} swaps, each after {self.c.learn_s:g} s and {self.learn_entries} polls seen); "
                f"{len(self.tasks_left_out)} seen only inside other polls are "
                "left out (their polls after that are not seen: the await tree under a task comes from memory "
                "at each stop)" + (f": {', '.join(n[:60] for n in self.tasks_left_out[:4])}"
                                   + (" ..." if len(self.tasks_left_out) > 4 else "") if self.tasks_left_out else ""))
