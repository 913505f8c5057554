//! Query latency: every query asked every way (ours three ways, each Dynamo indexer two) in
//! alternating passes, and the figures drawn from the samples.

use std::hint::black_box;
use std::time::{Duration, Instant};

use mooncake_conductor::index::QueryHits;

use crate::indexers::DynamoIndex;
use crate::measure::{micros, percentiles};
use crate::workload::Workload;
use crate::{dynamo, ours};

/// One way of asking a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// Ours over precomputed keys, into one reused answer (`query_into`).
    OursKeys,
    /// Ours from token ids into one reused answer (`query_tokens_into`).
    OursTokens,
    /// Ours from token ids through the service's call: a fresh answer, gRPC-encoded.
    OursService,
    /// Dynamo indexer `i` (of the sides given) over precomputed local hashes.
    DynamoKeys(usize),
    /// Dynamo indexer `i` from token ids (`find_matches_for_request` or its equivalent).
    DynamoTokens(usize),
}

impl Way {
    pub fn label(self, dynamo: &[&DynamoIndex]) -> String {
        match self {
            Way::OursKeys => "ours-keys".into(),
            Way::OursTokens => "ours-tokens".into(),
            Way::OursService => "ours-service".into(),
            Way::DynamoKeys(i) => format!("{}-keys", dynamo[i].kind.name()),
            Way::DynamoTokens(i) => format!("{}-tokens", dynamo[i].kind.name()),
        }
    }
}

/// Latency figures of one way, in microseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct WayStats {
    /// p50 and p99 over every timed sample.
    pub all: (f64, f64),
    /// p50 and p99 over queries of each query's fastest round: scheduler preemptions on a
    /// loaded machine hit longer queries more often and dominate a plain p99; the best of
    /// several rounds keeps the spread between queries and drops most of that noise.
    pub best: (f64, f64),
    /// p50 over the queries some holder matches to block [`DEEP`] or further: the long
    /// walks, which make most of the p99 that is not machine noise.
    pub deep: f64,
}

/// Matched blocks from which a query counts as a long walk (of 128).
pub const DEEP: u32 = 96;

/// The ways of the sides given, ours first.
pub fn ways(ours: bool, dynamo: usize) -> Vec<Way> {
    let mut v = Vec::new();
    if ours {
        v.extend([Way::OursKeys, Way::OursTokens, Way::OursService]);
    }
    for i in 0..dynamo {
        v.extend([Way::DynamoKeys(i), Way::DynamoTokens(i)]);
    }
    v
}

/// Times every query every way of the sides given: one untimed warm-up round, then `rounds`
/// timed ones. Returns the figures per way, in [`ways`] order.
pub fn latencies(
    w: &Workload,
    ours: Option<&ours::Ours>,
    dynamo: &[&DynamoIndex],
    depths: &[u32],
    rounds: usize,
) -> Vec<(Way, WayStats)> {
    let ways = ways(ours.is_some(), dynamo.len());
    let mut ours_keys: Vec<ours::QueryKeys> = match ours {
        Some(o) => w.queries.iter().map(|t| o.query_keys(t)).collect(),
        None => Vec::new(),
    };
    let dyn_keys: Vec<_> = w.queries.iter().map(|t| dynamo::local_hashes(t)).collect();
    let nq = w.queries.len();
    // Per way: sample of round r, query q at `r * nq + q`.
    let mut s: Vec<Vec<Duration>> = ways
        .iter()
        .map(|_| Vec::with_capacity(nq * rounds))
        .collect();
    let mut answer = QueryHits::default();
    for round in 0..=rounds {
        // One pass over every query per way of asking, never the same query twice in a row:
        // a query right after another on the same prompt would find its blocks in the CPU
        // caches and look faster than it is. The passes alternate within a round, so machine
        // noise hits every index alike.
        for (&way, samples) in ways.iter().zip(s.iter_mut()) {
            for (q, tokens) in w.queries.iter().enumerate() {
                // Time until the answer exists; freeing it is left out of the sample.
                let o = || ours.expect("ours ways only with ours");
                let d = match way {
                    Way::OursKeys => timed(|| o().query_into(&mut ours_keys[q], &mut answer)),
                    Way::OursTokens => timed(|| o().query_tokens_into(tokens, &mut answer)),
                    Way::OursService => timed(|| o().service_query(tokens)),
                    Way::DynamoKeys(i) => timed(|| dynamo[i].find_matches(&dyn_keys[q])),
                    Way::DynamoTokens(i) => timed(|| dynamo[i].query_tokens(tokens)),
                };
                if round > 0 {
                    samples.push(d);
                }
            }
        }
    }
    if let Some(path) = std::env::var_os("DUMP_SAMPLES") {
        let labels: Vec<String> = ways.iter().map(|w| w.label(dynamo)).collect();
        dump_samples(&path, &labels, &s, depths);
    }
    let us = |(a, b): (Duration, Duration)| (micros(a), micros(b));
    let stats = |v: &mut Vec<Duration>| {
        let mut deep: Vec<Duration> = v
            .iter()
            .enumerate()
            .filter(|&(i, _)| depths.get(i % nq).is_some_and(|&d| d >= DEEP))
            .map(|(_, &d)| d)
            .collect();
        let mut best: Vec<Duration> = (0..nq)
            .map(|q| (0..rounds).map(|r| v[r * nq + q]).min().unwrap_or_default())
            .collect();
        WayStats {
            deep: if deep.is_empty() {
                f64::NAN
            } else {
                micros(percentiles(&mut deep).0)
            },
            best: us(percentiles(&mut best)),
            all: us(percentiles(v)),
        }
    };
    ways.into_iter().zip(s.iter_mut().map(stats)).collect()
}

/// Every latency sample as `way,round,query,nanoseconds` lines, and beside them, in
/// `<path>.depth`, `query,matched blocks` lines: for studying the tail (see README,
/// "Profiling").
fn dump_samples(
    path: &std::ffi::OsStr,
    labels: &[String],
    samples: &[Vec<Duration>],
    depths: &[u32],
) {
    let nq = depths.len().max(1);
    let mut out = String::new();
    for (label, v) in labels.iter().zip(samples) {
        for (i, d) in v.iter().enumerate() {
            out += &format!("{label},{},{},{}\n", i / nq, i % nq, d.as_nanos());
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
