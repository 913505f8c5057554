//! Replicas sharing registrations through a real etcd on loopback: two real binaries, real
//! publishers. A registration made on one is subscribed and answered by the other; an
//! unregistration anywhere stops both; two replicas racing one key, or two keys onto one
//! endpoint, get one winner; an etcd outage keeps the answers and refuses changes with an error
//! naming etcd, until it returns.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::deliver::publish_to_all;
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::etcd::Etcd;
use crate::support::player::Player;
use crate::support::query::{device_hits, endpoints, etcd_up};
use crate::support::server::Server;
use crate::support::{WAIT, eventually, free_port, http, until};

async fn replica(etcd: &Etcd, prefix: &str) -> Server {
    Server::start_with(json!({"registry": etcd.registry(prefix)})).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_on_one_replica_is_served_by_the_other_and_either_can_remove_it() {
    let etcd = Etcd::start().await;
    let (a, b) = (replica(&etcd, "/t1/").await, replica(&etcd, "/t1/").await);
    let mut player = Player::start(false, 0).await;
    let reg = Registration::vllm("v0", &player.endpoint).json();
    a.register_ok(&reg).await;
    let expected = vec![("v0|default|0".to_owned(), player.endpoint.clone())];
    eventually("B runs A's registration", WAIT, || async {
        (endpoints(&b).await == expected).then_some(())
    })
    .await;

    let tokens: Vec<i32> = (1..=8).collect();
    let store = engine::vllm_store_prompt(&vllm_cbor_profile(), &tokens, 4, "GPU", 0);
    publish_to_all(&[&a, &b], &mut player, "v0|default|0", store).await;
    assert_eq!(device_hits(&a, "v0", &tokens).await, 8);
    assert_eq!(device_hits(&b, "v0", &tokens).await, 8);
    // Both saw one more subscriber each: the PUB fans out to every replica.
    assert!(player.accepted() >= 2, "accepted {}", player.accepted());
    assert_eq!(etcd_up(&a).await, Some(true));
    let revision = http::get(b.http_port, "/metrics").await.text();
    assert!(
        revision
            .lines()
            .any(|l| l.starts_with("conductor_registry_etcd_revision ") && !l.ends_with(" 0")),
        "{revision}"
    );

    let r = b.http_unregister("v0").await;
    assert_eq!(r.status, 200, "{}", r.text());
    eventually("A stops the registration removed on B", WAIT, || async {
        endpoints(&a).await.is_empty().then_some(())
    })
    .await;
    assert!(endpoints(&b).await.is_empty());
    assert_eq!(device_hits(&a, "v0", &tokens).await, 0);
    assert_eq!(device_hits(&b, "v0", &tokens).await, 0);
    // Unregistering what no replica holds is a plain not-found.
    let r = a.http_unregister("v0").await;
    assert_eq!(r.status, 404, "{}", r.text());
}

/// Register `left` and `right` on their replicas at the same moment: exactly one must be
/// accepted (200) and the other refused (400). Whether the left one won, and the loser's reply.
async fn race(left: (&Server, Value), right: (&Server, Value)) -> (bool, String) {
    let (rl, rr) = tokio::join!(
        http::post_json(left.0.http_port, "/register", &left.1),
        http::post_json(right.0.http_port, "/register", &right.1),
    );
    let mut statuses = [rl.status, rr.status];
    statuses.sort();
    assert_eq!(statuses, [200, 400], "{} / {}", rl.text(), rr.text());
    let left_won = rl.status == 200;
    let loser = if left_won { rr } else { rl };
    (left_won, loser.json().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_racing_one_key_with_different_configs_get_exactly_one_winner() {
    let etcd = Etcd::start().await;
    let (a, b) = (replica(&etcd, "/t2/").await, replica(&etcd, "/t2/").await);
    let mut used = std::collections::HashSet::new();
    for round in 0..6 {
        let instance = format!("race{round}");
        // Two different configurations, on endpoints no earlier round used.
        let mut fresh = || loop {
            let e = format!("tcp://127.0.0.1:{}", free_port());
            if used.insert(e.clone()) {
                break e;
            }
        };
        let (ea, eb) = (fresh(), fresh());
        let (a_won, error) = race(
            (&a, Registration::vllm(&instance, &ea).http()),
            (&b, Registration::vllm(&instance, &eb).http()),
        )
        .await;
        let winner = if a_won { ea } else { eb };
        assert!(error.contains("conflicting registration"), "{error}");
        let key = format!("{instance}|default|0");
        for r in [&a, &b] {
            eventually("both replicas run the winner", WAIT, || async {
                let running = endpoints(r).await;
                running
                    .iter()
                    .any(|(k, e)| *k == key && *e == winner)
                    .then_some(())
            })
            .await;
        }
    }
    assert_eq!(endpoints(&a).await, endpoints(&b).await);
    assert_eq!(endpoints(&a).await.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_racing_two_keys_onto_one_endpoint_get_exactly_one_winner() {
    let etcd = Etcd::start().await;
    let (a, b) = (replica(&etcd, "/t5/").await, replica(&etcd, "/t5/").await);
    let mut winners = Vec::new();
    for round in 0..6 {
        let endpoint = format!("tcp://127.0.0.1:{}", free_port());
        let (ka, kb) = (format!("left{round}"), format!("right{round}"));
        let (a_won, error) = race(
            (&a, Registration::vllm(&ka, &endpoint).http()),
            (&b, Registration::vllm(&kb, &endpoint).http()),
        )
        .await;
        let winner = if a_won { ka } else { kb };
        assert!(
            error.contains("conflicting active registration for endpoint")
                && error.contains(&endpoint),
            "{error}"
        );
        winners.push((format!("{winner}|default|0"), endpoint));
    }
    winners.sort();
    for r in [&a, &b] {
        eventually("both replicas run only the winners", WAIT, || async {
            (endpoints(r).await == winners).then_some(())
        })
        .await;
    }
    // Unregistering a winner releases its endpoint for another key, on either replica.
    let (key, endpoint) = winners[0].clone();
    let instance = key.split('|').next().unwrap_or_default().to_owned();
    let gone = a.http_unregister(&instance).await;
    assert_eq!(gone.status, 200, "{}", gone.text());
    eventually("B stops the unregistered winner", WAIT, || async {
        (!endpoints(&b).await.iter().any(|(k, _)| *k == key)).then_some(())
    })
    .await;
    let again = http::post_json(
        b.http_port,
        "/register",
        &Registration::vllm("late", &endpoint).http(),
    )
    .await;
    assert_eq!(again.status, 200, "{}", again.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_keeps_answers_refuses_changes_and_resynchronises() {
    let mut etcd = Etcd::start().await;
    let (a, b) = (replica(&etcd, "/t3/").await, replica(&etcd, "/t3/").await);
    let mut player = Player::start(false, 0).await;
    let r = http::post_json(
        a.http_port,
        "/register",
        &Registration::vllm("v0", &player.endpoint).http(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    eventually("B runs v0", WAIT, || async {
        (endpoints(&b).await.len() == 1).then_some(())
    })
    .await;
    let tokens: Vec<i32> = (1..=8).collect();
    let store = engine::vllm_store_prompt(&vllm_cbor_profile(), &tokens, 4, "GPU", 0);
    publish_to_all(&[&a, &b], &mut player, "v0|default|0", store).await;

    etcd.stop();
    // Known registrations keep being served, and keep ingesting.
    let more: Vec<i32> = (100..=107).collect();
    let batch = engine::vllm_store_prompt(&vllm_cbor_profile(), &more, 4, "GPU", 0);
    publish_to_all(&[&a, &b], &mut player, "v0|default|0", batch).await;
    for r in [&a, &b] {
        assert_eq!(device_hits(r, "v0", &tokens).await, 8);
        assert_eq!(device_hits(r, "v0", &more).await, 8);
    }
    // Changes are refused with an error that names etcd: HTTP 503 and CONDUCTOR_UNAVAILABLE.
    let other = format!("tcp://127.0.0.1:{}", free_port());
    let r = http::post_json(
        a.http_port,
        "/register",
        &Registration::vllm("v1", &other).http(),
    )
    .await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("etcd"), "{}", r.text());
    let r = b.http_unregister("v0").await;
    assert_eq!(r.status, 503, "{}", r.text());
    let grpc_reg = Registration::vllm("v1", &other).json();
    let reply = b.register(&grpc_reg).await;
    assert_eq!(reply.ret, -2000, "{:?}", reply.error);
    assert!(format!("{:?}", reply.error).contains("etcd"));
    assert_eq!(endpoints(&a).await.len(), 1);
    assert_eq!(endpoints(&b).await.len(), 1);
    assert!(a.log().contains("etcd unavailable"), "{}", a.log());
    for r in [&a, &b] {
        eventually("/metrics says etcd is down", WAIT, || async {
            etcd_up(r).await.eq(&Some(false)).then_some(())
        })
        .await;
    }

    etcd.restart().await;
    // Changes work again on either replica, and the other follows from where it stopped.
    let r = eventually(
        "register accepted again",
        Duration::from_secs(20),
        || async {
            let r = http::post_json(
                a.http_port,
                "/register",
                &Registration::vllm("v1", &other).http(),
            )
            .await;
            (r.status != 503).then_some(r)
        },
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    until(WAIT, async || match endpoints(&b).await.len() {
        2 => Ok(()),
        _ => Err(format!(
            "waiting for B to follow after the outage:\n{}\nA:\n{}",
            b.log(),
            a.log()
        )),
    })
    .await;
    assert_eq!(etcd_up(&b).await, Some(true));
    let r = b.http_unregister("v0").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let left = vec![("v1|default|0".to_owned(), other.clone())];
    eventually("A follows B's unregister", WAIT, || async {
        (endpoints(&a).await == left).then_some(())
    })
    .await;
    assert_eq!(device_hits(&a, "v0", &tokens).await, 0);
}

/// A replica that was down while registrations changed elsewhere converges at its restart: what
/// it restored from its own store is diffed against etcd's listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_after_changes_elsewhere_converges_to_etcd() {
    let etcd = Etcd::start().await;
    let a = replica(&etcd, "/t4/").await;
    let b = replica(&etcd, "/t4/").await;
    let (e0, e1) = (
        format!("tcp://127.0.0.1:{}", free_port()),
        format!("tcp://127.0.0.1:{}", free_port()),
    );
    let r = http::post_json(
        a.http_port,
        "/register",
        &Registration::vllm("v0", &e0).http(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    eventually("B runs v0", WAIT, || async {
        (endpoints(&b).await.len() == 1).then_some(())
    })
    .await;
    let dir = b.into_dir();
    let r = a.http_unregister("v0").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = http::post_json(
        a.http_port,
        "/register",
        &Registration::vllm("v1", &e1).http(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let b = Server::start_in(dir, json!({"registry": etcd.registry("/t4/")})).await;
    let expected = vec![("v1|default|0".to_owned(), e1.clone())];
    eventually("restarted B matches etcd", WAIT, || async {
        (endpoints(&b).await == expected).then_some(())
    })
    .await;
    assert_eq!(endpoints(&a).await, expected);
}

/// A replica that ran with its own registrations and is then switched to etcd brings them along
/// when etcd holds none under its prefix yet; once it has synchronised, etcd decides, so a
/// later restart does not bring back a registration removed elsewhere meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_switched_to_etcd_uploads_its_own_registrations_once() {
    let etcd = Etcd::start().await;
    let solo = Server::start().await;
    let e0 = format!("tcp://127.0.0.1:{}", free_port());
    let r = http::post_json(
        solo.http_port,
        "/register",
        &Registration::vllm("v0", &e0).http(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let dir = solo.into_dir();
    let a = Server::start_in(dir, json!({"registry": etcd.registry("/t5/")})).await;
    let b = replica(&etcd, "/t5/").await;
    let expected = vec![("v0|default|0".to_owned(), e0.clone())];
    eventually("B runs the registration A brought", WAIT, || async {
        (endpoints(&b).await == expected).then_some(())
    })
    .await;
    assert_eq!(endpoints(&a).await, expected, "A keeps its own");
    // Removed on B while A is down: A's restart follows etcd.
    let dir = a.into_dir();
    let r = b.http_unregister("v0").await;
    assert_eq!(r.status, 200, "{}", r.text());
    let a = Server::start_in(dir, json!({"registry": etcd.registry("/t5/")})).await;
    eventually("restarted A follows etcd", WAIT, || async {
        endpoints(&a).await.is_empty().then_some(())
    })
    .await;
    assert!(endpoints(&b).await.is_empty(), "nothing brought back");
}
