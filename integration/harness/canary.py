"""A canary process for the identity tests: a program held stopped at its
exec (ptrace TRACEME), whose memory must stay byte-identical while a proxy
works with a stub that reports the canary's pid for its own program.

    python canary.py [--pid N] PROGRAM [-- COMMAND ...]

--pid N: in a fresh pid namespace (this script its first process, /proc of
that namespace mounted), the canary gets pid N (ns_last_pid is set first).
Prints ``canary pid=P digest=D`` when the canary is stopped, runs COMMAND
(or waits for stdin to close), then prints ``canary after digest=D`` and
kills the canary. The digest is a sha256 of every readable mapping.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import subprocess
import sys


def digest(pid: int) -> str:
    h = hashlib.sha256()
    with open(f"/proc/{pid}/maps") as fh:
        rows = [line.split() for line in fh]
    fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    try:
        for r in rows:
            lo, hi = (int(x, 16) for x in r[0].split("-"))
            name = r[5] if len(r) > 5 else ""
            if "r" not in r[1] or name in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
                continue
            h.update(r[0].encode())
            try:
                h.update(os.pread(fd, hi - lo, lo))
            except OSError:
                h.update(b"?")
    finally:
        os.close(fd)
    return h.hexdigest()


def main(argv: list[str]) -> int:
    want = None
    if argv[:1] == ["--pid"]:
        want, argv = int(argv[1]), argv[2:]
    prog, cmd = argv[0], (argv[2:] if argv[1:2] == ["--"] else [])
    if want is not None:
        with open("/proc/sys/kernel/ns_last_pid", "w") as fh:
            fh.write(str(want - 1))
    pid = os.fork()
    if pid == 0:  # the canary
        ctypes.CDLL(None).ptrace(0, 0, None, None)  # PTRACE_TRACEME: stopped at exec
        os.execv(prog, [prog])
    os.waitpid(pid, os.WUNTRACED)
    print(f"canary pid={pid} digest={digest(pid)}", flush=True)
    try:
        if cmd:
            subprocess.run(cmd, check=False)
        else:
            sys.stdin.read()
        print(f"canary after digest={digest(pid)}", flush=True)
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
