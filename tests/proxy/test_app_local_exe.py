"""`local_exe` on a real local process whose file was replaced after it started,
or that runs from a file of another mount namespace."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from proxy.app import local_exe


def test_a_replaced_program_file_is_read_through_proc_exe(tmp_path: Path) -> None:
    prog = tmp_path / "sleeper"
    shutil.copy2("/bin/sleep", prog)
    p = subprocess.Popen([str(prog), "30"])
    try:
        time.sleep(0.2)
        assert local_exe(p.pid) == str(prog)
        prog.unlink()  # what a rebuild's rename does to the running file's name
        shutil.copy2("/bin/true", prog)
        got = local_exe(p.pid)
        assert got == f"/proc/{p.pid}/exe", got
        assert Path(got).read_bytes()[:4] == b"\x7fELF"  # still the running program's file
        assert Path(got).stat().st_size == Path("/bin/sleep").stat().st_size
    finally:
        p.kill()
        p.wait()


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare(1)")
def test_a_program_of_another_mount_namespace_is_read_through_proc_exe(tmp_path: Path) -> None:
    """A stub in a chroot: the program's path is one of the chroot's mounts,
    which this namespace does not see (here: a tmpfs mounted over tmp_path)."""
    p = subprocess.Popen(["unshare", "-m", "--", "sh", "-c",
                          'mount -t tmpfs none "$0" && cp /bin/sleep "$0/s" && exec "$0/s" 30', str(tmp_path)])
    try:
        deadline = time.monotonic() + 10
        while os.path.basename(os.readlink(f"/proc/{p.pid}/exe")) != "s" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.readlink(f"/proc/{p.pid}/exe") == str(tmp_path / "s")
        assert not (tmp_path / "s").exists()  # not here: only in the program's namespace
        got = local_exe(p.pid)
        assert got == f"/proc/{p.pid}/exe", got
        assert Path(got).stat().st_size == Path("/bin/sleep").stat().st_size
    finally:
        p.kill()
        p.wait()
