"""Runs inside gdb (``gdb -batch -x gdb_stack_dump.py``): stops a program at
breakpoints and single steps, and for every stop writes one JSON line with
the registers, the stack bytes from rsp up, and gdb's own backtrace pcs.

Configured through environment variables (gdb's -x takes no arguments):
ASYNCRSP_DUMP_OUT (output path), ASYNCRSP_DUMP_BREAKS (comma-separated
hex link-time addresses), ASYNCRSP_DUMP_MAX (stops), ASYNCRSP_DUMP_STEPS
(stepi count after each breakpoint hit).
"""

import json
import os
import re

import gdb  # type: ignore[import-not-found]

OUT = os.environ["ASYNCRSP_DUMP_OUT"]
BREAKS = [int(x, 16) for x in os.environ["ASYNCRSP_DUMP_BREAKS"].split(",") if x]
MAX = int(os.environ.get("ASYNCRSP_DUMP_MAX", "30"))
STEPS = int(os.environ.get("ASYNCRSP_DUMP_STEPS", "3"))
STACK = 256 * 1024
REGS = ["rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11",
        "r12", "r13", "r14", "r15", "rip"]

gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("starti")
auxv = gdb.execute("info auxv", to_string=True)
entry = int(re.search(r"AT_ENTRY\s.*?(0x[0-9a-f]+)", auxv).group(1), 16)
bias_known = os.environ.get("ASYNCRSP_DUMP_ENTRY")
bias = entry - int(bias_known, 16) if bias_known else 0
for a in BREAKS:
    gdb.execute(f"break *{a + bias:#x}", to_string=True)


def dump(f):
    frame = gdb.newest_frame()
    regs = {r: int(frame.read_register(r)) & 0xFFFFFFFFFFFFFFFF for r in REGS}
    inf = gdb.selected_inferior()
    sp = regs["rsp"]
    mem = b""
    addr = sp - 256  # the red zone: an epilogue's popped slots stay readable there
    while len(mem) < STACK:  # page by page, up to the end of the stack mapping
        n = 4096 - (addr % 4096)
        try:
            mem += bytes(inf.read_memory(addr, n))
        except gdb.MemoryError:
            break
        addr += n
    bt = []
    fr = frame
    while fr is not None and len(bt) < 64:
        if fr.type() != gdb.INLINE_FRAME:
            bt.append(int(fr.pc()))
        fr = fr.older()
    f.write(json.dumps({"entry": entry, "regs": regs, "stack_base": sp - 256, "stack": mem.hex(), "bt": bt}) + "\n")


stops = 0
with open(OUT, "w") as f:
    while stops < MAX:
        try:
            gdb.execute("continue", to_string=True)
        except gdb.error:
            break
        if not gdb.selected_inferior().pid:
            break
        dump(f)
        stops += 1
        for _ in range(STEPS):
            try:
                gdb.execute("stepi", to_string=True)
            except gdb.error:
                break
            if not gdb.selected_inferior().pid:
                break
            dump(f)
            stops += 1
gdb.execute("kill", to_string=True)
