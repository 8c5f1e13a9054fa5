"""The server benchmark's axum service (bench/server, axum 0.8 / hyper 1.11 / tokio 1.53, release)
read by `asyncrsp tree PID` with an idle keep-alive connection open, both builds (bare and
console-subscriber's).

axum's connection task is `loop { tokio::select! { result = conn.as_mut() => .., _ = &mut
signal_closed => .. } }`. select!'s tuple holds the branches' futures themselves (here a `Pin<&mut
UpgradeableConnection>` and a `&mut Fuse<..>`; tokio 1.53's macros/select.rs), and its `disabled`
mask says which ended: branch 0 has not. Between two requests hyper's HTTP/1 dispatcher has no
service future in flight (`Server { in_flight: Pin<Box<Option<F>>>, .. }` is None): the tree showed
that as branch 0 `core::option::Option (None) [completed]`, and the wait analysis then saw the task
waiting on its other branch alone (the watch channel's Notify) and reported "nothing can wake" it.
Branch 0 is hyper-util's connection, pending (it waits on its socket).

That Notify is watch's `notify_tx`, a field 0x100 into the channel's Arc data, awaited by
`Sender::closed()` in the connection task and in the main task: the word 16 bytes before it (the end
of another Notify, 0) was read as an Arc strong count, "references held by no other task (Arc strong
count 0)", no waker. Counts no live Arc has make the wait unknown (`tree --json`'s waits)."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.server import build_server
from integration.harness.stubs import free_port, port_listening

ROOT = Path(__file__).resolve().parents[1]

BRANCH0 = re.compile(r"^ *├╼ \[branch 0\] (.*)$", re.M)


@pytest.mark.parametrize("variant", ["bare", "console"])
def test_an_idle_connections_select_branch_is_its_pending_connection(variant: str) -> None:
    if build_server.missing(variant):
        pytest.skip(str(build_server.missing(variant)))
    prog = build_server.binary(variant)
    port = free_port()
    p = subprocess.Popen([str(prog), str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env={**os.environ, "TOKIO_CONSOLE_BIND": f"127.0.0.1:{free_port()}"})
    try:
        deadline = time.monotonic() + 60
        while not port_listening(port):
            assert p.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for _ in range(3):
            conn.request("GET", "/")
            assert conn.getresponse().read()
        time.sleep(0.3)  # the response written: the connection task back in its select!, idle
        out = subprocess.run([sys.executable, "-m", "proxy", "tree", str(p.pid)], cwd=ROOT, capture_output=True,
                             text=True, timeout=300)
        js = subprocess.run([sys.executable, "-m", "proxy", "tree", "--json", str(p.pid)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
        assert p.poll() is None, "the server died"
        conn.request("GET", "/")  # and it goes on serving
        assert conn.getresponse().read()
    finally:
        p.kill()
        p.wait()
    assert out.returncode == 0, out.stderr
    text = out.stdout
    # the connection task (the console build: inside tracing's Instrumented) and its select!
    task = re.search(r"^task #(\d+) .*handle_connection.*\n(?:[^t].*\n)*", text, re.M)
    assert task, text[-3000:]
    branches = BRANCH0.findall(task.group(0))
    assert branches == ["hyper_util::server::conn::auto::UpgradeableConnection (pending; inside, "
                        "hyper::proto::h1::dispatch::Server has nothing in flight: its in_flight is None)"], task.group(0)
    assert "[completed]" not in task.group(0), task.group(0)
    assert not re.search(rf"^(nothing can wake|blocked): #{task.group(1)} ", text, re.M), text[-3000:]
    # the waits on watch::Sender::closed() (the connection task's and the main task's): unknown
    assert js.returncode == 0, js.stderr
    closed = [w for t in json.loads(js.stdout)["tasks"] for w in t["waits"]
              if w["resource"]["kind"] == "Notify" and "tokio::sync::watch::" in w["evidence"]
              and "::closed::" in w["evidence"]]
    assert closed, js.stdout[-3000:]
    for w in closed:
        assert w["wakers"] is None and "no live Arc header" in w["evidence"], w
