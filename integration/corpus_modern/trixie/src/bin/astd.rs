//! `astd`: async-std 1.13 (async-executor + async-io + async-channel +
//! async-lock underneath). Spawned tasks, parked forever: `sleeper` (an async-io
//! timer), `receiver` (a channel nobody sends on), `holder` (keeps an async
//! Mutex locked while it sleeps) and `locker` (waits for that Mutex). When all
//! four are about to park, main's block stops at the `parked` marker, then
//! waits forever.

#[path = "../../../common/rt.rs"]
mod rt;

use async_std::channel;
use async_std::sync::{Arc, Mutex};
use async_std::task;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static ABOUT_TO_PARK: AtomicUsize = AtomicUsize::new(0);

fn about_to_park() {
    ABOUT_TO_PARK.fetch_add(1, Ordering::SeqCst);
}

async fn sleeper() {
    about_to_park();
    task::sleep(Duration::from_secs(3600)).await; // await: sleeper -> sleep
}

async fn receiver(rx: channel::Receiver<u64>) {
    about_to_park();
    let _ = rx.recv().await; // await: receiver -> recv
}

async fn holder(lock: Arc<Mutex<u64>>) {
    let guard = lock.lock().await; // await: holder -> lock
    about_to_park();
    task::sleep(Duration::from_secs(3600)).await; // await: holder -> sleep
    drop(guard);
}

async fn locker(lock: Arc<Mutex<u64>>) {
    about_to_park();
    let _guard = lock.lock().await; // await: locker -> lock
}

fn main() {
    task::block_on(async {
        let lock = Arc::new(Mutex::new(0u64));
        let (_tx, rx) = channel::bounded::<u64>(1);
        let _tasks = vec![task::spawn(sleeper()), task::spawn(receiver(rx)), task::spawn(holder(lock.clone()))];
        while ABOUT_TO_PARK.load(Ordering::SeqCst) < 3 {
            task::sleep(Duration::from_millis(5)).await; // await: main::{async_block} -> sleep
        }
        let _locker = task::spawn(locker(lock.clone()));
        while ABOUT_TO_PARK.load(Ordering::SeqCst) < 4 {
            task::sleep(Duration::from_millis(5)).await; // await: main::{async_block} -> sleep
        }
        task::sleep(Duration::from_millis(100)).await; // await: main::{async_block} -> sleep
        rt::ready("astd"); // bp: parked
        std::future::pending::<()>().await; // await: main::{async_block} -> pending
    })
}
