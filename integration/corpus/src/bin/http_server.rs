//! `http_server`: a small HTTP/1.1 keep-alive service on loopback, the
//! shape of a real handler, for the server benchmark (`bench/bench_server.py`
//! drives it with `wrk`).
//!
//! Usage: `http_server [PORT] [ct|mt]` (0 = any free port, ct). Prints
//!
//!     server ready port=<port> pid=<pid>
//!
//! then serves every connection in its own spawned task (`connection`): for
//! each request the handler (`handle`) locks a `tokio::sync::Mutex` shared by
//! all connections, spawns a `backend` task and awaits its answer on a
//! `oneshot`. `GET /quit` answers and ends the server, which then prints
//!
//!     server done requests=<N> connections=<C> conn_polls=<P> conn_busy_us=<B>
//!
//! `conn_polls` / `conn_busy_us`: the connection tasks' own count of their
//! polls and their own wall-clock time inside them (a wrapper future around
//! each `connection` future, in the `conn_task` every connection is spawned as), summed over all connections: what a debugger
//! should report for those tasks. No request body, no pipelining beyond what
//! `wrk` sends (one request at a time per connection). tokio's `io-util` is
//! not in the corpus' features: reads and writes use `readable`/`try_read`.

use std::future::Future;
use std::io::ErrorKind;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Mutex};

static REQUESTS: AtomicU64 = AtomicU64::new(0);
static CONNECTIONS: AtomicU64 = AtomicU64::new(0);
static CONN_POLLS: AtomicU64 = AtomicU64::new(0);
static CONN_BUSY_NS: AtomicU64 = AtomicU64::new(0);

struct Shared {
    served: u64,
}

/// Counts the polls of the future it wraps and the time spent in them.
struct Timed<F> {
    inner: Pin<Box<F>>,
}

impl<F: Future> Future for Timed<F> {
    type Output = F::Output;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let start = Instant::now();
        let out = self.inner.as_mut().poll(cx);
        CONN_BUSY_NS.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        CONN_POLLS.fetch_add(1, Ordering::Relaxed);
        out
    }
}

async fn backend(n: u64, reply: oneshot::Sender<u64>) {
    let _ = reply.send(n.wrapping_mul(2654435761) % 1000);
}

async fn handle(shared: Arc<Mutex<Shared>>) -> u64 {
    let n = {
        let mut s = shared.lock().await; // await: handle -> lock
        s.served += 1;
        s.served
    };
    let (tx, rx) = oneshot::channel();
    tokio::spawn(backend(n, tx));
    rx.await.unwrap_or(0) // await: handle -> oneshot
}

fn header_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n")
}

async fn write_all(sock: &TcpStream, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        if sock.writable().await.is_err() {
            return false;
        }
        match sock.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(_) => return false,
        }
    }
    true
}

/// Returns true when the client asked the server to quit.
async fn connection(sock: TcpStream, shared: Arc<Mutex<Shared>>) -> bool {
    let mut buf = vec![0u8; 16384];
    let mut have = 0;
    loop {
        if sock.readable().await.is_err() {
            return false;
        }
        match sock.try_read(&mut buf[have..]) {
            Ok(0) => return false,
            Ok(n) => have += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => continue,
            Err(_) => return false,
        }
        while let Some(end) = header_end(&buf[..have]) {
            let quit = buf.starts_with(b"GET /quit");
            let v = handle(shared.clone()).await; // await: connection -> handle
            REQUESTS.fetch_add(1, Ordering::Relaxed);
            let body = format!("ok {v}\n");
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: text/plain\r\n\r\n{}",
                body.len(),
                body
            );
            if !write_all(&sock, resp.as_bytes()).await {
                return false;
            }
            buf.copy_within(end + 4..have, 0);
            have -= end + 4;
            if quit {
                return true;
            }
        }
        if have == buf.len() {
            return false; // a header larger than the buffer: not this service's traffic
        }
    }
}

/// The connection's spawned task: its own count around the connection's polls.
async fn conn_task(sock: TcpStream, shared: Arc<Mutex<Shared>>, quit: tokio::sync::mpsc::Sender<()>) {
    if (Timed { inner: Box::pin(connection(sock, shared)) }).await { // await: conn_task -> connection
        let _ = quit.send(()).await;
    }
}

async fn serve(listener: TcpListener) {
    let shared = Arc::new(Mutex::new(Shared { served: 0 }));
    let (quit_tx, mut quit_rx) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let sock = match accepted {
                    Ok((sock, _)) => sock,
                    Err(_) => continue,
                };
                let _ = sock.set_nodelay(true);
                CONNECTIONS.fetch_add(1, Ordering::Relaxed);
                let shared = shared.clone();
                let quit_tx = quit_tx.clone();
                tokio::spawn(conn_task(sock, shared, quit_tx));
            }
            _ = quit_rx.recv() => break,
        }
    }
    // Let the answer to /quit reach its client before the runtime goes.
    tokio::time::sleep(Duration::from_millis(20)).await;
}

fn main() {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().map_or(0, |t| t.parse().expect("PORT"));
    let mode = args.next().unwrap_or_else(|| "ct".to_string());
    let rt = match mode.as_str() {
        "mt" => tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build(),
        _ => tokio::runtime::Builder::new_current_thread().enable_all().build(),
    }
    .expect("tokio runtime");
    rt.block_on(async {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
        let port = listener.local_addr().expect("local_addr").port();
        println!("server ready port={port} pid={}", std::process::id());
        serve(listener).await;
    });
    drop(rt);
    println!(
        "server done requests={} connections={} conn_polls={} conn_busy_us={}",
        REQUESTS.load(Ordering::Relaxed),
        CONNECTIONS.load(Ordering::Relaxed),
        CONN_POLLS.load(Ordering::Relaxed),
        CONN_BUSY_NS.load(Ordering::Relaxed) / 1000
    );
}
