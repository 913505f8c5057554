//! The HTTP API's contract: registration in JSON and msgpack, listings with the seed's keys, and
//! every error reason and status. Plus the gRPC error codes.

use mooncake_conductor::gateway::pb;
use serde_json::{Value, json};

use crate::support::api::reg;
use crate::support::engine::{Registration, vllm_cbor_profile};
use crate::support::server::Server;
use crate::support::{free_port, http};

fn to_msgpack(v: &Value) -> rmpv::Value {
    let bytes = rmp_serde::to_vec_named(v).unwrap();
    rmpv::decode::read_value(&mut bytes.as_slice()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_list_and_view_over_json_and_msgpack() {
    let server = Server::start().await;
    let r = http::post_json(server.http_port, "/register", &reg("e0", free_port())).await;
    assert_eq!(
        (r.status, r.json()),
        (
            200,
            json!({"status": "registered successfully", "instance_id": "e0"})
        )
    );
    // An exact duplicate is fine and changes nothing.
    let dup = reg("e0", 0);
    let first = http::get(server.http_port, "/services").await.json();
    let endpoint = first["services"][0]["Endpoint"].clone();
    let mut same = dup.clone();
    same["endpoint"] = endpoint;
    assert_eq!(
        http::post_json(server.http_port, "/register", &same)
            .await
            .status,
        200
    );
    // msgpack in, msgpack out.
    let r = http::post_msgpack(
        server.http_port,
        "/register",
        &to_msgpack(&reg("e1", free_port())),
    )
    .await;
    assert_eq!(
        (r.status, r.content_type.as_str()),
        (200, "application/msgpack")
    );
    assert_eq!(r.msgpack()["instance_id"], "e1");

    let services = http::get(server.http_port, "/services").await.json();
    assert_eq!(services["count"], 2);
    let s = &services["services"][0];
    let mut keys: Vec<&str> = s.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "BlockSize",
            "CacheGroup",
            "DPRank",
            "Endpoint",
            "HashProfile",
            "InstanceID",
            "LoraName",
            "ModelName",
            "ReplayEndpoint",
            "TenantID",
            "Type"
        ]
    );
    assert_eq!(
        (
            s["InstanceID"].as_str(),
            s["TenantID"].as_str(),
            s["Type"].as_str(),
            s["CacheGroup"].clone()
        ),
        (Some("e0"), Some("default"), Some("vLLM"), Value::Null)
    );
    assert_eq!(
        s["HashProfile"]["root_digest"],
        "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
    );

    let view = http::get(server.http_port, "/global_view").await.json();
    assert_eq!(view["context_count"], 1);
    let c = &view["contexts"][0];
    assert_eq!(
        (
            c["model_name"].as_str(),
            c["block_size"].as_u64(),
            c["tenant_id"].as_str(),
            c["prefix_count"].as_u64()
        ),
        (Some("m"), Some(16), Some("default"), Some(0))
    );
    assert_eq!(c["instances"], json!({"e0": [0], "e1": [0]}));

    let r = server.http_unregister("e1").await;
    assert_eq!(
        (r.status, r.json()),
        (
            200,
            json!({"status": "unregistered successfully", "removed_instances": ["e1|default|0"]})
        )
    );
    let r = server.http_unregister("e1").await;
    assert_eq!(r.status, 404);

    assert_eq!(http::get(server.http_port, "/health").await.status, 200);
    let metrics = http::get(server.http_port, "/metrics").await;
    assert_eq!(metrics.status, 200);
    for name in [
        "conductor_subscription_info",
        "conductor_query_duration_seconds_bucket",
        "conductor_index_blocks",
        "conductor_gaps_total",
    ] {
        assert!(metrics.text().contains(name), "missing {name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_reports_seed_codes() {
    let server = Server::start().await;
    let mut client = server.grpc().await;
    let good = Registration::vllm("g", &format!("tcp://127.0.0.1:{}", free_port()))
        .block_size(16)
        .json();
    let mut bad = good.clone();
    bad["endpoint"] = json!("127.0.0.1:5557");
    let r = server.register(&bad).await;
    assert_eq!(
        (r.ret, r.error.unwrap().field),
        (-600, "endpoint".to_owned())
    );
    let mut missing = good.clone();
    missing.as_object_mut().unwrap().remove("hash_profile");
    let r = server.register(&missing).await;
    assert_eq!(
        (r.ret, r.error.unwrap().reason),
        (-600, "missing".to_owned())
    );
    let mut bigram = good.clone();
    bigram["hash_profile"] = json!({"strategy": "sglang_bigram", "algorithm": "sha256", "python_hash_seed": "0", "index_projection": "first64_be"});
    let r = server.register(&bigram).await;
    assert_eq!(
        (r.ret, r.error.unwrap().field),
        (-600, "algorithm".to_owned())
    );
    assert_eq!(server.register(&good).await.ret, 0);
    let r = client
        .unregister(pb::UnregisterRequest {
            instance_id: "nobody".into(),
            tenant_id: String::new(),
            dp_rank: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.ret, -2001);
    let r = client
        .query(pb::QueryRequest {
            model_name: String::new(),
            block_size: 16,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.ret, r.hits.len()), (-600, 0));
    let health = client
        .health(pb::HealthRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(health.ready);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_registrations_start_and_bad_entries_are_skipped_by_name() {
    let port = free_port();
    let good = json!({"type": "vLLM", "endpoint": format!("tcp://127.0.0.1:{port}"), "modelname": "m", "block_size": 16, "dp_rank": 0, "hash_profile": vllm_cbor_profile()});
    let mut bad = good.clone();
    bad["block_size"] = json!(-3);
    let mut server =
        Server::start_with(json!({"kvevent_instance": {"engine-a": good, "engine-b": bad}})).await;
    let services = http::get(server.http_port, "/services").await.json();
    assert_eq!(services["count"], 1);
    assert_eq!(
        services["services"][0]["InstanceID"], "engine-a",
        "instance_id defaults to the stream key"
    );
    assert!(
        server.log().contains("engine-b"),
        "the skipped entry is named in the log"
    );
    assert_eq!(
        server.terminate(),
        Some(0),
        "SIGTERM exits 0:\n{}",
        server.log()
    );
}
