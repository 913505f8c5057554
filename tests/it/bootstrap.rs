//! A replica replaced with an empty data directory bootstraps from a peer's snapshot: three real
//! binaries sharing registrations through a real etcd, two vLLM-format publishers with replay
//! buffers that the replaced replica's downtime outruns. Then the failure paths, each against a
//! scripted peer on loopback: unreachable, newer format, truncated (with the progress `/health`
//! reports meanwhile), and records recovery cannot read. Each is retried until the configured
//! attempts are spent, and ends with an empty, ready replica.

use std::time::Duration;

use mooncake_conductor::gateway::pb;
use mooncake_conductor::gateway::pb_server::replica_server::{Replica, ReplicaServer};
use serde_json::json;

use crate::support::deliver::publish_to_all;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::etcd::Etcd;
use crate::support::player::Player;
use crate::support::query::{endpoints, etcd_up, grpc_query};
use crate::support::server::Server;
use crate::support::{WAIT, eventually, free_port, http};

/// The tokens of batch `n` of publisher `p`: two blocks of 4, distinct from every other batch.
fn prompt(p: usize, n: usize) -> Vec<i32> {
    let base = (p * 100_000 + n * 100 + 1) as i32;
    (base..base + 8).collect()
}

/// `prompt(p, n)` with its second block changed: only its first block is shared.
fn diverging(p: usize, n: usize) -> Vec<i32> {
    let mut tokens = prompt(p, n);
    tokens[4..].iter_mut().for_each(|t| *t += 50);
    tokens
}

/// Every prompt published so far, and each with its second block changed, answered by
/// `server`.
async fn answers(server: &Server, published: &[(usize, usize)]) -> Vec<pb::QueryResponse> {
    let mut out = Vec::with_capacity(2 * published.len());
    for &(p, n) in published {
        out.push(grpc_query(server, "m", prompt(p, n), 4).await);
        out.push(grpc_query(server, "m", diverging(p, n), 4).await);
    }
    out
}

/// Publisher 1 runs a window-first hybrid model (a window of 5 tokens: a boundary needs the one
/// block before it in the window group, which keeps the last block of each prompt only); a
/// prompt diverging after the first block is no hit there, while publisher 0 (one group of full
/// attention) reuses that block. Lost groups after a restart or bootstrap would show as 4 tokens.
fn hybrid_answers_hold(answers: &[pb::QueryResponse], published: &[(usize, usize)]) -> bool {
    published
        .iter()
        .zip(answers.chunks(2))
        .all(|(&(p, _), pair)| {
            let device =
                |r: &pb::QueryResponse| r.hits.get(&format!("v{p}")).map_or(0, |h| h.device);
            device(&pair[0]) == 8 && device(&pair[1]) == if p == 1 { 0 } else { 4 }
        })
}

struct Fleet {
    players: Vec<Player>,
    published: Vec<(usize, usize)>,
}

impl Fleet {
    /// Publish the next batch of every player to `replicas` (each re-sent until applied).
    async fn publish(&mut self, replicas: &[&Server]) {
        for p in 0..self.players.len() {
            let n = self.published.iter().filter(|(q, _)| *q == p).count();
            let profile = vllm_cbor_profile();
            let payload = match p {
                1 => engine::vllm_store_prompt_window_first(&profile, &prompt(p, n), 4, 5, 1),
                _ => engine::vllm_store_prompt(&profile, &prompt(p, n), 4, "GPU", 0),
            };
            publish_to_all(
                replicas,
                &mut self.players[p],
                &format!("v{p}|default|0"),
                payload,
            )
            .await;
            self.published.push((p, n));
        }
    }
}

