//! `--trace`: Mooncake's conversation trace replayed in process against our index and three of
//! Dynamo's, with the methodology of Dynamo's `mooncake_bench` (see README, "Trace").
//!
//! Per fleet size: the lockstep replay (`trace_prep`) checks every answer and makes the
//! schedule; then, per index and per speed, a fresh index gets the schedule replayed against
//! the clock. Each request is due at its trace arrival divided by the speed: its query is
//! walked on this thread at that moment (late if the thread is behind), then its events are
//! handed to the index's writer(s) without waiting. The run ends when every event is applied;
//! achieved rates count that drain.

use std::time::{Duration, Instant};

use serde_json::{Value as Json, json};

use crate::trace_index::{Crtc, KINDS, Ours, Pool, Side};
use crate::trace_prep::{Check, Prep, Step, lockstep, prepare};
use crate::trace_sim::{Request, Trace, percentile};

/// The trace kept in the repository.
const TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../traces/conversation_trace.jsonl"
);

struct Options {
    trace: String,
    requests: usize,
    engines: Vec<usize>,
    capacity: usize,
    speeds: Vec<f64>,
    keep_up: f64,
    indexers: Vec<String>,
    find_max: bool,
    max_speed: f64,
    json: Option<String>,
}

fn options(args: &[String]) -> Result<Options, String> {
    let get = |name: &str| {
        let flag = format!("--{name}");
        args.iter()
            .position(|a| *a == flag)
            .map(|i| {
                args.get(i + 1)
                    .cloned()
                    .ok_or(format!("{flag} needs a value"))
            })
            .transpose()
    };
    let list = |v: String| -> Result<Vec<f64>, String> {
        v.split(',')
            .map(|s| s.trim().parse::<f64>().map_err(|e| format!("{s}: {e}")))
            .collect()
    };
    let num = |name: &str, default: f64| -> Result<f64, String> {
        get(name)?.map_or(Ok(default), |v| {
            v.parse().map_err(|e| format!("--{name}: {e}"))
        })
    };
    let indexers: Vec<String> = get("indexers")?
        .map_or(KINDS.join(","), |v| v)
        .split(',')
        .map(|s| s.trim().to_owned())
        .collect();
    if let Some(bad) = indexers.iter().find(|i| !KINDS.contains(&i.as_str())) {
        return Err(format!(
            "--indexers: unknown {bad} (known: {})",
            KINDS.join(",")
        ));
    }
    Ok(Options {
        trace: get("trace")?.unwrap_or_else(|| TRACE.to_owned()),
        requests: num("requests", 2000.0)? as usize,
        engines: list(get("engines")?.unwrap_or_else(|| "16,64,128".into()))?
            .into_iter()
            .map(|e| e as usize)
            .collect(),
        capacity: num("capacity", 16384.0)? as usize,
        speeds: list(get("speeds")?.unwrap_or_else(|| "200,1000,5000".into()))?,
        keep_up: num("keep-up", 1.10)?,
        indexers,
        find_max: get("find-max")?.is_some_and(|v| v == "true"),
        max_speed: num("max-speed", 100_000.0)?,
        json: get("json")?,
    })
}

pub fn main(args: &[String]) -> Result<(), String> {
    let o = options(args)?;
    let requests = Trace::read(
        std::path::Path::new(&o.trace),
        Some(o.requests).filter(|&n| n > 0),
    );
    let span_s =
        (requests.last().map_or(0, |r| r.arrival_ms) - requests[0].arrival_ms) as f64 / 1e3;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "trace: {} requests over {span_s:.0} s of trace; engines of {} blocks; queries by keys \
         computed ahead; kept up: every event applied within {:.2} x the replay window; {cpus} CPUs",
        requests.len(),
        o.capacity,
        o.keep_up
    );
    let t = Instant::now();
    let prep = prepare(&requests);
    println!("prompts hashed for every index in {:.1?}", t.elapsed());
    let mut fleets = Vec::new();
    let mut all_identical = true;
    for &engines in &o.engines {
        let t = Instant::now();
        let (steps, check) = lockstep(&requests, &prep, engines, o.capacity);
        all_identical &= check.wrong.iter().all(|&w| w == 0);
        fleets.push(fleet(
            &o,
            &requests,
            &prep,
            engines,
            &steps,
            &check,
            t.elapsed(),
        ));
    }
    if let Some(path) = &o.json {
        let report = json!({
            "benchmark": "dynamo-compare --trace",
            "trace": {"requests": requests.len(), "span_s": span_s},
            "capacity_blocks": o.capacity,
            "keep_up_factor": o.keep_up,
            "query": "by keys computed ahead (ours: derived keys; Dynamo: local block hashes)",
            "cpus": cpus,
            "fleets": fleets,
        });
        let text = serde_json::to_string_pretty(&report).expect("JSON");
        std::fs::write(path, text).map_err(|e| format!("write {path}: {e}"))?;
        println!("\nreport written to {path}");
    }
    if all_identical {
        Ok(())
    } else {
        Err("some answers differed from the truth (see the check lines)".into())
    }
}

