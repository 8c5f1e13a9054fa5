"""The amd64 target description against real clients (gdb 13.1, lldb 14).

gdbserver 13.1 runs a tiny C program; tests/rsp/relay.py sits in between,
strips ``xmlRegisters=i386`` from the client's qSupported (as the proxy
does) and serves `amd64_linux_target_xml()` itself. gdb must then lay out
the registers exactly as `AMD64_LINUX_NOXML` (its ``maint print
remote-registers``), and lldb must read registers from it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rsp.regs import AMD64_LINUX_NOXML, amd64_linux_target_xml

HERE = Path(__file__).parent
PROGRAM = r"""
volatile long counter;
__attribute__((noinline)) long work(long x) { counter += x; return counter * 2; }
int main(void) { long acc = 0; for (int i = 0; i < 3; i++) acc += work(i); return (int)acc & 1; }
"""

needs = [shutil.which(t) for t in ("gdbserver", "gcc")]
pytestmark = pytest.mark.skipif(None in needs, reason="needs gdbserver and gcc (scripts/setup installs them)")


@pytest.fixture(scope="module")
def program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("regs_real")
    (folder / "prog.c").write_text(PROGRAM)
    subprocess.run(["gcc", "-g", "-O0", "-o", str(folder / "prog"), str(folder / "prog.c")], check=True)
    features = folder / "features"
    features.mkdir()
    for name, text in amd64_linux_target_xml().items():
        (features / name).write_text(text)
    return folder


def _port_from(proc: subprocess.Popen[str], pattern: str) -> int:
    assert proc.stderr is not None and proc.stdout is not None
    stream = proc.stderr if "Listening" in pattern else proc.stdout
    for _ in range(20):
        line = stream.readline()
        match = re.search(pattern, line)
        if match:
            return int(match.group(1))
    raise AssertionError(f"no {pattern!r} from {proc.args}")


@pytest.fixture
def relay_port(program: Path) -> Iterator[int]:
    stub = subprocess.Popen(["gdbserver", "--once", "127.0.0.1:0", str(program / "prog")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    relay = None
    try:
        stub_port = _port_from(stub, r"Listening on port (\d+)")
        relay = subprocess.Popen(
            [sys.executable, "-m", "tests.rsp.relay", "0", str(stub_port), str(program / "log.jsonl"),
             "--strip-xml-registers", "--serve-features", str(program / "features")],
            cwd=HERE.resolve().parents[1], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        yield _port_from(relay, r"listening (\d+)")
    finally:
        for proc in (relay, stub):
            if proc is not None:
                proc.kill()
                proc.wait(timeout=10)


@pytest.mark.skipif(shutil.which("gdb") is None, reason="needs gdb")
def test_gdb_lays_out_registers_like_gdbserver_noxml(program: Path, relay_port: int) -> None:
    out = subprocess.run(
        ["gdb", "-nx", "-batch", "-ex", "set sysroot /", "-ex", f"target remote 127.0.0.1:{relay_port}",
         "-ex", "maint print remote-registers", "-ex", "p/x $fs_base", "-ex", "kill", str(program / "prog")],
        capture_output=True, text=True, timeout=60).stdout
    rows = {}
    for line in out.splitlines():
        cols = line.split()
        if len(cols) == 8 and cols[1].isdigit():
            rows[cols[0]] = (int(cols[6]), int(cols[7]), int(cols[4]))  # remote nr, g offset, size
    for reg in AMD64_LINUX_NOXML.registers:
        assert rows.get(reg.name) == (reg.regnum, reg.offset, reg.size), reg.name
    assert re.search(r"\$1 = 0x[0-9a-f]+", out)


@pytest.mark.skipif(shutil.which("lldb") is None, reason="needs lldb")
def test_lldb_reads_registers_with_our_description(program: Path, relay_port: int) -> None:
    out = subprocess.run(
        ["lldb", "--batch", "-o", f"file {program / 'prog'}", "-o", f"gdb-remote 127.0.0.1:{relay_port}",
         "-o", "register read rip fs_base orig_rax mxcsr xmm0 st0", "-o", "kill"],
        capture_output=True, text=True, timeout=60).stdout
    for name in ("rip", "fs_base", "orig_rax", "mxcsr", "xmm0", "st0"):
        assert re.search(rf"^\s*{name} = ", out, re.M), (name, out[-2000:])
    assert "error" not in out.lower().split("register read", 1)[1].split("(lldb) kill")[0]
