//! `--fleet N`: N instances x 2 ranks, each holder caching 128 prompts (`Shape::fleet`). Every
//! side runs in its own child process (`--fleet-child N <side>`), so that one large index is
//! in memory at a time and each build starts from a fresh heap: the child builds its index,
//! checks that its ways of asking agree, times the queries and prints its figures and a digest
//! of each query's answer; the parent requires every side's digests to equal ours and draws
//! the rows. Memory per pair comes from `--rss-child` runs of the same shape (`FLEET_RSS=0`
//! skips them).

use std::collections::HashMap;
use std::fmt::Write;
use std::time::Instant;

use crate::build::{apply_dynamo, apply_ours, dynamo_events, ours_batches};
use crate::check::check;
use crate::indexers::{DynamoIndex, Kind};
use crate::latency::{Way, WayStats, latencies};
use crate::report::{Better, Report};
use crate::workload::{self, Shape};
use crate::{SEED, describe, memory, ours, query_rows, stats};

const SIDES: [&str; 4] = ["ours", "crtc", "pool4", "positional"];
/// Timed rounds over the queries (after one untimed warm-up): one fewer than the default
/// mode, as the answers of a large fleet take longer to build.
const ROUNDS: usize = 2;

/// One child's figures by name, and its per-query digests.
struct ChildFigures {
    values: HashMap<String, f64>,
    digests: Vec<u64>,
}

impl ChildFigures {
    fn get(&self, key: &str) -> f64 {
        self.values.get(key).copied().unwrap_or(f64::NAN)
    }

    /// The figures of one way ("keys", "tokens", "service").
    fn way(&self, way: &str) -> WayStats {
        WayStats {
            all: (
                self.get(&format!("{way}.p50")),
                self.get(&format!("{way}.p99")),
            ),
            best: (
                self.get(&format!("{way}.best50")),
                self.get(&format!("{way}.best99")),
            ),
            deep: self.get(&format!("{way}.deep")),
        }
    }
}

pub fn run(instances: usize) -> Result<Report, String> {
    let mut report = Report::new(&format!("fleet-{instances}"));
    let t = Instant::now();
    let w = workload::generate(SEED, Shape::fleet(instances));
    describe(&w, t.elapsed(), &mut report);
    let ops = w.block_ops as f64;
    drop(w);

    let mut figures = Vec::new();
    for side in SIDES {
        let t = Instant::now();
        let f = spawn_child(instances, side)?;
        println!(
            "{side}: built, checked and timed in its own process in {:.1?}",
            t.elapsed()
        );
        figures.push(f);
    }
    for (side, f) in SIDES.iter().zip(&figures).skip(1) {
        if let Some(q) = (0..f.digests.len()).find(|&q| f.digests[q] != figures[0].digests[q]) {
            return Err(format!("{side} answers query {q} differently from ours"));
        }
        if f.digests.len() != figures[0].digests.len() {
            return Err(format!("{side} answered {} queries", f.digests.len()));
        }
    }
    println!(
        "check: {} queries, per-holder overlap identical in every side (each side's ways agree \
         in its own process; the sides' answer digests agree); {:.0} of them with a hit, mean \
         service answer {:.0} bytes",
        figures[0].digests.len(),
        figures[0].get("any_hit"),
        figures[0].get("reply_bytes"),
    );
    report.note(
        "mean_reply_bytes",
        format!("{:.0}", figures[0].get("reply_bytes")),
    );

    let (o, d) = (&figures[0], &figures[1..]);
    let per = |f: &ChildFigures, key: &str| ops / f.get(key) / 1e6;
    let dyn3 = |key: &str| -> [f64; 3] { std::array::from_fn(|i| per(&d[i], key)) };
    report.row(
        "apply, M block ops/s",
        Better::Higher,
        2,
        per(o, "apply_wall"),
        dyn3("apply_wall"),
    );
    report.row(
        "apply, M block ops per CPU-second",
        Better::Higher,
        2,
        per(o, "apply_cpu"),
        dyn3("apply_cpu"),
    );
    query_rows(
        &mut report,
        ROUNDS,
        |way| {
            o.way(match way {
                Way::OursKeys => "keys",
                Way::OursTokens => "tokens",
                _ => "service",
            })
        },
        |i, by_keys| d[i].way(if by_keys { "keys" } else { "tokens" }),
    );
    if std::env::var("FLEET_RSS").as_deref() != Ok("0") {
        memory::rss_rows(&mut report, Some(instances))?;
    }
    let walls: Vec<String> = SIDES
        .iter()
        .zip(&figures)
        .map(|(s, f)| format!("{s} {:.2} s", f.get("apply_wall")))
        .collect();
    println!("(apply of {ops} block ops: {})", walls.join(", "));
    Ok(report)
}

