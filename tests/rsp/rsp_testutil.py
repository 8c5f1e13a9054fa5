"""Helpers for the rsp tests (a uniquely named module: tests/ has no
__init__.py, so a second `conftest` elsewhere must not shadow these)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"


def load_captured() -> dict[str, Any]:
    """Packets captured from gdb 13.1 / lldb 14 <-> gdbserver 13.1 on this
    machine (see the "_source" entry and tests/rsp/relay.py)."""
    with open(FIXTURES / "gdbserver13.json", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def wire(text: str) -> bytes:
    """A captured body (stored as latin-1 text) as bytes."""
    return text.encode("latin-1")


def framed(body: bytes, start: bytes = b"$") -> bytes:
    """Frame a body as a peer would, RLE and all (rsp.framing.frame refuses
    raw '*', which only a sender that run-length encodes may emit)."""
    return start + body + b"#%02x" % (sum(body) & 0xFF)
