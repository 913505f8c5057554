//! Query latency: every query asked four ways (each index by keys and from tokens) in
//! alternating passes, and the figures drawn from the samples.

use std::hint::black_box;
use std::time::{Duration, Instant};

use mooncake_conductor::index::QueryHits;

use crate::measure::{micros, percentiles};
use crate::workload::Workload;
use crate::{QUERY_ROUNDS, dynamo, ours};

/// Query latency figures in microseconds, per way of asking: `[by keys, from tokens]` of
/// `[ours, dynamo]`.
pub struct Latencies {
    /// p50 and p99 over every timed sample.
    pub all: [[(f64, f64); 2]; 2],
    /// p50 and p99 over queries of each query's fastest round: scheduler preemptions on a
    /// loaded machine hit longer queries more often and dominate a plain p99; the best of
    /// several rounds keeps the spread between queries and drops most of that noise.
    pub best: [[(f64, f64); 2]; 2],
    /// From tokens, p50 over the queries some holder matches to block [`DEEP`] or further:
    /// the long walks, which make most of the p99 that is not machine noise.
    pub deep_tokens: [f64; 2],
}

/// Matched blocks from which a query counts as a long walk (of 128).
pub const DEEP: u32 = 96;

pub fn latencies(
    w: &Workload,
    ours: &ours::Ours,
    dynamo: &dynamo::Dynamo,
    depths: &[u32],
) -> Latencies {
    let mut ours_keys: Vec<ours::QueryKeys> =
        w.queries.iter().map(|t| ours.query_keys(t)).collect();
    let dyn_keys: Vec<_> = w.queries.iter().map(|t| dynamo::local_hashes(t)).collect();
    let nq = w.queries.len();
    // Per way (ours keys, dynamo keys, ours tokens, dynamo tokens): sample of round r, query q
    // at `r * nq + q`.
    let mut s: [Vec<Duration>; 4] = std::array::from_fn(|_| Vec::with_capacity(nq * QUERY_ROUNDS));
    // Ours writes into one reused answer (`query_into`); Dynamo's `find_matches` has no such
    // form and returns a new map per query.
    let mut answer = QueryHits::default();
    for round in 0..=QUERY_ROUNDS {
        // One pass over every query per way of asking, never the same query twice in a row:
        // a query right after another on the same prompt would find its blocks in the CPU
        // caches and look faster than it is. The passes alternate within a round, so machine
        // noise hits both indexes alike.
        for (way, samples) in s.iter_mut().enumerate() {
            for (q, tokens) in w.queries.iter().enumerate() {
                // Time until the answer exists; freeing it is left out of the sample.
                let d = match way {
                    0 => timed(|| ours.query_into(&mut ours_keys[q], &mut answer)),
                    1 => timed(|| dynamo.find_matches(&dyn_keys[q])),
                    2 => timed(|| ours.query_tokens_into(tokens, &mut answer)),
                    _ => timed(|| dynamo.query_tokens(tokens)),
                };
                if round > 0 {
                    samples.push(d);
                }
            }
        }
    }
    if let Some(path) = std::env::var_os("DUMP_SAMPLES") {
        dump_samples(&path, &s, depths);
    }
    let deep = |v: &[Duration]| {
        let mut m: Vec<Duration> = v
            .iter()
            .enumerate()
            .filter(|&(i, _)| depths.get(i % nq).is_some_and(|&d| d >= DEEP))
            .map(|(_, &d)| d)
            .collect();
        micros(percentiles(&mut m).0)
    };
    let deep_tokens = [deep(&s[2]), deep(&s[3])];
    let us = |(a, b): (Duration, Duration)| (micros(a), micros(b));
    let best = |v: &[Duration]| {
        let mut m: Vec<Duration> = (0..nq)
            .map(|q| {
                (0..QUERY_ROUNDS)
                    .map(|r| v[r * nq + q])
                    .min()
                    .unwrap_or_default()
            })
            .collect();
        us(percentiles(&mut m))
    };
    let bests = s.each_ref().map(|v| best(v));
    let alls = s.map(|mut v| us(percentiles(&mut v)));
    Latencies {
        all: [[alls[0], alls[1]], [alls[2], alls[3]]],
        best: [[bests[0], bests[1]], [bests[2], bests[3]]],
        deep_tokens,
    }
}

/// Every latency sample as `way,round,query,nanoseconds` lines (ways: 0 ours by keys, 1
/// Dynamo by keys, 2 ours from tokens, 3 Dynamo from tokens), and beside them, in
/// `<path>.depth`, `query,matched blocks` lines: for studying the tail (see README,
/// "Profiling").
fn dump_samples(path: &std::ffi::OsStr, samples: &[Vec<Duration>; 4], depths: &[u32]) {
    let nq = depths.len().max(1);
    let mut out = String::new();
    for (way, v) in samples.iter().enumerate() {
        for (i, d) in v.iter().enumerate() {
            out += &format!("{way},{},{},{}\n", i / nq, i % nq, d.as_nanos());
        }
    }
    let depth: String = depths
        .iter()
        .enumerate()
        .map(|(q, d)| format!("{q},{d}\n"))
        .collect();
    let mut depth_path = path.to_os_string();
    depth_path.push(".depth");
    for (p, text) in [(path, &out), (depth_path.as_os_str(), &depth)] {
        if let Err(e) = std::fs::write(p, text) {
            eprintln!("DUMP_SAMPLES: cannot write {}: {e}", p.to_string_lossy());
        }
    }
}

pub fn timed<R>(f: impl FnOnce() -> R) -> Duration {
    let t = Instant::now();
    let r = f();
    let d = t.elapsed();
    black_box(r);
    d
}
