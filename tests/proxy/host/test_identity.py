"""proxy/host/identity.py: the rules that decide whether the stub's pid is this
host's process. A table of processes stands in for /proc here (FakeHost);
integration/test_identity.py runs the same decisions on real namespaces,
and the last test here reads this machine's /proc for real."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from proxy.host.identity import AT_RANDOM, HostProcs, decide, file_build_id, parse_auxv, prove


def auxv(**kv: int) -> bytes:
    keys = {"entry": 9, "random": AT_RANDOM, "phdr": 3}
    return b"".join(struct.pack("<QQ", keys[k], v) for k, v in kv.items()) + b"\0" * 16


@dataclass
class Proc:
    auxv: bytes
    nspid: tuple[int, ...]
    random: bytes = b"R" * 16
    ns: str = "pid:[1]"
    build_id: bytes | None = b"B1"


@dataclass
class FakeHost(HostProcs):
    procs: dict[int, Proc] = field(default_factory=dict)
    mem_reads: list[int] = field(default_factory=list)

    def auxv(self, pid: int) -> bytes | None:
        p = self.procs.get(pid)
        return p.auxv if p else None

    def nspid(self, pid: int) -> tuple[int, ...] | None:
        p = self.procs.get(pid)
        return p.nspid if p else None

    def pid_ns(self, pid: int) -> str | None:
        p = self.procs.get(pid)
        return p.ns if p else None

    def pids(self):  # type: ignore[no-untyped-def]
        return iter(sorted(self.procs))

    def read_mem(self, pid: int, addr: int, size: int) -> bytes | None:
        self.mem_reads.append(pid)
        p = self.procs.get(pid)
        return p.random if p else None

    def exe_build_id(self, pid: int) -> bytes | None:
        p = self.procs.get(pid)
        return p.build_id if p else None

    def exe(self, pid: int) -> str:
        return f"/proc/{pid}/exe"


PROG = auxv(entry=0x1000, random=0x7ffd00)


def test_the_reported_pid_with_the_same_auxv_and_random_bytes_is_local() -> None:
    host = FakeHost({100: Proc(PROG, (100,))})
    got = decide(100, PROG, b"R" * 16, None, host=host)
    assert got.local and got.host_pid == 100
    assert "auxv and AT_RANDOM bytes equal" in got.reason


def test_a_proved_reported_pid_needs_no_scan_of_every_process() -> None:
    """The scan for a pid-namespace stub reads every host process's status
    (10-90 ms on a busy machine, at each session's first resume): not made
    when the reported pid itself has the stub's auxv and random bytes."""
    host = FakeHost({100: Proc(PROG, (100,)), 101: Proc(PROG, (101,))})

    def no_scan():  # type: ignore[no-untyped-def]
        raise AssertionError("every process scanned")

    host.pids = no_scan  # type: ignore[method-assign]
    got = decide(100, PROG, b"R" * 16, None, host=host)
    assert got.local and got.host_pid == 100
    assert got.reason.startswith("pid 100, auxv and AT_RANDOM bytes equal")


def test_a_pid_namespace_stub_is_found_through_nspid_not_the_reported_pid() -> None:
    # host pid 5 is another process (a kernel worker in the report: no auxv)
    host = FakeHost({5: Proc(b"", (5,)), 2189: Proc(PROG, (2189, 5), ns="pid:[2]")})
    got = decide(5, PROG, b"R" * 16, None, host=host)
    assert got.local and got.host_pid == 2189 and got.stub_pid == 5
    assert got.reason.startswith("pid 2189 (pid 5 in its pid namespace)")
    assert host.mem_reads == [2189]  # the other pid 5 is never read


def test_same_auxv_but_other_random_bytes_is_another_process() -> None:
    # gdbserver turns ASLR off: two runs of one program can have equal auxv
    host = FakeHost({7: Proc(PROG, (7,), random=b"X" * 16)})
    got = decide(7, PROG, b"R" * 16, None, host=host)
    assert not got.local and got.host_pid is None
    assert "AT_RANDOM bytes differ" in got.reason


def test_two_candidates_with_equal_random_bytes_unreadable_is_remote() -> None:
    host = FakeHost({7: Proc(PROG, (7,)), 9: Proc(PROG, (9, 7))})
    host.read_mem = lambda pid, a, n: None  # type: ignore[method-assign]
    got = decide(7, PROG, b"R" * 16, None, host=host)
    assert not got.local and "cannot be told apart" in got.reason


def test_no_auxv_from_the_stub_is_remote_unless_local_is_forced() -> None:
    host = FakeHost({7: Proc(PROG, (7,))})
    assert not decide(7, None, None, None, host=host).local
    forced = decide(7, None, None, None, host=host, override="local")
    assert forced.local and forced.host_pid == 7 and "--local" in forced.reason
    assert not decide(7, PROG, b"R" * 16, None, host=host, override="remote").local


def test_a_program_path_that_is_another_file_here_reads_the_running_file(tmp_path: Path) -> None:
    host = FakeHost({7: Proc(PROG, (7,), build_id=b"RUNNING")})
    other = tmp_path / "prog"
    other.write_bytes(b"x")
    got = decide(7, PROG, b"R" * 16, str(other), host=host, build_id=lambda p: b"OTHER")
    assert got.local and got.exe == "/proc/7/exe" and "another build" in got.reason
    missing = decide(7, PROG, b"R" * 16, str(tmp_path / "nothing"), host=host, build_id=lambda p: b"X")
    assert missing.local and missing.exe == "/proc/7/exe" and "does not open here" in missing.reason
    same = decide(7, PROG, b"R" * 16, str(other), host=host, build_id=lambda p: b"RUNNING")
    assert same.local and same.exe is None and "build-id equal" in same.reason


def test_fork_children_translate_only_within_the_program_namespace_with_its_auxv() -> None:
    host = FakeHost({
        2189: Proc(PROG, (2189, 5), ns="pid:[2]"),
        2190: Proc(PROG, (2190, 6), ns="pid:[2]"),  # the fork child
        6: Proc(PROG, (6,), ns="pid:[1]"),  # host pid 6: not the child
        3000: Proc(auxv(entry=1), (3000, 7), ns="pid:[2]"),  # same namespace, other program
    })
    ident = decide(5, PROG, b"R" * 16, None, host=host)
    assert ident.host_pid_of(6) == 2190
    assert ident.host_pid_of(7) is None
    assert ident.host_pid_of(5) == 2189
    remote = decide(5, PROG, b"X" * 16, None, host=host)
    assert remote.host_pid_of(6) is None


def test_prove_reads_the_random_bytes_through_the_stub() -> None:
    host = FakeHost({100: Proc(PROG, (100,))})
    gen = prove(100, PROG, None, host=host, exchange=lambda bodies: bodies)
    asked = next(gen)
    assert asked == (b"m7ffd00,10",)
    try:
        gen.send([(b"R" * 16).hex().encode()])
    except StopIteration as stop:
        assert stop.value.local
    else:
        raise AssertionError("prove asked twice")
    gen = prove(100, PROG, None, host=host, exchange=lambda bodies: bodies)
    next(gen)
    try:
        gen.send([b"E01"])  # the stub cannot read it: auxv alone
    except StopIteration as stop:
        assert stop.value.local and "auxv equal" in stop.value.reason


def test_garbage_auxv_and_files_decide_without_raising(tmp_path: Path) -> None:
    assert parse_auxv(b"\x01" * 7) == {}
    bad = tmp_path / "bad"
    for blob in (b"", b"\x7fELF", b"\x7fELF\x02\x01" + b"\xff" * 100, os.urandom(300)):
        bad.write_bytes(blob)
        assert file_build_id(str(bad)) is None
    host = FakeHost({1: Proc(b"\xff" * 33, (1,))})
    assert not decide(1, b"\x00" * 5, b"", None, host=host).local


def test_this_machine_proves_its_own_child(tmp_path: Path) -> None:
    """Real /proc: a child of this test is proven by its own auxv and random bytes."""
    p = subprocess.Popen([sys.executable, "-c", "print('ready', flush=True); import sys; sys.stdin.read()"],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert p.stdout is not None and p.stdout.readline() == b"ready\n"  # exec'd: its own auxv
        host = HostProcs()
        blob = host.auxv(p.pid)
        if blob is None:
            import pytest

            pytest.skip("/proc/PID/auxv unreadable here")
        rnd = parse_auxv(blob)[AT_RANDOM]
        mine = host.read_mem(p.pid, rnd, 16)
        if mine is None:
            import pytest

            pytest.skip("/proc/PID/mem unreadable here (not root)")
        got = decide(p.pid, blob, mine, sys.executable, host=host)
        assert got.local and got.host_pid == p.pid, got.reason
        assert not decide(p.pid, blob, bytes(16), sys.executable, host=host).local
        assert file_build_id(sys.executable) == host.exe_build_id(p.pid)
    finally:
        p.stdin.close()  # type: ignore[union-attr]
        p.wait()
