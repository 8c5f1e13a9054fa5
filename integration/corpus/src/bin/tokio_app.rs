//! `tokio_app`: the common tokio shapes of an await graph.
//!
//! Exercises: serial awaits a -> b -> c with a `tokio::time::sleep` leaf,
//! `tokio::spawn` + `JoinHandle` await, `join!`, `select!` (one winner),
//! `Box::pin(dyn Future)`, a panic inside a spawned task (its handle returns
//! Err), awaits in a loop, and a `join!` inside a `select!` inside a spawned
//! task.
//!
//! Usage: `tokio_app [ct|mt]` (default ct): current-thread or multi-thread
//! (2 workers) runtime. Prints `tokio_app done mode=<m> total=<n>`.
//!
//! Await lines inside `join!`/`select!`: rustc gives macro-generated code the
//! line of the macro call, so the marker sits on the line of `tokio::join!(`
//! or `tokio::select! {`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

async fn a(x: u64) -> u64 {
    let label = "serial";
    let y = b(x + 1).await; // await: a -> b
    println!("locals: x={x} label={label} y={y}"); // bp: a_locals
    y + 1
}

async fn b(x: u64) -> u64 {
    let doubled = x * 2;
    c(doubled).await + 1 // await: b -> c
}

async fn c(x: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(1)).await; // await: c -> sleep
    x + 1 // bp: c_after_sleep
}

async fn worker(n: u64) -> u64 {
    let mut sum = 0;
    for i in 0..n {
        sum += c(i).await; // await: worker -> c
    }
    sum
}

async fn race() -> u64 {
    tokio::select! { // await: race -> select
        fast = c(10) => fast,
        _ = tokio::time::sleep(Duration::from_secs(3600)) => 0,
    }
}

async fn panicker(x: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(1)).await; // await: panicker -> sleep
    if x > 0 {
        panic!("panic in spawned task x={x}"); // bp: task_panic
    }
    x
}

async fn select_join() -> u64 {
    tokio::select! { // await: select_join -> select
        pair = async {
            tokio::join!(c(20), c(21)) // await: select_join::{async_block} -> join
        } => pair.0 + pair.1,
        _ = tokio::time::sleep(Duration::from_secs(3600)) => 0,
    }
}

async fn run() -> u64 {
    let mut total = a(1).await; // await: run -> a
    let handle = tokio::spawn(worker(3));
    total += handle.await.expect("worker task"); // await: run -> handle
    let (x, y) = tokio::join!(c(2), c(3)); // await: run -> join
    total += x + y;
    total += race().await; // await: run -> race
    let boxed: Pin<Box<dyn Future<Output = u64> + Send>> = Box::pin(b(4));
    total += boxed.await; // await: run -> boxed
    let bad = tokio::spawn(panicker(1));
    let joined = bad.await; // await: run -> handle
    let is_panic = matches!(&joined, Err(e) if e.is_panic());
    println!("tokio_app panicked task joined: is_panic={is_panic}");
    let nested = tokio::spawn(select_join());
    total += nested.await.expect("select_join task"); // await: run -> handle
    total
}

fn runtime(mode: &str) -> tokio::runtime::Runtime {
    let mut builder = match mode {
        "ct" => tokio::runtime::Builder::new_current_thread(),
        "mt" => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
        other => {
            eprintln!("usage: tokio_app [ct|mt]  (got {other:?})");
            std::process::exit(2)
        }
    };
    builder.enable_time().build().expect("tokio runtime")
}

fn main() {
    // One line per panic instead of a backtrace: the task panic is expected.
    std::panic::set_hook(Box::new(|info| eprintln!("tokio_app panic: {info}")));
    let mode = std::env::args().nth(1).unwrap_or_else(|| "ct".to_string());
    let rt = runtime(&mode);
    println!("tokio_app start mode={mode}"); // bp: main_start
    let total = rt.block_on(run());
    println!("tokio_app done mode={mode} total={total}"); // bp: main_done
}
