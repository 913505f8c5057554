//! Crash points: the real binary is killed right after its k-th write to RocksDB (the
//! `store_write` failpoint, compiled into test builds only, `src/storage/failpoint.rs`), for
//! every k the scenario reaches (migrations, registrations, every checkpoint round), started
//! again on its data directory, and once it caught up its answers and `/global_view` must equal
//! those of the same scenario run without a crash.
//!
//! The scenario: an engine publishing on two DP ranks (two streams) with a LoRA adapter context,
//! a Mooncake store, a context the store fed once and never again, and 200 more contexts the
//! store creates with one batch, so that a checkpoint round spans 200 contexts' writes. Its
//! variants add, half-way: a publisher restart (a source drop), an unregister and register
//! again of one rank, or a publisher restart while the Conductor is down.

use std::time::Duration;

use serde_json::{Value, json};

use crate::support::deliver::{Caught, deliver_streams};
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::fleet::{BS, MODEL, PROMPTS, adapter_store, next, prompt};
use crate::support::http::{HttpResponse, try_request};
use crate::support::player::Player;
use crate::support::server::Server;
use crate::support::{poll, until};

/// Contexts the store creates in one batch (one block each).
const MANY: usize = 200;
const IDLE_MODEL: &str = "m-idle";
const ROUNDS: usize = 4;
const WAIT: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Variant {
    Plain,
    /// Rank 1's publisher restarts (a new stream from seq 0) half-way: the source is dropped
    /// and rebuilt from the new stream.
    SourceDrop,
    /// Rank 1 is unregistered and registered again half-way, with no pause between.
    Reregister,
    /// Rank 1's publisher restarts half-way while the Conductor is down, and publishes past its
    /// old position before the Conductor comes back.
    RestartWhileDown,
}

fn config() -> Value {
    json!({"checkpoint_interval_ms": 20, "max_contexts_per_source": 256})
}

/// The service under test: killed by its failpoint at most once, then started again on its
/// data directory without it. The RestartWhileDown variant kills it once more itself; its
/// failpoint is armed either before that kill (segment 0) or in the process started after it
/// (segment 1), so that every write of both processes is a crash point.
struct Victim {
    server: Option<Server>,
    failpoint: Option<(usize, u64)>,
    crashes: usize,
}

impl Victim {
    async fn start(failpoint: Option<(usize, u64)>) -> Victim {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut victim = Victim {
            server: None,
            failpoint,
            crashes: 0,
        };
        victim.spawn(dir, 0).await;
        victim
    }

    async fn spawn(&mut self, dir: tempfile::TempDir, segment: usize) {
        let spec = self
            .failpoint
            .filter(|&(s, _)| s == segment)
            .map(|(_, k)| format!("store_write:{k}"));
        let env: Vec<(&str, &str)> = spec
            .as_deref()
            .map(|s| vec![("CONDUCTOR_FAILPOINT", s)])
            .unwrap_or_default();
        let mut server = Server::spawn_in_with_env(dir, config(), &env);
        server.ready_or_exited().await;
        self.server = Some(server);
    }

    /// The running server: one its failpoint killed is started again first.
    async fn up(&mut self) -> &Server {
        let server = self.server.as_mut().expect("a server");
        if server.exited() {
            self.crashes += 1;
            let dir = self.server.take().expect("a server").into_dir();
            self.server = Some(Server::start_in(dir, config()).await);
        }
        self.server.as_ref().expect("a server")
    }

    /// SIGKILL (the RestartWhileDown variant's own crash), and start again once `meanwhile`
    /// ran, with the failpoint of segment 1 unless it already fired.
    async fn kill_then<F: std::future::Future<Output = ()>>(&mut self, meanwhile: F) {
        let dir = self.server.take().expect("a server").into_dir();
        meanwhile.await;
        if self.crashes > 0 {
            self.failpoint = None;
        }
        self.spawn(dir, 1).await;
    }

    /// `method path body` until the server answers, restarting it if it died meanwhile.
    async fn call(&mut self, method: &str, path: &str, body: &Value) -> HttpResponse {
        let body = body.to_string();
        let headers = [("Content-Type", "application/json")];
        until(WAIT, async || {
            let port = self.up().await.http_port;
            try_request(port, method, path, &headers, body.as_bytes())
                .await
                .map_err(|e| format!("for {path} to be answered: {e}"))
        })
        .await
    }
}

struct Fleet {
    ranks: [Player; 2],
    store: Player,
}

fn engine_registration(fleet: &Fleet, rank: usize) -> Value {
    let player = &fleet.ranks[rank];
    Registration::vllm("e", &player.endpoint)
        .replay(player.replay_endpoint.as_deref())
        .model(MODEL)
        .block_size(BS)
        .rank(rank as u32)
        .http()
}

