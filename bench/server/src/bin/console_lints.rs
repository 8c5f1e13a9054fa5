//! `console_lints`: tasks that set off tokio-console's three warnings on purpose, built with
//! console-subscriber (the `console` feature, `--cfg tokio_unstable`), so that console's
//! recording (`TOKIO_CONSOLE_RECORD_PATH`) and `monitor async warnings` can be compared for
//! the very same tasks (integration/test_console_warnings.py).
//!
//! Usage: `console_lints` (a multi-thread runtime, 4 workers). The tasks, one spawn line each:
//! * `forgetful`: clones its waker, drops the clone and returns Pending: a lost waker;
//! * `self_waker`: wakes itself (from inside its own poll) three times for each timer wake:
//!   75% self-wakes;
//! * `hog`: its first poll never returns (a blocking sleep on a worker): never yielded;
//! * `late_hog`: yields once, then its second poll blocks 1.2 s and ends: no console warning
//!   (console's never-yielded is a first poll still running), `long poll` for asyncrsp;
//! * `big`: keeps 1,500 bytes across an await: a large future (console: 1,024 bytes or more);
//! * `huge`: keeps 20,000 across one: over tokio's BOX_FUTURE_THRESHOLD (16 KiB in release),
//!   boxed by `tokio::spawn`: an auto-boxed future (and not a large one: console measures the box);
//! * `sleeper`, `waiter`: healthy (a timer, a Notify kept by main): no warning.
//!
//! Prints `console_lints ready pid=<pid>` once every task ran and `hog` has blocked for
//! more than console's threshold (1 s), then sleeps.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::Notify;

/// Pending forever, with no waker kept: the clone of the waker is dropped at once.
struct Forget;

impl Future for Forget {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        drop(cx.waker().clone());
        Poll::Pending
    }
}

/// Pending `left` times, each time waking its own task from inside the poll.
struct WakeSelf {
    left: u32,
}

impl Future for WakeSelf {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.left == 0 {
            return Poll::Ready(());
        }
        self.left -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

async fn forgetful() {
    Forget.await; // await: forgetful -> forget
}

async fn self_waker() {
    loop {
        WakeSelf { left: 3 }.await; // await: self_waker -> wake_self
        tokio::time::sleep(Duration::from_millis(20)).await; // await: self_waker -> sleep
    }
}

async fn hog() {
    std::thread::sleep(Duration::from_secs(3600)); // never yields
}

async fn late_hog() {
    tokio::time::sleep(Duration::from_millis(10)).await; // await: late_hog -> sleep
    std::thread::sleep(Duration::from_millis(1200)); // one poll that does not yield for long
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: late_hog -> sleep
}

async fn big() {
    let buf = [7u8; 1500];
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: big -> sleep
    std::hint::black_box(&buf);
}

async fn huge() {
    let buf = [7u8; 20_000];
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: huge -> sleep
    std::hint::black_box(&buf);
}

async fn sleeper() {
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: sleeper -> sleep
}

async fn waiter(n: Arc<Notify>) {
    n.notified().await; // await: waiter -> notified
}

fn main() {
    #[cfg(feature = "console")]
    console_subscriber::init();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().expect("tokio runtime");
    rt.block_on(async {
        let notify = Arc::new(Notify::new());
        let _tasks = (
            tokio::spawn(forgetful()),
            tokio::spawn(self_waker()),
            tokio::spawn(hog()),
            tokio::spawn(late_hog()),
            tokio::spawn(big()),
            tokio::spawn(huge()),
            tokio::spawn(sleeper()),
            tokio::spawn(waiter(notify.clone())),
        );
        tokio::time::sleep(Duration::from_millis(1500)).await; // after late_hog's long poll ended
        println!("console_lints ready pid={}", std::process::id());
        use std::io::Write;
        std::io::stdout().flush().expect("flush stdout");
        loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    });
}
