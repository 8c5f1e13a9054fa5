//! `axum_server`: the server benchmark's axum 0.8 / tokio 1.53 service
//! (`bench/bench_server.py --server axum`).
//!
//! Usage: `axum_server [PORT]` (0 = any free port). One current-thread
//! runtime. `GET /` locks a `tokio::sync::Mutex` shared by all requests,
//! spawns a `backend` task and awaits its answer on a `oneshot`; `GET /quit`
//! ends the server (graceful shutdown). Prints
//!
//!     server ready port=<port> pid=<pid>
//!     server done requests=<N>
//!
//! Built with the `console` feature (and `--cfg tokio_unstable`) it runs
//! tokio-console's instrumentation, `console_subscriber::init()`, serving its
//! gRPC API on 127.0.0.1:6669 (`console_stats` reads it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use tokio::sync::{oneshot, Mutex, Notify};

static REQUESTS: AtomicU64 = AtomicU64::new(0);

#[derive(Clone)]
struct App {
    served: Arc<Mutex<u64>>,
    quit: Arc<Notify>,
}

async fn backend(n: u64, reply: oneshot::Sender<u64>) {
    let _ = reply.send(n.wrapping_mul(2654435761) % 1000);
}

async fn handler(State(app): State<App>) -> String {
    let n = {
        let mut s = app.served.lock().await; // await: handler -> lock
        *s += 1;
        *s
    };
    let (tx, rx) = oneshot::channel();
    tokio::spawn(backend(n, tx));
    let v = rx.await.unwrap_or(0); // await: handler -> oneshot
    REQUESTS.fetch_add(1, Ordering::Relaxed);
    format!("ok {v}\n")
}

async fn quit(State(app): State<App>) -> &'static str {
    app.quit.notify_one();
    "bye\n"
}

fn main() {
    let port: u16 = std::env::args().nth(1).map_or(0, |t| t.parse().expect("PORT"));
    #[cfg(feature = "console")]
    console_subscriber::init();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(async {
        let app = App { served: Arc::new(Mutex::new(0)), quit: Arc::new(Notify::new()) };
        let router = Router::new()
            .route("/", get(handler))
            .route("/quit", get(quit))
            .with_state(app.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.expect("bind");
        let port = listener.local_addr().expect("local_addr").port();
        println!("server ready port={port} pid={}", std::process::id());
        let q = app.quit.clone();
        axum::serve(listener, router)
            .with_graceful_shutdown(async move { q.notified().await })
            .await
            .expect("serve");
    });
    drop(rt);
    println!("server done requests={}", REQUESTS.load(Ordering::Relaxed));
}
