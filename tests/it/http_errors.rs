//! The HTTP API's error contract: every reason and status, with the offending field.

use serde_json::{Value, json};

use crate::support::api::{expect_error, reg};
use crate::support::engine::vllm_cbor_profile;
use crate::support::server::Server;
use crate::support::{free_port, http};

/// Every `/register` rejection: its status, reason and field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_errors_name_reason_and_field() {
    let body_limit = 4096;
    let server = Server::start_with(json!({"http_body_limit_bytes": body_limit})).await;
    let port = free_port();
    let base = reg("x", port);
    let with = |k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let without = |k: &str| {
        let mut b = base.clone();
        b.as_object_mut().unwrap().remove(k);
        b
    };
    // Each case is named by its body in a failure message (see `expect_error`).
    let mut rejected = vec![
        (with("bogus", json!(1)), "unknown_field", Some("bogus")),
        (
            with("model_name", json!("m")),
            "unknown_field",
            Some("model_name"),
        ),
        (without("endpoint"), "missing", Some("endpoint")),
        (without("modelname"), "missing", Some("modelname")),
        (without("hash_profile"), "missing", Some("hash_profile")),
        (
            with("endpoint", json!("")),
            "invalid_value",
            Some("endpoint"),
        ),
        (
            with("endpoint", json!("not-an-endpoint")),
            "invalid_value",
            Some("endpoint"),
        ),
        (with("type", json!("vllm")), "invalid_value", Some("type")),
        (
            with("block_size", json!(1.5)),
            "invalid_type",
            Some("block_size"),
        ),
        (
            with("block_size", json!(0)),
            "out_of_range",
            Some("block_size"),
        ),
        (with("dp_rank", json!(-1)), "out_of_range", Some("dp_rank")),
        (
            with("dp_rank", json!(true)),
            "invalid_type",
            Some("dp_rank"),
        ),
        (
            // Groups 0..64 are a hybrid model's KV-cache groups; any other is no group.
            with("cache_group", json!(64)),
            "out_of_range",
            Some("cache_group"),
        ),
        (
            // vLLM's events name their groups' kinds: a declared hybrid is SGLang's only.
            with("hybrid_parts", json!("mamba")),
            "invalid_value",
            Some("hybrid_parts"),
        ),
        (
            with("cache_group", json!("0")),
            "invalid_type",
            Some("cache_group"),
        ),
        (
            with("tenant_id", Value::Null),
            "invalid_type",
            Some("tenant_id"),
        ),
        (
            with("hash_profile", json!("x")),
            "invalid_type",
            Some("hash_profile"),
        ),
    ];
    let mut p = vllm_cbor_profile();
    p["root_digest"] = json!("00");
    rejected.push((
        with("hash_profile", p),
        "unknown_field",
        Some("root_digest"),
    ));
    for seed in ["", "-1", "+1", " 0", "0 ", "4294967296"] {
        let mut p = vllm_cbor_profile();
        p["python_hash_seed"] = json!(seed);
        rejected.push((
            with("hash_profile", p),
            "invalid_value",
            Some("python_hash_seed"),
        ));
    }
    let mut p = vllm_cbor_profile();
    p["python_hash_seed"] = json!(0);
    rejected.push((
        with("hash_profile", p),
        "invalid_type",
        Some("python_hash_seed"),
    ));
    let mut p = vllm_cbor_profile();
    p["algorithm"] = json!("md5");
    rejected.push((with("hash_profile", p), "invalid_value", Some("algorithm")));
    for (body, reason, field) in rejected {
        expect_error(&server, "/register", body, 400, reason, field).await;
    }
    // A conflicting registration of an existing key, and a context bound to another profile.
    assert_eq!(
        http::post_json(server.http_port, "/register", &base)
            .await
            .status,
        200
    );
    expect_error(
        &server,
        "/register",
        with("block_size", json!(32)),
        400,
        "invalid_registration",
        None,
    )
    .await;
    let mut other = reg("y", free_port());
    other["hash_profile"]["algorithm"] = json!("sha256");
    expect_error(
        &server,
        "/register",
        other,
        400,
        "invalid_registration",
        None,
    )
    .await;
}

