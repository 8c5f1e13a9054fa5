//! `tk_streams`: a connection-like task reads a `tokio_stream::StreamMap` of two streams, each
//! a boxed `futures::stream::unfold` whose generator (an async block) is suspended at its
//! `.await` on a broadcast receiver (the shape of a chat server's per-room subscriptions);
//! tokio 1.43. main's block_on future stops at the `parked` marker.
//!
//! Usage: `tk_streams [ct|mt]`.

#[path = "../../../common/rt.rs"]
mod rt;

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_stream::{Stream, StreamExt, StreamMap};

static SUBSCRIBED: AtomicUsize = AtomicUsize::new(0);

type Room = Pin<Box<dyn Stream<Item = String> + Send>>;

fn room(rx: broadcast::Receiver<String>) -> Room {
    Box::pin(futures::stream::unfold(rx, |mut rx| async move {
        SUBSCRIBED.fetch_add(1, Ordering::SeqCst);
        let msg = rx.recv().await.ok()?; // a room's generator waits for a message
        Some((msg, rx))
    }))
}

async fn connection(lobby: broadcast::Sender<String>, games: broadcast::Sender<String>) -> usize {
    let mut rooms = StreamMap::new();
    rooms.insert("lobby", room(lobby.subscribe()));
    rooms.insert("games", room(games.subscribe()));
    let mut seen = 0;
    while let Some((_room, _msg)) = rooms.next().await { // await: connection -> next
        seen += 1;
    }
    seen
}

async fn run() {
    let (lobby, _) = broadcast::channel::<String>(4);
    let (games, _) = broadcast::channel::<String>(4);
    let _conn = tokio::spawn(connection(lobby.clone(), games.clone()));
    while SUBSCRIBED.load(Ordering::SeqCst) < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await; // await: run -> sleep
    }
    tokio::time::sleep(Duration::from_millis(100)).await; // await: run -> sleep
    rt::ready("tk_streams"); // bp: parked
    std::future::pending::<()>().await; // await: run -> pending
    drop((lobby, games));
}

fn main() {
    rt::tokio_runtime("tk_streams").block_on(run());
}
