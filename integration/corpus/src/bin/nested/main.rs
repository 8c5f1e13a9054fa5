//! `nested`: std only, with a tiny hand-written executor, so every await in
//! the await graph is one this file wrote.
//!
//! Exercises: serial awaits a -> b -> c (c pends once), awaits in a loop, a
//! generic async fn, a trait method returning `Pin<Box<dyn Future>>`, a
//! `Box<dyn Future>` awaited, a panic inside a future caught by
//! `catch_unwind` around the executor, an async fn with 320 awaits (its
//! `__state` discriminant is a u16), and, for rustc >= 1.85 only (module
//! `modern`, left out with `--cfg old_rustc`), an `async fn` in a trait and an
//! async closure.
//!
//! Usage: `nested [ITERATIONS]` (default 3). Prints `locals: ...` lines a test
//! can compare with what the proxy decodes, and `nested done total=<n>`.
//!
//! Markers: `// await: <parent> -> <child>` on the line of each `.await`,
//! `// bp: <name>` on breakpoint lines (see integration/corpus/markers.py).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{self, Thread};

mod many_awaits;
#[cfg(not(old_rustc))]
mod modern;

/// Wakes the executor's thread by unparking it.
struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs one future to completion on this thread, parking while it pends.
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let mut fut = Box::pin(fut);
    let waker = Waker::from(Arc::new(ThreadWaker(thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(value) => return value,
            Poll::Pending => thread::park(),
        }
    }
}

/// Pends exactly once (waking itself), then completes: makes an await
/// really suspend its caller.
pub struct YieldOnce {
    yielded: bool,
}

impl YieldOnce {
    pub fn new() -> Self {
        YieldOnce { yielded: false }
    }
}

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

pub async fn a(x: u64) -> u64 {
    let name = String::from("alpha");
    let y = b(x + 1).await; // await: a -> b
    println!("locals: x={x} name={name}"); // bp: a_locals
    y + name.len() as u64
}

pub async fn b(x: u64) -> u64 {
    let doubled = x * 2;
    let r = c(doubled).await; // await: b -> c
    r + 1
}

pub async fn c(x: u64) -> u64 {
    let before = x + 100;
    YieldOnce::new().await; // await: c -> yield
    before - 99 // bp: c_after_yield
}

pub async fn looped(n: u64) -> u64 {
    let mut acc = 0;
    for i in 0..n {
        acc += c(i).await; // await: looped -> c
    }
    acc
}

pub async fn generic<T: Clone + std::fmt::Debug>(value: T) -> T {
    let copy = value.clone();
    YieldOnce::new().await; // await: generic -> yield
    println!("locals: generic value={copy:?}");
    copy
}

/// A trait whose method returns a boxed future: the pre-1.75 way.
pub trait Shape {
    fn area(&self) -> Pin<Box<dyn Future<Output = u64> + '_>>;
}

pub struct Square {
    pub side: u64,
}

impl Shape for Square {
    fn area(&self) -> Pin<Box<dyn Future<Output = u64> + '_>> {
        Box::pin(async move {
            YieldOnce::new().await; // await: Square::area::{async_block} -> yield
            self.side * self.side
        })
    }
}

pub async fn shapes() -> u64 {
    let square = Square { side: 4 };
    let shape: &dyn Shape = &square;
    shape.area().await // await: shapes -> boxed
}

pub async fn boxed_demo() -> u64 {
    let fut: Pin<Box<dyn Future<Output = u64>>> = Box::pin(c(5));
    fut.await // await: boxed_demo -> boxed
}

pub async fn boom(x: u64) -> u64 {
    YieldOnce::new().await; // await: boom -> yield
    if x > 0 {
        panic!("boom in future x={x}"); // bp: boom_panic
    }
    x
}

/// Stands in for `modern::modern_part` where rustc is too old for it.
#[cfg(old_rustc)]
async fn modern_part() -> u64 {
    0
}

#[cfg(not(old_rustc))]
use modern::modern_part;

pub async fn run(iterations: u64) -> u64 {
    let mut total = 0;
    for i in 0..iterations {
        total += a(i).await; // await: run -> a
    }
    total += looped(4).await; // await: run -> looped
    total += generic(7u64).await; // await: run -> generic
    total += generic("gen").await.len() as u64; // await: run -> generic
    total += shapes().await; // await: run -> shapes
    total += boxed_demo().await; // await: run -> boxed_demo
    total += many_awaits::many_awaits(1).await; // await: run -> many_awaits
    total += modern_part().await; // await: run -> modern_part
    total
}

fn parse_iterations() -> u64 {
    match std::env::args().nth(1) {
        None => 3,
        Some(text) => text.parse().unwrap_or_else(|_| {
            eprintln!("usage: nested [ITERATIONS]  (got {text:?})");
            std::process::exit(2)
        }),
    }
}

fn main() {
    // One line per panic instead of a backtrace: the panic below is expected.
    std::panic::set_hook(Box::new(|info| eprintln!("nested panic: {info}")));
    let iterations = parse_iterations();
    println!("nested start iterations={iterations}"); // bp: main_start
    let total = block_on(run(iterations));
    let caught = std::panic::catch_unwind(|| block_on(boom(1)));
    println!("nested caught panic: {}", caught.is_err());
    println!("nested done total={total}"); // bp: main_done
}
