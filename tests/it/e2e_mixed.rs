//! End to end with every publisher kind: a vLLM instance with two DP ranks on device and local
//! CPU, a Mooncake store holding shared CPU and disk blocks of the same context, and an SGLang
//! instance with signed hashes and a partial final page. Exact counts for every instance, rank
//! and tier, registered over gRPC, HTTP JSON and HTTP msgpack.

use rmpv::Value;
use serde_json::json;

use crate::support::deliver::handshake;
use crate::support::engine::{self, Registration, sglang_profile, vllm_cbor_profile};
use crate::support::player::Player;
use crate::support::query::grpc_query;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

fn tokens(n: i32) -> Vec<i32> {
    (1..=n).map(|t| t * 7).collect()
}

fn to_msgpack(v: &serde_json::Value) -> Value {
    let bytes = rmp_serde::to_vec_named(v).unwrap();
    rmpv::decode::read_value(&mut bytes.as_slice()).unwrap()
}

fn sglang_stored(hashes: &[u64], parent: Option<u64>, toks: &[i32], block_size: u32) -> Value {
    // SGLang sends the 64 bits as a signed int64.
    let signed = |h: u64| Value::from(h as i64);
    Value::Map(vec![
        ("type".into(), "BlockStored".into()),
        (
            "block_hashes".into(),
            Value::Array(hashes.iter().map(|h| signed(*h)).collect()),
        ),
        (
            "parent_block_hash".into(),
            parent.map_or(Value::Nil, signed),
        ),
        (
            "token_ids".into(),
            Value::Array(toks.iter().map(|t| Value::from(*t)).collect()),
        ),
        ("block_size".into(), block_size.into()),
        ("lora_id".into(), Value::Nil),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_publisher_kind_every_rank_and_tier() {
    let server = Server::start().await;
    let prompt = tokens(16);
    let keys = engine::block_keys(&vllm_cbor_profile(), &prompt, 4, "");
    assert_eq!(keys.len(), 4);

    // vLLM rank 0 over gRPC, rank 1 over HTTP JSON, the store over HTTP msgpack.
    let mut rank0 = Player::start(false, 0).await;
    let mut rank1 = Player::start(false, 0).await;
    let mut store = Player::start(false, 1).await;
    let r0 = Registration::vllm("v", &rank0.endpoint).model("mix").json();
    assert_eq!(server.register(&r0).await.ret, 0);
    let r1 = Registration::vllm("v", &rank1.endpoint)
        .model("mix")
        .rank(1)
        .json();
    assert_eq!(
        http::post_json(
            server.http_port,
            "/register",
            &engine::http_registration(&r1)
        )
        .await
        .status,
        200
    );
    let rs = Registration::mooncake("store", &store.endpoint)
        .model("mix")
        .json();
    let r = http::post_msgpack(
        server.http_port,
        "/register",
        &to_msgpack(&engine::http_registration(&rs)),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());

    // rank 0: block 0 on device, block 1 in local CPU; rank 1: blocks 0-1 on device.
    let b0 = engine::batch(
        vec![
            engine::vllm_stored(&keys[..1], None, &prompt[..4], 4, "GPU", None),
            engine::vllm_stored(&keys[1..2], Some(keys[0]), &prompt[4..8], 4, "CPU", None),
        ],
        0,
    );
    handshake(&server, &mut rank0, "v|default|0", b0).await;
    let b1 = engine::batch(
        vec![engine::vllm_stored(
            &keys[..2],
            None,
            &prompt[..8],
            4,
            "GPU",
            None,
        )],
        1,
    );
    handshake(&server, &mut rank1, "v|default|1", b1).await;
    // The store: block 2 in its CPU pool, block 3 on its disk, shared by every rank.
    let objects = engine::mooncake_batch(vec![
        engine::mooncake_event("stored", "mix", 4, "backend-a", "obj-2", "cpu", keys[2]),
        engine::mooncake_event("stored", "mix", 4, "backend-a", "obj-3", "disk", keys[3]),
    ]);
    handshake(&server, &mut store, "store|default|0", objects).await;

    let expected = json!({"instances": {"v": {
        "longest_matched": 16, "dp": {"0": 4, "1": 8},
        "rank_matches": {
            "0": {"device": 4, "cpu_local": 8, "cpu_share": 12, "disk": 16},
            "1": {"device": 8, "cpu_local": 8, "cpu_share": 12, "disk": 16},
        },
        "device": 8, "cpu_local": 8, "cpu_share": 12, "disk": 16,
    }}});
    let body = json!({"model": "mix", "block_size": 4, "token_ids": prompt});
    let got = eventually("mixed tiers", WAIT, || async {
        let r = http::post_json(server.http_port, "/query", &body)
            .await
            .json();
        (r == expected).then_some(r)
    })
    .await;
    assert_eq!(got, expected, "the store adds no query row of its own");
    // The same over gRPC, rank keys as strings.
    let g = grpc_query(&server, "mix", prompt.clone(), 4).await;
    let v = &g.hits["v"];
    assert_eq!(
        (
            v.device,
            v.cpu_local,
            v.cpu_share,
            v.disk,
            v.longest_matched
        ),
        (8, 8, 12, 16, 16)
    );
    assert_eq!(v.rank_matches["1"].device, 8);
    // Filters: an unknown instance answers nothing; the store is not an instance.
    let r = http::post_json(
        server.http_port,
        "/query",
        &json!({"model": "mix", "block_size": 4, "token_ids": prompt, "instance_id": "store"}),
    )
    .await;
    assert_eq!(r.json(), json!({"instances": {}}));

    // Removing the store's disk object shortens every rank's disk count.
    store
        .publish(engine::mooncake_batch(vec![engine::mooncake_event(
            "removed",
            "mix",
            4,
            "backend-a",
            "obj-3",
            "disk",
            keys[3],
        )]))
        .await;
    eventually("disk object removed", WAIT, || async {
        let g = grpc_query(&server, "mix", prompt.clone(), 4).await;
        (g.hits["v"].disk == 12).then_some(())
    })
    .await;

    let view = http::get(server.http_port, "/global_view").await.json();
    let mix = view["contexts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["model_name"] == "mix")
        .unwrap()
        .clone();
    assert_eq!(mix["instances"], json!({"v": [0, 1]}));
    assert_eq!(
        mix["prefix_count"], 3,
        "blocks 0, 1 and 2 are held somewhere"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_signed_hashes_and_a_partial_final_page() {
    let server = Server::start().await;
    let mut player = Player::start(false, 0).await;
    let reg = Registration::sglang("s", &player.endpoint)
        .model("sg")
        .json();
    assert_eq!(server.register(&reg).await.ret, 0);
    let prompt = tokens(10);
    let keys = engine::block_keys(&sglang_profile(), &prompt, 4, "");
    assert_eq!(keys.len(), 3, "two full pages and a partial one");
    let events = vec![
        sglang_stored(&keys[..2], None, &prompt[..8], 4),
        sglang_stored(&keys[2..], Some(keys[1]), &prompt[8..], 2),
    ];
    handshake(
        &server,
        &mut player,
        "s|default|0",
        engine::batch(events, 0),
    )
    .await;
    let hits = eventually("sglang hits", WAIT, || async {
        let g = grpc_query(&server, "sg", prompt.clone(), 4).await;
        g.hits.get("s").filter(|h| h.device == 10).cloned()
    })
    .await;
    assert_eq!(
        (hits.device, hits.disk, hits.longest_matched),
        (10, 10, 10),
        "the partial page counts its 2 tokens"
    );
    // A prompt that diverges in the partial page keeps the two full pages.
    let mut other = prompt.clone();
    other[9] = 1;
    assert_eq!(
        grpc_query(&server, "sg", other, 4).await.hits["s"].device,
        8
    );
}
