//! `lost_waker`: a task that loses its waker, built on purpose (tokio-console's
//! "lost waker" warning), next to tasks that keep theirs.
//!
//! Usage: `lost_waker [ct|mt]` (default ct). `forgetful` awaits a future that
//! clones the waker of its first poll, drops the clone and returns Pending: no
//! waker of the task is left anywhere, nothing can ever wake it. Not lost:
//! `sleeper` (its waker is in the timer) and `waiter` (in a Notify that main's
//! `run` keeps). Prints `lost_waker ready pid=<pid>` (at `// bp: ready`) once
//! each has been polled, then sleeps forever.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::Notify;

/// Pending forever; its first poll clones the waker and drops the clone (the bug).
struct Forgets {
    polled: bool,
}

impl Future for Forgets {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if !self.polled {
            self.polled = true;
            let kept = cx.waker().clone();
            drop(kept); // the waker is lost here
        }
        Poll::Pending
    }
}

async fn forgetful() {
    Forgets { polled: false }.await; // await: forgetful -> forgets
}

async fn sleeper() {
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: sleeper -> sleep
}

async fn waiter(notify: Arc<Notify>) {
    notify.notified().await; // await: waiter -> notified
}

async fn run() {
    let notify = Arc::new(Notify::new());
    let lost = tokio::spawn(forgetful());
    let timed = tokio::spawn(sleeper());
    let parked = tokio::spawn(waiter(notify.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await; // await: run -> sleep
    println!("lost_waker ready pid={}", std::process::id()); // bp: ready
    use std::io::Write;
    std::io::stdout().flush().expect("flush stdout");
    let _kept = (lost, timed, parked, notify);
    loop {
        tokio::time::sleep(Duration::from_secs(3600)).await; // await: run -> sleep
    }
}

fn main() {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "ct".to_string());
    let mut builder = match mode.as_str() {
        "ct" => tokio::runtime::Builder::new_current_thread(),
        "mt" => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
        other => {
            eprintln!("usage: lost_waker [ct|mt]  (got {other:?})");
            std::process::exit(2);
        }
    };
    builder.enable_all().build().expect("runtime").block_on(run());
}
