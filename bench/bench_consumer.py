"""The proxy's consumer under uprobe capture: CPU per ring record, replayed from real records.

    .venv/bin/python -m bench.bench_consumer [--records PATH] [--record] [--rounds 5] [--reps 3]
                                             [--against REF] [--profile] [--server axum|corpus]

A recording (made first when PATH does not exist, or again with `--record`):
the server of bench/bench_server.py (`--server axum`, the default: the axum
0.8 service, release; or the corpus' http_server) under full-mode uprobe
capture (the default one: nested one-poll coroutines counted in the kernel),
nobody reading, 50 warm-up requests and the return-site step as the proxy
does, then 2 s of `wrk -t1 -c16`; the program is stopped and the ring's
records copied out to PATH (a pickle, default
``$TMPDIR/asyncrsp-consumer-<server>-release.pkl``: not in git), with the
site table and the request count.

The replay: the records folded through ``RingFold.feed`` (the
capture's decode-and-feed loop, 4096 records a batch as ``RingFold.run`` does)
into a fresh engine without event log (as uprobe capture runs it), the heap
frozen and the young generation at 10,000 as the proxy does once the
program is analysed (``proxy.shell.link.settle_heap``). CPU time
(``time.process_time``), the best of `--reps` replays in one process, one
process per tree and round, rounds alternated. Printed: µs per record and per
request, and the same-run baselines: the decoder alone over the same records
(``Decoder.decode_at``) and a bare loop over the records' spans, with the
consumer's ratio to each.

`--against REF`: the same replay with the proxy of git revision REF (a
temporary `git worktree` of REF) in the same rounds, for before/after
figures in one invocation; the engine states at the end are compared too
(task ids, parents, phases, polls, edges, counters: equal unless the change
meant them to differ).

`--profile`: one replay under cProfile, the top functions by own time.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BATCH = 4096  # records per feed call (fold.py's BATCH)
FORMAT = 1


def default_path(server: str) -> Path:
    return Path(tempfile.gettempdir()) / f"asyncrsp-consumer-{server}-release.pkl"


# ---- recording -------------------------------------------------------------------------


def record(path: Path, server_kind: str, seconds: float, conns: int) -> None:
    """The server under full-mode uprobes, nobody reading; the ring's records to `path`."""
    from bench import bench_server as bs

    from integration.harness.stubs import free_port, port_listening
    from integration.harness.uprobes import spawn_stopped
    from proxy.analysis.inventory import build_inventory
    from proxy.capture.uprobes.capture import UprobeCapture
    from proxy.graph.catalog import Catalog
    from proxy.graph.engine import Engine

    server = bs.Server(server_kind, "release")
    wrk = bs.ensure_wrk()
    port = free_port()
    pid = spawn_stopped([str(server.prog), str(port)])
    cap = None
    try:
        inv = build_inventory(str(server.prog))
        bias = 0x555555554000 if inv.pie else 0  # spawn_stopped turns ASLR off
        target = SimpleNamespace(path=str(server.prog), pid=pid, local=True, inventory=inv, bias=bias,
                                 engine=Engine(Catalog(inv, bias)), note=None, extra={})
        cap = UprobeCapture(ring_bytes=512 << 20)
        cap.plan(target)  # type: ignore[arg-type]
        cap.install()
        if not cap.attached:
            raise SystemExit(f"bench_consumer: uprobes not attached: {cap.note}")
        os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while not port_listening(port) and time.monotonic() < deadline:
            time.sleep(0.01)
        warm = 50
        for _ in range(warm):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30).read()
        cap.returns.step(force=True)  # the return sites of vtable polls, as in the proxy's first 0.5 s
        for th in cap.returns.closing:
            th.join()
        res = subprocess.run([wrk, "-t1", f"-c{conns}", f"-d{seconds:g}s", f"http://127.0.0.1:{port}/"],
                             capture_output=True, text=True, check=True)
        os.kill(pid, signal.SIGSTOP)
        m = bs.WRK_REQUESTS.search(res.stdout)
        requests = (int(m.group(1)) if m else 0) + warm
        assert cap._ring is not None and cap.decoder is not None
        got = cap._ring.copy_out()
        if got is None:
            raise SystemExit("bench_consumer: the ring is empty")
        chunk, spans = got
        drops = cap._prog.counters().get("drops", 0) if cap._prog is not None else 0
        data = dict(format=FORMAT, server=server_kind, prog=str(server.prog), bias=bias,
                    sites=[(s.kind, s.site, s.addr, s.sp_adjust) for s in cap.decoder.sites],
                    fn_site=dict(cap._fn_site), chunk=bytes(chunk), spans=list(spans), requests=requests,
                    drops=drops, load=os.getloadavg()[0], made=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
        tmp = path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            pickle.dump(data, f, protocol=pickle.HIGHEST_PROTOCOL)
        tmp.replace(path)
        print(f"recorded {len(spans):,} records ({len(chunk) / 1e6:.1f} MB), {requests:,} requests, "
              f"{drops} dropped -> {path}", flush=True)
    finally:
        if cap is not None:
            cap.uninstall()
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


# ---- replay (run in a child process, with the proxy of one tree) ------------------------


def _load(path: Path) -> tuple[dict[str, Any], Any, Any]:
    """The recording, the program's inventory and the site table; then the heap
    settled as the proxy does once the program is analysed."""
    import gc

    from proxy.analysis.inventory import build_inventory
    from proxy.capture.uprobes.decode import SiteInfo

    with open(path, "rb") as f:
        data = pickle.load(f)
    inv = build_inventory(data["prog"])
    sites = [SiteInfo(*s) for s in data["sites"]]
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, *gc.get_threshold()[1:])
    return data, inv, sites


