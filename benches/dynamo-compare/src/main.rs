//! Side-by-side benchmark of mooncake-conductor's context index and NVIDIA Dynamo's
//! `ConcurrentRadixTreeCompressed`, in one process, on one deterministic workload (see README).
//!
//! Layout: `workload` generates prompts, engine events and queries; `ours` and `dynamo` adapt
//! them to each index; `latency` times the queries; this file checks that both answer the same
//! and prints the figures.
//! `--rss-child ours|dynamo` is the memory measurement, run by the parent in a fresh process.
//! `--profile <way>` runs one way of asking alone, for a profiler (see README, "Profiling").

mod dynamo;
mod latency;
mod measure;
mod ours;
mod trace;
mod trace_index;
mod trace_prep;
#[path = "../../trace_sim/mod.rs"]
mod trace_sim;
mod workload;

use std::hint::black_box;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use latency::{DEEP, latencies, timed};
use measure::{percentiles, proc_status_bytes};
use mooncake_conductor::index::QueryHits;
use workload::{BLOCK_SIZE, Event, PublisherBatch, Workload};

const SEED: u64 = 0x5eed_2026;
/// Timed passes over the query set (after one untimed warm-up pass).
const QUERY_ROUNDS: usize = 3;
const LONG_TOKENS: usize = 1_000_000;
const LONG_RUNS: usize = 10;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        None => run(),
        Some("--rss-child") => match args.get(2).map(String::as_str) {
            Some(side @ ("ours" | "dynamo")) => {
                rss_child(side);
                ExitCode::SUCCESS
            }
            _ => usage(),
        },
        Some("--profile") => match args.get(2).map(String::as_str) {
            Some(
                way @ ("keys" | "tokens" | "dynamo-keys" | "dynamo-tokens" | "apply" | "apply-budget" | "long-keys"
                | "long-tokens"),
            ) => {
                profile(way);
                ExitCode::SUCCESS
            }
            _ => usage(),
        },
        Some("--trace") => match trace::main(&args[2..]) {
            Ok(()) => ExitCode::SUCCESS,
            Err(msg) => {
                eprintln!("FAIL: {msg}");
                ExitCode::FAILURE
            }
        },
        Some(_) => usage(),
    }
}

