//! `--mixed`: reads under writes. Each index is built from the default workload, then one
//! writer thread applies churn while one reader thread asks queries from token ids through
//! the service's call (Dynamo: `find_matches_for_request` or its equivalent), both for a fixed
//! time. Before that, the writer runs alone for a while, for its CPU cost without a reader.
//!
//! The churn is a cycle of engine messages prepared in advance: in its first half each message
//! evicts one cached prompt's own blocks from a holder and stores a prompt the holder did not
//! cache (under a system prompt it holds); the second half undoes every message in order.
//! Stores balance removes, so the index stays at its size; at the end of each run the writer
//! completes its cycle (untimed), which puts the index back at the workload's final state, and
//! every side's answers are checked against ours before the churn.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dynamo_kv_router::protocols::RouterEvent;

use crate::build::{
    apply_dynamo, apply_ours, dynamo_events, dynamo_messages, ours_batches, ours_messages,
};
use crate::check::check;
use crate::indexers::{DynamoIndex, Kind, PacedSender};
use crate::latency::timed;
use crate::measure::{micros, quantile, thread_cpu_secs};
use crate::report::{Better, Report};
use crate::workload::{self, Event, PublisherBatch, Rng, Shape, Workload};
use crate::{SEED, describe, ours};

/// Message pairs per half cycle.
const CHURN_PAIRS: usize = 2_000;

fn secs_from_env(var: &str, default: f64) -> Duration {
    let s = std::env::var(var)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(default);
    Duration::from_secs_f64(s)
}

/// One churn cycle: the messages and the block ops of each.
struct Churn {
    messages: Vec<PublisherBatch>,
    ops: Vec<u64>,
    /// Lowest and highest change of the live pairs over the cycle.
    drift: (i64, i64),
}

fn store_events(events: &mut Vec<Event>, rng: &mut Rng, prompt: u32, start: u32, end: u32) {
    let mut s = start;
    while s < end {
        let len = (rng.range(8, 16) as u32).min(end - s);
        events.push(Event::Store {
            prompt,
            start: s,
            end: s + len,
        });
        s += len;
    }
}

fn churn(w: &Workload) -> Churn {
    let mut rng = Rng::new(SEED ^ 0xc4u64);
    let stored = w.shape.stored_prompts;
    let held: Vec<HashSet<u32>> = w
        .holdings
        .iter()
        .map(|h| h.iter().map(|&(p, _)| p).collect())
        .collect();
    let systems: Vec<HashSet<usize>> = w
        .holdings
        .iter()
        .map(|h| {
            h.iter()
                .map(|&(p, _)| w.prompts[p as usize].system)
                .collect()
        })
        .collect();
    let mut used: Vec<HashSet<u32>> = vec![HashSet::new(); w.holders()];
    let mut first = Vec::with_capacity(CHURN_PAIRS);
    let mut second = Vec::with_capacity(CHURN_PAIRS);
    while first.len() < CHURN_PAIRS {
        let h = rng.range(0, w.holders() - 1);
        let holding = &w.holdings[h];
        let (x, x_end) = holding[rng.range(0, holding.len() - 1)];
        let x_sys = w.prompts[x as usize].system_blocks as u32;
        let y = rng.range(0, stored - 1) as u32;
        let y_prompt = &w.prompts[y as usize];
        if x_end <= x_sys
            || held[h].contains(&y)
            || !systems[h].contains(&y_prompt.system)
            || !used[h].insert(x)
            || !used[h].insert(y)
        {
            continue;
        }
        let (y_sys, y_end) = (y_prompt.system_blocks as u32, y_prompt.blocks() as u32);
        let mut a = vec![Event::Remove {
            prompt: x,
            start: x_sys,
            end: x_end,
        }];
        store_events(&mut a, &mut rng, y, y_sys, y_end);
        let mut b = vec![Event::Remove {
            prompt: y,
            start: y_sys,
            end: y_end,
        }];
        store_events(&mut b, &mut rng, x, x_sys, x_end);
        first.push(PublisherBatch {
            holder: h,
            events: a,
        });
        second.push(PublisherBatch {
            holder: h,
            events: b,
        });
    }
    first.extend(second);
    let ops = first
        .iter()
        .map(|m| m.events.iter().map(Event::blocks).sum())
        .collect();
    let (mut live, mut drift) = (0i64, (0i64, 0i64));
    for m in &first {
        for e in &m.events {
            live += match e {
                Event::Store { .. } => e.blocks() as i64,
                Event::Remove { .. } => -(e.blocks() as i64),
            };
            drift = (drift.0.min(live), drift.1.max(live));
        }
    }
    Churn {
        messages: first,
        ops,
        drift,
    }
}

