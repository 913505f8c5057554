//! `--profile <way>`: builds the indexes, then runs one way of asking (or the apply) alone for
//! a few seconds, so that a profiler attached to the process sees that path and little else
//! (see README, "Profiling"). Dynamo's side here is its single-thread `crtc`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use mooncake_conductor::index::QueryHits;

use crate::build::{apply_dynamo, dynamo_events};
use crate::indexers::{DynamoIndex, Kind};
use crate::latency::DEEP;
use crate::long::long_prompt;
use crate::measure::thread_cpu_secs;
use crate::workload::{self, Shape};
use crate::{SEED, dynamo, ours};

pub const WAYS: &[&str] = &[
    "keys",
    "tokens",
    "service",
    "dynamo-keys",
    "dynamo-tokens",
    "apply",
    "apply-budget",
    "long-keys",
    "long-tokens",
];

/// The apply with a memory budget set but never reached beside the apply without one: builds
/// alternated (`BUILDS`, default 5, each), thread CPU time, fastest and median of each.
fn apply_budget(holders: usize, batches: &[ours::Batch]) {
    let builds: usize = std::env::var("BUILDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let (mut plain, mut bounded) = (Vec::new(), Vec::new());
    let mut evicted = 0;
    for _ in 0..builds {
        for with_budget in [false, true] {
            // A bound of 1 TiB and 1 G blocks per context: kept, charged, never reached.
            let mut fresh = if with_budget {
                ours::Ours::with_budget(holders, 1 << 40, 1 << 30)
            } else {
                ours::Ours::new(holders)
            };
            let cpu = thread_cpu_secs();
            batches.iter().for_each(|b| fresh.apply(b));
            let secs = thread_cpu_secs() - cpu;
            evicted += fresh.evicted();
            black_box(fresh.pairs());
            if with_budget {
                &mut bounded
            } else {
                &mut plain
            }
            .push(secs);
        }
    }
    assert_eq!(evicted, 0, "the budget was reached");
    for v in [&mut plain, &mut bounded] {
        v.sort_by(|a, b| a.total_cmp(b));
    }
    let median = |v: &[f64]| v[v.len() / 2];
    eprintln!(
        "apply, thread CPU over {builds} alternated builds each: without a budget best {:.1} ms, \
         median {:.1} ms; with a budget not reached best {:.1} ms, median {:.1} ms; ratio best \
         {:.3}, median {:.3}",
        plain[0] * 1e3,
        median(&plain) * 1e3,
        bounded[0] * 1e3,
        median(&bounded) * 1e3,
        bounded[0] / plain[0],
        median(&bounded) / median(&plain)
    );
}

/// Build both indexes, then run one way of asking (or the apply alone) for a few seconds, so
/// that a profiler attached to the process sees that path and little else.
pub fn profile(way: &str) {
    if way == "long-keys" || way == "long-tokens" {
        // Ours only, built once, then the 1M-token query many times.
        let (tokens, batch) = long_prompt();
        let mut ours = ours::Ours::new(1);
        let keys = [ours.prompt(&tokens)];
        ours.apply(&ours.batch(&batch, &keys));
        let mut query_keys = ours.query_keys(&tokens);
        let mut answer = QueryHits::default();
        let (t, cpu) = (Instant::now(), thread_cpu_secs());
        for _ in 0..100 {
            if way == "long-keys" {
                ours.query_into(&mut query_keys, &mut answer);
            } else {
                ours.query_tokens_into(&tokens, &mut answer);
            }
        }
        eprintln!(
            "{way}: {:.2} ms per query; {:.2} ms of CPU per query",
            t.elapsed().as_secs_f64() * 10.0,
            (thread_cpu_secs() - cpu) * 10.0
        );
        black_box(&answer);
        return;
    }
    let w = workload::generate(SEED, Shape::DEFAULT);
    let holders = w.holders();
    let mut ours = ours::Ours::new(holders);
    let prompts: Vec<_> = w.prompts.iter().map(|p| ours.prompt(&p.tokens)).collect();
    let batches: Vec<_> = w.batches.iter().map(|b| ours.batch(b, &prompts)).collect();
    if way == "apply-budget" {
        apply_budget(holders, &batches);
        return;
    }
    if way == "apply" {
        // Each build timed on its own, so that A/B runs can compare the fastest of five; the
        // thread's CPU time too, which leaves out time slices other processes took.
        let mut times: Vec<(f64, f64)> = (0..5)
            .map(|_| {
                let mut fresh = ours::Ours::new(holders);
                let (t, cpu) = (Instant::now(), thread_cpu_secs());
                batches.iter().for_each(|b| fresh.apply(b));
                let secs = (t.elapsed().as_secs_f64(), thread_cpu_secs() - cpu);
                black_box(fresh.pairs());
                secs
            })
            .collect();
        let first = times[0];
        times.sort_by(|a, b| a.1.total_cmp(&b.1));
        eprintln!(
            "apply: CPU best {:.1} ms, median {:.1} ms, first {:.1} ms; wall of those {:.1}, \
             {:.1}, {:.1} ms (5 builds)",
            times[0].1 * 1e3,
            times[2].1 * 1e3,
            first.1 * 1e3,
            times[0].0 * 1e3,
            times[2].0 * 1e3,
            first.0 * 1e3
        );
        return;
    }
    batches.iter().for_each(|b| ours.apply(b));
    let dynamo = DynamoIndex::new(Kind::Crtc);
    if way.starts_with("dynamo") {
        apply_dynamo(&dynamo, dynamo_events(&w));
    }
    let mut w = w;
    if std::env::var_os("PROFILE_DEEP").is_some() {
        // Only the queries some holder matches to block 96 or further: the long walks that
        // make the latency tail.
        let deep = |q: &Vec<u32>| {
            ours::overlap(&ours.query_tokens(q), holders)
                .into_iter()
                .max()
                >= Some(DEEP)
        };
        w.queries.retain(deep);
        eprintln!("{} queries matched to block 96 or further", w.queries.len());
    }
    let mut keys: Vec<ours::QueryKeys> = w.queries.iter().map(|t| ours.query_keys(t)).collect();
    let dyn_keys: Vec<_> = w.queries.iter().map(|t| dynamo::local_hashes(t)).collect();
    let mut answer = QueryHits::default();
    let (start, cpu) = (Instant::now(), thread_cpu_secs());
    let mut asked = 0u64;
    // A fixed number of passes for instruction-level tools (cachegrind), else 8 seconds.
    let passes: Option<u64> = std::env::var("PROFILE_PASSES")
        .ok()
        .and_then(|p| p.parse().ok());
    while passes.map_or(start.elapsed() < Duration::from_secs(8), |p| {
        asked < p * w.queries.len() as u64
    }) {
        asked += w.queries.len() as u64;
        for (q, tokens) in w.queries.iter().enumerate() {
            match way {
                "keys" => ours.query_into(&mut keys[q], &mut answer),
                "tokens" => ours.query_tokens_into(tokens, &mut answer),
                "service" => drop(black_box(ours.service_query(tokens))),
                "dynamo-keys" => drop(black_box(dynamo.find_matches(&dyn_keys[q]))),
                _ => drop(black_box(dynamo.query_tokens(tokens))),
            }
        }
    }
    black_box(&answer);
    eprintln!(
        "{way}: {:.2} us per query (mean of {asked}); {:.2} us of CPU per query",
        start.elapsed().as_secs_f64() * 1e6 / asked as f64,
        (thread_cpu_secs() - cpu) * 1e6 / asked as f64
    );
}
