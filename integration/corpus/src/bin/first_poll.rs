//! `first_poll`: a breakpoint in a leaf coroutine during its first poll.
//!
//! `app` spawns `a`, which runs `join!(b(1), b(2))`; `b` awaits `c`. The
//! breakpoint `// bp: c_first_poll` is reached first inside `c(2)`'s first poll
//! (b(1)'s), from `b(1)`'s first poll, from `join!`'s first poll in `a`'s first
//! poll: every `__state` on the way still reads Unresumed, yet each of them is
//! running on the thread. Every command must say so, with the same names and lines.
//!
//! Usage: `first_poll [ct|mt]` (default ct). Prints `first_poll done total=<n>`.

async fn c(x: u64) -> u64 {
    let y = x + 1; // bp: c_first_poll
    tokio::task::yield_now().await; // await: c -> yield
    y
}

async fn b(x: u64) -> u64 {
    c(x * 2).await + 1 // await: b -> c
}

async fn a() -> u64 {
    let (x, y) = tokio::join!(b(1), b(2)); // await: a -> join
    x + y
}

async fn app() -> u64 {
    tokio::spawn(a()).await.expect("task a") // await: app -> handle
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
            eprintln!("usage: first_poll [ct|mt]  (got {other:?})");
            std::process::exit(2)
        }
    };
    let rt = builder.enable_time().build().expect("tokio runtime");
    let total = rt.block_on(app());
    println!("first_poll done total={total}"); // bp: done
}