/// Operation totals of a schedule, counted as Dynamo's benchmark does.
#[derive(Default, Clone, Copy)]
struct Totals {
    requests: u64,
    stored: u64,
    removed: u64,
    request_blocks: u64,
    stored_blocks: u64,
}

impl Totals {
    fn of(steps: &[Step], prep: &Prep) -> Totals {
        let mut t = Totals::default();
        for s in steps {
            t.requests += 1;
            t.request_blocks += prep.prompts[s.prompt].published.len() as u64;
            t.removed += s.removed.len() as u64;
            t.stored += u64::from(s.stored.is_some());
            t.stored_blocks += s.stored_blocks() as u64;
        }
        t
    }
    /// Request + Stored + Removed (+ Cleared, none here).
    fn ops(&self) -> u64 {
        self.requests + self.stored + self.removed
    }
    /// Request hashes + stored hashes + removed hashes.
    fn block_ops(&self) -> u64 {
        self.request_blocks + self.stored_blocks + self.removed
    }
}

fn fleet(
    o: &Options,
    requests: &[Request],
    prep: &Prep,
    engines: usize,
    steps: &[Step],
    check: &Check,
    lockstep_time: Duration,
) -> Json {
    let totals = Totals::of(steps, prep);
    println!(
        "\n{engines} engines: {} ops ({} requests, {} stored and {} removed events), {} block ops; \
         kv-aware hit rate {:.4} (lockstep replay {:.1?})",
        totals.ops(),
        totals.requests,
        totals.stored,
        totals.removed,
        totals.block_ops(),
        check.hits.rate(),
        lockstep_time
    );
    println!(
        "check: {} queries, each index's answer for every engine against the truth: {}; \
         {} with a hit, {} of them partial",
        check.queries,
        (KINDS.iter().zip(check.wrong))
            .map(|(k, w)| format!("{k} {} wrong", w))
            .collect::<Vec<_>>()
            .join(", "),
        check.with_hit,
        check.partial
    );
    check
        .examples
        .iter()
        .for_each(|e| println!("  differs: {e}"));
    println!(
        "\n{:<12}{:>8}{:>9}{:>9}{:>9}{:>9}{:>10}{:>11}{:>12}{:>9}{:>9}{:>8}{:>6}",
        "index",
        "speed",
        "window s",
        "wall s",
        "drain ms",
        "late99ms",
        "ops/s",
        "offered/s",
        "blk ops/s",
        "q p50us",
        "q p99us",
        "stale%",
        "kept"
    );
    let mut indexers = Vec::new();
    for kind in &o.indexers {
        let mut runs = Vec::new();
        let mut kept = Vec::new();
        for &speed in &o.speeds {
            let r = run(kind, engines, steps, prep, speed, o.keep_up, totals);
            kept.push((speed, r["kept_up"].as_bool() == Some(true)));
            runs.push(r);
        }
        if o.find_max {
            // Double from the highest speed kept up until a run falls behind.
            let mut speed = kept.iter().filter(|k| k.1).map(|k| k.0).reduce(f64::max);
            while let Some(s) = speed.map(|s| s * 2.0).filter(|&s| s <= o.max_speed) {
                if kept.iter().any(|k| k.0 == s) {
                    break;
                }
                let r = run(kind, engines, steps, prep, s, o.keep_up, totals);
                let ok = r["kept_up"].as_bool() == Some(true);
                kept.push((s, ok));
                runs.push(r);
                speed = ok.then_some(s);
            }
        }
        let best = kept.iter().filter(|k| k.1).map(|k| k.0).reduce(f64::max);
        let lowest_not = (kept.iter())
            .filter(|k| !k.1 && best.is_none_or(|b| k.0 > b))
            .map(|k| k.0)
            .reduce(f64::min);
        indexers.push(json!({
            "name": kind, "runs": runs, "max_speed_kept_up": best,
            "lowest_speed_not_kept_up": lowest_not,
        }));
    }
    let wrong: serde_json::Map<String, Json> = (KINDS.iter().zip(check.wrong))
        .map(|(k, w)| ((*k).to_owned(), json!(w)))
        .collect();
    json!({
        "engines": engines,
        "requests": requests.len(),
        "hit_rate_kv_aware": check.hits.rate(),
        "totals": {
            "ops": totals.ops(), "block_ops": totals.block_ops(), "requests": totals.requests,
            "stored_events": totals.stored, "removed_events": totals.removed,
            "request_blocks": totals.request_blocks, "stored_blocks": totals.stored_blocks,
            "removed_blocks": totals.removed,
        },
        "check": {
            "queries": check.queries, "with_hit": check.with_hit, "partial": check.partial,
            "wrong_answers": wrong, "examples": check.examples,
        },
        "indexers": indexers,
    })
}

