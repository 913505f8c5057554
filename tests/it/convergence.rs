//! A restart never changes an answer: a victim SIGKILLed at random moments converges to an
//! uninterrupted reference run fed the same streams, through a base registration feeding LoRA
//! adapter contexts, a Mooncake store source, a context unregistered and registered again, and a
//! context left idle far past its publisher's small replay buffer.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use crate::support::deliver::{deliver, handshake};
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::fleet::{BS, MODEL, PROMPTS, adapter_store, next, prompt, random_batch, store};
use crate::support::player::Player;
use crate::support::query::{adapter_hits, grpc_query};
use crate::support::server::Server;
use crate::support::{WAIT, eventually, http};

/// The replay buffers of the engine and the store: more than a victim misses around one crash,
/// far fewer than the batches the run publishes after the idle context's only one.
const BUFFER: usize = 48;
/// The model of the instance that is unregistered and registered again (its own context).
const MOVED_MODEL: &str = "m-moved";
/// The model of the context the store feeds once and then never again.
const IDLE_MODEL: &str = "m-idle";

async fn register_as(server: &Server, instance: &str, kind: &str, model: &str, player: &Player) {
    let r = Registration::new(kind, instance, &player.endpoint)
        .replay(player.replay_endpoint.as_deref())
        .model(model)
        .block_size(BS)
        .json();
    server.register_ok(&r).await;
}

/// One store event: object `o{p}-{b}` holding block `b` of prompt `p`, stored or removed.
fn store_object(kind: &str, p: i32, b: usize, medium: &str) -> Vec<u8> {
    let keys = engine::block_keys(&vllm_cbor_profile(), &prompt(p), BS, "");
    let object = format!("o{p}-{b}");
    engine::mooncake_batch(vec![engine::mooncake_event(
        kind, MODEL, BS, "b0", &object, medium, keys[b],
    )])
}

fn random_store_batch(rng: &mut u64) -> Vec<u8> {
    let p = (next(rng) % PROMPTS as u64) as i32;
    let b = (next(rng) % 2) as usize;
    let medium = ["cpu", "disk"][(next(rng) % 2) as usize];
    let kind = if next(rng).is_multiple_of(3) {
        "removed"
    } else {
        "stored"
    };
    store_object(kind, p, b, medium)
}

/// Base blocks stored and removed, and now and then an adapter prompt: the base registration
/// indexes it in the adapter's context, and its removals reach every context it fed.
fn random_engine_batch(rng: &mut u64) -> Vec<u8> {
    if next(rng).is_multiple_of(5) {
        adapter_store((next(rng) % PROMPTS as u64) as i32, "ad")
    } else {
        random_batch(rng)
    }
}

/// Everything a client can ask: every prompt's hits in the two engine contexts (all four tiers,
/// every instance), the adapter context's, and each context's block count.
async fn everything(server: &Server) -> Vec<String> {
    let mut out = Vec::new();
    for model in [MODEL, MOVED_MODEL] {
        for p in 0..PROMPTS {
            let r = grpc_query(server, model, prompt(p), BS as i64).await;
            let hits: BTreeMap<String, [i64; 4]> = r
                .hits
                .iter()
                .map(|(i, h)| (i.clone(), [h.device, h.cpu_local, h.cpu_share, h.disk]))
                .collect();
            out.push(format!("{model} {p}: {hits:?}"));
        }
    }
    for p in 0..PROMPTS {
        out.push(format!("ad {p}: {}", adapter_hits(server, "ad", p).await));
    }
    let view = http::get(server.http_port, "/global_view").await.json();
    let mut contexts: Vec<String> = view["contexts"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            format!(
                "{}/{}: {}",
                c["model_name"], c["lora_name"], c["prefix_count"]
            )
        })
        .collect();
    contexts.sort();
    out.extend(contexts);
    out
}

struct Fleet {
    engine: Player,
    store: Player,
    moved: Player,
}

impl Fleet {
    /// Everything published so far has reached `server`.
    async fn deliver(&mut self, server: &Server) {
        deliver(server, &mut self.engine, "e|default|0").await;
        deliver(server, &mut self.store, "s|default|0").await;
        deliver(server, &mut self.moved, "u|default|0").await;
    }

    async fn publish(&mut self, rng: &mut u64) {
        self.engine.publish(random_engine_batch(rng)).await;
        if !next(rng).is_multiple_of(3) {
            self.store.publish(random_store_batch(rng)).await;
        }
        if next(rng).is_multiple_of(4) {
            let p = (next(rng) % PROMPTS as u64) as i32;
            self.moved.publish(store(p, "GPU")).await;
        }
    }
}