/// What the writer did in one phase.
#[derive(Debug, Clone, Copy, Default)]
struct Written {
    ops: u64,
    wall: f64,
    /// CPU seconds of the writer thread and, for Dynamo, of its event threads.
    cpu: f64,
}

/// What the reader saw: sorted latencies and its wall time.
struct Read {
    samples: Vec<Duration>,
    wall: f64,
}

/// The writer's side of the index under test, with its churn cycle prepared.
enum Writer<'a> {
    Ours(&'a mut ours::Ours, &'a [ours::Batch]),
    Dynamo(&'a DynamoIndex, &'a [Vec<RouterEvent>]),
}

/// The reader's side.
enum Reader<'a> {
    Ours(ours::OursReader),
    Dynamo(&'a DynamoIndex),
}

impl Writer<'_> {
    /// Applies churn messages from `next` until `stop` is set (checked after each message),
    /// then on until the cycle is complete; counts and times only the first part. Dynamo's
    /// sender waits at the end until its event threads have applied what it sent.
    fn write(&mut self, stop: &AtomicBool, next: &mut usize, ops_of: &[u64]) -> Written {
        let n = ops_of.len();
        let (t, cpu, workers) = (Instant::now(), thread_cpu_secs(), self.worker_cpu());
        let mut ops = 0;
        match self {
            Writer::Ours(o, batches) => {
                while !stop.load(Ordering::Relaxed) {
                    o.apply(&batches[*next % n]);
                    ops += ops_of[*next % n];
                    *next += 1;
                }
            }
            Writer::Dynamo(index, events) => {
                let mut sender = PacedSender::new(index);
                while !stop.load(Ordering::Relaxed) {
                    // Dynamo takes events by value: each is cloned from the prepared cycle.
                    for ev in &events[*next % n] {
                        sender.send(ev.clone());
                    }
                    ops += ops_of[*next % n];
                    *next += 1;
                }
                sender.finish();
            }
        }
        let written = Written {
            ops,
            wall: t.elapsed().as_secs_f64(),
            cpu: thread_cpu_secs() - cpu + self.worker_cpu() - workers,
        };
        while !(*next).is_multiple_of(n) {
            match self {
                Writer::Ours(o, batches) => o.apply(&batches[*next % n]),
                Writer::Dynamo(index, events) => events[*next % n]
                    .iter()
                    .for_each(|ev| index.send(ev.clone())),
            }
            *next += 1;
        }
        if let Writer::Dynamo(index, _) = self {
            index.flush();
        }
        written
    }

    fn worker_cpu(&self) -> f64 {
        match self {
            Writer::Ours(..) => 0.0,
            Writer::Dynamo(index, _) => index.worker_cpu_secs(),
        }
    }
}

impl Reader<'_> {
    /// One query from token ids, timed until the answer exists.
    fn query(&self, tokens: &[u32]) -> Duration {
        match self {
            Reader::Ours(r) => timed(|| r.service_query(tokens)),
            Reader::Dynamo(d) => timed(|| d.query_tokens(tokens)),
        }
    }

    /// Queries in a loop until `stop` is set.
    fn read(&self, queries: &[Vec<u32>], stop: &AtomicBool) -> Read {
        let t = Instant::now();
        let mut samples = Vec::with_capacity(1 << 20);
        let mut q = 0;
        while !stop.load(Ordering::Relaxed) {
            samples.push(self.query(&queries[q % queries.len()]));
            q += 1;
        }
        let wall = t.elapsed().as_secs_f64();
        samples.sort_unstable();
        Read { samples, wall }
    }
}

/// The writer alone for `alone`, then writer and reader together for `mixed`.
fn run_side(
    mut writer: Writer<'_>,
    reader: Reader<'_>,
    churn: &Churn,
    queries: &[Vec<u32>],
    (alone, mixed): (Duration, Duration),
) -> (Written, Written, Read) {
    let stop = AtomicBool::new(false);
    let mut next = 0usize;
    let solo = std::thread::scope(|s| {
        let w = s.spawn(|| writer.write(&stop, &mut next, &churn.ops));
        std::thread::sleep(alone);
        stop.store(true, Ordering::Relaxed);
        w.join().expect("the writer does not panic")
    });
    stop.store(false, Ordering::Relaxed);
    std::thread::scope(|s| {
        let w = s.spawn(|| writer.write(&stop, &mut next, &churn.ops));
        let r = s.spawn(|| reader.read(queries, &stop));
        std::thread::sleep(mixed);
        stop.store(true, Ordering::Relaxed);
        let both = w.join().expect("the writer does not panic");
        (solo, both, r.join().expect("the reader does not panic"))
    })
}

