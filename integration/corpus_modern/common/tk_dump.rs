//! `tk_dump`: the shape of the task dump example in tokio's design notes, for
//! tokio 1.43 and 1.53. Spawned tasks, all parked forever:
//! * `foo -> bar -> join!(buz -> baz -> sleep, fiz -> sleep)`;
//! * `holder` keeps a `tokio::sync::Mutex` locked while it sleeps, `waiter` waits for it;
//! * `receiver` waits on an mpsc channel, `oneshot_waiter` on a oneshot.
//! Built with `--cfg tokio_unstable --cfg tokio_taskdump`, `run` prints
//! `Handle::dump()` (every task's trace, between `==dump==` and `==end==`;
//! into the file `$TK_DUMP_FILE` names, if set) before it stops at the
//! `dumped` marker; other builds print nothing there.
//!
//! Usage: `tk_dump [ct|mt]` (default ct; mt: 2 workers).

#[path = "rt.rs"]
mod rt;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Mutex};

const PARKED: usize = 6;
static ABOUT_TO_PARK: AtomicUsize = AtomicUsize::new(0);

fn about_to_park() {
    ABOUT_TO_PARK.fetch_add(1, Ordering::SeqCst);
}

async fn foo() {
    bar().await; // await: foo -> bar
}

async fn bar() {
    tokio::join!(buz(), fiz()); // await: bar -> join
}

async fn buz() {
    baz().await; // await: buz -> baz
}

async fn baz() {
    about_to_park();
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: baz -> sleep
}

async fn fiz() {
    about_to_park();
    tokio::time::sleep(Duration::from_secs(7200)).await; // await: fiz -> sleep
}

async fn holder(lock: Arc<Mutex<u64>>) {
    let guard = lock.lock().await; // await: holder -> lock
    about_to_park();
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: holder -> sleep
    drop(guard);
}

async fn waiter(lock: Arc<Mutex<u64>>) -> u64 {
    about_to_park();
    let got = lock.lock().await; // await: waiter -> lock
    *got
}

async fn receiver(mut rx: mpsc::Receiver<u64>) -> Option<u64> {
    about_to_park();
    rx.recv().await // await: receiver -> recv
}

async fn oneshot_waiter(rx: oneshot::Receiver<u64>) -> u64 {
    about_to_park();
    rx.await.unwrap_or(0) // await: oneshot_waiter -> oneshot
}

async fn run() {
    let lock = Arc::new(Mutex::new(7));
    let (_tx, rx) = mpsc::channel::<u64>(1);
    let (_once_tx, once_rx) = oneshot::channel::<u64>();
    let _handles = (
        tokio::spawn(foo()),
        tokio::spawn(holder(lock.clone())),
        tokio::spawn(receiver(rx)),
        tokio::spawn(oneshot_waiter(once_rx)),
    );
    while ABOUT_TO_PARK.load(Ordering::SeqCst) < PARKED - 1 {
        tokio::time::sleep(Duration::from_millis(5)).await; // await: run -> sleep
    }
    let _waiting = tokio::spawn(waiter(lock.clone()));
    while ABOUT_TO_PARK.load(Ordering::SeqCst) < PARKED {
        tokio::time::sleep(Duration::from_millis(5)).await; // await: run -> sleep
    }
    // Each task counts itself just before its last await; give it time to park.
    tokio::time::sleep(Duration::from_millis(100)).await; // await: run -> sleep
    rt::task_dump().await; // await: run -> task_dump
    rt::ready("tk_dump"); // bp: dumped
    std::future::pending::<()>().await; // await: run -> pending
}

fn main() {
    rt::tokio_runtime("tk_dump").block_on(run());
}
