//! `tk_join3`: one spawned task whose `join!` has three branches, each ending in a tokio
//! `sleep`: an async fn (`slow`), an async block, and a bare `Sleep`; tokio 1.43, the
//! multi-thread runtime by default (`ct` for one thread). Built with `--cfg tokio_unstable
//! --cfg tokio_taskdump`, `run` writes `Handle::dump()` (between `==dump==` and `==end==`)
//! into the file `$TK_DUMP_FILE` names (or prints it) before it stops at the `dumped` marker.
//!
//! Usage: `tk_join3 [mt|ct]`.

#[path = "../../../common/rt.rs"]
mod rt;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

static ABOUT_TO_PARK: AtomicUsize = AtomicUsize::new(0);

async fn slow() {
    ABOUT_TO_PARK.fetch_add(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3600)).await; // await: slow -> sleep
}

async fn three() {
    tokio::join!( // await: three -> join
        slow(),
        async {
            ABOUT_TO_PARK.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(5400)).await; // the block ends in a sleep
        },
        tokio::time::sleep(Duration::from_secs(7200)),
    );
}

async fn run() {
    let _three = tokio::spawn(three());
    while ABOUT_TO_PARK.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await; // await: run -> sleep
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // await: run -> sleep
    rt::task_dump().await; // await: run -> task_dump
    rt::ready("tk_join3"); // bp: dumped
    std::future::pending::<()>().await; // await: run -> pending
}

fn main() {
    let rt = match std::env::args().nth(1).as_deref() {
        Some("ct") => tokio::runtime::Builder::new_current_thread().enable_all().build(),
        None | Some("mt") => tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build(),
        Some(other) => {
            eprintln!("usage: tk_join3 [mt|ct]  (got {other:?})");
            std::process::exit(2)
        }
    };
    rt.expect("tokio runtime").block_on(run());
}