async fn metric(server: &Server, line_start: &str) -> Option<String> {
    let text = http::get(server.http_port, "/metrics").await.text();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_replica_bootstraps_from_a_peer_and_is_exact_when_ready() {
    let mut etcd = Etcd::start().await;
    // No token in this fleet: its replicas serve their snapshots to anyone (opted in).
    let shared = json!({"registry": etcd.registry("/boot/"), "snapshot_export": "open"});
    let a = Server::start_with(shared.clone()).await;
    let b = Server::start_with(shared.clone()).await;
    let c = Server::start_with(shared.clone()).await;
    let mut fleet = Fleet {
        players: vec![Player::start(true, 0).await, Player::start(true, 0).await],
        published: Vec::new(),
    };
    for (p, player) in fleet.players.iter().enumerate() {
        let reg = Registration::vllm(&format!("v{p}"), &player.endpoint)
            .replay(player.replay_endpoint.as_deref())
            .json();
        let r = http::post_json(a.http_port, "/register", &engine::http_registration(&reg)).await;
        assert_eq!(r.status, 200, "{}", r.text());
    }
    for r in [&b, &c] {
        eventually("B and C run A's registrations", WAIT, || async {
            (endpoints(r).await.len() == 2).then_some(())
        })
        .await;
    }
    for _ in 0..3 {
        fleet.publish(&[&a, &b, &c]).await;
    }
    let on_a = answers(&a, &fleet.published).await;
    assert!(hybrid_answers_hold(&on_a, &fleet.published), "{on_a:?}");
    assert_eq!(answers(&b, &fleet.published).await, on_a);
    assert_eq!(answers(&c, &fleet.published).await, on_a);

    // B dies with its data; meanwhile the publishers move past what their buffers keep, so a
    // replay alone could not give B the first batches back.
    let dir = b.into_dir();
    std::fs::remove_dir_all(dir.path().join("data")).expect("delete B's data");
    for player in &mut fleet.players {
        player.keep_at_most(2);
    }
    for _ in 0..4 {
        fleet.publish(&[&a, &c]).await;
    }
    let peer = json!(format!("http://127.0.0.1:{}", a.rpc_port));
    let mut config = shared.clone();
    config["bootstrap_from"] = peer;
    config["replica_id"] = json!("replica-b");
    let b = Server::start_in(dir, config).await;
    // Ready means exact: the first answer B gives after `/health` said ready is A's.
    let on_a = answers(&a, &fleet.published).await;
    assert!(hybrid_answers_hold(&on_a, &fleet.published), "{on_a:?}");
    assert_eq!(answers(&b, &fleet.published).await, on_a, "{}", b.log());
    assert_eq!(answers(&c, &fleet.published).await, on_a);
    assert!(
        b.log().contains("bootstrapped from a peer's snapshot"),
        "{}",
        b.log()
    );
    assert_eq!(
        metric(&b, "conductor_bootstrap_state{state=\"done\"}")
            .await
            .as_deref(),
        Some("conductor_bootstrap_state{state=\"done\"} 1")
    );
    assert_eq!(
        metric(&b, "conductor_replica_info").await.as_deref(),
        Some("conductor_replica_info{replica_id=\"replica-b\"} 1")
    );
    // A, which never bootstrapped, says so.
    assert_eq!(
        metric(&a, "conductor_bootstrap_state{state=\"off\"}")
            .await
            .as_deref(),
        Some("conductor_bootstrap_state{state=\"off\"} 1")
    );
    // B follows the publishers from the snapshot's watermarks on.
    fleet.publish(&[&a, &b, &c]).await;
    let on_a = answers(&a, &fleet.published).await;
    assert_eq!(answers(&b, &fleet.published).await, on_a);
    assert_eq!(answers(&c, &fleet.published).await, on_a);

    // etcd goes away and comes back: every replica keeps answering, and answering the same.
    etcd.stop();
    fleet.publish(&[&a, &b, &c]).await;
    let on_a = answers(&a, &fleet.published).await;
    assert_eq!(answers(&b, &fleet.published).await, on_a);
    assert_eq!(answers(&c, &fleet.published).await, on_a);
    etcd.restart().await;
    for r in [&a, &b, &c] {
        eventually(
            "the replicas watch etcd again",
            Duration::from_secs(20),
            || async { etcd_up(r).await.eq(&Some(true)).then_some(()) },
        )
        .await;
    }
    assert_eq!(answers(&b, &fleet.published).await, on_a);
}

/// A peer that sends `chunks`, waiting `pause` before the last one.
#[derive(Clone)]
struct Scripted {
    chunks: Vec<pb::SnapshotChunk>,
    pause: Duration,
}

impl Scripted {
    /// One chunk at once: `begin`, one registration record, and an end mark counting it.
    fn one_registration(begin: pb::SnapshotBegin) -> Scripted {
        Scripted {
            chunks: vec![pb::SnapshotChunk {
                seq: 0,
                begin: Some(begin),
                records: vec![registration_record()],
                end: Some(pb::SnapshotEnd {
                    records: 1,
                    pairs: 0,
                }),
            }],
            pause: Duration::ZERO,
        }
    }
}

#[tonic::async_trait]
impl Replica for Scripted {
    type SnapshotStream = std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<pb::SnapshotChunk, tonic::Status>> + Send>,
    >;

    async fn snapshot(
        &self,
        _: tonic::Request<pb::SnapshotRequest>,
    ) -> Result<tonic::Response<Self::SnapshotStream>, tonic::Status> {
        let (chunks, pause) = (self.chunks.clone(), self.pause);
        let last = chunks.len().saturating_sub(1);
        let stream = futures::stream::iter(chunks.into_iter().enumerate()).then(
            move |(i, chunk)| async move {
                if i == last {
                    tokio::time::sleep(pause).await;
                }
                Ok(chunk)
            },
        );
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

use futures::StreamExt;

/// Serve `script` on a free loopback port until the test ends; its `http://` address.
async fn scripted_peer(script: Scripted) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ReplicaServer::new(script))
            .serve_with_incoming(incoming),
    );
    format!("http://{addr}")
}

