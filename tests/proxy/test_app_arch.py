"""The register-safety rule (gdbserver 13's x86 XSAVE bug) is not applied to another CPU's
program: its target description has no ymm/zmm registers to hide (proxy/app.py)."""

from __future__ import annotations

from pathlib import Path

from proxy.app import register_policy
from proxy.shell.upstream import UpstreamSpec


def test_an_aarch64_program_keeps_its_registers_full(tmp_path: Path) -> None:
    a64 = tmp_path / "a64"
    a64.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9) + b"\x03\x00" + (183).to_bytes(2, "little") + bytes(44))
    remote = UpstreamSpec.parse("192.0.2.7:1234")  # another host: x86-64 would stay safe
    policy = register_policy(remote, None, str(a64))
    assert not policy.safe and policy.reason == "the program is aarch64: gdbserver 13's XSAVE bug is x86-64's"
    assert register_policy(remote, None, "/bin/true").safe  # an x86-64 program: unchanged
    assert register_policy(remote, "safe", str(a64)).safe  # asked for: as asked