def _fresh(data: dict[str, Any], inv: Any, sites: Any) -> tuple[Any, Any, Any]:
    from proxy.capture.uprobes.capture import UprobeCapture
    from proxy.capture.uprobes.decode import Decoder
    from proxy.graph.catalog import Catalog
    from proxy.graph.engine import Engine

    eng = Engine(Catalog(inv, data["bias"]), keep_log=False)
    cap = UprobeCapture()
    dec = Decoder(sites, first_seq=1, fn_sites=data["fn_site"])
    cap.target = SimpleNamespace(engine=eng)
    cap.decoder, cap._fn_site = dec, data["fn_site"]
    return cap, dec, eng


def replay_once(data: dict[str, Any], inv: Any, sites: Any) -> tuple[float, Any]:
    cap, dec, eng = _fresh(data, inv, sites)
    spans, buf = data["spans"], data["chunk"]
    feed = cap.fold.feed if hasattr(cap, "fold") else cap._feed  # a revision from before fold.py: its own
    t0 = time.process_time()
    for i in range(0, len(spans), BATCH):
        feed(buf, spans[i:i + BATCH], dec, eng)
    return time.process_time() - t0, eng


def decode_once(data: dict[str, Any], sites: Any) -> float:
    from proxy.capture.uprobes.decode import Decoder

    dec = Decoder(sites, first_seq=1, fn_sites=data["fn_site"])
    decode, buf, spans = dec.decode_at, data["chunk"], data["spans"]
    t0 = time.process_time()
    for off, n in spans:
        decode(buf, off, n)
    return time.process_time() - t0


def loop_once(data: dict[str, Any]) -> float:
    buf, spans = data["chunk"], data["spans"]
    sink = 0
    t0 = time.process_time()
    for off, n in spans:
        sink += buf[off]
    return time.process_time() - t0


def state_of(eng: Any) -> dict[str, Any]:
    """The engine's state, comparable across trees: tasks, edges, scopes, counters."""
    g = eng._g
    tasks = sorted((r.id, r.self_ptr, r.site, r.generation, r.phase, r.state_value, r.running_on, r.polls,
                    r.parent, r.busy_ns, r.idle_ns, r.finished, r.dropped, r.exits_missed, r.first_seq,
                    r.last_seq) for r in g.tasks.values())
    edges = sorted((e.parent, e.child, e.callsite_addr, e.await_value, e.first_seq, e.last_seq, e.completed,
                    e.dropped) for e in g.edges.values())
    scopes = sorted((t, [(s.task, s.site, s.sp, s.entry_seq, s.nested) for s in st]) for t, st in g.scopes.items())
    st = eng.stats()
    timing = sorted((k, v.polls, v.raw_ns, v.events) for k, v in eng.timing.tasks.items())
    return dict(tasks=tasks, edges=edges, scopes=scopes, next_id=g.next_id, finished=len(g.finished),
                stats=[st.events, st.enters, st.exits, st.rejected, st.exits_missed, st.unmatched_exits,
                       st.tasks_seen, st.completed_evicted, st.stale_evicted, st.pending_reads],
                timing=timing, leaf_polls=eng.timing.leaf_polls)


def worker(path: Path, reps: int, what: str) -> None:
    """One tree's figures, as JSON on stdout (run with that tree on sys.path)."""
    import gc
    import hashlib

    data, inv, sites = _load(path)
    out: dict[str, Any] = {}
    if what == "consumer":
        times = []
        eng = None
        for _ in range(reps):
            t, eng = replay_once(data, inv, sites)
            times.append(t)
            del eng
            gc.collect()
        t, eng = replay_once(data, inv, sites)
        times.append(t)
        st = eng.stats()
        out = dict(times=times, tasks_seen=st.tasks_seen, events=st.events,
                   state=hashlib.sha256(json.dumps(state_of(eng)).encode()).hexdigest()[:16])
    elif what == "decode":
        out = dict(times=[decode_once(data, sites) for _ in range(reps + 1)])
    else:
        out = dict(times=[loop_once(data) for _ in range(reps + 1)])
    print(json.dumps(out))


