//! An etcd that comes back empty (wiped, reinstalled, replaced) on the same endpoints never wipes
//! the fleet: every replica keeps its registrations and blocks, says so on `/health`, `/metrics`
//! and `/services/status`, and either writes its registrations back (the default) or waits for
//! an operator (`on_reset: "hold"`), who writes them back or confirms the removal.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::deliver::publish_to_all;
use crate::support::engine::Registration;
use crate::support::engine::{self, vllm_cbor_profile};
use crate::support::etcd::Etcd;
use crate::support::player::Player;
use crate::support::query::{device_hits, endpoints, etcd_up};
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http, until};

/// How long a replica may take to notice an etcd that came back (wiped or restarted): its next
/// connection attempt succeeds after the restart, which can take a hanging attempt's request
/// timeout (5 s here) plus the follower's back-off (at most 2 s), and longer on a loaded 2-core
/// machine running the whole suite. The condition waited for is the same; only the bound is.
const RECONNECT_WAIT: Duration = Duration::from_secs(30);

const TOKEN: &str = "reset-token";
const SERVICE: &str = "v0|default|0";

/// One sample of `/metrics`, by its full series name (labels included), when present.
async fn metric(server: &Server, series: &str) -> Option<u64> {
    let text = http::get(server.http_port, "/metrics").await.text();
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

async fn resets(server: &Server) -> u64 {
    let series = "conductor_registry_resets_suspected_total{reason=\"history_lost\"}";
    metric(server, series).await.unwrap_or(0)
}

async fn health(server: &Server) -> (u16, Value) {
    let r = http::get(server.http_port, "/health").await;
    (r.status, r.json())
}

/// `POST path` with the service token (or without, when `token` is `None`).
async fn admin(server: &Server, path: &str, token: Option<&str>) -> http::HttpResponse {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(b) = bearer.as_deref() {
        headers.push(("Authorization", b));
    }
    http::request(server.http_port, "POST", path, &headers, b"{}").await
}

/// A replica with the token, following `etcd` under `prefix`; `hold` waits for an operator
/// after a reset instead of writing the registrations back.
fn config(etcd: &Etcd, prefix: &str, hold: bool) -> Value {
    let mut registry = etcd.registry(prefix);
    if hold {
        registry["etcd"]["on_reset"] = json!("hold");
    }
    json!({"registry": registry, "auth_token": TOKEN})
}

/// Register `v0` on `a`, wait until every replica runs it, and publish one batch of 8 tokens
/// to all of them; the tokens.
async fn registered_with_blocks(
    etcd: &Etcd,
    replicas: &[&Server],
    player: &mut Player,
) -> Vec<i32> {
    let body = Registration::vllm("v0", &player.endpoint).http();
    let bytes = serde_json::to_vec(&body).expect("encode JSON");
    let auth = format!("Bearer {TOKEN}");
    let headers = [
        ("Content-Type", "application/json"),
        ("Authorization", auth.as_str()),
    ];
    let r = http::request(replicas[0].http_port, "POST", "/register", &headers, &bytes).await;
    assert_eq!(r.status, 200, "{}", r.text());
    for r in replicas {
        eventually("every replica runs v0", WAIT, || async {
            (endpoints(r).await.len() == 1).then_some(())
        })
        .await;
    }
    // The scenario is an etcd wiped after the fleet agreed with it: each replica has also applied
    // etcd's whole history through its watch, which the replica that wrote v0 may not have done
    // yet when it already runs v0.
    let revision = etcd.revision().await;
    for r in replicas {
        eventually(
            "every replica has followed etcd's history",
            WAIT,
            || async {
                let status = http::get(r.http_port, "/services/status").await.json();
                (status["registry"]["revision"].as_i64() == Some(revision)).then_some(())
            },
        )
        .await;
    }
    let tokens: Vec<i32> = (1..=8).collect();
    let store = engine::vllm_store_prompt(&vllm_cbor_profile(), &tokens, 4, "GPU", 0);
    publish_to_all(replicas, player, SERVICE, store).await;
    tokens
}

/// Default (`on_reset: "reupload"`): every replica keeps serving, the registrations go back
/// into the empty etcd (one create each, whoever is first), and the fleet carries on from there:
/// a new replica runs them, and an unregister through it stops them everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_that_comes_back_empty_keeps_every_replica_serving_and_gets_its_registrations_back()
{
    let mut etcd = Etcd::start().await;
    let a = Server::start_with(config(&etcd, "/r1/", false)).await;
    let b = Server::start_with(config(&etcd, "/r1/", false)).await;
    let mut player = Player::start(false, 0).await;
    let tokens = registered_with_blocks(&etcd, &[&a, &b], &mut player).await;
    let expected = endpoints(&a).await;

    etcd.wipe().await;
    for r in [&a, &b] {
        eventually(
            "the replica follows the new etcd",
            RECONNECT_WAIT,
            || async { (etcd_up(r).await == Some(true)).then_some(()) },
        )
        .await;
        assert_eq!(endpoints(r).await, expected, "{}", r.log());
        assert_eq!(device_hits(r, "v0", &tokens).await, 8);
    }
    for r in [&a, &b] {
        eventually("the reset is counted", WAIT, || async {
            (resets(r).await >= 1).then_some(())
        })
        .await;
        // Written back: nothing held any more, so nothing degraded.
        eventually("the replica is healthy again", WAIT, || async {
            let (status, body) = health(r).await;
            (status == 200 && body["status"] == "ready").then_some(())
        })
        .await;
        assert_eq!(
            metric(r, "conductor_registry_reset_suspected").await,
            Some(0)
        );
        assert_eq!(endpoints(r).await, expected);
        assert_eq!(device_hits(r, "v0", &tokens).await, 8);
    }
    assert!(a.log().contains("etcd no longer holds"), "{}", a.log());

    // etcd holds it again: a new replica runs it, and a legitimate unregister through that
    // replica still propagates to the others.
    let c = Server::start_with(config(&etcd, "/r1/", false)).await;
    eventually(
        "a new replica runs the written-back registration",
        WAIT,
        || async { (endpoints(&c).await == expected).then_some(()) },
    )
    .await;
    let auth = format!("Bearer {TOKEN}");
    let body = serde_json::to_vec(&json!({"instance_id": "v0", "dp_rank": 0})).expect("JSON");
    let headers = [
        ("Content-Type", "application/json"),
        ("Authorization", auth.as_str()),
    ];
    let r = http::request(c.http_port, "POST", "/unregister", &headers, &body).await;
    assert_eq!(r.status, 200, "{}", r.text());
    for r in [&a, &b] {
        eventually("the unregister reaches every replica", WAIT, || async {
            endpoints(r).await.is_empty().then_some(())
        })
        .await;
        assert_eq!(device_hits(r, "v0", &tokens).await, 0);
        assert_eq!(health(r).await.1["status"], "ready");
    }
}

/// `on_reset: "hold"`: every replica keeps serving and ingesting, reports the reset (`/health`
/// degraded with the reason, still 200; the gauges; `/services/status`), keeps its local store
/// (a restart without etcd serves it), and waits for an operator: `POST /registry/reupload`
/// writes the registrations back, `POST /registry/accept` confirms the removal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_reset_hold_an_empty_etcd_is_reported_until_an_operator_decides() {
    let mut etcd = Etcd::start().await;
    let a = Server::start_with(config(&etcd, "/r2/", true)).await;
    let b = Server::start_with(config(&etcd, "/r2/", true)).await;
    let mut player = Player::start(false, 0).await;
    let tokens = registered_with_blocks(&etcd, &[&a, &b], &mut player).await;
    let expected = endpoints(&a).await;

    etcd.wipe().await;
    for r in [&a, &b] {
        let body = until(RECONNECT_WAIT, async || {
            let (status, body) = health(r).await;
            if body["status"] == "degraded" {
                return Ok((status, body));
            }
            // What the replica and etcd did, should it never see the reset.
            Err(format!(
                "/health says {body}\nreplica log:\n{}\netcd log:\n{}",
                r.log(),
                etcd.log()
            ))
        })
        .await;
        // Degraded still answers: every replica sees the same reset at once, and a 503 from all
        // of them would take the whole fleet out of its load balancer.
        assert_eq!(body.0, 200, "{}", body.1);
        let reason = body.1["reason"].as_str().unwrap_or_default().to_owned();
        assert!(
            reason.contains("etcd") && reason.contains("history_lost"),
            "{reason}"
        );
        assert_eq!(
            metric(r, "conductor_registry_reset_suspected").await,
            Some(1)
        );
        assert_eq!(
            metric(r, "conductor_registry_registrations_held").await,
            Some(1)
        );
        assert!(resets(r).await >= 1);
        let status = http::get(r.http_port, "/services/status").await.json();
        let section = &status["registry"]["reset_suspected"];
        assert_eq!(section["reason"], "history_lost", "{status}");
        assert_eq!(section["held"], json!([SERVICE]), "{status}");
        assert_eq!(endpoints(r).await, expected);
        assert_eq!(device_hits(r, "v0", &tokens).await, 8);
    }
    // Held registrations keep ingesting.
    let more: Vec<i32> = (100..=107).collect();
    let batch = engine::vllm_store_prompt(&vllm_cbor_profile(), &more, 4, "GPU", 0);
    publish_to_all(&[&a, &b], &mut player, SERVICE, batch).await;

    // The local store is untouched: stopped (its last checkpoint written) and restarted while
    // etcd is away, A serves what it held.
    etcd.stop();
    let mut a = a;
    assert_eq!(a.terminate(), Some(0), "{}", a.log());
    let a = Server::start_in(a.into_dir(), config(&etcd, "/r2/", true)).await;
    assert_eq!(endpoints(&a).await, expected);
    for t in [&tokens, &more] {
        eventually(
            "the restarted replica answers from its store",
            WAIT,
            || async { (device_hits(&a, "v0", t).await == 8).then_some(()) },
        )
        .await;
    }
    etcd.restart().await;
    eventually(
        "the restarted replica holds v0 again",
        RECONNECT_WAIT,
        || async { (health(&a).await.1["status"] == "degraded").then_some(()) },
    )
    .await;

    // The operator writes them back: the change needs the token, and both replicas converge.
    let r = admin(&b, "/registry/reupload", None).await;
    assert_eq!(r.status, 401, "{}", r.text());
    let r = admin(&b, "/registry/reupload", Some(TOKEN)).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["reuploaded"], json!([SERVICE]), "{}", r.text());
    for r in [&a, &b] {
        eventually("healthy once etcd holds v0 again", WAIT, || async {
            (health(r).await.1["status"] == "ready").then_some(())
        })
        .await;
        assert_eq!(
            metric(r, "conductor_registry_reset_suspected").await,
            Some(0)
        );
        assert_eq!(endpoints(r).await, expected);
        assert_eq!(device_hits(r, "v0", &more).await, 8);
    }

    // An operator who meant the empty etcd confirms it on each replica: only then is the
    // registration removed, with its blocks, and a restart does not bring it back.
    etcd.wipe().await;
    for r in [&a, &b] {
        eventually(
            "held again after the second wipe",
            RECONNECT_WAIT,
            || async { (health(r).await.1["status"] == "degraded").then_some(()) },
        )
        .await;
        let r2 = admin(r, "/registry/accept", Some(TOKEN)).await;
        assert_eq!(r2.status, 200, "{}", r2.text());
        assert_eq!(r2.json()["stopped"], json!([SERVICE]), "{}", r2.text());
        eventually("the confirmed removal is applied", WAIT, || async {
            endpoints(r).await.is_empty().then_some(())
        })
        .await;
        assert_eq!(device_hits(r, "v0", &tokens).await, 0);
        assert_eq!(health(r).await.1["status"], "ready");
    }
    let a = Server::start_in(a.into_dir(), config(&etcd, "/r2/", true)).await;
    eventually(
        "the restarted replica follows etcd",
        RECONNECT_WAIT,
        || async { (etcd_up(&a).await == Some(true)).then_some(()) },
    )
    .await;
    assert!(endpoints(&a).await.is_empty());
    assert_eq!(health(&a).await.1["status"], "ready");
}
