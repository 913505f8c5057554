//! End to end: register a publisher, feed it engine batches over a real PUB socket, and check
//! exact query answers over gRPC, HTTP JSON and HTTP msgpack.

use mooncake_conductor::gateway::pb;
use serde_json::json;

use crate::support::deliver::handshake;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::player::Player;
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_blocks_become_hits_over_every_transport() {
    let server = Server::start().await;
    let mut player = Player::start(false, 0).await;
    let registration = Registration::vllm("vllm-0", &player.endpoint)
        .model("my-model")
        .json();
    server.register_ok(&registration).await;

    // 10 tokens, block size 4: two complete blocks on GPU; the tail is never a block for vLLM.
    let tokens: Vec<i32> = (1..=10).collect();
    let store = engine::vllm_store_prompt(&vllm_cbor_profile(), &tokens, 4, "GPU", 0);
    handshake(&server, &mut player, "vllm-0|default|0", store).await;

    let hits = eventually("hits", WAIT, || async {
        let r = grpc_query(&server, "my-model", tokens.clone(), 4).await;
        (r.hits.get("vllm-0").map(|h| h.device) == Some(8)).then_some(r)
    })
    .await;
    assert_eq!(hits.ret, 0);
    let row = &hits.hits["vllm-0"];
    assert_eq!(
        (
            row.longest_matched,
            row.device,
            row.cpu_local,
            row.cpu_share,
            row.disk
        ),
        (8, 8, 8, 8, 8)
    );
    assert_eq!(row.dp.get("0"), Some(&8));
    let rank = &row.rank_matches["0"];
    assert_eq!(
        (rank.device, rank.cpu_local, rank.cpu_share, rank.disk),
        (8, 8, 8, 8)
    );

    // A prompt that diverges in block 1 matches block 0 only.
    let mut other = tokens.clone();
    other[5] = 999;
    let r = grpc_query(&server, "my-model", other, 4).await;
    assert_eq!(r.hits["vllm-0"].device, 4);

    // The same answer over HTTP JSON and msgpack, with the seed's field names.
    let expected = json!({"instances": {"vllm-0": {
        "longest_matched": 8, "dp": {"0": 8},
        "rank_matches": {"0": {"device": 8, "cpu_local": 8, "cpu_share": 8, "disk": 8}},
        "device": 8, "cpu_local": 8, "cpu_share": 8, "disk": 8,
    }}});
    let body = json!({"model": "my-model", "block_size": 4, "token_ids": tokens});
    let r = http::post_json(server.http_port, "/query", &body).await;
    assert_eq!((r.status, r.json()), (200, expected.clone()));
    let packed: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let body = rmpv::Value::Map(vec![
        ("model".into(), "my-model".into()),
        ("block_size".into(), 4.into()),
        ("token_ids".into(), rmpv::Value::Binary(packed)),
    ]);
    let r = http::post_msgpack(server.http_port, "/query", &body).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.content_type, "application/msgpack");
    assert_eq!(r.msgpack(), expected);

    // Removing block 1 from GPU leaves block 0.
    let keys = engine::block_keys(&vllm_cbor_profile(), &tokens, 4, "");
    player
        .publish(engine::batch(
            vec![engine::vllm_removed(&keys[1..2], "GPU")],
            0,
        ))
        .await;
    eventually("removal applied", WAIT, || async {
        let r = grpc_query(&server, "my-model", tokens.clone(), 4).await;
        (r.hits["vllm-0"].device == 4).then_some(())
    })
    .await;
}

/// One base registration indexes the blocks its publisher reports under an adapter, in that
/// adapter's own context, which lists the publisher's instance and rank.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapter_blocks_from_a_base_registration_get_their_own_context() {
    let server = Server::start().await;
    let mut player = Player::start(false, 0).await;
    let registration = Registration::vllm("v", &player.endpoint)
        .model("base-model")
        .json();
    assert_eq!(server.register(&registration).await.ret, 0);
    let tokens: Vec<i32> = (1..=8).collect();
    let keys = engine::block_keys(&vllm_cbor_profile(), &tokens, 4, "ad");
    let stored = engine::vllm_stored(&keys, None, &tokens, 4, "GPU", Some("ad"));
    handshake(
        &server,
        &mut player,
        "v|default|0",
        engine::batch(vec![stored], 0),
    )
    .await;
    let query = pb::QueryRequest {
        model_name: "base-model".into(),
        lora_name: "ad".into(),
        block_size: 4,
        token_ids: tokens.clone(),
        ..Default::default()
    };
    let hits = eventually("adapter hits", WAIT, || async {
        let r = server
            .grpc()
            .await
            .query(query.clone())
            .await
            .unwrap()
            .into_inner();
        r.hits.get("v").filter(|h| h.device == 8).cloned()
    })
    .await;
    assert_eq!(hits.dp.get("0"), Some(&8));
    // The base context has nothing of the adapter's.
    let base = grpc_query(&server, "base-model", tokens, 4).await;
    assert_eq!(base.hits["v"].device, 0);
    let view = http::get(server.http_port, "/global_view").await.json();
    let adapter = view["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["lora_name"] == "ad")
        .cloned()
        .expect("adapter context");
    assert_eq!(adapter["instances"], json!({"v": [0]}));
    assert_eq!(adapter["prefix_count"], 2);
}