/// `/unregister` and `/query` rejections, and what is not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregister_and_query_errors_name_reason_and_field() {
    let body_limit = 4096;
    let server = Server::start_with(json!({"http_body_limit_bytes": body_limit})).await;
    for (body, reason, field) in [
        (json!({"instance_id": "x"}), "missing", Some("dp_rank")),
        (json!({"dp_rank": 0}), "missing", Some("instance_id")),
    ] {
        expect_error(&server, "/unregister", body, 400, reason, field).await;
    }
    let r = server.http_unregister("nobody").await;
    assert_eq!(r.status, 404);

    for (body, reason, field) in [
        (
            json!({"block_size": 4, "token_ids": []}),
            "missing",
            Some("model"),
        ),
        (
            json!({"model": "m", "token_ids": []}),
            "missing",
            Some("block_size"),
        ),
        (
            json!({"model": "m", "block_size": 0, "token_ids": []}),
            "out_of_range",
            Some("block_size"),
        ),
        (
            json!({"model": "m", "block_size": "4", "token_ids": []}),
            "invalid_type",
            Some("block_size"),
        ),
        (
            json!({"model": "m", "block_size": 4, "token_ids": [2147483648i64]}),
            "out_of_range",
            Some("token_ids"),
        ),
        (
            json!({"model": "m", "block_size": 4, "token_ids": ["1"]}),
            "invalid_type",
            Some("token_ids"),
        ),
        (
            json!({"model": "m", "block_size": 4, "token_ids": []})
                .as_object()
                .map(|o| {
                    let mut o = o.clone();
                    o.insert("root_digest".into(), json!("x"));
                    Value::Object(o)
                })
                .unwrap(),
            "unknown_field",
            Some("root_digest"),
        ),
        (
            json!({"model": "m", "block_size": 4, "token_ids": [], "cache_salt": 1}),
            "invalid_type",
            Some("cache_salt"),
        ),
    ] {
        expect_error(&server, "/query", body, 400, reason, field).await;
    }
    let bad_bin = rmpv::Value::Map(vec![
        ("model".into(), "m".into()),
        ("block_size".into(), 4.into()),
        ("token_ids".into(), rmpv::Value::Binary(vec![1, 2, 3])),
    ]);
    let r = http::post_msgpack(server.http_port, "/query", &bad_bin).await;
    assert_eq!(
        (r.status, r.msgpack()["reason"].as_str()),
        (400, Some("invalid_value"))
    );
    // Unknown context: OK and empty.
    let r = http::post_json(
        server.http_port,
        "/query",
        &json!({"model": "nope", "block_size": 4, "token_ids": [1, 2, 3, 4]}),
    )
    .await;
    assert_eq!((r.status, r.json()), (200, json!({"instances": {}})));
}

/// Undecodable bodies, wrong content types, oversized bodies, wrong methods and paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_are_not_what_they_claim() {
    let body_limit = 4096;
    let server = Server::start_with(json!({"http_body_limit_bytes": body_limit})).await;
    // Bodies that are not what they claim to be.
    let r = http::request(
        server.http_port,
        "POST",
        "/query",
        &[("Content-Type", "application/json")],
        b"{not json",
    )
    .await;
    assert_eq!(
        (r.status, r.json()["reason"].as_str()),
        (400, Some("invalid_json"))
    );
    let r = http::request(
        server.http_port,
        "POST",
        "/query",
        &[("Content-Type", "application/msgpack")],
        &[0xc1],
    )
    .await;
    assert_eq!(
        (r.status, r.msgpack()["reason"].as_str()),
        (400, Some("invalid_msgpack"))
    );
    let r = http::request(
        server.http_port,
        "POST",
        "/query",
        &[("Content-Type", "text/plain")],
        b"hi",
    )
    .await;
    assert_eq!(
        (r.status, r.json()["reason"].as_str()),
        (400, Some("unsupported_content_type"))
    );
    let big = vec![b' '; body_limit + 1];
    let r = http::request(
        server.http_port,
        "POST",
        "/query",
        &[("Content-Type", "application/json")],
        &big,
    )
    .await;
    assert_eq!(r.status, 413);
    assert_eq!(http::get(server.http_port, "/query").await.status, 405);
    assert_eq!(
        http::request(server.http_port, "POST", "/services", &[], b"")
            .await
            .status,
        405
    );
    assert_eq!(http::get(server.http_port, "/nowhere").await.status, 404);
}
