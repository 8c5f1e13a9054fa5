"""`--mode tasks`: after learning which resume functions are tasks' roots, only those stay probed."""

from __future__ import annotations

import time

from . import bpf as B


class TasksMode:
    """UprobeCapture's task-level probes (a mixin: the state lives in UprobeCapture.__init__)."""

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
    def _tasks_step(self) -> None:
        prog = self._prog
        if self._swap is not None and not self._swap.is_alive():
            self._swap.join()
            self._swap = None
            if prog is not None:
                prog.set_dedupe(False)
        if not self._learning or prog is None or self._link is None or self._sliced_out or self._swap is not None:
            return
        if time.monotonic() - self._learn_t0 < self.learn_s or self._learn_entries < self.learn_entries:
            return
        nested_only = self._nested_fns - self._root_fns
        keep = [(i, st) for i, st in zip(self._cookie_list or range(len(self._att_sites)), self._kept_sites())
                if st.spec.kind == B.KIND_COUNT or st.info.site not in nested_only]
        self._learn_t0, self._learn_entries = time.monotonic(), 0
        if len(keep) == len(self._offsets) or not keep:
            return
        offsets, cookies = [st.file_offset for _, st in keep], [i for i, _ in keep]
        prog.set_dedupe(True)
        try:
            link = prog.attach(self._path or "", offsets, self._pid, cookies)
        except B.BpfError as err:
            prog.set_dedupe(False)
            self._learning = False
            self.notices.append(f"uprobes: task-level probes could not be attached, all stay: {err}")
            return
        old, self._link = self._link, link
        self._offsets, self._cookie_list = offsets, cookies
        self._swap = prog.detach_later(old)
        self.swaps += 1
        names = {st.info.site: st.name for st in self._att_sites if st.spec.kind == B.KIND_ENTRY}
        self.tasks_left_out = sorted(names.get(f, hex(f)) for f in nested_only)

    def tasks_line(self) -> str | None:
        if not self.tasks_only:
            return None
        if not self.swaps:
            return (f"tasks mode: learning which resume functions are tasks' roots ({len(self._root_fns)} so far, "
                    f"{len(self._nested_fns - self._root_fns)} only inside other polls); every one is probed")
        n_fn = len({st.info.site for st in self._att_sites if st.spec.kind == B.KIND_ENTRY})
        return (f"tasks mode: {n_fn - len(self.tasks_left_out)} of {n_fn} resume functions probed "
                f"({self.swaps} swaps, each after {self.learn_s:g} s and {self.learn_entries} polls seen); "
                f"{len(self.tasks_left_out)} seen only inside other polls are "
                "left out (their polls after that are not seen: the await tree under a task comes from memory "
                "at each stop)" + (f": {', '.join(n[:60] for n in self.tasks_left_out[:4])}"
                                   + (" ..." if len(self.tasks_left_out) > 4 else "") if self.tasks_left_out else ""))
