"""gdbserver >= 14 is not affected by the AVX-512 write-back (GDB 14 reads the
XSAVE layout from CPUID): register safety must then choose ``full`` even
for a stub the proxy did not start, and ymm16 must survive.

gdbserver 16.3 (Debian trixie) and 18.1 (sid) run in the chroots of
``scripts/debuggers-chroot`` (their libc is newer than this host's); the
proxy on the host connects to them over loopback, so it cannot run
``gdbserver --version``: it learns the version from its own first
``qSupported``, whose reply from gdbserver >= 14 carries ``QThreadOptions=``
(proxy/host/regsafety.py). The client is the gdb of the same release.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from integration.harness import debuggers
from integration.harness import regsafety as h
from integration.harness.regsafety import STOPS, bp_site, parse_result
from integration.harness.stubs import start_stub

pytestmark = [
    pytest.mark.skipif(not {"avx512f", "avx512vl"} <= h.cpu_flags(),
                       reason="the ymm16 reproducer needs AVX-512F/VL; the decision alone is checked "
                              "in tests/proxy/test_regsafety.py"),
    pytest.mark.skipif(not h.have("gcc"), reason="needs gcc"),
]

FULL_NOTICE = re.compile(r"asyncrsp: registers: full \(gdbserver >= 14 \(it answers QThreadOptions\)")


@pytest.fixture(scope="module")
def ymm16() -> Path:
    return h.build_c("ymm16.c", "-O1", "-mavx512f", "-mavx512vl", "-no-pie")


# The suite checks the newest; scripts/test-debuggers both (ASYNCRSP_DEBUGGERS=full).
RELEASES = {"full": debuggers.NEWER, "subset": debuggers.NEWER[-1:], "none": ()}[debuggers.newer_mode()]


@pytest.fixture(params=RELEASES or [pytest.param("", marks=pytest.mark.skip(reason="ASYNCRSP_DEBUGGERS=none"))])
def release(request: pytest.FixtureRequest) -> str:
    why = debuggers.SETS[request.param].missing()
    if why:
        pytest.skip(why)
    return str(request.param)


def gdb(prog: Path, target: str, commands: list[str]) -> str:
    """The chroot's gdb in batch mode (the set in use)."""
    argv = debuggers.argv("gdb", "-nx", "-q", "-batch", "-ex", "set confirm off", "-ex", "set pagination off",
                          "-ex", f"target remote {target}", *[w for c in commands for w in ("-ex", c)], str(prog))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL, check=False)
    return done.stdout + done.stderr


def first_source_bytes() -> list[int]:
    """What ymm16.c loads into ymm16 in its first iteration (src for i = 0)."""
    return [(0xA5 ^ (j * 7) ^ (j << 3)) & 0xFF | 1 for j in range(32)]


def test_full_mode_and_ymm16_survives_hidden_stops(ymm16: Path, tmp_path: Path, release: str) -> None:
    """1,000 hidden stops at bp_site through the proxy, default register mode."""
    result = tmp_path / "result"
    with debuggers.use(release), \
            start_stub("gdbserver", ymm16, [str(STOPS), str(result)], wrapper=h.WRAPPER) as stub, \
            h.ProxyProcess(stub.address, ["--probe", "bp_site", "--capture", "breakpoints"]) as proxy:
        out = gdb(ymm16, f"127.0.0.1:{proxy.port}", ["continue"])
    print("\n" + proxy.output())
    assert FULL_NOTICE.search(proxy.output()), proxy.output()
    assert "exited normally" in out, out[-2000:]
    verdict, count, armed = parse_result(result.read_text())
    print(f"{release} gdbserver through asyncrsp (full), hidden probe: {verdict} {count}/{STOPS}, "
          f"armed {armed}/{STOPS}")
    assert armed == STOPS
    assert (verdict, count) == ("preserved", STOPS)


def test_client_sees_ymm16_in_full_mode(ymm16: Path, tmp_path: Path, release: str) -> None:
    """In full mode xmlRegisters goes through: gdb reads ymm16 at bp_site, and
    it holds what the program loaded; the program still ends preserved."""
    result = tmp_path / "result"
    with debuggers.use(release), \
            start_stub("gdbserver", ymm16, ["3", str(result)], wrapper=h.WRAPPER) as stub, \
            h.ProxyProcess(stub.address, []) as proxy:
        bp = bp_site(ymm16)
        out = gdb(ymm16, f"127.0.0.1:{proxy.port}",
                  [f"break *{bp:#x}", "continue", "p/x $ymm16.v32_int8", "delete", "continue"])
    assert FULL_NOTICE.search(proxy.output()), proxy.output()
    m = re.search(r"\$1 = \{([^}]*)\}", out)
    assert m, out[-2000:]
    seen = [int(x, 16) for x in m.group(1).split(",")]
    assert seen == first_source_bytes(), out
    assert result.read_text().startswith("preserved 3/3 "), result.read_text()
