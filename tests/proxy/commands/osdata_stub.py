"""A minimal RSP responder on stdin/stdout that serves our osdata tables.

Not a stub: just enough protocol (qSupported, ?, g, qXfer:osdata) for a real
gdb 13.1 to connect through ``target remote | python3 -m tests.proxy.commands.osdata_stub TYPES`` (PYTHONPATH: the repository root)
and parse our XML with its own osdata DTD. Used by test_osdata_gdb.py.
"""
import re, sys
from proxy.commands.osdata import osdata_table, merge_osdata_types
from tests.proxy.graph.graphfix import Script, engine, snapshot
s = Script(); s.enter("sel", 0x200000); s.enter("x", 0x200100); s.exit(3); s.enter("y", 0x200200); s.exit(1); s.exit(3)
e = engine(); e.feed_many(s.events)
docs = {"async-tasks": osdata_table("async-tasks", snapshot(e)), "async-edges": osdata_table("async-edges", snapshot(e)),
        "": merge_osdata_types(open(sys.argv[1], "rb").read())}
inp, out = sys.stdin.buffer, sys.stdout.buffer
def esc(b):
    return re.sub(rb"[#$}*]", lambda m: b"}" + bytes([m.group(0)[0] ^ 0x20]), b)
def send(body):
    out.write(b"$" + body + b"#%02x" % (sum(body) & 0xff)); out.flush()
buf = b""
while True:
    c = inp.read(1)
    if not c: break
    if not buf and c in b"+-": continue
    if c == b"\x03": send(b"S02"); continue
    buf += c
    m = re.match(rb"\$(.*)#..", buf, re.S)
    if not m: continue
    pkt = m.group(1); buf = b""; out.write(b"+")
    if pkt.startswith(b"qSupported"): send(b"PacketSize=4000;qXfer:osdata:read+")
    elif pkt == b"?": send(b"S05")
    elif pkt == b"g": send(b"00" * 8 * 17 + b"00" * 4 * 7)
    elif pkt.startswith(b"qXfer:osdata:read:"):
        annex, rng = pkt[len(b"qXfer:osdata:read:"):].split(b":")
        off, ln = (int(x, 16) for x in rng.split(b","))
        d = docs[annex.decode()][off:off + ln]
        send((b"l" if off + ln >= len(docs[annex.decode()]) else b"m") + esc(d))
    elif pkt.startswith(b"m"): send(b"E01")
    elif pkt == b"k": break
    else: send(b"")
