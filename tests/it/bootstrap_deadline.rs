//! A bootstrap has an overall deadline: a peer that trickles its snapshot (a begin mark, then one
//! small chunk every second, each well within the per-message stall limit) keeps the new replica
//! not ready (`/health` 503) until the deadline, where the attempt is abandoned, counted and
//! retried; once the attempts are spent the replica starts empty and ready.

use std::time::{Duration, Instant};

use mooncake_conductor::gateway::pb;
use mooncake_conductor::gateway::pb_server::replica_server::{Replica, ReplicaServer};
use serde_json::json;

use crate::support::query::endpoints;
use crate::support::server::Server;
use crate::support::{http, until};

/// A peer announcing many pairs, then sending one every `every`, never its end mark.
struct Trickle {
    every: Duration,
}

#[tonic::async_trait]
impl Replica for Trickle {
    type SnapshotStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<pb::SnapshotChunk, tonic::Status>> + Send>,
    >;

    async fn snapshot(
        &self,
        _: tonic::Request<pb::SnapshotRequest>,
    ) -> Result<tonic::Response<Self::SnapshotStream>, tonic::Status> {
        let every = self.every;
        let stream = futures::stream::unfold(0u64, move |seq| async move {
            if seq > 0 {
                tokio::time::sleep(every).await;
            }
            let mut key = vec![7u8; 8];
            key.extend_from_slice(&0u32.to_be_bytes());
            key.extend_from_slice(&seq.to_be_bytes());
            let chunk = pb::SnapshotChunk {
                seq,
                begin: (seq == 0).then(|| pb::SnapshotBegin {
                    format: mooncake_conductor::replica::format::FORMAT,
                    records: 1_000_000,
                    pairs: 1_000_000,
                    contexts: 1,
                    registrations: 0,
                    replica_id: "trickle".into(),
                    sources: Vec::new(),
                    chain_tuning: 0,
                }),
                records: vec![pb::SnapshotRecord {
                    cf: 6,
                    key,
                    value: vec![1],
                }],
                end: None,
            };
            Some((Ok(chunk), seq + 1))
        });
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

async fn trickling_peer(every: Duration) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ReplicaServer::new(Trickle { every }))
            .serve_with_incoming(incoming),
    );
    format!("http://{addr}")
}

async fn metric(server: &Server, name: &str) -> Option<String> {
    let text = http::get(server.http_port, "/metrics").await.text();
    text.lines()
        .find(|l| l.starts_with(name))
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickling_peer_is_abandoned_at_the_deadline_and_the_replica_is_not_ready_meanwhile() {
    let peer = trickling_peer(Duration::from_secs(1)).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    let mut server = Server::spawn_in(
        dir,
        json!({
            "bootstrap_from": peer,
            "bootstrap_attempts": 2,
            "bootstrap_deadline_ms": 3000,
        }),
    );
    // Not ready while the peer trickles: every answer until the first attempt is abandoned is a
    // 503, and at least one of them shows the trickle arriving.
    let mut seen_progress = false;
    until(
        Duration::from_secs(30).saturating_sub(started.elapsed()),
        async || {
            let log = server.log();
            if log.contains("bootstrap attempt failed, retrying") {
                return Ok(());
            }
            if let Ok(r) = http::try_request(server.http_port, "GET", "/health", &[], b"").await {
                assert_eq!(r.status, 503, "ready while the peer trickles: {}", r.text());
                seen_progress |= r.text().contains("of 1000000 pairs received");
            }
            Err(format!(
                "waiting for the first attempt to be abandoned\n{log}"
            ))
        },
    )
    .await;
    assert!(seen_progress, "{}", server.log());
    server.wait_ready().await;
    let log = server.log();
    assert!(
        log.contains("abandoned: not complete within bootstrap_deadline_ms (3s)"),
        "{log}"
    );
    assert!(log.contains("bootstrap failed, starting empty"), "{log}");
    // Two attempts of 3 s and a back-off of 1 s: well before the trickle would have ended.
    assert!(started.elapsed() < Duration::from_secs(25), "{log}");
    assert_eq!(
        metric(
            &server,
            "conductor_bootstrap_abandoned_total{reason=\"deadline\"}"
        )
        .await
        .as_deref(),
        Some("conductor_bootstrap_abandoned_total{reason=\"deadline\"} 2")
    );
    assert_eq!(
        metric(&server, "conductor_bootstrap_failures_total ")
            .await
            .as_deref(),
        Some("conductor_bootstrap_failures_total 2")
    );
    assert!(endpoints(&server).await.is_empty());
}
