//! `--mode trace`: Mooncake's conversation trace replayed through the service (see
//! `trace_run`), at one or more speeds, or searching for the highest speed it keeps up with.
//!
//! A run *keeps up* when, over the whole run: the p99 of the apply lag (publish of a batch to
//! the service having applied it) and the p99 of the issue lateness (a request asked later than
//! its schedule) are both within `--max-lag-ms`, the backlog left when issuing ends drains
//! within `--max-lag-ms`, no run was cut short by `--max-run-secs`, and every checked answer
//! equals the truth.
//!
//! Options: `engines` (comma-separated fleet sizes, 16; each engine one DP rank), `capacity`
//! (blocks per engine, 16384), `requests` (0: the whole
//! trace), `speeds` (comma-separated, 100), `find-max-speed` (`true`: double the first speed
//! while it keeps up, halve it while it does not, then bisect `bisect` (2) times between the two
//! speeds that bracket the limit; `max-speed` 10000 caps it), `max-lag-ms` (100), `check-every`
//! (250 requests), `poll-ms` (10, the monitor's period and so the lag's resolution),
//! `max-run-secs` (300), `trace` (a file of the same format), `json` (write the report there).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value as Json, json};

use crate::opt;
use crate::trace_run::{RunConfig, RunReport, run};
use crate::trace_sim::fleet::{Policy, offline};
use crate::trace_sim::{Prompts, Request, Trace, percentile, trace_path};

pub(crate) async fn trace() {
    let path = PathBuf::from(opt("trace", trace_path().display().to_string()));
    let limit = Some(opt("requests", 0usize)).filter(|n| *n > 0);
    let requests = Trace::read(&path, limit);
    let capacity: usize = opt("capacity", 16384);
    let max_lag = Duration::from_millis(opt("max-lag-ms", 100));
    let span_s = requests.last().map_or(0, |r| r.arrival_ms) as f64 / 1e3;
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "trace: {} requests over {span_s:.0} s of trace, engines of {capacity} blocks, keeps up: \
         lag and lateness p99 and drain within {} ms; {cpus} CPUs",
        requests.len(),
        max_lag.as_millis()
    );
    // Every prompt is hashed once, by the first replay without the service, before any timed run.
    let mut prompts = Prompts::new();
    let mut fleets = Vec::new();
    for engines in (opt("engines", "16".to_owned()).split(',')).map(|e| {
        e.trim()
            .parse::<usize>()
            .expect("--engines: comma-separated counts")
    }) {
        let cfg = |speed| RunConfig {
            speed,
            engines,
            capacity,
            check_every: opt("check-every", 250usize).max(1),
            poll: Duration::from_millis(opt("poll-ms", 10)),
            max_run: Duration::from_secs(opt("max-run-secs", 300)),
        };
        fleets.push(fleet(&requests, &mut prompts, engines, &cfg, max_lag).await);
    }
    let json_path: String = opt("json", String::new());
    if !json_path.is_empty() {
        let report = json!({
            "trace": {"requests": requests.len(), "span_s": span_s},
            "capacity_blocks": capacity, "max_lag_ms": max_lag.as_millis() as u64,
            "fleets": fleets,
        });
        let text = serde_json::to_string_pretty(&report).expect("JSON");
        std::fs::write(&json_path, text).unwrap_or_else(|e| panic!("write {json_path}: {e}"));
        println!("report written to {json_path}");
    }
}

/// The runs of one fleet size: the hit rates without the service, then each speed asked for and
/// the search, if asked for. Its part of the JSON report.
async fn fleet(
    requests: &[Request],
    prompts: &mut Prompts,
    engines: usize,
    config: &impl Fn(f64) -> RunConfig,
    max_lag: Duration,
) -> Json {
    let capacity = config(1.0).capacity;
    println!("\n{engines} engines");
    let mut offline_rates = serde_json::Map::new();
    for policy in [Policy::KvAware, Policy::RoundRobin, Policy::Random] {
        let (hits, counts) = offline(requests, prompts, engines, capacity, policy);
        println!(
            "  without the service, {:<11} hit rate {:.4} ({counts:?})",
            policy.name(),
            hits.rate()
        );
        offline_rates.insert(policy.name().into(), json!(hits.rate()));
    }
    println!(
        "\n{:>8}{:>7}{:>8}{:>9}{:>9}{:>9}{:>8}{:>9}{:>9}{:>9}{:>9}{:>9}{:>8}{:>10}{:>8}{:>6}",
        "speed",
        "reqs",
        "wall s",
        "lag p50",
        "lag p99",
        "lag max",
        "backlog",
        "drain",
        "late99",
        "q p50us",
        "q p99us",
        "q p999",
        "stale%",
        "checked",
        "hit",
        "ok"
    );
    let mut runs = Vec::new();
    let mut tried = Vec::new();
    let speeds: Vec<f64> = (opt("speeds", "100".to_owned()).split(','))
        .map(|s| s.trim().parse().expect("--speeds: comma-separated numbers"))
        .collect();
    for &speed in &speeds {
        let ok = one(requests, prompts, &config(speed), max_lag, &mut runs).await;
        tried.push((speed, ok));
    }
    let mut best = tried.iter().filter(|t| t.1).map(|t| t.0).reduce(f64::max);
    if opt("find-max-speed", false) {
        let max_speed: f64 = opt("max-speed", 10_000.0);
        let (mut lo, mut hi) = bracket(&tried);
        // Double up from the highest speed kept up, or halve down from the lowest one that was not.
        while hi.is_none() && lo.is_some_and(|l| l * 2.0 <= max_speed) {
            let s = lo.expect("checked") * 2.0;
            let ok = one(requests, prompts, &config(s), max_lag, &mut runs).await;
            (lo, hi) = if ok { (Some(s), None) } else { (lo, Some(s)) };
        }
        while lo.is_none() && hi.is_some_and(|h| h / 2.0 >= 1.0) {
            let s = hi.expect("checked") / 2.0;
            let ok = one(requests, prompts, &config(s), max_lag, &mut runs).await;
            (lo, hi) = if ok { (Some(s), hi) } else { (None, Some(s)) };
        }
        for _ in 0..opt("bisect", 2usize) {
            let (Some(l), Some(h)) = (lo, hi) else { break };
            let s = ((l * h).sqrt()).round();
            if s <= l || s >= h {
                break;
            }
            let ok = one(requests, prompts, &config(s), max_lag, &mut runs).await;
            (lo, hi) = if ok { (Some(s), hi) } else { (lo, Some(s)) };
        }
        best = lo;
        println!("\nhighest speed kept up: {lo:?} (lowest not kept up: {hi:?})");
    }
    json!({
        "engines": engines, "offline_hit_rate": offline_rates, "runs": runs,
        "max_speed_kept_up": best,
    })
}

