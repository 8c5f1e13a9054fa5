//! `combinators`: futures' `join_all`, `select` and `FuturesUnordered`,
//! tokio's `yield_now` and an I/O readiness wait, all pending at once (for
//! reflection's describers).
//!
//! Usage: `combinators` (current-thread runtime, so the state at the
//! breakpoint is deterministic). Spawned tasks:
//! * `gather`: `join_all` of three `step`s; step 0 has completed at `checkpoint`;
//! * `race`: `select` of two boxed `step`s, both pending at `checkpoint`;
//! * `pool`: a `FuturesUnordered` of three `step`s; step 20 has completed
//!   (and left the set) at `checkpoint`;
//! * `spinner`: `yield_now` in a loop until told to stop;
//! * `reader`: `TcpStream::readable` on a loopback socket nobody writes to yet;
//! * `outer`: `outer -> middle -> probe` (see `probe`), finished by the breakpoint.
//! `run` then stops at its breakpoint in `checkpoint`, releases everything
//! and prints `combinators done sum=101`.

use futures::future::{join_all, select, Either};
use futures::stream::{FuturesUnordered, StreamExt};
use std::sync::atomic::{AtomicBool, Ordering};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

async fn step(id: u64, rx: oneshot::Receiver<u64>) -> u64 {
    rx.await.unwrap_or(0) + id // await: step -> oneshot
}

async fn gather(rxs: Vec<oneshot::Receiver<u64>>) -> u64 {
    let steps = rxs.into_iter().enumerate().map(|(i, rx)| step(i as u64, rx));
    join_all(steps).await.iter().sum() // await: gather -> join_all
}

async fn race(a: oneshot::Receiver<u64>, b: oneshot::Receiver<u64>) -> u64 {
    match select(Box::pin(step(10, a)), Box::pin(step(11, b))).await { // await: race -> select
        Either::Left((v, _)) | Either::Right((v, _)) => v,
    }
}

async fn pool(rxs: Vec<oneshot::Receiver<u64>>) -> u64 {
    let mut set: FuturesUnordered<_> = rxs.into_iter().enumerate().map(|(i, rx)| step(20 + i as u64, rx)).collect();
    let mut sum = 0;
    while let Some(v) = set.next().await { // await: pool -> next
        sum += v;
    }
    sum
}

async fn spinner(stop: Arc<AtomicBool>) -> u64 {
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        tokio::task::yield_now().await; // await: spinner -> yield
        n += 1;
    }
    (n > 0) as u64
}

async fn reader(stream: TcpStream) -> u64 {
    stream.readable().await.expect("readable"); // await: reader -> readable
    let mut buf = [0u8; 8];
    stream.try_read(&mut buf).expect("read") as u64
}

async fn checkpoint(pending: usize) -> usize {
    let n = unsafe { std::ptr::read_volatile(&pending) }; // bp: checkpoint
    tokio::time::sleep(Duration::from_millis(1)).await; // await: checkpoint -> sleep
    n
}

// `middle` awaits `probe` through a `Pin<Box<dyn Future>>`, so `probe`'s resume function
// is called through a vtable and stays out of line, while `middle` (awaited once) is inlined
// into `outer`'s: at the breakpoint in `probe`, `async bt` shows `middle` as an inlined
// frame between two observed ones.
async fn probe(tag: u64) -> u64 {
    tokio::task::yield_now().await; // await: probe -> yield
    let v = unsafe { std::ptr::read_volatile(&tag) } * 2; // bp: probe
    tokio::task::yield_now().await; // await: probe -> yield
    v
}

async fn middle(tag: u64) -> u64 {
    let boxed: Pin<Box<dyn Future<Output = u64> + Send>> = Box::pin(probe(tag));
    let v = boxed.await; // await: middle -> probe
    v + 1
}

async fn outer(tag: u64) -> u64 {
    middle(tag).await + 1 // await: outer -> middle
}

fn channels(n: usize) -> (Vec<oneshot::Sender<u64>>, Vec<oneshot::Receiver<u64>>) {
    (0..n).map(|_| oneshot::channel()).unzip()
}

async fn settle() {
    // the spinner keeps the run queue busy: a short sleep lets every task run to its await
    tokio::time::sleep(Duration::from_millis(20)).await; // await: settle -> sleep
}

async fn run() -> u64 {
    let (mut gather_tx, gather_rx) = channels(3);
    let (mut race_tx, race_rx) = channels(2);
    let (mut pool_tx, pool_rx) = channels(3);
    let stop = Arc::new(AtomicBool::new(false));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind"); // await: run -> bind
    let addr = listener.local_addr().expect("addr");
    let client = TcpStream::connect(addr).await.expect("connect"); // await: run -> connect
    let (server, _) = listener.accept().await.expect("accept"); // await: run -> accept
    let mut rb = race_rx.into_iter();
    let (ra, rb2) = (rb.next().unwrap(), rb.next().unwrap());
    let handles = vec![
        tokio::spawn(gather(gather_rx)),
        tokio::spawn(race(ra, rb2)),
        tokio::spawn(pool(pool_rx)),
        tokio::spawn(spinner(stop.clone())),
        tokio::spawn(reader(client)),
        tokio::spawn(outer(7)),
    ];
    settle().await; // await: run -> settle
    gather_tx.remove(0).send(1).expect("gather 0");
    pool_tx.remove(0).send(1).expect("pool 0");
    settle().await; // await: run -> settle
    let n = checkpoint(handles.len()).await; // await: run -> checkpoint
    for tx in gather_tx.into_iter().chain(pool_tx) {
        tx.send(1).expect("send");
    }
    race_tx.remove(0).send(1).expect("race");
    server.try_write(b"x").expect("write");
    stop.store(true, Ordering::SeqCst);
    let mut sum = 0;
    for h in handles.into_iter().take(n) {
        sum += h.await.expect("task"); // await: run -> handle
    }
    sum
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    let sum = rt.block_on(run());
    println!("combinators done sum={sum}");
}
