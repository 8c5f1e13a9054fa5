//! `smol_app`: smol 2.0 (async-executor, async-io timers, async-channel,
//! async-lock). Tasks spawned on one `Executor`, parked forever: `sleeper`,
//! `receiver`, `holder` (keeps an async Mutex locked while it sleeps) and
//! `locker` (waits for it). main runs the executor on its own thread
//! (`smol_app ct`) or on two more threads as well (`smol_app mt`); when all
//! four tasks are about to park, main's block stops at the `parked` marker.

#[path = "../../../common/rt.rs"]
mod rt;

use smol::lock::Mutex;
use smol::{channel, Executor, Timer};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

static ABOUT_TO_PARK: AtomicUsize = AtomicUsize::new(0);
static EX: Executor<'static> = Executor::new();

fn about_to_park() {
    ABOUT_TO_PARK.fetch_add(1, Ordering::SeqCst);
}

async fn sleeper() {
    about_to_park();
    Timer::after(Duration::from_secs(3600)).await; // await: sleeper -> timer
}

async fn receiver(rx: channel::Receiver<u64>) {
    about_to_park();
    let _ = rx.recv().await; // await: receiver -> recv
}

async fn holder(lock: Arc<Mutex<u64>>) {
    let guard = lock.lock().await; // await: holder -> lock
    about_to_park();
    Timer::after(Duration::from_secs(3600)).await; // await: holder -> timer
    drop(guard);
}

async fn locker(lock: Arc<Mutex<u64>>) {
    about_to_park();
    let _guard = lock.lock().await; // await: locker -> lock
}

fn main() {
    let workers = if rt::multi_thread("smol_app") { 2 } else { 0 };
    for _ in 0..workers {
        std::thread::spawn(|| smol::block_on(EX.run(smol::future::pending::<()>())));
    }
    smol::block_on(EX.run(async {
        let lock = Arc::new(Mutex::new(0u64));
        let (_tx, rx) = channel::bounded::<u64>(1);
        let _tasks = vec![EX.spawn(sleeper()), EX.spawn(receiver(rx)), EX.spawn(holder(lock.clone()))];
        while ABOUT_TO_PARK.load(Ordering::SeqCst) < 3 {
            Timer::after(Duration::from_millis(5)).await; // await: main::{async_block} -> timer
        }
        let _locker = EX.spawn(locker(lock.clone()));
        while ABOUT_TO_PARK.load(Ordering::SeqCst) < 4 {
            Timer::after(Duration::from_millis(5)).await; // await: main::{async_block} -> timer
        }
        Timer::after(Duration::from_millis(100)).await; // await: main::{async_block} -> timer
        rt::ready("smol_app"); // bp: parked
        smol::future::pending::<()>().await; // await: main::{async_block} -> pending
    }))
}
