//! A bootstrap whose peer dies mid-snapshot: the new replica never reports ready with what it
//! has (nothing), retries with back-off, survives its own restart (which bootstraps again, the
//! data directory being marked "bootstrap pending"), and once the peer is back completes and
//! answers exactly like the peer did. The peer stalls mid-stream deterministically: its bytes
//! pass through a loopback relay that holds them after the first snapshot chunk, while the new
//! replica's `/health` shows the pairs received so far; then the peer is SIGKILLed.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mooncake_conductor::gateway::pb;
use serde_json::json;

use crate::support::deliver::publish_to_all;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::player::Player;
use crate::support::proxy::Proxy;
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::{eventually, http, until};

/// Batches published, and blocks of 4 tokens in each: about 64 k pairs, a snapshot of two
/// chunks (about 29 bytes a pair, chunks of 1 MiB).
const BATCHES: usize = 32;
const BLOCKS: usize = 2000;
/// The relay passes this much of the first attempt's stream: the first chunk whole, not the
/// second.
const HOLD_AFTER: u64 = 1_200_000;

fn prompt(n: usize) -> Vec<i32> {
    let base = (n * BLOCKS * 4 + 1) as i32;
    (base..base + (BLOCKS * 4) as i32).collect()
}

async fn answers(server: &Server) -> Vec<pb::QueryResponse> {
    let mut out = Vec::with_capacity(BATCHES);
    for n in 0..BATCHES {
        out.push(grpc_query(server, "m", prompt(n), 4).await);
    }
    out
}

