"""Runs inside gdb (``gdb -batch -x gdb_count_exits.py PROGRAM``): counts, over
one whole run, the hits of a breakpoint at every resume function's entry and
at every exit the inventory found. Breakpoints never stop (``stop()`` returns
False). Configured by ASYNCRSP_EXITS_IN (JSON: {"entry": elf entry,
"entries": {addr: id}, "exits": {addr: id}}) and ASYNCRSP_EXITS_OUT."""

import json
import os
import re

import gdb  # type: ignore[import-not-found]

spec = json.load(open(os.environ["ASYNCRSP_EXITS_IN"]))
counts = {"entries": {}, "exits": {}}

gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("starti", to_string=True)
auxv = gdb.execute("info auxv", to_string=True)
bias = int(re.search(r"AT_ENTRY\s.*?(0x[0-9a-f]+)", auxv).group(1), 16) - spec["entry"]


class Counter(gdb.Breakpoint):
    def __init__(self, addr, kind, ident):
        super().__init__(f"*{addr + bias:#x}", internal=True)
        self.kind, self.ident = kind, ident

    def stop(self):
        c = counts[self.kind]
        c[self.ident] = c.get(self.ident, 0) + 1
        return False


for kind in ("entries", "exits"):
    for addr, ident in spec[kind].items():
        Counter(int(addr), kind, ident)
try:
    gdb.execute("continue", to_string=True)
except gdb.error:
    pass
with open(os.environ["ASYNCRSP_EXITS_OUT"], "w") as f:
    json.dump(counts, f)
