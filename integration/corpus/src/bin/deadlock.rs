//! `deadlock`: a program whose stuck state is known exactly, for the wait-for
//! graph (`monitor async waits` / `deadlocks`).
//!
//! Usage: `deadlock [ct|mt]` (default mt, 2 workers). When every task below is
//! about to block it prints `deadlock ready pid=<pid>` (at `// bp: ready`).
//! The stuck state, as the source makes it:
//! * `lock_ab` / `lock_ba`: each holds one `tokio::sync::Mutex` and waits for
//!   the other's: a cycle;
//! * `joiner`: awaits the `JoinHandle` of `lock_ab`: blocked behind the cycle;
//! * `lonely`: waits on a `Notify` that lives in its own future: no other task
//!   can reach it, nothing can wake it;
//! * and tasks that are NOT stuck: `sleeper` (a timer wakes it), `receiver`
//!   (an mpsc channel whose sender `sender_holder` keeps while it sleeps: it
//!   can still send), `once_waiter` (a oneshot whose sender `sender_holder`
//!   keeps too), and main's `run`, which sleeps in a loop.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, Barrier, Mutex, Notify};

const BLOCKING: usize = 7;
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

async fn joiner(handle: tokio::task::JoinHandle<u64>) -> u64 {
    about_to_block();
    handle.await.unwrap_or(0) // await: joiner -> handle
}

async fn lonely() -> u64 {
    let notify = Notify::new();
    about_to_block();
    notify.notified().await; // await: lonely -> notify
    1
}

async fn sleeper() {
    about_to_block();
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: sleeper -> sleep
}

async fn receiver(mut rx: mpsc::Receiver<u64>) -> Option<u64> {
    about_to_block();
    rx.recv().await // await: receiver -> recv
}

async fn once_waiter(rx: oneshot::Receiver<u64>) -> u64 {
    about_to_block();
    rx.await.unwrap_or(0) // await: once_waiter -> oneshot
}

async fn sender_holder(tx: mpsc::Sender<u64>, once: oneshot::Sender<u64>) {
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: sender_holder -> sleep
    let _ = tx.send(1).await;
    let _ = once.send(2);
}

async fn run() {
    let m1 = Arc::new(Mutex::new(1));
    let m2 = Arc::new(Mutex::new(2));
    let both = Arc::new(Barrier::new(2));
    let (tx, rx) = mpsc::channel::<u64>(1);
    let (once_tx, once_rx) = oneshot::channel::<u64>();
    let ab = tokio::spawn(lock_ab(m1.clone(), m2.clone(), both.clone()));
    let _handles = (
        tokio::spawn(lock_ba(m1.clone(), m2.clone(), both)),
        tokio::spawn(joiner(ab)),
        tokio::spawn(lonely()),
        tokio::spawn(sleeper()),
        tokio::spawn(receiver(rx)),
        tokio::spawn(once_waiter(once_rx)),
        tokio::spawn(sender_holder(tx, once_tx)),
    );
    while ABOUT_TO_BLOCK.load(Ordering::SeqCst) < BLOCKING {
        tokio::time::sleep(Duration::from_millis(5)).await; // await: run -> sleep
    }
    // Each task counts itself just before its last await; give it time to park.
    tokio::time::sleep(Duration::from_millis(100)).await; // await: run -> sleep
    assert!(m1.try_lock().is_err() && m2.try_lock().is_err(), "deadlock not reached");
    println!("deadlock ready pid={}", std::process::id()); // bp: ready
    use std::io::Write;
    std::io::stdout().flush().expect("flush stdout");
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await; // await: run -> sleep
    }
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
            eprintln!("usage: deadlock [ct|mt]  (got {other:?})");
            std::process::exit(2)
        }
    };
    let rt = builder.enable_time().build().expect("tokio runtime");
    rt.block_on(run());
}
