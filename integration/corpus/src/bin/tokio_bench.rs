//! `tokio_bench`: the multi-thread benchmark (DESIGN.md section 7).
//!
//! Usage: `tokio_bench [N] [mt|ct]` (default 100 mt; mt = 2 worker threads).
//! Each iteration spawns two tasks, runs a third chain locally, joins all
//! three inside a `select!` and polls about 35 coroutines (16 coroutine
//! instances, most pend once through `yield_now`).
//!
//! Futures carry 96-byte `Block`s and 32-byte arrays across awaits and are
//! moved by `tokio::spawn`, `Box::pin` and `join!`: every move is a memcpy,
//! which is what exposed gdbserver 13.1's XSAVE write-back corruption
//! (research/gdbserver-xsave-corruption.md). The result is checked against a
//! synchronous twin of the same arithmetic, so a corrupted move shows:
//!
//!     bench done n=<N> mode=<m> leaves=<3N> acc=<u64> check=ok
//!
//! and `check=MISMATCH expected=<u64>` with exit status 3 otherwise.

use std::future::Future;
use std::pin::Pin;

const MIX: u64 = 0x9E37_79B9_7F4A_7C15;

/// 96 bytes: moves of futures holding it take memcpy's 64-128-byte path.
#[derive(Clone, Copy)]
struct Block([u64; 12]);

impl Block {
    fn new(i: u64) -> Block {
        let mut words = [0u64; 12];
        for (j, w) in words.iter_mut().enumerate() {
            *w = (i + 1).wrapping_mul(MIX).rotate_left(j as u32 * 5) ^ j as u64;
        }
        Block(words)
    }

    fn derive(&self, k: u64) -> Block {
        let mut words = self.0;
        for w in words.iter_mut() {
            *w = w.wrapping_add(k).rotate_left(k as u32 % 63 + 1);
        }
        Block(words)
    }

    fn hash(&self, k: u64) -> u64 {
        self.0
            .iter()
            .fold(k, |acc, w| acc.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(*w))
    }

    fn sum(&self) -> u64 {
        self.0.iter().fold(0u64, |acc, w| acc.wrapping_add(*w))
    }
}

fn small_value(x: u64) -> u64 {
    let pair = [x, x.rotate_left(7), x ^ 0x5555, 3];
    pair.iter().fold(0u64, |acc, w| acc.wrapping_add(*w))
}

fn combine(acc: u64, a: u64, b: u64, c: u64) -> u64 {
    acc.wrapping_mul(MIX) ^ a.wrapping_add(b.rotate_left(13)).wrapping_add(c.rotate_left(29))
}

async fn small(x: u64) -> u64 {
    let pair = [x, x.rotate_left(7), x ^ 0x5555, 3]; // 32 bytes held across the await
    tokio::task::yield_now().await; // await: small -> yield
    pair.iter().fold(0u64, |acc, w| acc.wrapping_add(*w))
}

async fn leaf(block: Block, k: u64) -> u64 {
    tokio::task::yield_now().await; // await: leaf -> yield
    block.hash(k) // bp: leaf_after_yield
}

async fn mid(block: Block, k: u64) -> u64 {
    let boxed: Pin<Box<dyn Future<Output = u64> + Send>> = Box::pin(leaf(block.derive(7), k));
    let x = boxed.await; // await: mid -> boxed
    let y = small(x).await; // await: mid -> small
    x.wrapping_add(y)
}

async fn top(seed: Block, k: u64) -> u64 {
    let local = seed.derive(k);
    let m = mid(local, k).await; // await: top -> mid
    m ^ local.sum()
}

async fn task(seed: Block, k: u64) -> u64 {
    top(seed, k).await // await: task -> top
}

async fn iteration(i: u64, acc: u64) -> u64 {
    let seed = Block::new(i);
    let h1 = tokio::spawn(task(seed, 1));
    let h2 = tokio::spawn(task(seed, 2));
    let local = top(seed, 3);
    let (a, b, c) = tokio::select! { // await: iteration -> select
        out = async { tokio::join!(h1, h2, local) } => out,
        _ = std::future::pending::<()>() => unreachable!(),
    };
    combine(acc, a.expect("task 1"), b.expect("task 2"), c)
}

async fn run(n: u64) -> u64 {
    let mut acc = 0;
    for i in 0..n {
        acc = iteration(i, acc).await; // await: run -> iteration
    }
    acc
}

/// The same arithmetic without any future: the right answer.
fn expected(n: u64) -> u64 {
    let top_sync = |seed: Block, k: u64| {
        let local = seed.derive(k);
        let x = local.derive(7).hash(k);
        x.wrapping_add(small_value(x)) ^ local.sum()
    };
    (0..n).fold(0, |acc, i| {
        let seed = Block::new(i);
        combine(acc, top_sync(seed, 1), top_sync(seed, 2), top_sync(seed, 3))
    })
}

fn usage(msg: &str) -> ! {
    eprintln!("usage: tokio_bench [N] [mt|ct]  ({msg})");
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: u64 = match args.next() {
        None => 100,
        Some(t) => t.parse().unwrap_or_else(|_| usage(&format!("bad N {t:?}"))),
    };
    let mode = args.next().unwrap_or_else(|| "mt".to_string());
    let mut builder = match mode.as_str() {
        "ct" => tokio::runtime::Builder::new_current_thread(),
        "mt" => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
        other => usage(&format!("bad mode {other:?}")),
    };
    let rt = builder.build().expect("tokio runtime");
    let acc = rt.block_on(run(n)); // bp: bench_block_on
    let want = expected(n);
    if acc == want {
        println!("bench done n={n} mode={mode} leaves={} acc={acc} check=ok", 3 * n);
    } else {
        println!("bench done n={n} mode={mode} leaves={} acc={acc} check=MISMATCH expected={want}", 3 * n);
        std::process::exit(3);
    }
}