/// The apply with a memory budget set but never reached beside the apply without one: builds
/// alternated (`BUILDS`, default 5, each), thread CPU time, fastest and median of each.
fn apply_budget(batches: &[ours::Batch]) {
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
                ours::Ours::with_budget(1 << 40, 1 << 30)
            } else {
                ours::Ours::new()
            };
            let cpu = thread_cpu_secs();
            batches.iter().for_each(|b| fresh.apply(b));
            let secs = thread_cpu_secs() - cpu;
            evicted += fresh.evicted();
            black_box(fresh.pairs());
            if with_budget { &mut bounded } else { &mut plain }.push(secs);
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
fn profile(way: &str) {
    if way == "long-keys" || way == "long-tokens" {
        // Ours only, built once, then the 1M-token query many times.
        let (tokens, batch) = long_prompt();
        let mut ours = ours::Ours::new();
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
    let w = workload::generate(SEED);
    let mut ours = ours::Ours::new();
    let prompts: Vec<_> = w.prompts.iter().map(|p| ours.prompt(&p.tokens)).collect();
    let batches: Vec<_> = w.batches.iter().map(|b| ours.batch(b, &prompts)).collect();
    if way == "apply-budget" {
        apply_budget(&batches);
        return;
    }
    if way == "apply" {
        // Each build timed on its own, so that A/B runs can compare the fastest of five; the
        // thread's CPU time too, which leaves out time slices other processes took.
        let mut times: Vec<(f64, f64)> = (0..5)
            .map(|_| {
                let mut fresh = ours::Ours::new();
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
    let dynamo = dynamo::Dynamo::new(None);
    if way.starts_with("dynamo") {
        let dyn_prompts: Vec<_> = w
            .prompts
            .iter()
            .map(|p| dynamo::prompt(&p.tokens))
            .collect();
        let mut builder = dynamo::EventBuilder::new();
        for b in &w.batches {
            builder
                .events(b, &dyn_prompts)
                .into_iter()
                .for_each(|ev| dynamo.send(ev));
        }
        dynamo.flush();
    }
    let mut w = w;
    if std::env::var_os("PROFILE_DEEP").is_some() {
        // Only the queries some holder matches to block 96 or further: the long walks that
        // make the latency tail.
        let deep =
            |q: &Vec<u32>| ours::overlap(&ours.query_tokens(q)).into_iter().max() >= Some(DEEP);
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

/// CPU time every thread of this process ran so far (live threads only: Dynamo's worker
/// lives until its index is dropped), from `/proc/self/task/*/schedstat`.
fn process_cpu_secs() -> f64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0.0;
    };
    let ns: u64 = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    ns as f64 * 1e-9
}

/// CPU time this thread ran, from `/proc/thread-self/schedstat` (0 where there is none).
fn thread_cpu_secs() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 * 1e-9)
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: dynamo-compare [--rss-child ours|dynamo | --profile keys|tokens|dynamo-keys|dynamo-tokens|apply|apply-budget|long-keys|long-tokens]"
    );
    ExitCode::from(2)
}

fn run() -> ExitCode {
    let t = Instant::now();
    let w = workload::generate(SEED);
    let events: usize = w.batches.iter().map(|b| b.events.len()).sum();
    let removes: usize = w
        .batches
        .iter()
        .flat_map(|b| &b.events)
        .filter(|e| matches!(e, Event::Remove { .. }))
        .count();
    println!(
        "workload: {} holders ({} instances x {} ranks), {} prompts, {} publisher batches, \
         {events} events ({removes} removes), {} block ops, {} live (block, holder) pairs, \
         {} queries of {} tokens (generated in {:.1?})",
        workload::HOLDERS,
        workload::INSTANCES,
        workload::RANKS,
        w.prompts.len(),
        w.batches.len(),
        w.block_ops,
        w.live_pairs,
        w.queries.len(),
        workload::QUERY_TOKENS,
        t.elapsed()
    );

    // Ours: keys and batches prepared untimed, then one writer applies every batch.
    let mut ours = ours::Ours::new();
    let ours_prompts: Vec<ours::PromptKeys> =
        w.prompts.iter().map(|p| ours.prompt(&p.tokens)).collect();
    let ours_batches: Vec<ours::Batch> = w
        .batches
        .iter()
        .map(|b| ours.batch(b, &ours_prompts))
        .collect();
    let (t, cpu) = (Instant::now(), process_cpu_secs());
    for b in &ours_batches {
        ours.apply(b);
    }
    let ours_apply = t.elapsed();
    let ours_apply_cpu = process_cpu_secs() - cpu;
    drop(ours_batches);
    if ours.pairs() != w.live_pairs {
        eprintln!(
            "FAIL: our index holds {} (block, holder) pairs, the workload leaves {}",
            ours.pairs(),
            w.live_pairs
        );
        return ExitCode::FAILURE;
    }

    // Dynamo: events prepared untimed, then sent to its worker loop; timed until it has
    // applied the last one.
    let dynamo = dynamo::Dynamo::new(None);
    let dyn_prompts: Vec<dynamo::PromptKeys> = w
        .prompts
        .iter()
        .map(|p| dynamo::prompt(&p.tokens))
        .collect();
    let mut builder = dynamo::EventBuilder::new();
    let dyn_events: Vec<_> = w
        .batches
        .iter()
        .flat_map(|b| builder.events(b, &dyn_prompts))
        .collect();
    let (t, cpu) = (Instant::now(), process_cpu_secs());
    for ev in dyn_events {
        dynamo.send(ev);
    }
    dynamo.flush();
    let dyn_apply = t.elapsed();
    let dyn_apply_cpu = process_cpu_secs() - cpu;

    let depths = match check(&w, &ours, &dynamo) {
        Ok(d) => d,
        Err(msg) => {
            eprintln!("FAIL: {msg}");
            return ExitCode::FAILURE;
        }
    };

    let lat = latencies(&w, &ours, &dynamo, &depths);
    let long = match long_query() {
        Ok(l) => l,
        Err(msg) => {
            eprintln!("FAIL: {msg}");
            return ExitCode::FAILURE;
        }
    };
    let mem_ours = spawn_rss_child("ours");
    let mem_dyn = spawn_rss_child("dynamo");

    let ops = w.block_ops as f64;
    let rate = |d: Duration| ops / d.as_secs_f64();
    println!();
    println!(
        "{:<52} {:>14} {:>14} {:>12}",
        "figure", "ours", "dynamo", "ours/dynamo"
    );
    row(
        "apply, M block ops/s (higher is better)",
        rate(ours_apply) / 1e6,
        rate(dyn_apply) / 1e6,
        2,
    );
    // The same per CPU-second of the process (every thread: Dynamo's worker and sender), which
    // leaves out the time slices other processes of a loaded machine take.
    row(
        "apply, M block ops per CPU-second",
        ops / ours_apply_cpu / 1e6,
        ops / dyn_apply_cpu / 1e6,
        2,
    );
    for (way, name) in ["query by keys", "query from 2,048 tokens"]
        .iter()
        .enumerate()
    {
        let [o, d] = lat.all[way];
        row(&format!("{name}, p50 us"), o.0, d.0, 1);
        row(&format!("{name}, p99 us"), o.1, d.1, 1);
        let [o, d] = lat.best[way];
        row(
            &format!("{name}, best of {QUERY_ROUNDS}, p50 us"),
            o.0,
            d.0,
            1,
        );
        row(
            &format!("{name}, best of {QUERY_ROUNDS}, p99 us"),
            o.1,
            d.1,
            1,
        );
    }
    row(
        &format!("query from 2,048 tokens, {DEEP}+ blocks matched, p50 us"),
        lat.deep_tokens[0],
        lat.deep_tokens[1],
        1,
    );
    row(
        "query from 1M tokens, full hit, p50 ms",
        long.from_tokens.0 * 1e3,
        long.from_tokens.1 * 1e3,
        2,
    );
    row(
        "query by keys, 1M tokens, full hit, p50 ms",
        long.by_keys.0 * 1e3,
        long.by_keys.1 * 1e3,
        2,
    );
    match (mem_ours, mem_dyn) {
        (Ok(o), Ok(d)) => {
            row("RSS after build, B per (block, holder)", o.0, d.0, 1);
            row("peak RSS during build, B per pair", o.1, d.1, 1);
        }
        (o, d) => {
            eprintln!("FAIL: memory measurement: ours {o:?}, dynamo {d:?}");
            return ExitCode::FAILURE;
        }
    }
    println!(
        "(apply: {} block ops, ours {:.2?}, dynamo {:.2?}; latency over {} queries x {} rounds)",
        w.block_ops,
        ours_apply,
        dyn_apply,
        w.queries.len(),
        QUERY_ROUNDS
    );
    ExitCode::SUCCESS
}

fn row(name: &str, ours: f64, dynamo: f64, decimals: usize) {
    println!(
        "{name:<52} {ours:>14.decimals$} {dynamo:>14.decimals$} {:>12.2}",
        ours / dynamo
    );
}

/// Every query, asked four ways (each index by keys and from tokens): the per-holder matched
/// blocks must agree exactly.
fn check(w: &Workload, ours: &ours::Ours, dynamo: &dynamo::Dynamo) -> Result<Vec<u32>, String> {
    let mut mismatches = Vec::new();
    let mut depths = Vec::with_capacity(w.queries.len());
    let (mut any_hit, mut partial, mut total_blocks) = (0usize, 0usize, 0u64);
    for (q, tokens) in w.queries.iter().enumerate() {
        let a = ours::overlap(&ours.query(&mut ours.query_keys(tokens)));
        let b = ours::overlap(&ours.query_tokens(tokens));
        let c = dynamo::overlap(&dynamo.find_matches(&dynamo::local_hashes(tokens)));
        let d = dynamo::overlap(&dynamo.query_tokens(tokens));
        if a != b || a != c || a != d {
            mismatches.push(q);
            if mismatches.len() <= 3 {
                let diff: Vec<String> = (0..a.len())
                    .filter(|&h| a[h] != c[h] || a[h] != b[h] || c[h] != d[h])
                    .take(5)
                    .map(|h| {
                        format!(
                            "holder {h}: ours {}/{} dynamo {}/{}",
                            a[h], b[h], c[h], d[h]
                        )
                    })
                    .collect();
                eprintln!("query {q} differs: {}", diff.join("; "));
            }
        }
        let max = a.iter().copied().max().unwrap_or(0);
        depths.push(max);
        any_hit += usize::from(max > 0);
        partial += usize::from(max > 0 && max < (workload::QUERY_TOKENS / BLOCK_SIZE) as u32);
        total_blocks += a.iter().map(|&x| u64::from(x)).sum::<u64>();
    }
    if !mismatches.is_empty() {
        return Err(format!(
            "{} of {} queries answer differently",
            mismatches.len(),
            w.queries.len()
        ));
    }
    println!(
        "check: {} queries, per-holder overlap identical in both indexes \
         ({any_hit} with a hit, {partial} of them partial; {total_blocks} matched \
         (block, holder) pairs in all)",
        w.queries.len()
    );
    Ok(depths)
}

/// p50 seconds, (ours, dynamo).
struct LongQuery {
    from_tokens: (f64, f64),
    by_keys: (f64, f64),
}

/// The 1M-token prompt and the one publisher message of 16-block store events that stores it.
fn long_prompt() -> (Vec<u32>, PublisherBatch) {
    let mut rng = workload::Rng::new(SEED ^ 0x1_000_000);
    let tokens = rng.tokens(LONG_TOKENS);
    let n = LONG_TOKENS / BLOCK_SIZE;
    let batch = PublisherBatch {
        holder: 0,
        events: (0..n)
            .step_by(16)
            .map(|s| Event::Store {
                prompt: 0,
                start: s as u32,
                end: (s + 16).min(n) as u32,
            })
            .collect(),
    };
    (tokens, batch)
}

/// A 1M-token prompt stored by one holder, queried end to end from its tokens (keys + walk) in
/// both indexes, and by precomputed keys (the walk alone).
fn long_query() -> Result<LongQuery, String> {
    let (tokens, batch) = long_prompt();
    let n = LONG_TOKENS / BLOCK_SIZE;

    let mut ours = ours::Ours::new();
    let keys = [ours.prompt(&tokens)];
    ours.apply(&ours.batch(&batch, &keys));
    let dynamo = dynamo::Dynamo::new(None);
    let keys = [dynamo::prompt(&tokens)];
    for ev in dynamo::EventBuilder::new().events(&batch, &keys) {
        dynamo.send(ev);
    }
    dynamo.flush();

    let mut ours_keys = ours.query_keys(&tokens);
    let dyn_keys = dynamo::local_hashes(&tokens);
    let mut s: [Vec<Duration>; 4] = Default::default();
    for _ in 0..LONG_RUNS {
        let t = Instant::now();
        let hits = ours.query_tokens(&tokens);
        s[0].push(t.elapsed());
        let got = ours::device_tokens(&hits, 0);
        if got != LONG_TOKENS as u64 {
            return Err(format!("1M-token query: ours matched {got} tokens"));
        }
        let t = Instant::now();
        let scores = dynamo.query_tokens(&tokens);
        s[1].push(t.elapsed());
        let got = dynamo::overlap(&scores)[0] as usize;
        if got != n {
            return Err(format!(
                "1M-token query: dynamo matched {got} of {n} blocks"
            ));
        }
        s[2].push(timed(|| ours.query(&mut ours_keys)));
        s[3].push(timed(|| dynamo.find_matches(&dyn_keys)));
    }
    let [o, d, ok, dk] = s.map(|mut v| percentiles(&mut v).0.as_secs_f64());
    Ok(LongQuery {
        from_tokens: (o, d),
        by_keys: (ok, dk),
    })
}

/// Run this binary as `--rss-child <side>` and read back (bytes per pair after the build, peak
/// bytes per pair during it).
fn spawn_rss_child(side: &str) -> Result<(f64, f64), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .args(["--rss-child", side])
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "{side} child failed ({}): {text} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let f: Vec<f64> = text
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    match f.as_slice() {
        [pairs, rss, hwm, base] => {
            println!(
                "memory ({side}, own process): baseline {:.1} MiB, +{:.1} MiB after build, \
                 peak +{:.1} MiB, {pairs} pairs",
                base / 1048576.0,
                rss / 1048576.0,
                hwm / 1048576.0
            );
            Ok((rss / pairs, hwm / pairs))
        }
        _ => Err(format!("{side} child printed {text:?}")),
    }
}

