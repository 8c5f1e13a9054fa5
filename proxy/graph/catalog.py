"""Runtime address -> coroutine facts, built from an analysis Inventory.

The inventory holds link-time addresses; the catalog adds the load bias once
so the engine's hot path is a dict lookup on the runtime ``site`` (the low_pc
of a resume function). Line lookups go through an optional callable that
takes a *link-time* pc (the analysis' line table); results are cached in a
bounded dict because the same return addresses come back on every poll.
"""

from __future__ import annotations

from collections.abc import Callable

from proxy.analysis.model import Inventory, Layout, ResumeFn, SourceLoc

LineLookup = Callable[[int], SourceLoc | None]
"""link-time pc -> the source line of the instruction at that pc."""

_LINE_CACHE_MAX = 4096


class Catalog:
    def __init__(
        self,
        inventory: Inventory,
        load_bias: int,
        line_for_pc: LineLookup | None = None,
    ) -> None:
        self.inventory = inventory
        self.load_bias = load_bias
        self._line_for_pc = line_for_pc
        self._by_site: dict[int, ResumeFn] = {
            f.low_pc + load_bias: f for f in inventory.resume_fns if f.low_pc
        }
        self._layout_by_site: dict[int, Layout | None] = {
            site: inventory.layouts.get(f.layout_name) if f.layout_name else None
            for site, f in self._by_site.items()
        }
        # site -> the task type (`type_key`): the engine's first lookup on every event
        self.type_keys: dict[int, str] = {site: f.layout_name or f.name for site, f in self._by_site.items()}
        self._line_cache: dict[int, SourceLoc | None] = {}
        self._valid: dict[tuple[int, int], bool] = {}  # (site, __state value) -> a state of its layout

    def __len__(self) -> int:
        return len(self._by_site)

    def sites(self) -> list[int]:
        return sorted(self._by_site)

    def resume_fn(self, site: int) -> ResumeFn | None:
        return self._by_site.get(site)

    def has_site(self, site: int) -> bool:
        return site in self._by_site

    def valid_state(self, site: int, value: int) -> bool:
        """Is `value` a state of the site's layout (True without a layout)? Cached:
        asked at every exit, and a layout's states are a list to search."""
        key = (site, value)
        got = self._valid.get(key)
        if got is None:
            layout = self._layout_by_site.get(site)
            got = layout is None or layout.state(value) is not None
            if len(self._valid) < 65536:
                self._valid[key] = got
        return got

    def layout_for(self, site: int) -> Layout | None:
        return self._layout_by_site.get(site)

    def type_key(self, site: int) -> str:
        """The task type for a site: its layout name, else the resume fn's name."""
        fn = self._by_site.get(site)
        if fn is None:
            return f"0x{site:x}"
        return fn.layout_name or fn.name

    def loc_for_pc(self, pc: int) -> SourceLoc | None:
        """The line of the instruction at runtime address ``pc``."""
        if self._line_for_pc is None:
            return None
        cache = self._line_cache
        if pc in cache:
            return cache[pc]
        try:
            loc = self._line_for_pc(pc - self.load_bias)
        except (ValueError, LookupError):
            loc = None
        if len(cache) >= _LINE_CACHE_MAX:
            cache.clear()
        cache[pc] = loc
        return loc

    def loc_for_return_address(self, addr: int) -> SourceLoc | None:
        """The line of the call that returns to ``addr`` (the ``.await``).

        The return address is the instruction after the call; the call's own
        line is the one of ``addr - 1``.
        """
        return self.loc_for_pc(addr - 1) if addr > 0 else None

    def state_loc(self, site: int, value: int | None) -> SourceLoc | None:
        layout = self._layout_by_site.get(site)
        if layout is None or value is None:
            return None
        state = layout.state(value)
        return state.loc if state is not None else None