def profile(path: Path, top: int) -> None:
    import cProfile
    import pstats

    data, inv, sites = _load(path)
    replay_once(data, inv, sites)  # warm
    pr = cProfile.Profile()
    pr.enable()
    replay_once(data, inv, sites)
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(top)


def run_worker(tree: Path, path: Path, reps: int, what: str) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", what, "--tree", str(tree),
                          "--records", str(path), "--reps", str(reps)],
                         env=env, capture_output=True, text=True, check=False, cwd=str(tree))
    if res.returncode != 0:
        raise SystemExit(f"bench_consumer: the replay with {tree} failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def worktree_of(ref: str) -> Path:
    """A temporary git worktree of `ref` (removed at exit by the caller)."""
    d = Path(tempfile.mkdtemp(prefix="bench-consumer-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(d / "tree"), ref],
                   check=True, capture_output=True)
    return d / "tree"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=Path, help="the recording (default: $TMPDIR/asyncrsp-consumer-<server>-release.pkl)")
    ap.add_argument("--record", action="store_true", help="record again (else only when the file is missing)")
    ap.add_argument("--server", choices=["axum", "corpus"], default="axum")
    ap.add_argument("--seconds", type=float, default=2.0, help="wrk's -d when recording (2)")
    ap.add_argument("--connections", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each tree once per round (3)")
    ap.add_argument("--reps", type=int, default=2, help="replays per process: the best counts (2, +1)")
    ap.add_argument("--against", metavar="REF", help="also replay with git revision REF's proxy (e.g. main)")
    ap.add_argument("--profile", action="store_true", help="one replay under cProfile")
    ap.add_argument("--worker", choices=["consumer", "decode", "loop"], help=argparse.SUPPRESS)
    ap.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    path = args.records or default_path(args.server)
    if args.worker:
        worker(path, args.reps, args.worker)
        return 0
    if args.record or not path.exists():
        record(path, args.server, args.seconds, args.connections)
    if args.profile:
        profile(path, 30)
        return 0
    with open(path, "rb") as f:
        data = pickle.load(f)
    n, req = len(data["spans"]), data["requests"]
    print(f"recording: {path} ({data['server']}, made {data.get('made', '?')} at load {data.get('load', 0):.1f}): "
          f"{n:,} records, {req:,} requests ({n / req:.2f} records a request), {data.get('drops', 0)} dropped")
    print(f"replays: best of {args.reps + 1} per process, {args.rounds} rounds alternated; load average "
          f"{os.getloadavg()[0]:.2f} at the start", flush=True)
    trees: dict[str, Path] = {"this tree": ROOT}
    made = None
    if args.against:
        made = worktree_of(args.against)
        trees = {args.against: made, "this tree": ROOT}
    try:
        best: dict[str, list[float]] = {k: [] for k in [*trees, "decode", "loop"]}
        states: dict[str, set[str]] = {k: set() for k in trees}
        for rnd in range(args.rounds):
            for name, tree in trees.items():
                r = run_worker(tree, path, args.reps, "consumer")
                best[name].append(min(r["times"]))
                states[name].add(f"{r['state']} (tasks seen {r['tasks_seen']:,}, events {r['events']:,})")
            best["decode"].append(min(run_worker(ROOT, path, args.reps, "decode")["times"]))
            best["loop"].append(min(run_worker(ROOT, path, args.reps, "loop")["times"]))
            print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1] / n * 1e6:.3f}" for k, v in best.items())
                  + f" us/record (load {os.getloadavg()[0]:.2f})", flush=True)
    finally:
        if made is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(made)],
                           check=False, capture_output=True)
    loop = min(best["loop"]) / n * 1e6
    dec = min(best["decode"]) / n * 1e6
    print(f"\n{'':22} {'us/record':>10} {'us/request':>11} {'x decode':>9} {'x loop':>8}  (best of rounds; rounds)")
    for k, v in best.items():
        us = min(v) / n * 1e6
        print(f"{k:22} {us:10.3f} {us * n / req:11.2f} {us / dec:9.2f} {us / loop:8.0f}  "
              f"({', '.join(f'{t / n * 1e6:.3f}' for t in v)})")
    if args.against:
        a, b = (min(best[k]) for k in trees)
        print(f"this tree / {args.against}: {b / a:.3f} (medians: "
              f"{statistics.median(best['this tree']) / statistics.median(best[args.against]):.3f})")
    for k, s in states.items():
        print(f"engine state at the end, {k}: {', '.join(sorted(s))}")
    print(f"load average at the end {os.getloadavg()[0]:.2f} (2 cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
