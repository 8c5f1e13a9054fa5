//! `hyper_svc`: a hyper 1.5 HTTP/1 service with its client, in one process on
//! loopback (tokio 1.43). The handler waits on a `Notify` nobody notifies, so
//! at the `requested` marker: the client task awaits its response, the server's
//! connection task polls the handler, which is parked in `notified()`.
//!
//! Usage: `hyper_svc [ct|mt]` (default ct).

#[path = "../../../common/rt.rs"]
mod rt;

use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);

async fn handle(_req: Request<Incoming>, gate: Arc<Notify>) -> Result<Response<Full<Bytes>>, Infallible> {
    IN_HANDLER.fetch_add(1, Ordering::SeqCst);
    gate.notified().await; // await: handle -> notify
    Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
}

async fn serve(listener: TcpListener, gate: Arc<Notify>) {
    loop {
        let (stream, _) = listener.accept().await.expect("accept"); // await: serve -> accept
        let gate = gate.clone();
        tokio::spawn(connection(stream, gate));
    }
}

async fn connection(stream: TcpStream, gate: Arc<Notify>) {
    let service = hyper::service::service_fn(move |req| handle(req, gate.clone()));
    let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    let _ = conn.await; // await: connection -> serve_connection
}

async fn client(port: u16) -> usize {
    let stream = TcpStream::connect(("127.0.0.1", port)).await.expect("connect"); // await: client -> connect
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("handshake"); // await: client -> handshake
    tokio::spawn(conn);
    let req = Request::get("/").body(Empty::<Bytes>::new()).expect("request");
    let resp = sender.send_request(req).await.expect("response"); // await: client -> send_request
    resp.into_body().collect().await.map(|b| b.to_bytes().len()).unwrap_or(0) // await: client -> collect
}

async fn run() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind"); // await: run -> bind
    let port = listener.local_addr().expect("addr").port();
    let gate = Arc::new(Notify::new());
    let _server = tokio::spawn(serve(listener, gate));
    let _client = tokio::spawn(client(port));
    while IN_HANDLER.load(Ordering::SeqCst) < 1 {
        tokio::time::sleep(Duration::from_millis(5)).await; // await: run -> sleep
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // await: run -> sleep
    rt::ready("hyper_svc"); // bp: requested
    std::future::pending::<()>().await; // await: run -> pending
}

fn main() {
    rt::tokio_runtime("hyper_svc").block_on(run());
}
