//! Side-by-side benchmark of mooncake-conductor's context index and NVIDIA Dynamo's three
//! production indexers, in one process, on one deterministic workload (see README).
//!
//! Layout: `workload` generates prompts, engine events and queries; `ours`, `dynamo` and
//! `indexers` adapt them to each index; `build` applies them; `check` compares the answers;
//! `latency` times the queries; `report` prints and writes the figures. The modes: this file
//! (the default), `fleet` (`--fleet N`), `mixed` (`--mixed`); `memory` is the RSS measurement
//! run in a fresh process, `profile` runs one way of asking alone for a profiler.

mod build;
mod check;
mod dynamo;
mod fleet;
mod indexers;
mod latency;
mod long;
mod measure;
mod memory;
mod mixed;
mod ours;
mod profile;
mod report;
mod trace;
mod trace_index;
mod trace_prep;
#[path = "../../trace_sim/mod.rs"]
mod trace_sim;
mod workload;

use std::process::ExitCode;
use std::time::Instant;

use build::{apply_dynamo, apply_ours, dynamo_events, ours_batches};
use indexers::{DynamoIndex, Kind};
use latency::{DEEP, Way, WayStats, latencies};
use report::{Better, Report};
use workload::{Event, Shape, Workload};

pub const SEED: u64 = 0x5eed_2026;
/// Timed passes over the query set (after one untimed warm-up pass).
pub const QUERY_ROUNDS: usize = 3;

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    // The trace replay reads its own options, `--json` among them.
    if args.first().map(String::as_str) == Some("--trace") {
        return exit(trace::main(&args[1..]));
    }
    let json = match args.iter().position(|a| a == "--json") {
        Some(i) if i + 1 < args.len() => {
            let path = args.remove(i + 1);
            args.remove(i);
            Some(path)
        }
        Some(_) => return usage(),
        None => None,
    };
    let arg = |i: usize| args.get(i).map(String::as_str);
    let result = match (arg(0), arg(1), arg(2)) {
        (None, _, _) => run_default(),
        (Some("--fleet"), Some(n), None) => match n.parse() {
            Ok(n) if n > 0 => fleet::run(n),
            _ => return usage(),
        },
        (Some("--mixed"), None, _) => mixed::run(),
        (Some("--fleet-child"), Some(n), Some(side)) => match n.parse() {
            Ok(n) => return exit(fleet::child(n, side)),
            _ => return usage(),
        },
        (Some("--rss-child"), Some(side), n) => {
            let shape = match n.map(str::parse) {
                None => Shape::DEFAULT,
                Some(Ok(n)) => Shape::fleet(n),
                Some(Err(_)) => return usage(),
            };
            return exit(memory::rss_child(side, shape));
        }
        (Some("--profile"), Some(way), None) if profile::WAYS.contains(&way) => {
            profile::profile(way);
            return ExitCode::SUCCESS;
        }
        _ => return usage(),
    };
    let report = match result {
        Ok(r) => r,
        Err(msg) => {
            eprintln!("FAIL: {msg}");
            return ExitCode::FAILURE;
        }
    };
    report.print();
    if let Some(path) = json {
        if let Err(e) = report.write_json(&path) {
            eprintln!("FAIL: {e}");
            return ExitCode::FAILURE;
        }
        println!("(figures written to {path})");
    }
    ExitCode::SUCCESS
}

fn exit(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("FAIL: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: dynamo-compare [--fleet <instances> | --mixed] [--json <path>]\n       \
         dynamo-compare --trace [options, see README]\n       \
         dynamo-compare --profile {}\n       \
         dynamo-compare --rss-child ours|crtc|pool4|positional [<instances>]",
        profile::WAYS.join("|")
    );
    ExitCode::from(2)
}

/// One line describing the workload; also kept as notes of the report.
pub fn describe(w: &Workload, generated: std::time::Duration, report: &mut Report) {
    let events: usize = w.batches.iter().map(|b| b.events.len()).sum();
    let removes = w
        .batches
        .iter()
        .flat_map(|b| &b.events)
        .filter(|e| matches!(e, Event::Remove { .. }))
        .count();
    println!(
        "workload: {} holders ({} instances x {} ranks), {} prompts, {} publisher batches, \
         {events} events ({removes} removes), {} block ops, {} live (block, holder) pairs, \
         {} queries of {} tokens (generated in {:.1?})",
        w.holders(),
        w.shape.instances,
        workload::RANKS,
        w.prompts.len(),
        w.batches.len(),
        w.block_ops,
        w.live_pairs,
        w.queries.len(),
        workload::QUERY_TOKENS,
        generated
    );
    report.note("instances", w.shape.instances);
    report.note("holders", w.holders());
    report.note("prompts_per_holder", w.shape.prompts_per_holder);
    report.note("events", events);
    report.note("block_ops", w.block_ops);
    report.note("live_pairs", w.live_pairs);
    report.note("queries", w.queries.len());
}

/// The figures of one way, from a latency run.
pub fn stats(lat: &[(Way, WayStats)], way: Way) -> WayStats {
    lat.iter()
        .find(|(w, _)| *w == way)
        .map(|&(_, s)| s)
        .unwrap_or_default()
}

