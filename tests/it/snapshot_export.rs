//! `Replica.Snapshot` is guarded: refused without a configured token unless opened on purpose,
//! needing the token when one is configured, and one export at a time (another is refused with
//! `RESOURCE_EXHAUSTED` while the first one's stream is open); every outcome counted in
//! `/metrics`.

use std::time::Duration;

use mooncake_conductor::gateway::pb;
use mooncake_conductor::gateway::pb::replica_client::ReplicaClient;
use serde_json::json;
use tonic::transport::Channel;

use crate::support::deliver::publish_to_all;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::player::Player;
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::{eventually, http};

/// A snapshot client of `server`; `window`: its HTTP/2 flow-control windows, when small enough
/// that a client which does not read holds the export open.
async fn client(server: &Server, window: Option<u32>) -> ReplicaClient<Channel> {
    let mut endpoint =
        tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", server.rpc_port))
            .expect("endpoint");
    if let Some(window) = window {
        endpoint = endpoint
            .initial_stream_window_size(window)
            .initial_connection_window_size(window);
    }
    let channel = endpoint.connect().await.expect("connect");
    ReplicaClient::new(channel).max_decoding_message_size(8 << 20)
}

fn request(token: Option<&str>) -> tonic::Request<pb::SnapshotRequest> {
    let mut request = tonic::Request::new(pb::SnapshotRequest {});
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("metadata");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

/// Read a snapshot stream to its end mark; the chunks read.
async fn read_whole(stream: &mut tonic::Streaming<pb::SnapshotChunk>) -> u64 {
    let mut chunks = 0;
    loop {
        let chunk = stream
            .message()
            .await
            .expect("chunk")
            .expect("the end mark before the stream ends");
        chunks += 1;
        if chunk.end.is_some() {
            return chunks;
        }
    }
}

async fn exports(server: &Server, outcome: &str) -> u64 {
    let text = http::get(server.http_port, "/metrics").await.text();
    let line = format!("conductor_snapshot_exports_total{{outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .unwrap_or_else(|| panic!("no {line} in {text}"))
        .parse()
        .expect("a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unauthenticated_snapshot_is_refused_by_default() {
    let server = Server::start().await;
    let e = client(&server, None)
        .await
        .snapshot(request(None))
        .await
        .expect_err("refused without a configured token");
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("snapshot_export"), "{}", e.message());
    assert_eq!(exports(&server, "no_token").await, 1);
    assert_eq!(exports(&server, "served").await, 0);

    // With a token configured, the token is needed, and enough.
    let guarded = Server::start_with(json!({"auth_token": "s3cret"})).await;
    let e = client(&guarded, None)
        .await
        .snapshot(request(Some("wrong")))
        .await
        .expect_err("refused without the token");
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
    let mut stream = client(&guarded, None)
        .await
        .snapshot(request(Some("s3cret")))
        .await
        .expect("served with the token")
        .into_inner();
    assert_eq!(read_whole(&mut stream).await, 1);
    assert_eq!(exports(&guarded, "unauthorized").await, 1);
    assert_eq!(exports(&guarded, "served").await, 1);

    // Opened on purpose, anyone may take it.
    let open = Server::start_with(json!({"snapshot_export": "open"})).await;
    let mut stream = client(&open, None)
        .await
        .snapshot(request(None))
        .await
        .expect("served when opened")
        .into_inner();
    assert_eq!(read_whole(&mut stream).await, 1);
}

/// Blocks in one batch: about 580 kB of snapshot, far more than a 64 KiB window.
const BLOCKS: usize = 20_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_export_while_one_runs_is_refused_and_counted() {
    let server = Server::start_with(json!({"snapshot_export": "open"})).await;
    let mut player = Player::start(true, 0).await;
    let reg = Registration::vllm("v0", &player.endpoint)
        .replay(player.replay_endpoint.as_deref())
        .json();
    let r = http::post_json(
        server.http_port,
        "/register",
        &engine::http_registration(&reg),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let prompt: Vec<i32> = (1..=(BLOCKS * 4) as i32).collect();
    let payload = engine::vllm_store_prompt(&vllm_cbor_profile(), &prompt, 4, "GPU", 0);
    publish_to_all(&[&server], &mut player, "v0|default|0", payload).await;
    eventually(
        "the batch is applied whole",
        Duration::from_secs(30),
        || {
            let prompt = prompt.clone();
            let server = &server;
            async move {
                let r = grpc_query(server, "m", prompt, 4).await;
                r.hits
                    .values()
                    .any(|h| h.device == BLOCKS as i64 * 4)
                    .then_some(())
            }
        },
    )
    .await;

    // The first export's client reads nothing: its window full, the export stays open.
    let mut slow = client(&server, Some(65_535)).await;
    let held = slow
        .snapshot(request(None))
        .await
        .expect("the first export is served");
    let e = client(&server, None)
        .await
        .snapshot(request(None))
        .await
        .expect_err("a second export while the first runs is refused");
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("one at a time"), "{}", e.message());
    assert_eq!(exports(&server, "busy").await, 1);
    assert_eq!(exports(&server, "served").await, 1);

    // Once the first one's client is gone, the next export runs.
    drop(held);
    drop(slow);
    let mut stream = eventually(
        "an export is served again",
        Duration::from_secs(10),
        || async {
            let mut c = client(&server, None).await;
            c.snapshot(request(None)).await.ok().map(|r| r.into_inner())
        },
    )
    .await;
    assert!(read_whole(&mut stream).await >= 1);
    assert_eq!(exports(&server, "served").await, 2);
}
