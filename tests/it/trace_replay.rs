//! Mooncake's conversation trace through the real binary: simulated vLLM engines (one DP rank
//! each, small block pools so that they evict) publish their stored and removed blocks over
//! ZeroMQ, a KV-aware router asks the service over gRPC where each prompt's longest cached
//! prefix is, and every answer is checked against the simulator's ground truth for every engine.
//! Each request's events are applied (the subscription's `last_seq` reached, nothing pending in
//! the context) before the next request asks, so an exact index answers each question exactly.

#[path = "../../benches/trace_sim/mod.rs"]
mod trace_sim;

use std::time::{Duration, Instant};

use mooncake_conductor::gateway::pb;
use rmpv::Value;

use crate::support::deliver::{Caught, deliver_streams};
use crate::support::engine::{self, Registration, vllm_cbor_profile};
use crate::support::player::Player;
use crate::support::server::Server;
use crate::support::{WAIT, http};
use trace_sim::fleet::{Event, EventCounts, Fleet, HitRate, Policy, Router, offline};
use trace_sim::{BLOCK_SIZE, Prompts, Trace, trace_path};

const MODEL: &str = "trace-model";

/// One replay's shape.
struct Setup {
    requests: usize,
    engines: usize,
    /// Blocks per engine.
    capacity: usize,
    /// Leave this removal (counted over the whole run, from 0) out of what is published: a
    /// lost event the check has to notice.
    lose_removal: Option<u64>,
}

/// What one replay saw.
struct Outcome {
    /// Every answer that differed from the truth (at most [`SHOWN`] are described).
    mismatches: Vec<String>,
    wrong: usize,
    /// Answers checked, one per (question, engine).
    checked: usize,
    hits: HitRate,
    counts: EventCounts,
}

/// Mismatches described in a failure message.
const SHOWN: usize = 8;

