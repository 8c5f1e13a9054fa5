//! `console_stats [ADDR]`: tokio-console's own figures for every task of a
//! program running console-subscriber (default http://127.0.0.1:6669), read
//! from the first update of its gRPC API (the same stream `tokio-console`
//! reads). One line per task:
//!
//!     task id=<id> loc=<file>:<line> polls=<n> busy_ns=<ns> dropped=<0|1>

use console_api::instrument::instrument_client::InstrumentClient;
use console_api::instrument::InstrumentRequest;
use std::collections::HashMap;

fn main() {
    let addr = std::env::args().nth(1).unwrap_or_else(|| "http://127.0.0.1:6669".to_string());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
    rt.block_on(async move {
        let mut client = InstrumentClient::connect(addr).await.expect("connect to console-subscriber");
        let mut stream = client.watch_updates(InstrumentRequest {}).await.expect("watch_updates").into_inner();
        let update = stream.message().await.expect("first update").expect("an update");
        let tasks = update.task_update.expect("task update");
        let mut loc: HashMap<u64, String> = HashMap::new();
        for t in &tasks.new_tasks {
            if let (Some(id), Some(l)) = (&t.id, &t.location) {
                loc.insert(id.id, format!("{}:{}", l.file.clone().unwrap_or_default(), l.line.unwrap_or(0)));
            }
        }
        let mut ids: Vec<_> = tasks.stats_update.keys().copied().collect();
        ids.sort();
        for id in ids {
            let s = &tasks.stats_update[&id];
            let (polls, busy) = s.poll_stats.as_ref().map_or((0, 0), |p| {
                (p.polls, p.busy_time.as_ref().map_or(0, |d| d.seconds as i128 * 1_000_000_000 + d.nanos as i128))
            });
            println!(
                "task id={id} loc={} polls={polls} busy_ns={busy} dropped={}",
                loc.get(&id).map_or("?", |s| s.as_str()),
                u8::from(s.dropped_at.is_some())
            );
        }
        println!("console dropped_events={}", tasks.dropped_events);
    });
}
