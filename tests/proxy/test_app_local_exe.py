"""`local_exe` on a real local process whose file was replaced after it started."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

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