async fn register_fleet(server: &Server, fleet: &Fleet) {
    register_as(server, "e", "vLLM", MODEL, &fleet.engine).await;
    register_as(server, "s", "Mooncake", MODEL, &fleet.store).await;
    register_as(server, "u", "vLLM", MOVED_MODEL, &fleet.moved).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_converges_to_the_uninterrupted_run() {
    let fast = json!({"checkpoint_interval_ms": 50});
    let reference = Server::start_with(fast.clone()).await;
    let mut victim = Server::start_with(fast.clone()).await;
    let mut fleet = Fleet {
        engine: Player::start(true, 0).await,
        store: Player::start(true, 1).await,
        moved: Player::start(true, 0).await,
    };
    fleet.engine.keep_at_most(BUFFER);
    fleet.store.keep_at_most(BUFFER);
    register_fleet(&reference, &fleet).await;
    register_fleet(&victim, &fleet).await;
    handshake(
        &reference,
        &mut fleet.engine,
        "e|default|0",
        store(0, "GPU"),
    )
    .await;
    // Every prompt once, so that the store's objects name blocks the engine announced.
    for p in 1..PROMPTS {
        fleet.engine.publish(store(p, "GPU")).await;
    }
    // The store's first object goes to a context it never feeds again.
    let idle = engine::mooncake_batch(vec![engine::mooncake_event(
        "stored", IDLE_MODEL, BS, "b0", "idle", "cpu", 42,
    )]);
    handshake(&reference, &mut fleet.store, "s|default|0", idle).await;
    handshake(&reference, &mut fleet.moved, "u|default|0", store(1, "GPU")).await;
    fleet.deliver(&victim).await;

    let mut rng = 0x5eed_u64;
    for round in 0..6 {
        for _ in 0..(5 + next(&mut rng) % 20) {
            fleet.publish(&mut rng).await;
        }
        if round == 2 {
            // The moved instance's engine comes back on another endpoint: its context goes with
            // its last source and is created again, right before a crash.
            for server in [&reference, &victim] {
                server.unregister_ok("u").await;
            }
            fleet.moved = Player::start(true, 0).await;
            for server in [&reference, &victim] {
                register_as(server, "u", "vLLM", MOVED_MODEL, &fleet.moved).await;
            }
            handshake(&reference, &mut fleet.moved, "u|default|0", store(2, "GPU")).await;
        }
        // Kill somewhere between checkpoints, then publish while the victim is down.
        tokio::time::sleep(Duration::from_millis(next(&mut rng) % 120)).await;
        let dir = victim.into_dir();
        for _ in 0..(next(&mut rng) % 10) {
            fleet.publish(&mut rng).await;
        }
        victim = Server::start_in(dir, fast.clone()).await;
        // Live batches after the restart: the victim catches up through replay up to them.
        fleet.publish(&mut rng).await;
        fleet.deliver(&victim).await;
    }
    assert!(
        fleet.store.next_seq() as usize > BUFFER + 1,
        "the idle context's batch left the store's replay buffer long ago"
    );
    // Last, one marker per source and context: batches apply in order, so once a context
    // answers its marker, it has applied everything published before it.
    let marker = PROMPTS;
    fleet.engine.publish(store(marker, "GPU")).await;
    fleet.engine.publish(adapter_store(marker, "ad")).await;
    fleet
        .store
        .publish(store_object("stored", marker + 1, 0, "cpu"))
        .await;
    fleet.moved.publish(store(marker, "GPU")).await;
    fleet.deliver(&reference).await;
    eventually("the reference answers every marker", WAIT, || async {
        let base = grpc_query(&reference, MODEL, prompt(marker), BS as i64).await;
        let shared = grpc_query(&reference, MODEL, prompt(marker + 1), BS as i64).await;
        let moved = grpc_query(&reference, MOVED_MODEL, prompt(marker), BS as i64).await;
        let done = base.hits.get("e").is_some_and(|h| h.device == 8)
            && shared.hits.get("e").is_some_and(|h| h.cpu_share == 4)
            && moved.hits.get("u").is_some_and(|h| h.device == 8)
            && adapter_hits(&reference, "ad", marker).await == 8;
        done.then_some(())
    })
    .await;
    let expected = everything(&reference).await;
    let indexed = |model: &str| {
        expected
            .iter()
            .any(|l| l.starts_with(&format!("{model} ")) && l.contains('8'))
    };
    assert!(
        indexed(MODEL) && indexed(MOVED_MODEL),
        "the scenario indexes something: {expected:#?}"
    );
    fleet.deliver(&victim).await;
    eventually("victim answers like the reference", WAIT, || async {
        (everything(&victim).await == expected).then_some(())
    })
    .await;
    for service in ["e|default|0", "s|default|0", "u|default|0"] {
        let status = victim.service_status(service).await;
        assert_eq!(
            status["sources_dropped"],
            json!(0),
            "replay covered every restart: {status}"
        );
    }
}
