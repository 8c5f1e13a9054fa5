//! `axum_svc`: an axum 0.8 service with a hyper 1.11 client, in one process on
//! loopback (tokio 1.53). The handler waits on a `Notify` nobody notifies, so
//! at the `requested` marker: the client task awaits its response, axum's
//! connection task polls the handler, which is parked in `notified()`.
//!
//! Usage: `axum_svc [ct|mt]` (default ct).

#[path = "../../../common/rt.rs"]
mod rt;

use axum::extract::State;
use axum::routing::get;
use axum::Router;
use http_body_util::Empty;
use hyper::body::Bytes;
use hyper::Request;
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);

async fn hello(State(gate): State<Arc<Notify>>) -> &'static str {
    IN_HANDLER.fetch_add(1, Ordering::SeqCst);
    gate.notified().await; // await: hello -> notify
    "hello"
}

async fn client(port: u16) -> u16 {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connect"); // await: client -> connect
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake"); // await: client -> handshake
    tokio::spawn(conn);
    let req = Request::get("/").body(Empty::<Bytes>::new()).expect("request");
    let resp = sender.send_request(req).await.expect("response"); // await: client -> send_request
    resp.status().as_u16()
}

async fn run() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind"); // await: run -> bind
    let port = listener.local_addr().expect("addr").port();
    let app = Router::new().route("/", get(hello)).with_state(Arc::new(Notify::new()));
    let _server = tokio::spawn(async move { axum::serve(listener, app).await }); // await: run::{async_block} -> serve
    let _client = tokio::spawn(client(port));
    while IN_HANDLER.load(Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await; // await: run -> sleep
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // await: run -> sleep
    rt::ready("axum_svc"); // bp: requested
    std::future::pending::<()>().await; // await: run -> pending
}

fn main() {
    rt::tokio_runtime("axum_svc").block_on(run());
}