fn store_registration(fleet: &Fleet) -> Value {
    Registration::mooncake("s", &fleet.store.endpoint)
        .replay(fleet.store.replay_endpoint.as_deref())
        .model(MODEL)
        .block_size(BS)
        .http()
}

async fn register(victim: &mut Victim, registration: &Value) {
    let r = victim.call("POST", "/register", registration).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Unregister rank `rank` of `e`; a 404 after a crash means the unregister landed before it.
async fn unregister(victim: &mut Victim, rank: usize) {
    let crashes = victim.crashes;
    let body = json!({"instance_id": "e", "dp_rank": rank});
    let r = victim.call("POST", "/unregister", &body).await;
    let landed_before_a_crash = r.status == 404 && victim.crashes > crashes;
    assert!(r.status == 200 || landed_before_a_crash, "{}", r.text());
}

fn rank_store(p: i32, medium: &str, rank: u32) -> Vec<u8> {
    engine::vllm_store_prompt(&vllm_cbor_profile(), &prompt(p), BS, medium, rank)
}

fn rank_remove(p: i32, block: usize, medium: &str, rank: u32) -> Vec<u8> {
    let keys = engine::block_keys(&vllm_cbor_profile(), &prompt(p), BS, "");
    engine::batch(
        vec![engine::vllm_removed(&keys[block..block + 1], medium)],
        rank,
    )
}

fn rank_batch(rng: &mut u64, rank: u32) -> Vec<u8> {
    let p = (next(rng) % PROMPTS as u64) as i32;
    let medium = ["GPU", "CPU", "DISK"][(next(rng) % 3) as usize];
    match next(rng) % 6 {
        0 | 1 => rank_remove(p, (next(rng) % 2) as usize, medium, rank),
        2 if rank == 0 => adapter_store(p, "ad"),
        _ => rank_store(p, medium, rank),
    }
}

fn many_model(i: usize) -> String {
    format!("m-many-{i:03}")
}

/// Store events: objects of the base prompts, and now and then a block of one of the many
/// contexts stored or removed.
fn store_batch(rng: &mut u64) -> Vec<u8> {
    let event = if next(rng).is_multiple_of(2) {
        let p = (next(rng) % PROMPTS as u64) as i32;
        let b = (next(rng) % 2) as usize;
        let keys = engine::block_keys(&vllm_cbor_profile(), &prompt(p), BS, "");
        let kind = ["stored", "stored", "removed"][(next(rng) % 3) as usize];
        let medium = ["cpu", "disk"][(next(rng) % 2) as usize];
        engine::mooncake_event(kind, MODEL, BS, "b0", &format!("o{p}-{b}"), medium, keys[b])
    } else {
        let i = (next(rng) % MANY as u64) as usize;
        let kind = ["stored", "removed"][(next(rng) % 2) as usize];
        let hash = 1000 + i as u64 + (next(rng) % 2);
        engine::mooncake_event(kind, &many_model(i), BS, "b0", "o", "cpu", hash)
    };
    engine::mooncake_batch(vec![event])
}

fn many_contexts_batch() -> Vec<u8> {
    let events = (0..MANY)
        .map(|i| {
            let hash = 1000 + i as u64;
            engine::mooncake_event("stored", &many_model(i), BS, "b0", "o", "cpu", hash)
        })
        .collect();
    engine::mooncake_batch(events)
}

/// Until the service consumed every published batch of each source, and follows each live again.
async fn deliver(victim: &mut Victim, fleet: &mut Fleet) {
    let [rank0, rank1] = &mut fleet.ranks;
    let mut streams = [
        ("e|default|0", rank0),
        ("e|default|1", rank1),
        ("s|default|0", &mut fleet.store),
    ];
    deliver_streams(&mut streams, Caught::AppliedAndLive, WAIT, async || {
        let status = victim.call("GET", "/services/status", &Value::Null).await;
        vec![status.json()]
    })
    .await;
}

/// Everything a client can ask of the scenario's contexts.
async fn everything(victim: &mut Victim) -> Vec<String> {
    let mut out = Vec::new();
    for p in 0..PROMPTS {
        for lora in ["", "ad"] {
            let body = json!({"model": MODEL, "lora_name": lora, "block_size": BS, "token_ids": prompt(p)});
            let r = victim.call("POST", "/query", &body).await;
            out.push(format!("{lora} {p}: {}", r.text()));
        }
    }
    out.push(
        victim
            .call("GET", "/global_view", &Value::Null)
            .await
            .text(),
    );
    out
}

/// Run the scenario against `victim` (the reference, when `uninterrupted`, sees the
/// RestartWhileDown variant's publisher restart live); its answers once everything is delivered,
/// and the publishers, which must stay up until the answers are compared.
async fn scenario(
    variant: Variant,
    victim: &mut Victim,
    uninterrupted: bool,
) -> (Vec<String>, Fleet) {
    let mut fleet = Fleet {
        ranks: [Player::start(true, 0).await, Player::start(true, 0).await],
        store: Player::start(true, 1).await,
    };
    let mut rng = 0xc0ffee_u64;
    for rank in 0..2 {
        register(victim, &engine_registration(&fleet, rank)).await;
    }
    register(victim, &store_registration(&fleet)).await;
    for p in 0..PROMPTS {
        fleet.ranks[0].publish(rank_store(p, "GPU", 0)).await;
    }
    fleet.ranks[1].publish(rank_store(1, "GPU", 1)).await;
    fleet
        .store
        .publish(engine::mooncake_batch(vec![engine::mooncake_event(
            "stored", IDLE_MODEL, BS, "b0", "idle", "cpu", 42,
        )]))
        .await;
    fleet.store.publish(many_contexts_batch()).await;
    deliver(victim, &mut fleet).await;
    for round in 0..ROUNDS {
        if round == ROUNDS / 2 {
            match variant {
                Variant::Plain => {}
                Variant::SourceDrop => {
                    fleet.ranks[1].restart(0);
                    fleet.ranks[1].publish(rank_store(2, "CPU", 1)).await;
                }
                Variant::Reregister => {
                    unregister(victim, 1).await;
                    register(victim, &engine_registration(&fleet, 1)).await;
                }
                Variant::RestartWhileDown => {
                    let rank = &mut fleet.ranks[1];
                    let rng = &mut rng;
                    let restart = async move {
                        let old = rank.next_seq();
                        rank.restart(0);
                        // The new process publishes past the old position (while the service
                        // is down, its stream and buffer are all the service will see).
                        while rank.next_seq() <= old + 2 {
                            rank.publish(rank_batch(rng, 1)).await;
                        }
                    };
                    if uninterrupted {
                        restart.await;
                    } else {
                        victim.kill_then(restart).await;
                    }
                }
            }
        }
        for _ in 0..6 {
            fleet.ranks[0].publish(rank_batch(&mut rng, 0)).await;
            fleet.ranks[1].publish(rank_batch(&mut rng, 1)).await;
            fleet.store.publish(store_batch(&mut rng)).await;
        }
        deliver(victim, &mut fleet).await;
    }
    // Asked once nothing crashed meanwhile: a restart while asking answers before its catch-up.
    loop {
        let crashes = victim.crashes;
        let answers = everything(victim).await;
        if victim.crashes == crashes {
            return (answers, fleet);
        }
        deliver(victim, &mut fleet).await;
    }
}

/// The scenario without a crash, then once for each k, killed after its k-th store write.
async fn every_crash_point(variant: Variant) {
    let mut reference = Victim::start(None).await;
    let (expected, _fleet) = scenario(variant, &mut reference, true).await;
    assert!(
        expected.iter().any(|a| a.contains(&many_model(MANY - 1))),
        "the reference holds the many contexts"
    );
    let segments = if variant == Variant::RestartWhileDown {
        2
    } else {
        1
    };
    for segment in 0..segments {
        let mut k = 1;
        loop {
            let mut victim = Victim::start(Some((segment, k))).await;
            // The publishers stay up until the answers are compared.
            let (answers, _fleet) = scenario(variant, &mut victim, false).await;
            // Settled: a batch consumed may still be on its way to a context.
            let answers = if answers == expected {
                answers
            } else {
                let settled = poll(WAIT, async || {
                    let answers = everything(&mut victim).await;
                    if answers == expected {
                        Ok(answers)
                    } else {
                        Err(answers)
                    }
                });
                settled.await.unwrap_or_else(|unsettled| unsettled)
            };
            if answers != expected {
                let log = victim.server.as_ref().map(Server::log).unwrap_or_default();
                eprintln!("--- the restarted service's log:\n{log}");
            }
            for (got, want) in answers.iter().zip(&expected) {
                assert_eq!(
                    got, want,
                    "{variant:?}, killed after store write {k} of segment {segment}"
                );
            }
            assert_eq!(answers.len(), expected.len());
            if victim.crashes == 0 {
                // The process makes fewer writes than k: every crash point was covered.
                assert!(k > 3, "{variant:?}: only {k} writes in segment {segment}");
                eprintln!(
                    "{variant:?}: segment {segment} crashed after each of its {} writes",
                    k - 1
                );
                break;
            }
            k += 1;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_any_store_write_recovers_the_uninterrupted_answers() {
    every_crash_point(Variant::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_any_store_write_around_a_source_drop_recovers_the_uninterrupted_answers() {
    every_crash_point(Variant::SourceDrop).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_after_any_store_write_around_a_reregistration_recovers_the_uninterrupted_answers()
{
    every_crash_point(Variant::Reregister).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_restarted_while_the_service_is_down_is_replayed_from_its_new_start() {
    every_crash_point(Variant::RestartWhileDown).await;
}
