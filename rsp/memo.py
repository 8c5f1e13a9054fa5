"""Parses of packets a debugger sends again and again, kept.

gdb sends the same few requests around every step (`z0,ADDR,1`, `Z0,ADDR,1`,
its thread ids), and the proxy parses each more than once on its way (the
shield checks it, its route reads it). The parses are pure and their results
frozen, so a small cache per parser answers the repeats: a dict lookup for
the bytes in place of the parse. A parse that raises is not kept (it raises
again). A body that is not `bytes` (a bytearray, unhashable) is parsed every
time.

Only for parses whose results nobody tells apart by identity: the session
marks a resume it has already seen by the `Resume` object itself (the step
follower's note, the threads checked), so two equal `vCont;r` in a row are two
resumes there, and `parse_resume` is not kept.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

SIZE = 256  # distinct bodies kept per parser: a session's breakpoints and threads


def kept(parse: Callable[[bytes], T]) -> Callable[[bytes], T]:
    """`parse`, with its results for the last SIZE distinct bodies kept."""
    cached = functools.lru_cache(maxsize=SIZE)(parse)

    @functools.wraps(parse)
    def run(body: bytes) -> T:
        if type(body) is not bytes:
            return parse(body)
        return cached(body)

    return run