/// The query rows shared by the default and fleet modes: `ours(way)` gives our figures of a
/// way, `dynamo(i, by_keys)` those of `Kind::ALL[i]`; `rounds` is the number of timed rounds.
pub fn query_rows(
    report: &mut Report,
    rounds: usize,
    ours: impl Fn(Way) -> WayStats,
    dynamo: impl Fn(usize, bool) -> WayStats,
) {
    type Pick = fn(&WayStats) -> f64;
    let (best50, best99) = (
        format!("best of {rounds}, p50 us"),
        format!("best of {rounds}, p99 us"),
    );
    let picks: [(&str, Pick); 4] = [
        ("p50 us", |s| s.all.0),
        ("p99 us", |s| s.all.1),
        (&best50, |s| s.best.0),
        (&best99, |s| s.best.1),
    ];
    let sets: [(&str, Way, bool, usize); 3] = [
        (
            "query from tokens, service call (fresh + gRPC encoding)",
            Way::OursService,
            false,
            4,
        ),
        (
            "query from tokens, reused answer (no encoding)",
            Way::OursTokens,
            false,
            2,
        ),
        ("query by keys, reused answer", Way::OursKeys, true, 4),
    ];
    for (name, way, by_keys, n) in sets {
        for (what, pick) in &picks[..n] {
            let d: [f64; 3] = std::array::from_fn(|i| pick(&dynamo(i, by_keys)));
            report.row(
                &format!("{name}, {what}"),
                Better::Lower,
                1,
                pick(&ours(way)),
                d,
            );
        }
    }
    let d: [f64; 3] = std::array::from_fn(|i| dynamo(i, false).deep);
    report.row(
        &format!("query from tokens, service call, {DEEP}+ blocks matched, p50 us"),
        Better::Lower,
        1,
        ours(Way::OursService).deep,
        d,
    );
}

/// The default mode: every index built in this process, checked, then timed in alternating
/// passes; the 1M-token query; memory in child processes.
fn run_default() -> Result<Report, String> {
    let mut report = Report::new("default");
    let t = Instant::now();
    let w = workload::generate(SEED, Shape::DEFAULT);
    describe(&w, t.elapsed(), &mut report);

    let mut ours = ours::Ours::new(w.holders());
    let batches = ours_batches(&ours, &w);
    let ours_apply = apply_ours(&mut ours, &batches);
    drop(batches);
    if ours.pairs() != w.live_pairs {
        return Err(format!(
            "our index holds {} (block, holder) pairs, the workload leaves {}",
            ours.pairs(),
            w.live_pairs
        ));
    }
    let mut indexes = Vec::new();
    let mut applied = Vec::new();
    for kind in Kind::ALL {
        let index = DynamoIndex::new(kind);
        let events = dynamo_events(&w);
        applied.push(apply_dynamo(&index, events));
        indexes.push(index);
    }
    let refs: Vec<&DynamoIndex> = indexes.iter().collect();
    let summary = check::check(&w, Some(&ours), &refs)?;
    println!(
        "{}",
        summary.line("ours (3 ways) and every Dynamo indexer (2 ways each)")
    );
    println!(
        "service answer: {:.0} bytes encoded on average ({} instances listed per answer)",
        summary.reply_bytes, w.shape.instances
    );
    report.note("mean_reply_bytes", format!("{:.0}", summary.reply_bytes));

    let lat = latencies(&w, Some(&ours), &refs, &summary.depths, QUERY_ROUNDS);
    drop(refs);
    drop(indexes);
    drop(ours);
    let long = long::long_query()?;

    let ops = w.block_ops as f64;
    let per_s = |a: &build::Applied| ops / a.wall.as_secs_f64() / 1e6;
    let per_cpu = |a: &build::Applied| ops / a.cpu / 1e6;
    let d: [f64; 3] = std::array::from_fn(|i| per_s(&applied[i]));
    report.row(
        "apply, M block ops/s",
        Better::Higher,
        2,
        per_s(&ours_apply),
        d,
    );
    let d: [f64; 3] = std::array::from_fn(|i| per_cpu(&applied[i]));
    report.row(
        "apply, M block ops per CPU-second",
        Better::Higher,
        2,
        per_cpu(&ours_apply),
        d,
    );
    query_rows(
        &mut report,
        QUERY_ROUNDS,
        |way| stats(&lat, way),
        |i, by_keys| {
            stats(
                &lat,
                if by_keys {
                    Way::DynamoKeys(i)
                } else {
                    Way::DynamoTokens(i)
                },
            )
        },
    );
    report.row(
        "query from 1M tokens, full hit, p50 ms",
        Better::Lower,
        2,
        long.from_tokens.0 * 1e3,
        long.from_tokens.1.map(|s| s * 1e3),
    );
    report.row(
        "query by keys, 1M tokens, full hit, p50 ms",
        Better::Lower,
        2,
        long.by_keys.0 * 1e3,
        long.by_keys.1.map(|s| s * 1e3),
    );
    memory::rss_rows(&mut report, None)?;
    let walls: Vec<String> = std::iter::once(("ours", ours_apply))
        .chain(Kind::ALL.into_iter().map(|k| k.name()).zip(applied))
        .map(|(n, a)| format!("{n} {:.2?}", a.wall))
        .collect();
    println!(
        "(apply of {} block ops: {}; latency over {} queries x {QUERY_ROUNDS} rounds)",
        w.block_ops,
        walls.join(", "),
        w.queries.len()
    );
    Ok(report)
}
