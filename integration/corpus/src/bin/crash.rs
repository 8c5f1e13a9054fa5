//! `crash`: a program that dies inside a poll, for core files.
//!
//! Usage: `crash segv|panic [ct|mt]` (default mt, 2 workers). A spawned task
//! `outer -> middle -> leaf` sleeps 10 ms in `leaf`, then `leaf`:
//! * `segv`: writes through an invalid pointer: SIGSEGV inside `leaf`'s poll;
//! * `panic`: panics; the panic hook aborts the process in the panicking
//!   thread, what `panic = "abort"` does (the corpus' profiles unwind: the
//!   other programs need it): SIGABRT inside `leaf`'s poll.
//! A `bystander` task sleeps an hour meanwhile; the main task awaits the
//! crashing task's `JoinHandle`. It prints `crash armed pid=<pid> kind=<kind>`
//! before the crash and never prints a result.

use std::time::Duration;

async fn leaf(kind: &'static str, depth: u64) -> u64 {
    tokio::time::sleep(Duration::from_millis(10)).await; // await: leaf -> sleep
    match kind {
        // SAFETY: none: the point is the fault.
        "segv" => unsafe { std::ptr::write_volatile(0x10 as *mut u64, depth) }, // bp: segv
        "panic" => panic!("crash: leaf panicked at depth {depth}"), // bp: panic
        _ => {}
    }
    depth
}

async fn middle(kind: &'static str) -> u64 {
    leaf(kind, 2).await + 1 // await: middle -> leaf
}

async fn outer(kind: &'static str) -> u64 {
    middle(kind).await + 1 // await: outer -> middle
}

async fn bystander() {
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: bystander -> sleep
}

async fn run(kind: &'static str) {
    let _idle = tokio::spawn(bystander());
    println!("crash armed pid={} kind={kind}", std::process::id());
    use std::io::Write;
    std::io::stdout().flush().expect("flush stdout");
    let got = tokio::spawn(outer(kind)).await; // await: run -> handle
    println!("crash survived: {got:?}");
}

fn main() {
    let kind: &'static str = match std::env::args().nth(1).as_deref() {
        Some("segv") => "segv",
        Some("panic") => "panic",
        other => {
            eprintln!("usage: crash segv|panic [ct|mt]  (got {other:?})");
            std::process::exit(2)
        }
    };
    std::panic::set_hook(Box::new(|info| {
        eprintln!("{info}");
        std::process::abort();
    }));
    let mut builder = match std::env::args().nth(2).as_deref().unwrap_or("mt") {
        "ct" => tokio::runtime::Builder::new_current_thread(),
        _ => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
    };
    builder.enable_time().build().expect("tokio runtime").block_on(run(kind));
}