fn run(
    kind: &str,
    engines: usize,
    steps: &[Step],
    prep: &Prep,
    speed: f64,
    keep_up: f64,
    totals: Totals,
) -> Json {
    let r = match kind {
        "ours" => timed(Ours::new(engines), steps, prep, speed),
        "crtc" => timed(Crtc::new(engines), steps, prep, speed),
        "crtc-pool4" => timed(Pool::crtc(engines), steps, prep, speed),
        _ => timed(Pool::positional(engines), steps, prep, speed),
    };
    report(kind, speed, keep_up, totals, r)
}

/// What one timed replay measured.
struct Timed {
    window: Duration,
    /// From the first due time to the last event applied.
    wall: Duration,
    /// From the first due time to the last operation issued.
    issue: Duration,
    lateness: Vec<Duration>,
    query: Vec<Duration>,
    /// Answers whose count for the chosen engine was not its true prefix (its events still
    /// queued): stale, as a router would see under load.
    stale: usize,
}

fn timed<S: Side>(mut side: S, steps: &[Step], prep: &Prep, speed: f64) -> Timed {
    // Outside timing: every message in the index's own form, and a few lookups to warm up.
    let payloads: Vec<S::Payload> = steps.iter().map(|s| side.payload(s, prep)).collect();
    for s in steps.iter().take(64) {
        side.query(prep, s.prompt);
    }
    let first = steps[0].arrival_ms;
    let due_at = |ms: u64| Duration::from_secs_f64((ms - first) as f64 / 1e3 / speed);
    let mut r = Timed {
        window: due_at(steps.last().expect("steps").arrival_ms),
        wall: Duration::ZERO,
        issue: Duration::ZERO,
        lateness: Vec::with_capacity(steps.len()),
        query: Vec::with_capacity(steps.len()),
        stale: 0,
    };
    let start = Instant::now();
    for (step, payload) in steps.iter().zip(payloads) {
        let due = start + due_at(step.arrival_ms);
        // Sleep, no spin: on a small machine a spinning issuer takes the writers' cores.
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        let began = Instant::now();
        r.lateness.push(began.saturating_duration_since(due));
        side.query(prep, step.prompt);
        r.query.push(began.elapsed());
        r.stale += usize::from(side.matched(step.engine) != step.hit);
        side.send(payload);
    }
    r.issue = start.elapsed();
    side.flush();
    r.wall = start.elapsed();
    drop(side);
    r
}

fn report(kind: &str, speed: f64, keep_up: f64, t: Totals, mut r: Timed) -> Json {
    r.lateness.sort_unstable();
    r.query.sort_unstable();
    let window = r.window.as_secs_f64().max(1e-9);
    let wall = r.wall.as_secs_f64().max(1e-9);
    let kept_up = wall <= keep_up * window;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let us = |p: f64| percentile(&r.query, p).as_secs_f64() * 1e6;
    let late = |p: f64| ms(percentile(&r.lateness, p));
    let drain = r.wall.saturating_sub(r.issue);
    let (ops, blocks) = (t.ops() as f64, t.block_ops() as f64);
    println!(
        "{kind:<12}{speed:>8}{window:>9.2}{wall:>9.2}{:>9.1}{:>9.1}{:>10.0}{:>11.0}{:>12.0}{:>9.1}{:>9.1}{:>8.1}{:>6}",
        ms(drain),
        late(0.99),
        ops / wall,
        ops / window,
        blocks / wall,
        us(0.5),
        us(0.99),
        100.0 * r.stale as f64 / r.query.len().max(1) as f64,
        if kept_up { "yes" } else { "no" }
    );
    json!({
        "speed": speed, "window_s": window, "wall_s": wall, "issue_s": r.issue.as_secs_f64(),
        "drain_ms": ms(drain), "kept_up": kept_up,
        "issued_within_1pct": r.issue.as_secs_f64() <= 1.01 * window,
        "offered_ops_per_s": ops / window, "achieved_ops_per_s": ops / wall,
        "offered_block_ops_per_s": blocks / window, "achieved_block_ops_per_s": blocks / wall,
        "query_us": {
            "p50": us(0.5), "p99": us(0.99), "p999": us(0.999), "max": us(1.0),
            "count": r.query.len(),
        },
        "issue_lateness_ms": {"p50": late(0.5), "p99": late(0.99), "max": late(1.0)},
        "stale_answers": r.stale,
    })
}
