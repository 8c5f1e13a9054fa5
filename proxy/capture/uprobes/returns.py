"""Exits at learned return sites: the exits of resume functions polled through a vtable."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

from . import bpf as B
from .caller_exits import return_site
from .sites import Site, retsite_site

if TYPE_CHECKING:
    from .capture import UprobeCapture


class LearnedReturns:
    """Exits at return sites learnt at run time, a part the capture holds (``capture.returns``):
    the functions polled through a vtable, their rets' links, the return sites probed and
    the functions given up on. The BPF program, the sites table and the mask are the
    capture's (``c``); the nested probes' split takes the return sites that serve only
    nested functions (nested.py)."""

    def __init__(self, capture: UprobeCapture) -> None:
        self.c = capture
        self.links: dict[int, int] = {}  # fn index -> the link of its rets (while probed)
        self.closing: list[Any] = []  # threads closing rets' links
        self.fns: dict[int, list[int]] = {}  # fn index -> cookies of its entry sites
        self.covered: set[int] = set()  # return addresses (runtime) whose return site is probed
        self.given_up: dict[int, str] = {}  # fn index -> why its exits stay on its rets
        self.t0 = 0.0
        self.sites: list[Site] = []  # return-site probes added
        self.retsite_links: list[tuple[int, list[int]]] = []  # return sites' links (cookies) not split yet
        self.retsite_ret: dict[int, int] = {}  # a return site's cookie -> the return address it serves


    def step(self, force: bool = False) -> None:
        """Exits at learned return sites. A resume function polled through a vtable
        has no direct caller whose next instruction could hold its exit probe, so
        its exits start on its single-stepped rets (a link of their own) while its
        entries note each return address (``rets_seen``). Every ``learn_s``, each
        new return address is checked (``return_site``: the instruction before it
        is a call, then a straight window to an emulated instruction that no
        branch lands in) and probed there; a function whose return addresses are
        all probed then has its entries check theirs (REG_RETSITES) and its rets'
        link is closed. A poll that returns to an address not probed yet is
        counted at its entry (``uncovered`` in stats; its exit is not seen) and
        its return site is probed at the next step. A return address that fails
        the check gives the function its rets back for good."""
        prog = self.c._prog
        if prog is None or not self.fns or self.c._elf is None or self.c._path is None:
            return
        now = time.monotonic()
        if not force and now - self.t0 < self.c.learn_s:
            return
        self.t0 = now
        bias = int(getattr(self.c.target, "bias", 0) or 0)
        starts = [fn.low_pc for fn in self.c.inventory.resume_fns] if self.c.inventory is not None else []
        new: dict[int, Site] = {}  # return address (runtime) -> its probe
        seen = prog.rets_seen()  # one read of the kernel's map a step (a syscall an entry)
        for (ret, fn), _n in sorted(seen.items()):
            if ret in self.covered or ret in new or fn in self.given_up or fn not in self.fns:
                continue
            got = return_site(self.c._elf, ret - bias, starts)
            site = retsite_site(self.c._elf, got, ret - bias, bias) if not isinstance(got, str) else None
            if site is None or site.addr in self.c._sites_by_addr or site.addr in self.c.view.client_sw:
                why = got if isinstance(got, str) else f"its return site 0x{ret:x} is probed or watched already"
                self.give_up(prog, fn, why)
                continue
            new[ret] = site
        if new:
            first = len(self.c._att_sites)
            sites = list(new.values())
            if first + len(sites) > self.c._site_cap:
                return  # the site table is full: the rets stay
            prog.set_sites([st.spec for st in sites], first)
            cookies = list(range(first, first + len(sites)))
            # After the nested probes' split, a return site serving only nested
            # functions belongs to the nested probes: out with them, or it traps
            # for every other call returning there. The axum benchmark's handler
            # future returns into futures_util's Map::poll after a vtable call
            # that every boxed future of a request passes through: 438,234 hits
            # in 5 s, 420,421 of them other calls' ("retsite other"), ~1.9 traps
            # a request while the nested probes were out (docs/history/2026-speed.md).
            served = self.c.nested_links.served(seen) if self.c.nested_links.split_done and self.c.nested is not None else {}
            inner = [c for c, ret in zip(cookies, new) if self.c.nested_links.inner_fns(served.get(ret, set()))]
            outer = [c for c in cookies if c not in inner]
            offsets = {c: st.file_offset for c, st in zip(cookies, sites)}
            try:
                # the nested ones: attached now only while the nested probes are in
                link_out = prog.attach(self.c._path, [offsets[c] for c in outer], self.c._pid, outer) if outer else None
                link_in = (prog.attach(self.c._path, [offsets[c] for c in inner], self.c._pid, inner)
                           if inner and self.c.nested is not None and not self.c.nested.out else None)
            except B.BpfError as err:
                for fn in list(self.fns):
                    self.give_up(prog, fn, f"return sites could not be attached: {err}")
                return
            self.c._att_sites += sites
            self.sites += sites
            if link_out is not None:
                self.retsite_links.append((link_out, outer))
            if link_in is not None:
                self.c.nested_links.extra.append(link_in)
            self.c.nested_links.cookies += inner
            self.retsite_ret.update(zip(cookies, new))
            if self.c.decoder is not None:
                self.c.decoder.sites += [st.info for st in sites]
            for i, st in enumerate(sites, first):
                self.c._sites_by_addr[st.addr] = st
                self.c._cookies[st.addr] = i
            self.c._mask = sorted(self.c._mask + [(st.addr, st.original) for st in sites])
            prog.add_retsites(list(new))
            self.covered.update(new)
        # functions whose every return address seen is probed: their rets go
        for fn, link in list(self.links.items()):
            if fn in self.given_up or not any(f == fn for _r, f in seen):
                continue
            if all(r in self.covered for r, f in seen if f == fn):
                for c in self.fns[fn]:
                    prog.set_sites([dataclasses.replace(self.c._att_sites[c].spec, cfa_reg=B.REG_RETSITES)], c)
                del self.links[fn]
                self.closing.append(prog.detach_later(link))

    def give_up(self, prog: B.Program, fn: int, why: str) -> None:
        """The function's exits stay on (or go back to) its rets: the rets' link
        first, then its entries stop checking their return addresses (REG_LEARN:
        none uncovered). If the rets cannot be probed again, the entries keep
        checking: its polls are still counted, at their entries."""
        self.given_up[fn] = why
        if fn not in self.links and self.c._path is not None:
            mine = [i for i, st in enumerate(self.c._att_sites) if st.group == fn + 1]
            try:
                self.links[fn] = prog.attach(self.c._path, [self.c._att_sites[i].file_offset for i in mine],
                                                  self.c._pid, mine)
            except B.BpfError as err:
                self.c.notices.append(f"uprobes: the rets of {self.c._fn_name(fn)[:60]} could not be probed "
                                    f"again ({err}): its polls are counted at their entries, exits not seen")
                return
        for c in self.fns.get(fn, []):
            prog.set_sites([self.c._att_sites[c].spec], c)

    def line(self) -> str | None:
        if not self.fns:
            return None
        c = self.c.counters()
        moved = len(self.fns) - len(self.links)
        line = (f"{len(self.fns)} resume functions polled through a vtable: {moved} with their exits at "
                f"{len(self.sites)} return sites learned at run time (the emulated instruction after the "
                f"return address; their rets no longer probed); polls that returned to an address not probed yet "
                f"(counted at their entry, exit not seen): {c.get('uncovered', 0):,}; return-site hits of other "
                f"calls: {c.get('retsite other', 0):,}")
        if self.given_up:
            line += "; exits left on the rets: " + "; ".join(
                f"{self.c._fn_name(fn)[:50]} ({why})" for fn, why in self.given_up.items())
        return line
