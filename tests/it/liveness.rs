//! A publisher whose network path freezes (no FIN, no RST, no byte: a hung host, an expired NAT
//! entry) is noticed by its silence, disconnected, counted, and reconnected; its blocks stay
//! while it is briefly away and go once it is away past the grace; on its return its continuity
//! is checked through replay. The frozen path is a loopback relay in front of a publisher that
//! answers PING as libzmq does.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::fleet::{BS, MODEL};
use crate::support::heartbeat_pub::HeartbeatPub;
use crate::support::query::grpc_query;
use crate::support::relay::Relay;
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

const SERVICE: &str = "a|default|0";
const HEARTBEAT_MS: u64 = 200;
const TIMEOUT_MS: u64 = 1000;

fn prompt(p: i32) -> Vec<i32> {
    (0..8).map(|i| p * 100 + i).collect()
}

fn store(p: i32) -> Vec<u8> {
    engine::vllm_store_prompt(&vllm_cbor_profile(), &prompt(p), BS, "GPU", 0)
}

async fn start_server(grace_ms: u64) -> Server {
    Server::start_with(json!({
        "publisher_heartbeat_ms": HEARTBEAT_MS,
        "publisher_timeout_ms": TIMEOUT_MS,
        "publisher_unreachable_grace_ms": grace_ms,
    }))
    .await
}

/// Register instance `instance` whose live stream goes through `live` and whose replay socket
/// is reached directly.
async fn register(server: &Server, instance: &str, live: &str, replay: &str) {
    let r = Registration::vllm(instance, live)
        .replay(Some(replay))
        .model(MODEL)
        .block_size(BS)
        .json();
    server.register_ok(&r).await;
}

async fn device_hits(server: &Server, p: i32) -> i64 {
    let r = grpc_query(server, MODEL, prompt(p), BS as i64).await;
    r.hits.get("a").map_or(0, |h| h.device)
}

