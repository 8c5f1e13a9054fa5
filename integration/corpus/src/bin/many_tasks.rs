//! `many_tasks`: K live tasks, all waiting, for the 1,000-live-task benchmark.
//!
//! Usage: `many_tasks [K] [ct|mt]` (default 1000 mt). Every task runs a small
//! chain `waiter -> chain -> notified` and waits on one shared `Notify`.
//! Prints `ready tasks=<K> pid=<pid>` once all are waiting. Then reads stdin:
//! a line `go` wakes every task, joins them and prints
//! `many_tasks done tasks=<K> sum=<n>`; end of input leaves them waiting
//! forever (kill the process to end it).

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

static WAITING: AtomicUsize = AtomicUsize::new(0);

async fn notified(id: u64, notify: Arc<Notify>) -> u64 {
    let wait = notify.notified();
    WAITING.fetch_add(1, Ordering::SeqCst);
    wait.await; // await: notified -> notify
    id * 2 // bp: task_woken
}

async fn chain(id: u64, notify: Arc<Notify>) -> u64 {
    notified(id, notify).await + 1 // await: chain -> notified
}

async fn waiter(id: u64, notify: Arc<Notify>) -> u64 {
    chain(id, notify).await // await: waiter -> chain
}

fn parse_args() -> (usize, String) {
    let mut args = std::env::args().skip(1);
    let count = match args.next() {
        None => 1000,
        Some(t) => t.parse().unwrap_or_else(|_| {
            eprintln!("usage: many_tasks [K] [ct|mt]  (bad K {t:?})");
            std::process::exit(2)
        }),
    };
    (count, args.next().unwrap_or_else(|| "mt".to_string()))
}

fn main() {
    let (count, mode) = parse_args();
    let mut builder = match mode.as_str() {
        "ct" => tokio::runtime::Builder::new_current_thread(),
        "mt" => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
        other => {
            eprintln!("usage: many_tasks [K] [ct|mt]  (bad mode {other:?})");
            std::process::exit(2)
        }
    };
    let rt = builder.enable_time().build().expect("tokio runtime");
    let notify = Arc::new(Notify::new());
    let handles: Vec<_> = rt.block_on(async {
        let handles: Vec<_> = (0..count as u64).map(|id| tokio::spawn(waiter(id, notify.clone()))).collect();
        while WAITING.load(Ordering::SeqCst) < count {
            tokio::time::sleep(Duration::from_millis(2)).await; // await: main::{async_block} -> sleep
        }
        // `notified()` registers on its first poll, just after the count.
        tokio::time::sleep(Duration::from_millis(50)).await; // await: main::{async_block} -> sleep
        handles
    });
    println!("ready tasks={count} pid={}", std::process::id()); // bp: many_ready
    std::io::stdout().flush().expect("flush stdout");
    let go = std::io::stdin().lock().lines().any(|line| line.map(|l| l.trim() == "go").unwrap_or(false));
    if !go {
        loop {
            std::thread::park();
        }
    }
    let sum = rt.block_on(async {
        notify.notify_waiters();
        let mut sum = 0;
        for handle in handles {
            sum += handle.await.expect("waiter task"); // await: main::{async_block} -> handle
        }
        sum
    });
    println!("many_tasks done tasks={count} sum={sum}");
}