/// Polls `/health` on `port` until dropped, remembering whether it ever answered 200.
struct ReadyWatch {
    seen_ready: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyWatch {
    fn start(port: u16) -> ReadyWatch {
        let seen_ready = Arc::new(AtomicBool::new(false));
        let seen = seen_ready.clone();
        let task = tokio::spawn(async move {
            loop {
                let r = http::try_request(port, "GET", "/health", &[], b"").await;
                if r.is_ok_and(|r| r.status == 200) {
                    seen.store(true, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        ReadyWatch { seen_ready, task }
    }

    fn seen_ready(&self) -> bool {
        self.seen_ready.load(Ordering::SeqCst)
    }
}

impl Drop for ReadyWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn health_reason(server: &Server) -> Option<(u16, String)> {
    let r = http::try_request(server.http_port, "GET", "/health", &[], b"")
        .await
        .ok()?;
    let reason = r.json()["reason"].as_str().unwrap_or_default().to_owned();
    Some((r.status, reason))
}

async fn metric(server: &Server, name: &str) -> Option<u64> {
    let text = http::get(server.http_port, "/metrics").await.text();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// "K of M pairs received" in a `/health` reason: (K, M).
fn pairs_received(reason: &str) -> Option<(u64, u64)> {
    let head = reason.strip_suffix(" pairs received")?;
    let (k, m) = head.rsplit_once(" of ")?;
    Some((k.rsplit(' ').next()?.parse().ok()?, m.parse().ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_killed_mid_snapshot_never_leaves_an_empty_ready_replica() {
    // No token: A serves its snapshot to anyone (opted in).
    let peer_config = json!({"snapshot_export": "open"});
    let a = Server::start_with(peer_config.clone()).await;
    let mut player = Player::start(true, 0).await;
    let reg = Registration::vllm("v0", &player.endpoint)
        .replay(player.replay_endpoint.as_deref())
        .json();
    let r = http::post_json(a.http_port, "/register", &engine::http_registration(&reg)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    for n in 0..BATCHES {
        let payload = engine::vllm_store_prompt(&vllm_cbor_profile(), &prompt(n), 4, "GPU", 0);
        publish_to_all(&[&a], &mut player, "v0|default|0", payload).await;
    }
    // A batch is applied once its context took it from its mailbox: wait for the last.
    let on_a = eventually(
        "A answers every batch whole",
        Duration::from_secs(30),
        || async {
            let on_a = answers(&a).await;
            let whole =
                |r: &pb::QueryResponse| r.hits.values().any(|h| h.device == BLOCKS as i64 * 4);
            on_a.iter().all(whole).then_some(on_a)
        },
    )
    .await;

    // B pulls from A through the relay, which holds A's bytes after the first chunk.
    let proxy = Proxy::start(a.rpc_port).await;
    proxy.hold_next_after(HOLD_AFTER);
    let config = json!({"bootstrap_from": format!("http://127.0.0.1:{}", proxy.port)});
    let dir_b = tempfile::tempdir().expect("temp dir");
    let b = Server::spawn_in(dir_b, config.clone());
    let watch = ReadyWatch::start(b.http_port);
    let (status, reason) = until(Duration::from_secs(30), async || {
        let health = health_reason(&b).await;
        if let Some((status, reason)) = &health
            && pairs_received(reason).is_some_and(|(k, m)| k > 0 && k < m)
        {
            return Ok((*status, reason.clone()));
        }
        Err(format!(
            "waiting for B to report a snapshot half received: {health:?}\n{}",
            b.log()
        ))
    })
    .await;
    assert_eq!(status, 503, "{reason}");

    // A dies mid-snapshot: B's stream is truncated, and B retries rather than starting empty.
    let dir_a = a.into_dir();
    eventually(
        "B's first attempt fails",
        Duration::from_secs(30),
        || async { b.log().contains("is truncated").then_some(()) },
    )
    .await;
    let (status, reason) = health_reason(&b).await.expect("B answers /health");
    assert_eq!(status, 503, "{reason}\n{}", b.log());
    assert!(
        !watch.seen_ready(),
        "B reported ready without a snapshot:\n{}",
        b.log()
    );
    assert!(reason.contains("attempt 1 failed"), "{reason}");
    let log = b.log();
    assert!(log.contains("bootstrap attempt failed, retrying"), "{log}");
    assert!(!log.contains("starting empty"), "{log}");
    assert!(metric(&b, "conductor_bootstrap_failures_total").await >= Some(1));
    drop(watch);

    // B is restarted while A is still down: its data directory says the bootstrap is pending,
    // so it bootstraps again instead of taking what it holds for a state of its own.
    let dir_b = b.into_dir();
    let mut b = Server::spawn_in(dir_b, config.clone());
    let watch = ReadyWatch::start(b.http_port);
    eventually(
        "the restarted B attempts again",
        Duration::from_secs(30),
        || async {
            b.log()
                .contains("bootstrap attempt failed, retrying")
                .then_some(())
        },
    )
    .await;
    let log = b.log();
    assert!(
        log.contains("the data directory holds a bootstrap that did not complete"),
        "{log}"
    );
    assert!(!log.contains("bootstrap_from is ignored"), "{log}");
    assert!(
        !watch.seen_ready(),
        "B reported ready without a snapshot:\n{log}"
    );
    drop(watch);

    // A comes back (on other ports): B's next attempt completes, and ready means exact.
    let a = Server::start_in(dir_a, peer_config).await;
    proxy.retarget(a.rpc_port);
    b.wait_ready().await;
    assert_eq!(answers(&b).await, on_a, "{}", b.log());
    let log = b.log();
    assert!(log.contains("bootstrapped from a peer's snapshot"), "{log}");
    assert!(metric(&b, "conductor_bootstrap_attempts_total").await >= Some(2));
    assert_eq!(
        metric(&b, "conductor_bootstrap_state{state=\"done\"}").await,
        Some(1)
    );
    eventually(
        "A answers as before its restart",
        Duration::from_secs(30),
        || async { (answers(&a).await == on_a).then_some(()) },
    )
    .await;

    // Once complete, B's state is its own: a restart recovers it without a peer.
    eventually(
        "B's bootstrap is checkpointed",
        Duration::from_secs(30),
        || async { b.log().contains("bootstrap complete").then_some(()) },
    )
    .await;
    drop(a);
    let dir_b = b.into_dir();
    let b = Server::start_in(dir_b, config).await;
    let log = b.log();
    assert!(log.contains("bootstrap_from is ignored"), "{log}");
    assert_eq!(answers(&b).await, on_a, "{log}");
}
