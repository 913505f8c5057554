//! Endpoint policy and caps: registrations outside the allowed hosts, over the subscription cap
//! or with over-long names are refused naming the field and counted; a store whose events name
//! too many contexts, another tenant or a bad block size has those events refused and counted
//! while its good events of the same batch still apply.

use serde_json::{Value, json};

use crate::support::api::{expect_error, reg};
use crate::support::deliver::handshake;
use crate::support::engine::{self, Registration};
use crate::support::grpc::register_request;
use crate::support::player::Player;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, free_port, http, until};

fn with_endpoint(mut body: Value, key: &str, endpoint: &str) -> Value {
    body[key] = json!(endpoint);
    body
}

/// The value of the sample of `metric` whose labels contain `labels`.
fn sample(metrics: &str, metric: &str, labels: &str) -> Option<u64> {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{metric}{{")) && l.contains(labels))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `metric` on `/metrics` counts exactly `count` refusals of each `field` (its labels `prefix`
/// followed by `field="..."`).
async fn refusals_are(server: &Server, metric: &str, prefix: &str, expected: &[(&str, u64)]) {
    let metrics = http::get(server.http_port, "/metrics").await.text();
    for &(field, count) in expected {
        let labels = format!("{prefix}field=\"{field}\"");
        assert_eq!(
            sample(&metrics, metric, &labels),
            Some(count),
            "{field}: {metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registrations_outside_the_policy_are_refused_naming_the_field() {
    let server = Server::start_with(json!({
        "allowed_endpoint_hosts": ["127.0.0.1/32", "::1", "publisher.internal"],
        "max_subscriptions": 2,
        "max_name_bytes": 16,
    }))
    .await;
    let port = free_port();
    for (field, endpoint) in [
        ("endpoint", format!("tcp://127.0.0.2:{port}")),
        ("endpoint", format!("tcp://localhost:{port}")),
        ("endpoint", format!("tcp://[::2]:{port}")),
        ("endpoint", format!("tcp://10.0.0.1:{port}")),
        ("replay_endpoint", format!("tcp://192.168.1.1:{port}")),
    ] {
        let body = with_endpoint(reg("e0", port), field, &endpoint);
        expect_error(&server, "/register", body, 400, "not_allowed", Some(field)).await;
    }
    let r = http::post_json(server.http_port, "/register", &{
        let mut b = reg("e0", port);
        b["instance_id"] = json!("x".repeat(17));
        b
    })
    .await;
    let j = r.json();
    assert_eq!(
        (r.status, &j["reason"], &j["field"]),
        (400, &json!("too_long"), &json!("instance_id")),
        "{j}"
    );
    assert!(
        j["error"].as_str().unwrap().contains("max_name_bytes"),
        "{j}"
    );
    let mut long_model = reg("e0", port);
    long_model["modelname"] = json!("m".repeat(17));
    expect_error(
        &server,
        "/register",
        long_model,
        400,
        "too_long",
        Some("modelname"),
    )
    .await;
    let mut long_lora = reg("e0", port);
    long_lora["lora_name"] = json!("l".repeat(17));
    expect_error(
        &server,
        "/register",
        long_lora,
        400,
        "too_long",
        Some("lora_name"),
    )
    .await;

    // gRPC applies the same policy (and names fields as the Python API does).
    let mut r = Registration::vllm("g0", &format!("tcp://127.0.0.3:{port}"))
        .block_size(16)
        .json();
    let reply = server.register(&r).await;
    assert_eq!(reply.ret, -600);
    assert_eq!(
        reply.error.as_ref().map(|e| e.field.as_str()),
        Some("endpoint")
    );
    r["endpoint"] = json!(format!("tcp://127.0.0.1:{port}"));
    r["tenant_id"] = json!("t".repeat(17));
    let reply = server.register(&r).await;
    assert_eq!(reply.ret, -600);
    let error = reply.error.expect("detail");
    assert_eq!(
        (error.field.as_str(), error.reason.as_str()),
        ("tenant_id", "too_long")
    );

    // Inside the policy: an allowed IPv4 address, an allowed IPv6 address.
    let ok = http::post_json(server.http_port, "/register", &reg("e0", port)).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let v6 = with_endpoint(reg("e1", port), "endpoint", &format!("tcp://[::1]:{port}"));
    let ok = http::post_json(server.http_port, "/register", &v6).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    // The third subscription is over the cap, and fits again once one is gone.
    let third = reg("e2", free_port());
    let r = http::post_json(server.http_port, "/register", &third).await;
    let j = r.json();
    assert_eq!(
        (r.status, &j["reason"]),
        (400, &json!("limit_exceeded")),
        "{j}"
    );
    assert!(
        j["error"].as_str().unwrap().contains("max_subscriptions"),
        "{j}"
    );
    let gone = server.http_unregister("e1").await;
    assert_eq!(gone.status, 200);
    let r = http::post_json(server.http_port, "/register", &third).await;
    assert_eq!(r.status, 200, "{}", r.text());

    refusals_are(
        &server,
        "conductor_registrations_refused_total",
        "",
        &[
            ("endpoint", 5),
            ("replay_endpoint", 1),
            ("instance_id", 1),
            ("model_name", 1),
            ("tenant_id", 1),
            ("max_subscriptions", 1),
        ],
    )
    .await;
}

/// A Mooncake store object event with `tenant`, `model`, `lora` and `block_size`.
fn object(
    tenant: &str,
    model: &str,
    lora: Option<&str>,
    block_size: u64,
    hash: u64,
) -> rmpv::Value {
    let mut event = engine::mooncake_event("stored", model, 16, "backend-a", "obj", "cpu", hash);
    if let rmpv::Value::Map(fields) = &mut event {
        for (k, v) in fields.iter_mut() {
            match k.as_str() {
                Some("tenant_id") => *v = rmpv::Value::from(tenant),
                Some("lora_name") => *v = lora.map_or(rmpv::Value::Nil, rmpv::Value::from),
                Some("block_size") => *v = rmpv::Value::from(block_size),
                _ => {}
            }
        }
    }
    event
}

/// Each context of the global view as `tenant/model/lora/block_size` with its block count.
async fn contexts(server: &Server) -> Vec<(String, u64)> {
    let view = http::get(server.http_port, "/global_view").await.json();
    view["contexts"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|c| {
                    let name = format!(
                        "{}/{}/{}/{}",
                        c["tenant_id"].as_str().unwrap_or_default(),
                        c["model_name"].as_str().unwrap_or_default(),
                        c["lora_name"].as_str().unwrap_or_default(),
                        c["block_size"]
                    );
                    (name, c["prefix_count"].as_u64().unwrap_or_default())
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn contexts_become(server: &Server, expected: &[(&str, u64)]) {
    let expected: Vec<(String, u64)> = expected.iter().map(|(n, c)| (n.to_string(), *c)).collect();
    until(WAIT, async || {
        let now = contexts(server).await;
        if now == expected {
            return Ok(());
        }
        Err(format!("waiting for contexts {expected:?}, have {now:?}"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_naming_too_many_contexts_or_another_tenant_is_refused_event_by_event() {
    let server = Server::start_with(json!({
        "max_contexts_per_source": 2,
        "warning_interval_ms": 60_000,
    }))
    .await;
    let mut store = Player::start(false, 1).await;
    let mut r = Registration::mooncake("store", &store.endpoint)
        .block_size(16)
        .json();
    r["tenant_id"] = json!("t1");
    let reply = server.grpc().await.register(register_request(&r)).await;
    assert_eq!(reply.unwrap().into_inner().ret, 0);

    // One batch: two good contexts, then a third and a fourth (over the cap), another tenant's
    // event, and block sizes a registration would refuse; then more for the good contexts.
    let batch = engine::mooncake_batch(vec![
        object("t1", "m", None, 16, 1),
        object("t1", "m", Some("ad"), 16, 2),
        object("t1", "m2", None, 16, 3),
        object("t1", "m", Some("other"), 16, 4),
        object("intruder", "m", None, 16, 5),
        object("t1", "m", None, 1 << 30, 6),
        object("t1", "m", None, 1 << 21, 7),
        object("t1", "m", None, 16, 8),
        object("t1", "m", Some("ad"), 16, 9),
    ]);
    handshake(&server, &mut store, "store|t1|0", batch).await;

    // Only the first two contexts exist, each with both its good blocks (also those after the
    // refused events).
    contexts_become(&server, &[("t1/m//16", 2), ("t1/m/ad/16", 2)]).await;
    let st = server.service_status("store|t1|0").await;
    assert_eq!(
        st["refused"],
        json!({"max_contexts_per_source": 2, "tenant_id": 1, "block_size": 2}),
        "{st}"
    );

    // The good contexts keep working in later batches; refusals keep being counted.
    let later = engine::mooncake_batch(vec![
        object("t1", "m3", None, 16, 10),
        object("t1", "m", None, 16, 11),
    ]);
    let seq = store.publish(later).await;
    eventually("the later batch", WAIT, || async {
        (server.service_status("store|t1|0").await["last_seq"] == json!(seq)).then_some(())
    })
    .await;
    contexts_become(&server, &[("t1/m//16", 3), ("t1/m/ad/16", 2)]).await;
    let st = server.service_status("store|t1|0").await;
    assert_eq!(st["refused"]["max_contexts_per_source"], json!(3), "{st}");

    refusals_are(
        &server,
        "conductor_events_refused_total",
        "service=\"store|t1|0\",",
        &[
            ("max_contexts_per_source", 3),
            ("tenant_id", 1),
            ("block_size", 2),
        ],
    )
    .await;
    // Rate-limited: one warning per kind within the interval, each naming its field.
    let log = server.log();
    let warnings = |field: &str| {
        log.lines()
            .filter(|l| l.contains("events refused") && l.contains(&format!("field=\"{field}\"")))
            .count()
    };
    assert_eq!(warnings("max_contexts_per_source"), 1, "{log}");
    assert_eq!(warnings("tenant_id"), 1, "{log}");
    assert_eq!(warnings("block_size"), 1, "{log}");
}

/// The sample of an unlabelled `metric` on `/metrics`.
async fn metric(server: &Server, metric: &str) -> Option<u64> {
    let metrics = http::get(server.http_port, "/metrics").await.text();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{metric} ")))
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_naming_200000_backends_makes_only_max_holders_per_context_holders() {
    const BACKENDS: usize = 200_000;
    const PER_BATCH: usize = 5_000;
    const CAP: u64 = 1024;
    // The defaults: `max_holders_per_context` 1024, `max_name_bytes` 256.
    let server = Server::start_with(json!({"warning_interval_ms": 60_000})).await;
    let mut store = Player::start(false, 1).await;
    let r = Registration::mooncake("store", &store.endpoint)
        .block_size(16)
        .json();
    let reply = server.grpc().await.register(register_request(&r)).await;
    assert_eq!(reply.unwrap().into_inner().ret, 0);

    // A backend id of 24 KiB first: refused by its length, it makes no holder.
    let long = "b".repeat(24 * 1024);
    let first = engine::mooncake_batch(vec![
        engine::mooncake_event("stored", "m", 16, &long, "obj", "cpu", 1),
        engine::mooncake_event("stored", "m", 16, "node-0", "obj", "cpu", 2),
    ]);
    handshake(&server, &mut store, "store|default|0", first).await;
    let mut hash = 3u64;
    for start in (1..BACKENDS).step_by(PER_BATCH) {
        let events = (start..(start + PER_BATCH).min(BACKENDS))
            .map(|i| {
                hash += 1;
                let backend = format!("node-{i}");
                engine::mooncake_event("stored", "m", 16, &backend, "obj", "cpu", hash)
            })
            .collect();
        let seq = store.publish(engine::mooncake_batch(events)).await;
        eventually("the batch applied", WAIT, || async {
            (server.service_status("store|default|0").await["last_seq"] == json!(seq)).then_some(())
        })
        .await;
    }
    let st = server.service_status("store|default|0").await;
    assert_eq!(
        st["refused"],
        json!({"max_holders_per_context": BACKENDS as u64 - CAP, "backend_id": 1}),
        "{st}"
    );
    assert_eq!(metric(&server, "conductor_index_holders").await, Some(CAP));
    // The admitted backends' blocks are there: one block each.
    contexts_become(&server, &[("default/m//16", CAP)]).await;
    refusals_are(
        &server,
        "conductor_events_refused_total",
        "service=\"store|default|0\",",
        &[
            ("max_holders_per_context", BACKENDS as u64 - CAP),
            ("backend_id", 1),
        ],
    )
    .await;
    // Rate-limited: one line per kind within the interval.
    let log = server.log();
    let warnings = |field: &str| {
        log.lines()
            .filter(|l| l.contains("events refused") && l.contains(&format!("field=\"{field}\"")))
            .count()
    };
    assert_eq!(warnings("max_holders_per_context"), 1, "{log}");
    assert_eq!(warnings("backend_id"), 1, "{log}");
}
