"""Timers: tokio's Sleep and async-io's Timer, with their deadlines against the target's clock."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..node import missing_or_unreadable, Node
from .fields import _enum_variant, _field, _find_field

if TYPE_CHECKING:
    from ..walker import Reflector


def sleep(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """tokio's ``Sleep``: its deadline is a field named ``deadline`` (``inner.deadline`` in 1.24,
    ``entry.deadline`` of the ``TimerEntry`` in 1.43 and 1.53), an ``Instant`` that wraps std's,
    which wraps a ``Timespec { tv_sec, tv_nsec }`` of CLOCK_MONOTONIC: found by name."""
    node = Node("leaf", "tokio::time::Sleep", addr, type_name)
    found = _find_field(r, type_name, "deadline")
    if found is None:
        return node
    return _deadline(r, node, addr + found[0], found[1]) or missing_or_unreadable(r, addr, type_name,
                                                                                    "Sleep deadline")


def _timespec(r: Reflector, type_name: str) -> tuple[int, int, int] | None:
    """(offset, tv_sec field offset, tv_nsec field offset) of the Timespec inside an Instant."""
    off = 0
    for _ in range(6):
        t = r.type(type_name)
        if t is None or t.kind != "struct" or not t.fields:
            return None
        sec, nsec = t.field("tv_sec"), t.field("tv_nsec")
        if sec is not None and nsec is not None:
            return off, sec.offset, nsec.offset
        f = t.fields[0] if len(t.fields) == 1 else (t.field("std") or t.field("t") or t.field("__0"))
        if f is None:
            return None
        off, type_name = off + f.offset, f.type_name
    return None


def _deadline(r: Reflector, node: Node, at: int, instant: str) -> Node | None:
    """Sets ``node.detail`` to the time left until the Instant at ``at``; None: unreadable."""
    ts = _timespec(r, instant)
    if ts is None:
        return node
    off, sec_off, nsec_off = ts
    sec = r.mem.u(at + off + sec_off, 8)
    nsec = r.mem.u(at + off + nsec_off, 4)
    if sec is None or nsec is None:
        return None
    deadline = sec * 1_000_000_000 + nsec
    if r.now_ns is not None:
        left = deadline - r.now_ns
        node.detail = f"{_dur(left)} left" if left > 0 else f"expired {_dur(-left)} ago"
    else:
        node.detail = f"deadline {sec}.{nsec:09d} s (CLOCK_MONOTONIC)"
    return node


def _dur(ns: int) -> str:
    if ns >= 3_600_000_000_000:
        return f"{ns / 3.6e12:.1f} h"
    if ns >= 60_000_000_000:
        return f"{ns / 6e10:.1f} min"
    if ns >= 1_000_000_000:
        return f"{ns / 1e9:.1f} s"
    return f"{ns // 1_000_000} ms"


def async_io_timer(r: Reflector, addr: int, type_name: str, depth: int, seen: frozenset) -> Node | None:
    """``async_io::Timer { when: Option<Instant>, id_and_waker, period }``: time left."""
    f = _field(r, type_name, "when")
    if f is None:
        return None
    node = Node("leaf", "async_io::Timer", addr, type_name)
    v, ok = _enum_variant(r, addr + f.offset, f.type_name)
    if not ok:
        return missing_or_unreadable(r, addr, type_name, "Timer")
    if v is None:
        return node
    if v.name == "None" or not v.fields:
        node.detail = "never fires"
        return node
    return _deadline(r, node, addr + f.offset + v.fields[0].offset, v.fields[0].type_name) or \
        missing_or_unreadable(r, addr, type_name, "Timer deadline")
