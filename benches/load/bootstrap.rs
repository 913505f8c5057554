//! `--mode bootstrap`: how long a new replica takes to be ready from a peer that holds `pairs`
//! (block, holder) pairs, and how many snapshot bytes each pair costs on the wire.
//!
//! A peer (in-process, like the scenario's service) subscribes to one publisher with a replay
//! buffer and ingests `pairs` new blocks; then a second service starts with an empty data
//! directory and `bootstrap_from` the peer, timed from its start to its first `/health` 200
//! (pull, load, resubscribe from the snapshot's watermark, its subscription live again). The
//! new replica must answer the last block like the peer, and report every pair received.
//! With `--binary PATH` both are child processes of that build of `mooncake_conductor` (a
//! release build with RocksDB: the store's real cost), their log's snapshot lines printed.

use std::time::{Duration, Instant};

use mooncake_conductor::fixture::publisher::Publisher;
use mooncake_conductor::gateway::pb;
use serde_json::json;

use crate::client::{HttpConn, grpc, register_request, status};
use crate::publish::{batch, mix, prompt, stored};
use crate::service::Node;
use crate::{BS, E2E_EVENTS, EVENT_BLOCKS, INGEST_MODEL, opt};

pub(crate) async fn bootstrap() {
    // The bootstrap's own log lines say where its time goes (cut, transfer, recovery).
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(
            "mooncake_conductor::replica=info",
        ))
        .with_writer(std::io::stderr)
        .init();
    let sizes: Vec<u64> = opt("pairs", "1000000,10000000".to_owned())
        .split(',')
        .filter_map(|n| n.trim().parse().ok())
        .collect();
    for pairs in sizes {
        one(pairs).await;
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `name value` from a Prometheus text.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0)
}

async fn metrics(port: u16) -> String {
    let mut http = HttpConn::connect(port).await.expect("HTTP");
    let (_, body) = http
        .call("GET", "/metrics", "", b"")
        .await
        .expect("metrics");
    String::from_utf8_lossy(&body).into_owned()
}

async fn last_block_held(port: u16, hash: u64) -> bool {
    let probe = pb::QueryByHashRequest {
        model_name: INGEST_MODEL.into(),
        block_size: BS.into(),
        block_hashes: vec![hash],
        ..Default::default()
    };
    let r = grpc(port)
        .await
        .query_by_hash(probe)
        .await
        .expect("probe")
        .into_inner();
    r.hits.get("ingest").is_some_and(|h| h.device == BS as i64)
}

async fn one(pairs: u64) {
    // `--binary`: both replicas are child processes of that build (with RocksDB, say).
    let binary: String = opt("binary", String::new());
    let binary = Some(binary.as_str()).filter(|b| !b.is_empty());
    // No token here: the peer serves its snapshot to anyone (loopback only).
    let peer = Node::spawn(binary, json!({"snapshot_export": "open"}));
    peer.wait_ready().await;
    let mut http = HttpConn::connect(peer.http_port()).await.expect("HTTP");
    let mut publisher = Publisher::loopback(true, 0)
        .await
        .expect("bind the publisher");
    // Enough for any replay the subscription asks for here; bounded so 10 M pairs stay cheap.
    publisher.limit_replay(Some(4096));
    let request = register_request(
        "ingest",
        &publisher.endpoint,
        publisher.replay_endpoint.clone(),
        INGEST_MODEL,
        0,
    );
    let reply = grpc(peer.rpc_port())
        .await
        .register(request)
        .await
        .expect("register")
        .into_inner();
    assert_eq!(reply.ret, 0, "register: {:?}", reply.error);

    // Seq 0 until the subscription has it (a PUB drops what it sends before the subscription).
    let tokens = prompt(EVENT_BLOCKS * BS as usize);
    let hello = batch(
        vec![stored(&[u64::MAX], None, &tokens[..BS as usize], "GPU")],
        0,
    );
    publisher.publish(hello.to_vec()).await.expect("publish");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !status(&mut http).await.iter().any(|s| s["last_seq"] == 0) {
        assert!(Instant::now() < deadline, "seq 0 never applied");
        publisher.resend(0).await.expect("resend");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let per_batch = (E2E_EVENTS * EVENT_BLOCKS) as u64;
    let batches = pairs.div_ceil(per_batch);
    let hash = |b: u64| mix(b ^ 0x5eed_0000_0000);
    let filled = Instant::now();
    for b in 0..batches {
        let hashes: Vec<u64> = (b * per_batch..(b + 1) * per_batch).map(hash).collect();
        let events = hashes
            .chunks(EVENT_BLOCKS)
            .map(|h| stored(h, Some(h[0] ^ 1), &tokens, "GPU"));
        let payload = batch(events.collect(), 0);
        publisher.publish(payload.to_vec()).await.expect("publish");
    }
    let last = hash(batches * per_batch - 1);
    let deadline = Instant::now() + Duration::from_secs(300);
    while !last_block_held(peer.rpc_port(), last).await {
        assert!(
            Instant::now() < deadline,
            "the peer did not ingest in 300 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let fill = filled.elapsed();
    let held = batches * per_batch + 1;

    let load = load_average();
    let started = Instant::now();
    let replica = Node::spawn(
        binary,
        json!({
            "bootstrap_from": format!("http://127.0.0.1:{}", peer.rpc_port()),
        }),
    );
    // When `/health` first says each phase (pulling, loading, replaying), then ready.
    let mut phases: Vec<(&str, Duration)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let health = replica.health().await;
        let now = started.elapsed();
        let phase = match &health {
            Some((200, _)) => "ready",
            Some((_, body)) if body.contains("loading") => "loading",
            Some((_, body)) if body.contains("replaying") => "replaying",
            Some((_, body)) if body.contains("bootstrapping") => "pulling",
            _ => "starting",
        };
        if phases.last().is_none_or(|(p, _)| *p != phase) {
            phases.push((phase, now));
        }
        if phase == "ready" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new replica was not ready in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let ready = started.elapsed();
    let phases: Vec<String> = phases
        .iter()
        .map(|(p, t)| format!("{p} {:.2}", t.as_secs_f64()))
        .collect();
    let text = metrics(replica.http_port()).await;
    let (received, bytes) = (
        metric(&text, "conductor_bootstrap_pairs_received"),
        metric(&text, "conductor_bootstrap_bytes_received"),
    );
    assert_eq!(
        metric(&text, "conductor_bootstrap_state{state=\"done\"}"),
        1,
        "the bootstrap did not complete"
    );
    assert_eq!(received, held, "pairs received");
    assert!(
        last_block_held(replica.rpc_port(), last).await,
        "the new replica does not answer the peer's last block"
    );
    println!(
        "bootstrap: {held} pairs (peer filled in {:.1} s): new replica ready in {:.2} s; \
         snapshot {:.1} MB, {:.1} B/pair; load average before: {load}; phases from its start \
         (s): {}",
        fill.as_secs_f64(),
        ready.as_secs_f64(),
        bytes as f64 / 1e6,
        bytes as f64 / held as f64,
        phases.join(", "),
    );
    replica.stop();
    peer.stop();
}