impl Outcome {
    /// Count one check; describe it if it failed and fewer than [`SHOWN`] are described.
    fn check(&mut self, ok: bool, describe: impl FnOnce() -> String) {
        self.checked += 1;
        if !ok {
            self.wrong += 1;
            if self.mismatches.len() < SHOWN {
                self.mismatches.push(describe());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_during_a_trace_replay_is_the_fleets_true_prefix() {
    let started = Instant::now();
    let setup = Setup {
        requests: 400,
        engines: 16,
        capacity: 16384,
        lose_removal: None,
    };
    let out = replay(&setup).await;
    assert!(
        out.wrong == 0,
        "{} of {} answers differ from the truth, e.g.:\n{}",
        out.wrong,
        out.checked,
        out.mismatches.join("\n")
    );
    // The slice must exercise what can go wrong: evictions, and reuse beyond the common system
    // prompt (its first 512 tokens are 3.6 % of the slice's prompt tokens).
    assert!(out.counts.removed_blocks > 10_000, "{:?}", out.counts);
    assert!(out.hits.rate() > 0.06, "hit rate {}", out.hits.rate());
    // Exact answers route as the router on the truth does: the same hit rate to the token.
    let requests = Trace::read(&trace_path(), Some(setup.requests));
    let mut prompts = Prompts::new();
    let (truth, _) = offline(
        &requests,
        &mut prompts,
        setup.engines,
        setup.capacity,
        Policy::KvAware,
    );
    assert_eq!(out.hits.cached_tokens, truth.cached_tokens);
    let (blind, _) = offline(
        &requests,
        &mut prompts,
        setup.engines,
        setup.capacity,
        Policy::RoundRobin,
    );
    assert!(
        out.hits.rate() > blind.rate(),
        "round-robin {}",
        blind.rate()
    );
    eprintln!(
        "trace replay: {} requests, {} answers checked, hit rate {:.3}, {:?}, {:.1} s",
        setup.requests,
        out.checked,
        out.hits.rate(),
        out.counts,
        started.elapsed().as_secs_f64()
    );
}

/// The check above can fail: one removal left out of the stream makes some answer wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removal_lost_on_the_way_makes_the_replay_fail() {
    let setup = Setup {
        requests: 60,
        engines: 4,
        capacity: 2048,
        lose_removal: Some(0),
    };
    let out = replay(&setup).await;
    assert!(out.counts.removed_blocks > 0, "{:?}", out.counts);
    assert!(out.wrong > 0, "a lost removal went unnoticed");
}

async fn replay(setup: &Setup) -> Outcome {
    let requests = Trace::read(&trace_path(), Some(setup.requests));
    let server = Server::start().await;
    let mut players = Vec::new();
    for i in 0..setup.engines {
        let player = Player::start(false, 0).await;
        let registration = Registration::vllm(&Fleet::instance(i), &player.endpoint)
            .model(MODEL)
            .block_size(BLOCK_SIZE as u32)
            .profile(vllm_cbor_profile())
            .json();
        server.register_ok(&registration).await;
        players.push(player);
    }
    // An empty batch per engine, delivered until applied: the PUB drops what it sends before the
    // subscription's SUB has joined.
    let services: Vec<String> = (0..setup.engines)
        .map(|i| format!("{}|default|0", Fleet::instance(i)))
        .collect();
    for p in &mut players {
        p.publish(engine::batch(vec![], 0)).await;
    }
    let mut streams: Vec<(&str, &mut Player)> = services
        .iter()
        .map(String::as_str)
        .zip(players.iter_mut())
        .collect();
    deliver_streams(&mut streams, Caught::Applied, WAIT, async || {
        vec![http::get(server.http_port, "/services/status").await.json()]
    })
    .await;

    let mut grpc = server.grpc().await;
    let (mut prompts, mut fleet) = (Prompts::new(), Fleet::new(setup.engines, setup.capacity));
    let mut router = Router::new(Policy::KvAware);
    let mut out = Outcome {
        mismatches: Vec::new(),
        wrong: 0,
        checked: 0,
        hits: HitRate::default(),
        counts: EventCounts::default(),
    };
    let mut removals = 0u64;
    for (n, r) in requests.iter().enumerate() {
        fleet.advance(r.arrival_ms);
        let prompt = prompts.prompt(r);
        let truth = fleet.truth(&prompt.keys);
        let answer = ask(&mut grpc, &prompt.tokens).await;
        let matched = compare(&mut out, &format!("request {n}"), &answer, &truth);
        let e = router.choose(prompt.keys.len(), &matched, &fleet.load());
        let admission = fleet.admit(e, &prompt, r.arrival_ms, r.duration_ms());
        out.hits.add(r, admission.hit_blocks);
        out.counts.add(&admission);
        if admission.events.is_empty() {
            continue;
        }
        let mut events = Vec::new();
        for event in &admission.events {
            match event {
                Event::Removed(key) => {
                    removals += 1;
                    if setup.lose_removal != Some(removals - 1) {
                        events.push(engine::vllm_removed(&[*key], "GPU"));
                    }
                }
                Event::Stored {
                    parent,
                    first,
                    keys,
                } => events.push(stored(
                    *parent,
                    keys,
                    prompt.block_tokens(*first, keys.len()),
                )),
            }
        }
        let seq = players[e].publish(engine::batch(events, 0)).await;
        applied(&server, &services[e], seq).await;
        // A block the index kept after its engine evicted it may be out of every later walk's
        // reach (its parent evicted too); the context's count of distinct blocks still shows it.
        let blocks = context_blocks(&server).await;
        let want = fleet.distinct_blocks() as u64;
        out.check(blocks == want, || {
            format!("after request {n}: the fleet holds {want} distinct blocks, the index {blocks}")
        });
    }
    // Every prompt of the slice once more, on the final state.
    for (n, r) in requests.iter().enumerate() {
        let prompt = prompts.prompt(r);
        let answer = ask(&mut grpc, &prompt.tokens).await;
        compare(
            &mut out,
            &format!("final, prompt {n}"),
            &answer,
            &fleet.truth(&prompt.keys),
        );
    }
    out
}

fn stored(parent: Option<u64>, keys: &[u64], tokens: &[i32]) -> Value {
    engine::vllm_stored(keys, parent, tokens, BLOCK_SIZE as u32, "GPU", None)
}

async fn ask(
    grpc: &mut pb::conductor_client::ConductorClient<tonic::transport::Channel>,
    tokens: &[i32],
) -> pb::QueryResponse {
    let request = pb::QueryRequest {
        model_name: MODEL.into(),
        block_size: BLOCK_SIZE as i64,
        token_ids: tokens.to_vec(),
        ..Default::default()
    };
    let answer = grpc.query(request).await.expect("gRPC query").into_inner();
    assert_eq!(answer.ret, 0, "{:?}", answer.error);
    answer
}

/// Check `answer` against the true prefix (blocks) of every engine; the blocks each engine
/// matched, as the router reads them.
fn compare(
    out: &mut Outcome,
    what: &str,
    answer: &pb::QueryResponse,
    truth: &[usize],
) -> Vec<usize> {
    let mut matched = Vec::with_capacity(truth.len());
    for (i, want) in truth.iter().enumerate() {
        let want = (want * BLOCK_SIZE) as i64;
        let got = answer
            .hits
            .get(&Fleet::instance(i))
            .map(|h| (h.device, h.longest_matched));
        out.check(got == Some((want, want)), || {
            format!("{what}: engine {i} holds {want} tokens, answered (device, longest) {got:?}")
        });
        matched.push(got.map_or(0, |g| g.0 as usize / BLOCK_SIZE));
    }
    if answer.hits.len() != truth.len() {
        out.wrong += 1;
        out.mismatches
            .push(format!("{what}: {} instances answered", answer.hits.len()));
    }
    matched
}

/// Distinct blocks the index holds in the trace's context (`/global_view`).
async fn context_blocks(server: &Server) -> u64 {
    let view = http::get(server.http_port, "/global_view").await.json();
    let contexts = view["contexts"].as_array().cloned().unwrap_or_default();
    let context = contexts.iter().find(|c| c["model_name"] == MODEL);
    context
        .and_then(|c| c["prefix_count"].as_u64())
        .unwrap_or(0)
}

/// Wait until `service` has applied `seq` into the index: the subscription consumed it and no
/// batch of it is still queued for the context. Polled every 2 ms, at most [`WAIT`].
async fn applied(server: &Server, service: &str, seq: u64) {
    let deadline = Instant::now() + WAIT;
    loop {
        let st = server.service_status(service).await;
        if st["last_seq"].as_u64() == Some(seq) && st["pending_batches"].as_u64() == Some(0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{service} did not apply seq {seq} within {WAIT:?}: {st}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}