pub fn run() -> Result<Report, String> {
    let durations = (
        secs_from_env("MIXED_ALONE_SECS", 2.0),
        secs_from_env("MIXED_SECS", 5.0),
    );
    let mut report = Report::new("mixed");
    let t = Instant::now();
    let w = workload::generate(SEED, Shape::DEFAULT);
    describe(&w, t.elapsed(), &mut report);
    let churn = churn(&w);
    let cycle_ops: u64 = churn.ops.iter().sum();
    println!(
        "churn: a cycle of {} messages, {cycle_ops} block ops; the live pairs stay within \
         {:+} / {:+} of {} over it; writer alone {:.1?}, then writer and reader {:.1?}",
        churn.messages.len(),
        churn.drift.0,
        churn.drift.1,
        w.live_pairs,
        durations.0,
        durations.1
    );
    report.note("churn_cycle_messages", churn.messages.len());
    report.note("churn_cycle_block_ops", cycle_ops);
    report.note("alone_secs", durations.0.as_secs_f64());
    report.note("mixed_secs", durations.1.as_secs_f64());

    let mut results = Vec::new();
    let mut ours = ours::Ours::new(w.holders());
    let batches = ours_batches(&ours, &w);
    apply_ours(&mut ours, &batches);
    drop(batches);
    let reference = check(&w, Some(&ours), &[])?;
    let cycle = ours_messages(&ours, &w, &churn.messages);
    let reader = Reader::Ours(ours.reader());
    results.push(run_side(
        Writer::Ours(&mut ours, &cycle),
        reader,
        &churn,
        &w.queries,
        durations,
    ));
    if ours.pairs() != w.live_pairs || check(&w, Some(&ours), &[])?.digests != reference.digests {
        return Err("ours: the churn cycle did not restore the index".into());
    }
    drop(ours);
    // `MIXED_ONLY=ours` leaves Dynamo's indexers out: our side alone, for a profiler.
    let only_ours = std::env::var("MIXED_ONLY").is_ok_and(|v| v == "ours");
    for kind in Kind::ALL.into_iter().filter(|_| !only_ours) {
        let index = DynamoIndex::new(kind);
        apply_dynamo(&index, dynamo_events(&w));
        let cycle = dynamo_messages(&w, &churn.messages);
        let writer = Writer::Dynamo(&index, &cycle);
        results.push(run_side(
            writer,
            Reader::Dynamo(&index),
            &churn,
            &w.queries,
            durations,
        ));
        let threads = index.event_threads();
        let expected = if kind == Kind::Crtc {
            1
        } else {
            crate::indexers::LANES
        };
        if threads != expected {
            return Err(format!("{}: found {threads} event threads", kind.name()));
        }
        if check(&w, None, &[&index])?.digests != reference.digests {
            return Err(format!(
                "{}: answers differ from ours after the churn",
                kind.name()
            ));
        }
    }
    let lanes = crate::indexers::LANES;
    println!(
        "check: after each run every index answers the {} queries as ours did before the churn \
         (Dynamo's writer CPU counts its sender and 1 / {lanes} / {lanes} event threads)",
        w.queries.len()
    );

    type Figure = fn(&(Written, Written, Read)) -> f64;
    let rows: [(&str, Better, usize, Figure); 8] = [
        (
            "read from tokens under writes, service call, p50 us",
            Better::Lower,
            1,
            |r| micros(quantile(&r.2.samples, 0.50)),
        ),
        (
            "read from tokens under writes, service call, p99 us",
            Better::Lower,
            1,
            |r| micros(quantile(&r.2.samples, 0.99)),
        ),
        (
            "read from tokens under writes, service call, p99.9 us",
            Better::Lower,
            1,
            |r| micros(quantile(&r.2.samples, 0.999)),
        ),
        (
            "reads per second under writes, thousands",
            Better::Higher,
            1,
            |r| r.2.samples.len() as f64 / r.2.wall / 1e3,
        ),
        (
            "writes under reads, M block ops/s",
            Better::Higher,
            2,
            |r| r.1.ops as f64 / r.1.wall / 1e6,
        ),
        ("writes alone, M block ops/s", Better::Higher, 2, |r| {
            r.0.ops as f64 / r.0.wall / 1e6
        }),
        (
            "writer, M block ops per CPU-second, with the reader",
            Better::Higher,
            2,
            |r| r.1.ops as f64 / r.1.cpu / 1e6,
        ),
        (
            "writer, M block ops per CPU-second, alone",
            Better::Higher,
            2,
            |r| r.0.ops as f64 / r.0.cpu / 1e6,
        ),
    ];
    for (name, better, decimals, f) in rows {
        if only_ours {
            // No side to compare with: our figure alone, for a profiler's run.
            println!("{name:<80} {:>8.*}", decimals, f(&results[0]));
            continue;
        }
        let d: [f64; 3] = std::array::from_fn(|i| f(&results[i + 1]));
        report.row(name, better, decimals, f(&results[0]), d);
    }
    Ok(report)
}