fn spawn_child(instances: usize, side: &str) -> Result<ChildFigures, String> {
    let args = [
        "--fleet-child".to_string(),
        instances.to_string(),
        side.to_string(),
    ];
    let text = memory::run_child(&args, side)?;
    let mut f = ChildFigures {
        values: HashMap::new(),
        digests: Vec::new(),
    };
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("digests", list)) => {
                f.digests = list
                    .split(',')
                    .map(|h| u64::from_str_radix(h, 16).map_err(|e| e.to_string()))
                    .collect::<Result<_, _>>()?;
            }
            Some((key, v)) => {
                let v = v
                    .parse()
                    .map_err(|_| format!("{side} child printed {line:?}"))?;
                f.values.insert(key.to_string(), v);
            }
            None => {}
        }
    }
    Ok(f)
}

/// One side of the fleet comparison, in its own process: prints `key value` lines.
pub fn child(instances: usize, side: &str) -> Result<(), String> {
    let w = workload::generate(SEED, Shape::fleet(instances));
    let mut out = String::new();
    let (applied, summary, lat);
    if side == "ours" {
        let mut ours = ours::Ours::new(w.holders());
        let batches = ours_batches(&ours, &w);
        applied = apply_ours(&mut ours, &batches);
        drop(batches);
        if ours.pairs() != w.live_pairs {
            return Err(format!(
                "ours holds {} pairs of {}",
                ours.pairs(),
                w.live_pairs
            ));
        }
        summary = check(&w, Some(&ours), &[])?;
        lat = latencies(&w, Some(&ours), &[], &summary.depths, ROUNDS);
        for (name, way) in [
            ("keys", Way::OursKeys),
            ("tokens", Way::OursTokens),
            ("service", Way::OursService),
        ] {
            put_way(&mut out, name, stats(&lat, way));
        }
    } else {
        let kind = Kind::parse(side).ok_or_else(|| format!("unknown side {side}"))?;
        let index = DynamoIndex::new(kind);
        let events = dynamo_events(&w);
        applied = apply_dynamo(&index, events);
        summary = check(&w, None, &[&index])?;
        lat = latencies(&w, None, &[&index], &summary.depths, ROUNDS);
        put_way(&mut out, "keys", stats(&lat, Way::DynamoKeys(0)));
        put_way(&mut out, "tokens", stats(&lat, Way::DynamoTokens(0)));
    }
    let _ = writeln!(out, "apply_wall {}", applied.wall.as_secs_f64());
    let _ = writeln!(out, "apply_cpu {}", applied.cpu);
    let _ = writeln!(out, "any_hit {}", summary.any_hit);
    let _ = writeln!(out, "reply_bytes {}", summary.reply_bytes);
    let digests: Vec<String> = summary.digests.iter().map(|d| format!("{d:x}")).collect();
    let _ = writeln!(out, "digests {}", digests.join(","));
    print!("{out}");
    Ok(())
}

fn put_way(out: &mut String, name: &str, s: WayStats) {
    let _ = writeln!(out, "{name}.p50 {}", s.all.0);
    let _ = writeln!(out, "{name}.p99 {}", s.all.1);
    let _ = writeln!(out, "{name}.best50 {}", s.best.0);
    let _ = writeln!(out, "{name}.best99 {}", s.best.1);
    let _ = writeln!(out, "{name}.deep {}", s.deep);
}
