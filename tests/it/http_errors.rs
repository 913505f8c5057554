//! The HTTP API's error contract: every reason and status, with the offending field.

use serde_json::{Value, json};

use crate::http_api::{expect_error, reg};
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
    expect_error(
        &server,
        "/register",
        with("bogus", json!(1)),
        400,
        "unknown_field",
        Some("bogus"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("model_name", json!("m")),
        400,
        "unknown_field",
        Some("model_name"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        without("endpoint"),
        400,
        "missing",
        Some("endpoint"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        without("modelname"),
        400,
        "missing",
        Some("modelname"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        without("hash_profile"),
        400,
        "missing",
        Some("hash_profile"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("endpoint", json!("")),
        400,
        "invalid_value",
        Some("endpoint"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("endpoint", json!("not-an-endpoint")),
        400,
        "invalid_value",
        Some("endpoint"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("type", json!("vllm")),
        400,
        "invalid_value",
        Some("type"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("block_size", json!(1.5)),
        400,
        "invalid_type",
        Some("block_size"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("block_size", json!(0)),
        400,
        "out_of_range",
        Some("block_size"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("dp_rank", json!(-1)),
        400,
        "out_of_range",
        Some("dp_rank"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("dp_rank", json!(true)),
        400,
        "invalid_type",
        Some("dp_rank"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("cache_group", json!(1)),
        400,
        "unsupported",
        Some("cache_group"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("cache_group", json!("0")),
        400,
        "invalid_type",
        Some("cache_group"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("tenant_id", Value::Null),
        400,
        "invalid_type",
        Some("tenant_id"),
    )
    .await;
    expect_error(
        &server,
        "/register",
        with("hash_profile", json!("x")),
        400,
        "invalid_type",
        Some("hash_profile"),
    )
    .await;
    let mut p = vllm_cbor_profile();
    p["root_digest"] = json!("00");
    expect_error(
        &server,
        "/register",
        with("hash_profile", p),
        400,
        "unknown_field",
        Some("root_digest"),
    )
    .await;
    for seed in ["", "-1", "+1", " 0", "0 ", "4294967296"] {
        let mut p = vllm_cbor_profile();
        p["python_hash_seed"] = json!(seed);
        expect_error(
            &server,
            "/register",
            with("hash_profile", p),
            400,
            "invalid_value",
            Some("python_hash_seed"),
        )
        .await;
    }
    let mut p = vllm_cbor_profile();
    p["python_hash_seed"] = json!(0);
    expect_error(
        &server,
        "/register",
        with("hash_profile", p),
        400,
        "invalid_type",
        Some("python_hash_seed"),
    )
    .await;
    let mut p = vllm_cbor_profile();
    p["algorithm"] = json!("md5");
    expect_error(
        &server,
        "/register",
        with("hash_profile", p),
        400,
        "invalid_value",
        Some("algorithm"),
    )
    .await;
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
    expect_error(
        &server,
        "/unregister",
        json!({"instance_id": "x"}),
        400,
        "missing",
        Some("dp_rank"),
    )
    .await;
    expect_error(
        &server,
        "/unregister",
        json!({"dp_rank": 0}),
        400,
        "missing",
        Some("instance_id"),
    )
    .await;
    let r = http::post_json(
        server.http_port,
        "/unregister",
        &json!({"instance_id": "nobody", "dp_rank": 0}),
    )
    .await;
    assert_eq!(r.status, 404);

    expect_error(
        &server,
        "/query",
        json!({"block_size": 4, "token_ids": []}),
        400,
        "missing",
        Some("model"),
    )
    .await;
    expect_error(
        &server,
        "/query",
        json!({"model": "m", "token_ids": []}),
        400,
        "missing",
        Some("block_size"),
    )
    .await;
    expect_error(
        &server,
        "/query",
        json!({"model": "m", "block_size": 0, "token_ids": []}),
        400,
        "out_of_range",
        Some("block_size"),
    )
    .await;
    expect_error(
        &server,
        "/query",
        json!({"model": "m", "block_size": "4", "token_ids": []}),
        400,
        "invalid_type",
        Some("block_size"),
    )
    .await;
    expect_error(
        &server,
        "/query",
        json!({"model": "m", "block_size": 4, "token_ids": [2147483648i64]}),
        400,
        "out_of_range",
        Some("token_ids"),
    )
    .await;
    expect_error(
        &server,
        "/query",
        json!({"model": "m", "block_size": 4, "token_ids": ["1"]}),
        400,
        "invalid_type",
        Some("token_ids"),
    )
    .await;
    expect_error(
        &server,
        "/query",
        json!({"model": "m", "block_size": 4, "token_ids": []})
            .as_object()
            .map(|o| {
                let mut o = o.clone();
                o.insert("root_digest".into(), json!("x"));
                Value::Object(o)
            })
            .unwrap(),
        400,
        "unknown_field",
        Some("root_digest"),
    )
    .await;
    expect_error(
        &server,
        "/query",
        json!({"model": "m", "block_size": 4, "token_ids": [], "cache_salt": 1}),
        400,
        "invalid_type",
        Some("cache_salt"),
    )
    .await;
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
