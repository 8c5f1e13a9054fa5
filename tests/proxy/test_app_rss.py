"""`stats`' memory line names the part that is the BPF ring buffer (a real one, loaded
with the project's own BPF object: root and BPF needed)."""

from __future__ import annotations

import re

import pytest

from proxy.app import _rss_mb
from proxy.capture.uprobes.capture import UprobeCapture


def test_rss_without_a_ring_is_the_process_rss() -> None:
    assert re.fullmatch(r"\d+ MB", _rss_mb()), _rss_mb()


def test_rss_names_the_ring_buffer_mapped_twice() -> None:
    ok, why = UprobeCapture.available(None)
    if not ok:
        pytest.skip(f"no BPF here: {why}")
    from proxy.capture.uprobes import bpf

    prog = bpf.Program.open(ring_bytes=16 << 20)
    try:
        ring = prog.ring()
        try:
            m = re.fullmatch(r"(\d+) MB \((\d+) MB of it the BPF ring buffer, its pages mapped twice\)", _rss_mb())
            assert m, _rss_mb()
            # 16 MiB of data pages, each counted in both mappings
            assert 32 <= int(m.group(2)) <= int(m.group(1)), m.groups()
        finally:
            ring.close()
    finally:
        prog.close()