/// Wait until the device hits of every prompt equal `expected[p]`.
async fn expect_hits(server: &Server, expected: &[(i32, i64)]) {
    eventually("expected hits", WAIT, || async {
        for (p, want) in expected {
            if device_hits(server, *p).await != *want {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// Wait until the status row of `SERVICE` satisfies `check`; returns it.
async fn status_until(server: &Server, what: &str, check: impl Fn(&Value) -> bool) -> Value {
    eventually(what, WAIT, || async {
        let st = server.service_status(SERVICE).await;
        check(&st).then_some(st)
    })
    .await
}

/// A publisher behind a relay, subscribed, with its first batch (`store(1)`, seq 0) applied.
async fn subscribed(server: &Server) -> (HeartbeatPub, Relay) {
    let publisher = HeartbeatPub::start(1).await;
    let relay = Relay::start(&publisher.endpoint).await;
    register(server, "a", &relay.endpoint, &publisher.replay_endpoint).await;
    eventually("the subscription", WAIT, || async {
        (publisher.subscriptions() >= 1).then_some(())
    })
    .await;
    assert_eq!(publisher.publish(store(1)).await, 0);
    status_until(server, "the first batch", |st| st["last_seq"] == 0).await;
    expect_hits(server, &[(1, 8)]).await;
    (publisher, relay)
}

/// A counter of `SERVICE` in `/metrics`.
async fn metric(server: &Server, name: &str) -> Option<u64> {
    let text = http::get(server.http_port, "/metrics").await.text();
    let prefix = format!("{name}{{service=\"{SERVICE}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_path_is_noticed_within_the_timeout_and_healed_through_replay_on_return() {
    let server = start_server(60_000).await;
    let (publisher, relay) = subscribed(&server).await;
    // The publisher speaks 3.1, so it is pinged, with the timeout as TTL (in tenths of a second).
    eventually("PINGs", WAIT, || async {
        (publisher.pings() >= 2).then_some(())
    })
    .await;
    assert_eq!(publisher.last_ttl(), Some((TIMEOUT_MS / 100) as u16));
    let subscriptions = publisher.subscriptions();

    relay.freeze();
    let frozen_at = Instant::now();
    // Published while the path is frozen: it never arrives on the old connection.
    assert_eq!(publisher.publish(store(2)).await, 1);
    let st = status_until(&server, "the silence noticed", |st| {
        st["connected"] == false && st["timeouts"] == 1
    })
    .await;
    let noticed_after = frozen_at.elapsed();
    assert!(
        noticed_after < Duration::from_millis(TIMEOUT_MS + 2000),
        "noticed only after {noticed_after:?}"
    );
    assert_eq!(st["disconnects"], 1, "{st}");
    assert_eq!(
        metric(&server, "conductor_publisher_timeouts_total").await,
        Some(1)
    );
    // Away for less than the grace: its blocks stay.
    assert_eq!(device_hits(&server, 1).await, 8);
    assert_eq!(st["sources_dropped"], 0, "{st}");

    relay.resume();
    // Back: resubscribed, the last applied batch found again through replay, and the batch
    // lost with the frozen connection replayed.
    eventually("the resubscription", WAIT, || async {
        (publisher.subscriptions() > subscriptions).then_some(())
    })
    .await;
    expect_hits(&server, &[(1, 8), (2, 8)]).await;
    assert_eq!(publisher.publish(store(3)).await, 2);
    expect_hits(&server, &[(1, 8), (2, 8), (3, 8)]).await;
    let st = status_until(&server, "live again", |st| {
        st["state"] == "live" && st["connected"] == true && st["last_seq"] == 2
    })
    .await;
    assert_eq!(
        (
            &st["timeouts"],
            &st["replays_ok"],
            &st["sources_dropped"],
            &st["restarts"],
            &st["unreachable_drops"],
        ),
        (&json!(1), &json!(1), &json!(0), &json!(0), &json!(0)),
        "{st}"
    );
    assert!(relay.accepted() >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_away_past_the_grace_loses_its_blocks_and_is_rebuilt_on_return() {
    let server = start_server(1500).await;
    let (publisher, relay) = subscribed(&server).await;
    relay.freeze();
    assert_eq!(publisher.publish(store(2)).await, 1);
    // Past the grace: a counted false miss rather than a stale hit.
    let st = status_until(&server, "the source dropped", |st| {
        st["unreachable_drops"] == 1
    })
    .await;
    assert_eq!(st["connected"], false, "{st}");
    assert_eq!(st["timeouts"], 1, "{st}");
    assert!(st["sources_dropped"].as_u64() >= Some(1), "{st}");
    expect_hits(&server, &[(1, 0), (2, 0)]).await;
    assert_eq!(
        metric(&server, "conductor_publisher_unreachable_drops_total").await,
        Some(1)
    );

    relay.resume();
    // Rebuilt from the publisher's replay buffer, then live again.
    expect_hits(&server, &[(1, 8), (2, 8)]).await;
    assert_eq!(publisher.publish(store(3)).await, 2);
    expect_hits(&server, &[(1, 8), (2, 8), (3, 8)]).await;
    let st = status_until(&server, "live again", |st| {
        st["state"] == "live" && st["connected"] == true && st["last_seq"] == 2
    })
    .await;
    assert_eq!(st["unreachable_drops"], 1, "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_that_restarted_while_unreachable_is_detected_on_return() {
    let server = start_server(60_000).await;
    let (publisher, relay) = subscribed(&server).await;
    relay.freeze();
    status_until(&server, "the silence noticed", |st| st["timeouts"] == 1).await;
    // A new process reuses seq 0 with another batch; nothing of the old one remains.
    publisher.restart().await;
    assert_eq!(publisher.publish(store(5)).await, 0);
    assert_eq!(publisher.publish(store(6)).await, 1);
    relay.resume();
    // Seq 0 replayed with other bytes: the old process's blocks go, the new stream applies.
    expect_hits(&server, &[(1, 0), (5, 8), (6, 8)]).await;
    let st = server.service_status(SERVICE).await;
    assert_eq!(st["restarts"], 1, "{st}");
    assert!(st["sources_dropped"].as_u64() >= Some(1), "{st}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_3_0_publisher_is_never_pinged_and_its_silence_is_no_timeout() {
    let server = start_server(60_000).await;
    let quiet = HeartbeatPub::start(0).await;
    let pinged = HeartbeatPub::start(1).await;
    register(&server, "a", &quiet.endpoint, &quiet.replay_endpoint).await;
    register(&server, "b", &pinged.endpoint, &pinged.replay_endpoint).await;
    eventually("both subscribed", WAIT, || async {
        (quiet.subscriptions() >= 1 && pinged.subscriptions() >= 1).then_some(())
    })
    .await;
    // Well past the timeout by the 3.1 publisher's clock: the 3.0 one got no PING and, silent
    // all along, is still connected.
    let enough = (3 * TIMEOUT_MS / HEARTBEAT_MS) as usize;
    eventually("PINGs to the 3.1 publisher", WAIT, || async {
        (pinged.pings() >= enough).then_some(())
    })
    .await;
    assert_eq!(quiet.pings(), 0);
    let st = server.service_status(SERVICE).await;
    assert_eq!(
        (&st["connected"], &st["timeouts"], &st["disconnects"]),
        (&json!(true), &json!(0), &json!(0)),
        "{st}"
    );
    assert_eq!(quiet.subscriptions(), 1, "never reconnected");
}
