"""What stack discovery needs from DWARF at a pc, cached on disk by build-id.

Stack discovery (``stacks.py``) asks, for each frame of each thread, which of the
frame's variables are coroutines (or pointers to one), where they live (their
location expression at that pc) and which coroutine types an executor's frame
takes as template parameters. Finding that out reads the whole DWARF unit
behind the frame (about 0.26 s for std's unit in a release tokio binary, the
first time), which made the first ``monitor async tree`` of a session slow. The
answer depends only on the binary and the link-time pc (and the inventory,
which is keyed the same way), so it is kept next to the inventory's cache file
(``proxy.analysis.cache``): ``<build-id>-v<ANALYSIS_VERSION>-frames<FRAMES_VERSION>.pickle``,
a dict ``pc -> FrameFacts | None``. Another instance of the same program, or the
program attached again, reads no DWARF for the frames seen before; a rebuilt
binary has another build-id and starts empty. Stored as plain tuples (not
classes), checked on load; a broken file is ignored, like the inventory's.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from proxy.analysis import cache as cache_mod

FRAMES_VERSION = 1


class Scope(NamedTuple):
    """One scope of a frame: the subprogram or one inlined call covering the pc."""

    function: str
    variables: tuple[tuple[str, str, int, bytes], ...]  # (value | pointer, layout, offset of the env, location)
    templates: tuple[str, ...]  # coroutine layouts among its template type parameters


class FrameFacts(NamedTuple):
    frame_base: bytes | None  # the subprogram's DW_AT_frame_base expression
    scopes: tuple[Scope, ...]  # only the scopes that have something to find, outermost first


def path(build_id: str, cache_dir: Path | None = None) -> Path | None:
    return cache_mod.cache_path(build_id, cache_dir, kind=f"-frames{FRAMES_VERSION}")


def load(build_id: str, cache_dir: Path | None = None) -> dict[int, FrameFacts | None]:
    raw = cache_mod.load_pickle(path(build_id, cache_dir))
    out: dict[int, FrameFacts | None] = {}
    if not isinstance(raw, dict):
        return out
    try:
        for pc, facts in raw.items():
            out[int(pc)] = None if facts is None else _facts(facts)
    except (TypeError, ValueError):
        return {}  # not what this version writes: start again
    return out


def store(build_id: str, facts: dict[int, FrameFacts | None], cache_dir: Path | None = None) -> Path | None:
    """Merge with what another session may have written meanwhile, then replace atomically."""
    merged = load(build_id, cache_dir)
    merged.update(facts)
    plain = {pc: None if f is None else (f.frame_base, tuple(tuple(s) for s in f.scopes))
             for pc, f in merged.items()}
    return cache_mod.store_pickle(plain, path(build_id, cache_dir))


def _facts(raw: object) -> FrameFacts:
    if not isinstance(raw, tuple) or len(raw) != 2:
        raise TypeError("frame facts")
    fb: object = raw[0]
    scopes: object = raw[1]
    if (fb is not None and not isinstance(fb, bytes)) or not isinstance(scopes, tuple):
        raise TypeError("frame base")
    out = []
    for function, variables, templates in scopes:
        vs = tuple((str(m), str(lay), int(extra), bytes(expr)) for m, lay, extra, expr in variables)
        if not isinstance(function, str) or any(m not in ("value", "pointer") for m, _, _, _ in vs):
            raise TypeError("scope")
        out.append(Scope(function, vs, tuple(str(t) for t in templates)))
    return FrameFacts(fb, tuple(out))
