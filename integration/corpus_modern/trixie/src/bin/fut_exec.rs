//! `fut_exec`: futures 0.3.31's own executor (`LocalPool`). Spawned tasks,
//! parked forever: `once` (a futures oneshot), `stream` (an mpsc receiver's
//! `next()`), `both` (`join!` of the two) and `either` (`select!` of a oneshot
//! and a pending future). main's `run_until` block stops at the `parked` marker.

#[path = "../../../common/rt.rs"]
mod rt;

use futures::channel::{mpsc, oneshot};
use futures::executor::LocalPool;
use futures::task::LocalSpawnExt;
use futures::{FutureExt, StreamExt};
use std::cell::Cell;
use std::rc::Rc;

async fn once(rx: oneshot::Receiver<u64>, parked: Rc<Cell<usize>>) {
    parked.set(parked.get() + 1);
    let _ = rx.await; // await: once -> oneshot
}

async fn stream(mut rx: mpsc::Receiver<u64>, parked: Rc<Cell<usize>>) {
    parked.set(parked.get() + 1);
    let _ = rx.next().await; // await: stream -> next
}

async fn both(a: oneshot::Receiver<u64>, b: mpsc::Receiver<u64>, parked: Rc<Cell<usize>>) {
    let p = parked.clone();
    futures::join!(once(a, parked), stream(b, p)); // await: both -> join
}

async fn either(rx: oneshot::Receiver<u64>, parked: Rc<Cell<usize>>) {
    parked.set(parked.get() + 1);
    let mut never = futures::future::pending::<()>().fuse();
    let mut rx = rx.fuse();
    futures::select! { // await: either -> select
        _ = rx => {}
        _ = never => {}
    }
}

/// Pending once, waking itself: the pool polls the spawned tasks, then this again.
async fn yield_once() {
    let mut yielded = false;
    futures::future::poll_fn(|cx| {
        if yielded {
            return std::task::Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
    .await // await: yield_once -> poll_fn
}

/// The marker's call stays a call: `rt::ready` inlined into LocalPool's inlined `run_until`
/// left no line-table row for the marker's line in release builds, so a breakpoint there
/// went to line 75 and never stopped (with or without the proxy).
#[inline(never)]
fn ready() {
    rt::ready("fut_exec");
}

fn main() {
    let mut pool = LocalPool::new();
    let spawner = pool.spawner();
    let parked = Rc::new(Cell::new(0));
    let (_t1, r1) = oneshot::channel::<u64>();
    let (_t2, r2) = mpsc::channel::<u64>(1);
    let (_t3, r3) = oneshot::channel::<u64>();
    let (_t4, r4) = oneshot::channel::<u64>();
    spawner.spawn_local(once(r1, parked.clone())).expect("spawn");
    let (_t5, r5) = mpsc::channel::<u64>(1);
    spawner.spawn_local(stream(r5, parked.clone())).expect("spawn");
    spawner.spawn_local(both(r3, r2, parked.clone())).expect("spawn");
    spawner.spawn_local(either(r4, parked.clone())).expect("spawn");
    pool.run_until(async {
        while parked.get() < 5 {
            yield_once().await; // await: main::{async_block} -> yield
        }
        ready(); // bp: parked
        futures::future::pending::<()>().await; // await: main::{async_block} -> pending
    });
}