fn begin(format: u32, records: u64, pairs: u64) -> pb::SnapshotBegin {
    pb::SnapshotBegin {
        format,
        records,
        pairs,
        contexts: 1,
        registrations: 1,
        replica_id: "scripted".into(),
        sources: Vec::new(),
        chain_tuning: 0,
    }
}

fn record(cf: u32, key: &[u8], value: &[u8]) -> pb::SnapshotRecord {
    pb::SnapshotRecord {
        cf,
        key: key.to_vec(),
        value: value.to_vec(),
    }
}

/// A registration record in the store's encoding, as a peer would send it.
fn registration_record() -> pb::SnapshotRecord {
    use mooncake_conductor::model::{PublisherConfig, PublisherType};
    let config = PublisherConfig {
        instance_id: "v0".into(),
        endpoint: format!("tcp://127.0.0.1:{}", free_port()),
        replay_endpoint: String::new(),
        publisher_type: PublisherType::Vllm,
        model_name: "m".into(),
        lora_name: String::new(),
        tenant_id: "default".into(),
        block_size: 4,
        dp_rank: 0,
        cache_group: None,
        hybrid_parts: Vec::new(),
        hash_profile: mooncake_conductor::hashing::HashProfile::resolve(
            Some("vllm_v1"),
            Some("sha256_cbor"),
            Some("0"),
            Some("low64_be"),
        )
        .expect("profile"),
    };
    let value = mooncake_conductor::durability::codec::registration_value(&config);
    record(1, config.subscription_key().to_string().as_bytes(), &value)
}

