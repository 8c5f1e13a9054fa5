//! `stuck`: a program whose every task is stuck, for reflection (attach
//! later with `gdbserver --attach`).
//!
//! Usage: `stuck [ct|mt]` (default mt, 2 workers). Stuck tasks:
//! * `lock_ab` / `lock_ba`: a deadlock on two `tokio::sync::Mutex`es;
//! * `sleeper`: a `sleep` of an hour;
//! * `receiver`: an mpsc channel nobody sends on (the sender is kept alive);
//! * `oneshot_waiter`: a oneshot whose sender is kept alive and never used.
//! When all five are about to block it prints `stuck ready pid=<pid>`, then
//! the main task waits forever (it is stuck too: `pending`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Barrier, Mutex};

const STUCK_TASKS: usize = 5;
static ABOUT_TO_BLOCK: AtomicUsize = AtomicUsize::new(0);

fn about_to_block() {
    ABOUT_TO_BLOCK.fetch_add(1, Ordering::SeqCst);
}

async fn lock_ab(first: Arc<Mutex<u64>>, second: Arc<Mutex<u64>>, both: Arc<Barrier>) -> u64 {
    let held = first.lock().await; // await: lock_ab -> lock
    both.wait().await; // await: lock_ab -> barrier
    about_to_block();
    let other = second.lock().await; // await: lock_ab -> lock
    *held + *other
}

async fn lock_ba(first: Arc<Mutex<u64>>, second: Arc<Mutex<u64>>, both: Arc<Barrier>) -> u64 {
    let held = second.lock().await; // await: lock_ba -> lock
    both.wait().await; // await: lock_ba -> barrier
    about_to_block();
    let other = first.lock().await; // await: lock_ba -> lock
    *held + *other
}

async fn sleeper() {
    about_to_block();
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: sleeper -> sleep
}

async fn receiver(mut rx: mpsc::Receiver<u64>) -> Option<u64> {
    about_to_block();
    rx.recv().await // await: receiver -> recv
}

async fn oneshot_waiter(rx: oneshot::Receiver<u64>) -> u64 {
    about_to_block();
    rx.await.unwrap_or(0) // await: oneshot_waiter -> oneshot
}

async fn run() {
    let m1 = Arc::new(Mutex::new(1));
    let m2 = Arc::new(Mutex::new(2));
    let both = Arc::new(Barrier::new(2));
    let (_tx, rx) = mpsc::channel::<u64>(1);
    let (_once_tx, once_rx) = oneshot::channel::<u64>();
    let _handles = (
        tokio::spawn(lock_ab(m1.clone(), m2.clone(), both.clone())),
        tokio::spawn(lock_ba(m1.clone(), m2.clone(), both)),
        tokio::spawn(sleeper()),
        tokio::spawn(receiver(rx)),
        tokio::spawn(oneshot_waiter(once_rx)),
    );
    while ABOUT_TO_BLOCK.load(Ordering::SeqCst) < STUCK_TASKS {
        tokio::time::sleep(Duration::from_millis(5)).await; // await: run -> sleep
    }
    // Each task counts itself just before its last await; give it time to park.
    tokio::time::sleep(Duration::from_millis(100)).await; // await: run -> sleep
    assert!(m1.try_lock().is_err() && m2.try_lock().is_err(), "deadlock not reached");
    println!("stuck ready pid={}", std::process::id()); // bp: stuck_ready
    use std::io::Write;
    std::io::stdout().flush().expect("flush stdout");
    std::future::pending::<()>().await; // await: run -> pending
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "mt".to_string());
    let mut builder = match mode.as_str() {
        "ct" => tokio::runtime::Builder::new_current_thread(),
        "mt" => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
        other => {
            eprintln!("usage: stuck [ct|mt]  (got {other:?})");
            std::process::exit(2)
        }
    };
    let rt = builder.enable_time().build().expect("tokio runtime");
    rt.block_on(run());
}
