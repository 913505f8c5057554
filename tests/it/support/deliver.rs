//! Deliver until applied. A PUB drops what it sends before a SUB's subscription arrived, and a
//! SUB that (re)joined misses the live messages sent meanwhile; so a test re-sends a publisher's
//! newest batch until the server's subscription has applied it. Every server ignores a re-send
//! it already applied as a duplicate, or fills the gap it shows through replay.

use std::time::Duration;

use serde_json::Value;

use super::player::Player;
use super::server::Server;
use super::{WAIT, http, until};

/// Whether a subscription only counts as caught up once it is `live` again (a restarted server
/// lists the position it recovered before it has reconnected).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Caught {
    Applied,
    AppliedAndLive,
}

/// Re-send each stream's newest batch (service, publisher) until every `/services/status`
/// document `statuses` fetches (one per server) lists that service at that seq. Panics after
/// `timeout` with the streams still behind and the documents last seen.
pub async fn deliver_streams(
    streams: &mut [(&str, &mut Player)],
    caught: Caught,
    timeout: Duration,
    mut statuses: impl AsyncFnMut() -> Vec<Value>,
) {
    until(timeout, async || {
        let documents = statuses().await;
        let mut behind = Vec::new();
        for (service, player) in streams.iter_mut() {
            let seq = player.next_seq() - 1;
            if !documents.iter().all(|d| applied(d, service, seq, caught)) {
                behind.push(format!("{service} seq {seq}"));
                player.resend(seq).await;
            }
        }
        if behind.is_empty() {
            return Ok(());
        }
        let documents = documents.iter().map(Value::to_string).collect::<Vec<_>>();
        Err(format!(
            "for {behind:?} to be applied; status:\n{}",
            documents.join("\n")
        ))
    })
    .await;
}

fn applied(status: &Value, service: &str, seq: u64, caught: Caught) -> bool {
    let rows = status["services"].as_array();
    let row = rows.and_then(|rows| rows.iter().find(|s| s["service"] == service));
    row.is_some_and(|s| {
        s["last_seq"].as_u64() == Some(seq) && (caught == Caught::Applied || s["state"] == "live")
    })
}

async fn status(server: &Server) -> Value {
    http::get(server.http_port, "/services/status").await.json()
}

/// Re-send `player`'s newest batch until `server`'s subscription `service` has applied it.
pub async fn deliver(server: &Server, player: &mut Player, service: &str) {
    deliver_to_all(&[server], player, service).await;
}

/// [`deliver`] to every one of `servers` (replicas subscribed to one publisher).
pub async fn deliver_to_all(servers: &[&Server], player: &mut Player, service: &str) {
    deliver_streams(
        &mut [(service, player)],
        Caught::Applied,
        WAIT,
        async || {
            let mut documents = Vec::new();
            for server in servers {
                documents.push(status(server).await);
            }
            documents
        },
    )
    .await;
}

/// Publish `payload` and deliver it: the first batch after a registration, which the PUB drops
/// until the new subscription's SUB has joined.
pub async fn handshake(server: &Server, player: &mut Player, service: &str, payload: Vec<u8>) {
    publish_to_all(&[server], player, service, payload).await;
}

/// Publish `payload` and deliver it to every one of `servers`.
pub async fn publish_to_all(
    servers: &[&Server],
    player: &mut Player,
    service: &str,
    payload: Vec<u8>,
) {
    player.publish(payload).await;
    deliver_to_all(servers, player, service).await;
}