/// Start a replica that bootstraps from `peer` with two attempts; it must retry once, then come
/// up ready, empty, and having logged `error` and reported a failed bootstrap.
async fn starts_empty_after(peer: &str, error: &str) -> Server {
    let dir = tempfile::tempdir().expect("temp dir");
    let server = Server::start_in(
        dir,
        json!({"bootstrap_from": peer, "bootstrap_attempts": 2}),
    )
    .await;
    let log = server.log();
    assert!(log.contains("bootstrap attempt failed, retrying"), "{log}");
    assert!(log.contains("bootstrap failed, starting empty"), "{log}");
    assert!(log.contains(error), "{log}");
    assert!(endpoints(&server).await.is_empty());
    assert_eq!(
        metric(&server, "conductor_bootstrap_state{state=\"failed\"}")
            .await
            .as_deref(),
        Some("conductor_bootstrap_state{state=\"failed\"} 1")
    );
    for counter in [
        "conductor_bootstrap_attempts_total",
        "conductor_bootstrap_failures_total",
    ] {
        assert_eq!(metric(&server, counter).await, Some(format!("{counter} 2")));
    }
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_peer_gives_a_clear_error_and_an_empty_start() {
    let peer = format!("http://127.0.0.1:{}", free_port());
    starts_empty_after(&peer, &format!("peer {peer} is unreachable")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_format_is_refused_and_the_replica_starts_empty() {
    let format = mooncake_conductor::replica::format::FORMAT;
    let peer = scripted_peer(Scripted::one_registration(begin(format + 1, 1, 0))).await;
    starts_empty_after(
        &peer,
        &format!("snapshot format {}, newer than", format + 1),
    )
    .await;
}

/// A peer of an older format (6: no per-source positions, so resuming from its watermarks could
/// miss a context) is refused the same way: the replica starts empty and subscribes from
/// scratch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_format_is_refused_and_the_replica_starts_empty() {
    let format = mooncake_conductor::replica::format::FORMAT;
    let peer = scripted_peer(Scripted::one_registration(begin(format - 1, 1, 0))).await;
    starts_empty_after(
        &peer,
        &format!("snapshot format {}, older than", format - 1),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_announced_is_refused_and_the_replica_starts_empty() {
    let format = mooncake_conductor::replica::format::FORMAT;
    let mut announced = begin(format, 1, 0);
    announced.registrations = 0;
    let peer = scripted_peer(Scripted::one_registration(announced)).await;
    starts_empty_after(&peer, "more registrations than the 0 announced").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_snapshot_reports_progress_then_leaves_nothing_behind() {
    let format = mooncake_conductor::replica::format::FORMAT;
    let ctx = [7u8; 8];
    let pair_key = |block: u64| {
        let mut k = ctx.to_vec();
        k.extend_from_slice(&0u32.to_be_bytes());
        k.extend_from_slice(&block.to_be_bytes());
        k
    };
    let peer = scripted_peer(Scripted {
        chunks: vec![
            pb::SnapshotChunk {
                seq: 0,
                begin: Some(begin(format, 4, 2)),
                records: vec![registration_record(), record(6, &pair_key(1), &[1])],
                end: None,
            },
            // The peer dies before its end mark: the stream just stops.
            pb::SnapshotChunk {
                seq: 1,
                begin: None,
                records: vec![record(6, &pair_key(2), &[1])],
                end: None,
            },
        ],
        pause: Duration::from_millis(1500),
    })
    .await;
    let dir = tempfile::tempdir().expect("temp dir");
    let mut server = Server::spawn_in(
        dir,
        json!({"bootstrap_from": peer, "bootstrap_attempts": 1}),
    );
    let health = eventually("/health reports the bootstrap's progress", WAIT, || async {
        let r = http::try_request(server.http_port, "GET", "/health", &[], b"").await;
        let r = r.ok()?;
        r.text().contains("1 of 2 pairs received").then_some(r)
    })
    .await;
    assert_eq!(health.status, 503, "{}", health.text());
    assert!(
        health
            .text()
            .contains(&format!("bootstrapping from {peer}")),
        "{}",
        health.text()
    );
    server.wait_ready().await;
    let log = server.log();
    assert!(log.contains("bootstrap failed, starting empty"), "{log}");
    assert!(log.contains("is truncated"), "{log}");
    assert!(endpoints(&server).await.is_empty());
    // Nothing of it survives a restart either.
    let dir = server.into_dir();
    let server = Server::start_in(dir, json!({})).await;
    assert!(endpoints(&server).await.is_empty());
    let log = server.log();
    assert!(log.contains("contexts=0 registrations=0 pairs=0"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_recovery_cannot_read_leave_an_empty_replica() {
    let format = mooncake_conductor::replica::format::FORMAT;
    let peer = scripted_peer(Scripted {
        chunks: vec![pb::SnapshotChunk {
            seq: 0,
            begin: Some(begin(format, 2, 0)),
            // A context header that is not one: the registration beside it must not run.
            records: vec![registration_record(), record(2, &[7u8; 8], b"not a header")],
            end: Some(pb::SnapshotEnd {
                records: 2,
                pairs: 0,
            }),
        }],
        pause: Duration::ZERO,
    })
    .await;
    starts_empty_after(&peer, "cannot be loaded").await;
}

/// A begin mark announcing more than this replica could hold is refused before anything is
/// taken from it (nothing is sized from the peer's counts): the attempt is counted as beyond
/// the bounds, and the replica starts empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_announcing_more_than_the_local_caps_is_refused_at_its_begin_mark() {
    let format = mooncake_conductor::replica::format::FORMAT;
    let mut announced = begin(format, u64::MAX, u64::MAX / 2);
    announced.registrations = 1 << 40;
    let peer = scripted_peer(Scripted::one_registration(announced)).await;
    let server = starts_empty_after(
        &peer,
        "announces 1099511627776 registrations, more than this replica holds (4096, max_subscriptions)",
    )
    .await;
    assert_eq!(
        metric(
            &server,
            "conductor_bootstrap_abandoned_total{reason=\"limit\"}"
        )
        .await
        .as_deref(),
        Some("conductor_bootstrap_abandoned_total{reason=\"limit\"} 2")
    );
}
