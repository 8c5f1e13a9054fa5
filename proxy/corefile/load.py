"""Open a core file from disk (the only I/O of `proxy.corefile`): mmap the
core and the files it maps, parse, and build the `ProgramImage`."""

from __future__ import annotations

import mmap
import os
import time

from .elfcore import CoreError, parse_core
from .image import Buffer, ProgramImage, core_image


def map_file(path: str) -> Buffer | None:
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                return b""
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError:
        return None


def open_core(path: str, elf: str | None = None) -> ProgramImage:
    """The program image of the core at `path`; CoreError with one line if unusable."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise CoreError(f"{path}: empty file")
            buf = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as err:
        raise CoreError(f"{path}: {err.strerror or err}") from None
    if elf is not None and not os.path.exists(elf):
        raise CoreError(f"--elf {elf}: no such file")
    core = parse_core(buf, path)
    image = core_image(core, buf, map_file, elf=elf, origin=f"core file {path}")
    if image.exec_file is None or not os.path.exists(image.exec_file):
        raise CoreError(f"{path}: the program's file {image.exec_file or '(unknown)'} is not here; "
                        "pass it with --elf PROG")
    image.extra["clock_ns"] = dump_clock(path)
    return image


def dump_clock(path: str) -> int | None:
    """CLOCK_MONOTONIC at the time the core was written, estimated from its
    modification time, when that falls in this boot (a core from an earlier
    boot or another machine has no clock this host can relate to): a Sleep's
    time left is then reckoned from the moment of the dump."""
    try:
        written = os.stat(path).st_mtime_ns
    except OSError:
        return None
    now_real, now_mono = time.time_ns(), time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    booted = now_real - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    if written < booted or written > now_real:
        return None
    return now_mono - (now_real - written)