/// The highest speed kept up and the lowest one not kept up above it, of the runs so far.
fn bracket(tried: &[(f64, bool)]) -> (Option<f64>, Option<f64>) {
    let lo = tried.iter().filter(|t| t.1).map(|t| t.0).reduce(f64::max);
    let hi = (tried.iter())
        .filter(|t| !t.1 && lo.is_none_or(|l| t.0 > l))
        .map(|t| t.0)
        .reduce(f64::min);
    (lo, hi)
}

/// One run at `cfg.speed`: print its row, keep its JSON, and say whether it kept up.
async fn one(
    requests: &[Request],
    prompts: &mut Prompts,
    cfg: &RunConfig,
    max_lag: Duration,
    runs: &mut Vec<Json>,
) -> bool {
    let mut r = run(requests, prompts, cfg).await;
    let (row, keeps_up) = summarize(&mut r, cfg.speed, max_lag);
    let ms = |k: &str| row["apply_lag_ms"][k].as_f64().unwrap_or(0.0);
    let us = |k: &str| row["query_us"][k].as_f64().unwrap_or(0.0);
    println!(
        "{:>8}{:>7}{:>8.1}{:>9.1}{:>9.1}{:>9.1}{:>8}{:>9.1}{:>9.1}{:>9.0}{:>9.0}{:>9.0}{:>8.1}{:>10}{:>8.4}{:>6}",
        cfg.speed,
        r.issued,
        r.wall.as_secs_f64(),
        ms("p50"),
        ms("p99"),
        ms("max"),
        r.max_backlog,
        r.drain.as_secs_f64() * 1e3,
        row["lateness_ms"]["p99"].as_f64().unwrap_or(0.0),
        us("p50"),
        us("p99"),
        us("p999"),
        100.0 * r.stale as f64 / r.issued.max(1) as f64,
        format!("{}/{}", r.checked - r.wrong, r.checked),
        r.hits.rate(),
        if keeps_up { "yes" } else { "no" },
    );
    for m in &r.mismatches {
        println!("  wrong answer: {m}");
    }
    runs.push(row);
    keeps_up
}

/// The run's figures as JSON, and whether it kept up.
fn summarize(r: &mut RunReport, speed: f64, max_lag: Duration) -> (Json, bool) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for v in [&mut r.apply_lag, &mut r.query, &mut r.lateness] {
        v.sort_unstable();
    }
    let (lag99, late99) = (
        percentile(&r.apply_lag, 0.99),
        percentile(&r.lateness, 0.99),
    );
    let keeps_up =
        !r.cut_short && r.wrong == 0 && lag99 <= max_lag && late99 <= max_lag && r.drain <= max_lag;
    let quantiles = |v: &[Duration], scale: f64| {
        json!({
            "p50": ms(percentile(v, 0.5)) * scale, "p99": ms(percentile(v, 0.99)) * scale,
            "p999": ms(percentile(v, 0.999)) * scale, "max": ms(percentile(v, 1.0)) * scale,
            "count": v.len(),
        })
    };
    let c = r.counts;
    let secs = r.wall.as_secs_f64().max(1e-9);
    let row = json!({
        "speed": speed, "requests": r.issued, "cut_short": r.cut_short, "wall_s": secs,
        "keeps_up": keeps_up,
        "apply_lag_ms": quantiles(&r.apply_lag, 1.0), "max_backlog_batches": r.max_backlog,
        "drain_ms": ms(r.drain), "lateness_ms": quantiles(&r.lateness, 1.0),
        "query_us": quantiles(&r.query, 1e3),
        "stale_answers": r.stale, "checked_answers": r.checked, "wrong_answers": r.wrong,
        "hit_rate": r.hits.rate(),
        "events": {
            "batches": c.batches, "stored_blocks": c.stored_blocks,
            "removed_blocks": c.removed_blocks, "uncached_blocks": c.uncached_blocks,
            "block_events_per_s": (c.stored_blocks + c.removed_blocks) as f64 / secs,
            "requests_per_s": r.issued as f64 / secs,
        },
    });
    (row, keeps_up)
}