/// The memory measurement: build one index from the workload, generating each batch just
/// before it is applied so the input never sits in memory whole, and print `pairs, RSS growth,
/// peak growth, baseline` in bytes. The baseline is taken after the workload and its keys exist.
fn rss_child(side: &str) {
    let w = workload::generate(SEED);
    if side == "ours" {
        let mut ours = ours::Ours::new();
        let prompts: Vec<_> = w.prompts.iter().map(|p| ours.prompt(&p.tokens)).collect();
        let base = proc_status_bytes("VmRSS");
        for b in &w.batches {
            let batch = ours.batch(b, &prompts);
            ours.apply(&batch);
        }
        report(w.live_pairs, base);
        assert_eq!(ours.pairs(), w.live_pairs, "our index lost pairs");
        black_box(&ours);
    } else {
        // A bounded queue: events wait in the channel only briefly, so its size stays small.
        let dynamo = dynamo::Dynamo::new(Some(1024));
        let prompts: Vec<_> = w
            .prompts
            .iter()
            .map(|p| dynamo::prompt(&p.tokens))
            .collect();
        let mut builder = dynamo::EventBuilder::new();
        let base = proc_status_bytes("VmRSS");
        for b in &w.batches {
            for ev in builder.events(b, &prompts) {
                dynamo.send(ev);
            }
        }
        dynamo.flush();
        // Read before the worker thread ends: its per-worker lookups are part of the index.
        report(w.live_pairs, base);
        black_box(&dynamo);
    }
}

fn report(pairs: u64, base: u64) {
    let rss = proc_status_bytes("VmRSS");
    let hwm = proc_status_bytes("VmHWM");
    println!(
        "{pairs} {} {} {base}",
        rss.saturating_sub(base),
        hwm.saturating_sub(base)
    );
}
