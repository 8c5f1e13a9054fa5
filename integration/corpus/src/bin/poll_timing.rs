//! `poll_timing`: one task that spins inside every poll, one that sleeps
//! between tiny polls, for poll timing (`monitor async top`).
//!
//! Usage: `poll_timing [POLLS] [SPIN_MS]` (default 20 polls, 2 ms): on a
//! current-thread runtime, `spinner` busy-loops SPIN_MS in each of its POLLS
//! polls (then yields), `sleeper` sleeps 2 x SPIN_MS between POLLS polls
//! that do almost nothing. The spinner measures its own time inside each
//! poll (from its resumption to its `.await`, wall clock: what a debugger
//! should report as its busy time). Prints
//!
//!     timing done polls=<P> spin_ms=<S> spun=<u64> slept=<P> spinner_busy_us=<u64>

use std::time::{Duration, Instant};

async fn spinner(polls: u32, spin: Duration) -> (u64, Duration) {
    let mut acc = 0u64;
    let mut busy = Duration::ZERO;
    for i in 0..polls {
        let start = Instant::now();
        while start.elapsed() < spin {
            // A volatile read keeps the loop (std::hint::black_box is
            // unstable in rustc 1.63, which builds the old-* corpus).
            acc = unsafe { std::ptr::read_volatile(&acc.wrapping_mul(31).wrapping_add(u64::from(i))) };
        }
        busy += start.elapsed();
        tokio::task::yield_now().await;
    }
    (acc, busy)
}

async fn sleeper(polls: u32, nap: Duration) -> u32 {
    let mut n = 0;
    for _ in 0..polls {
        tokio::time::sleep(nap).await;
        n += 1;
    }
    n
}

fn main() {
    let mut args = std::env::args().skip(1);
    let polls: u32 = args.next().map_or(20, |t| t.parse().expect("POLLS"));
    let spin_ms: u64 = args.next().map_or(2, |t| t.parse().expect("SPIN_MS"));
    let spin = Duration::from_millis(spin_ms);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("tokio runtime");
    let ((spun, busy), slept) = rt.block_on(async {
        let s = tokio::spawn(spinner(polls, spin));
        let z = tokio::spawn(sleeper(polls, spin * 2));
        (s.await.expect("spinner"), z.await.expect("sleeper"))
    });
    let busy_us = busy.as_micros();
    println!("timing done polls={polls} spin_ms={spin_ms} spun={spun} slept={slept} spinner_busy_us={busy_us}");
}
