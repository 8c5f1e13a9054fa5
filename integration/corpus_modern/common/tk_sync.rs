//! `tk_sync`: tokio's combinators and sync primitives, each awaited by its own
//! spawned task that stays parked forever (tokio 1.43 and 1.53):
//! join!/select!/try_join!, JoinSet, timeout, spawn_blocking, LocalSet,
//! Notify, RwLock, Semaphore, Barrier, watch, broadcast, mpsc, oneshot and a
//! tokio-stream stream. When every task is about to park, `run` stops at the
//! `parked` marker, then waits forever.
//!
//! Usage: `tk_sync [ct|mt]` (default ct; mt: 2 workers).

#[path = "rt.rs"]
mod rt;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, oneshot, watch, Barrier, Notify, RwLock, Semaphore};
use tokio::task::JoinSet;
use tokio_stream::StreamExt;

const PARKED: usize = 14;
static ABOUT_TO_PARK: AtomicUsize = AtomicUsize::new(0);

fn about_to_park() {
    ABOUT_TO_PARK.fetch_add(1, Ordering::SeqCst);
}

const HOUR: Duration = Duration::from_secs(3600);

async fn nap() {
    tokio::time::sleep(HOUR).await; // await: nap -> sleep
}

async fn fails() -> Result<(), String> {
    tokio::time::sleep(HOUR).await; // await: fails -> sleep
    Err("never".into())
}

async fn joiner() {
    about_to_park();
    tokio::join!(nap(), nap()); // await: joiner -> join
}

async fn try_joiner() -> Result<(), String> {
    about_to_park();
    tokio::try_join!(fails(), fails())?; // await: try_joiner -> join
    Ok(())
}

async fn selector(mut rx: mpsc::Receiver<u64>) {
    about_to_park();
    tokio::select! { // await: selector -> select
        _ = rx.recv() => {}
        _ = nap() => {}
    }
}

async fn timed() {
    about_to_park();
    let _ = tokio::time::timeout(HOUR, nap()).await; // await: timed -> timeout
}

async fn notified(notify: Arc<Notify>) {
    about_to_park();
    notify.notified().await; // await: notified -> notify
}

async fn writer(lock: Arc<RwLock<u64>>) {
    about_to_park();
    *lock.write().await += 1; // await: writer -> write
}

async fn permit(sem: Arc<Semaphore>) {
    about_to_park();
    let _p = sem.acquire().await; // await: permit -> acquire
}

async fn barrier(b: Arc<Barrier>) {
    about_to_park();
    b.wait().await; // await: barrier -> barrier
}

async fn watcher(mut rx: watch::Receiver<u64>) {
    about_to_park();
    let _ = rx.changed().await; // await: watcher -> changed
}

async fn listener(mut rx: broadcast::Receiver<u64>) {
    about_to_park();
    let _ = rx.recv().await; // await: listener -> recv
}

async fn once(rx: oneshot::Receiver<u64>) {
    about_to_park();
    let _ = rx.await; // await: once -> oneshot
}

async fn streamer(rx: mpsc::Receiver<u64>) {
    let mut stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    about_to_park();
    let _ = stream.next().await; // await: streamer -> next
}

async fn set_owner() {
    let mut set = JoinSet::new();
    set.spawn(nap());
    set.spawn(nap());
    about_to_park();
    let _ = set.join_next().await; // await: set_owner -> join_next
}

async fn blocking_waiter(gate: std::sync::mpsc::Receiver<()>) {
    let handle = tokio::task::spawn_blocking(move || gate.recv());
    about_to_park();
    let _ = handle.await; // await: blocking_waiter -> handle
}

async fn local_nap() {
    tokio::time::sleep(HOUR).await; // await: local_nap -> sleep
}

async fn run() {
    let (_tx, rx) = mpsc::channel::<u64>(1);
    let (_tx2, rx2) = mpsc::channel::<u64>(1);
    let (_once_tx, once_rx) = oneshot::channel::<u64>();
    let (_watch_tx, watch_rx) = watch::channel(0u64);
    let (bcast_tx, bcast_rx) = broadcast::channel::<u64>(4);
    let (_gate_tx, gate_rx) = std::sync::mpsc::channel::<()>();
    let lock = Arc::new(RwLock::new(0u64));
    let _reading = lock.clone().read_owned().await; // await: run -> read
    let _handles = vec![
        tokio::spawn(joiner()),
        tokio::spawn(async { let _ = try_joiner().await; }), // await: run::{async_block} -> try_joiner
        tokio::spawn(selector(rx)),
        tokio::spawn(timed()),
        tokio::spawn(notified(Arc::new(Notify::new()))),
        tokio::spawn(writer(lock.clone())),
        tokio::spawn(permit(Arc::new(Semaphore::new(0)))),
        tokio::spawn(barrier(Arc::new(Barrier::new(2)))),
        tokio::spawn(watcher(watch_rx)),
        tokio::spawn(listener(bcast_rx)),
        tokio::spawn(once(once_rx)),
        tokio::spawn(streamer(rx2)),
        tokio::spawn(set_owner()),
        tokio::spawn(blocking_waiter(gate_rx)),
    ];
    let local = tokio::task::LocalSet::new();
    let _local_task = local.spawn_local(local_nap());
    local
        .run_until(async {
            while ABOUT_TO_PARK.load(Ordering::SeqCst) < PARKED {
                tokio::time::sleep(Duration::from_millis(5)).await; // await: run::{async_block} -> sleep
            }
            // Each task counts itself just before its last await; give it time to park.
            tokio::time::sleep(Duration::from_millis(100)).await; // await: run::{async_block} -> sleep
            rt::ready("tk_sync"); // bp: parked
            std::future::pending::<()>().await; // await: run::{async_block} -> pending
        })
        .await; // await: run -> run_until
    drop(bcast_tx);
}

fn main() {
    rt::tokio_runtime("tk_sync").block_on(run());
}
