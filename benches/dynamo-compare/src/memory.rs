//! Resident memory per (block, holder) pair: each index is built in a fresh process (this
//! binary run as `--rss-child <side> [<instances>]`), generating each message just before it
//! is applied so the input never sits in memory whole.

use std::hint::black_box;
use std::process::Command;

use crate::indexers::{DynamoIndex, Kind, PacedSender};
use crate::measure::proc_status_bytes;
use crate::report::{Better, Report};
use crate::workload::{self, Shape};
use crate::{SEED, dynamo, ours};

/// Every side's memory, each built in its own process, as the report's two memory rows.
pub fn rss_rows(report: &mut Report, fleet: Option<usize>) -> Result<(), String> {
    let mut mem = Vec::new();
    for side in ["ours", "crtc", "pool4", "positional"] {
        mem.push(spawn_rss_child(side, fleet)?);
    }
    report.row(
        "RSS after build, B per (block, holder)",
        Better::Lower,
        1,
        mem[0].0,
        std::array::from_fn(|i| mem[i + 1].0),
    );
    report.row(
        "peak RSS during build, B per pair",
        Better::Lower,
        1,
        mem[0].1,
        std::array::from_fn(|i| mem[i + 1].1),
    );
    Ok(())
}

/// Run this binary with `args` for `side` and return what it printed; a failed run is an
/// error with both its outputs.
pub fn run_child(args: &[String], side: &str) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let out = Command::new(exe)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "{side} child failed ({}): {text} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(text)
}

/// Run this binary as `--rss-child <side>` and read back (bytes per pair after the build, peak
/// bytes per pair during it).
fn spawn_rss_child(side: &str, fleet: Option<usize>) -> Result<(f64, f64), String> {
    let mut args = vec!["--rss-child".to_string(), side.to_string()];
    args.extend(fleet.map(|n| n.to_string()));
    let text = run_child(&args, side)?;
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

/// The memory measurement: build one index from the workload and print `pairs, RSS growth,
/// peak growth, baseline` in bytes. The baseline is taken after the workload and its keys
/// exist. Dynamo's sender waits for its event threads every few thousand events, so queued
/// input stays small; the RSS is read while those threads (which own per-worker lookup tables
/// that are part of the index) are alive.
pub fn rss_child(side: &str, shape: Shape) -> Result<(), String> {
    let w = workload::generate(SEED, shape);
    if side == "ours" {
        let mut ours = ours::Ours::new(w.holders());
        let prompts: Vec<_> = w.prompts.iter().map(|p| ours.prompt(&p.tokens)).collect();
        let base = proc_status_bytes("VmRSS");
        for b in &w.batches {
            let batch = ours.batch(b, &prompts);
            ours.apply(&batch);
        }
        report(w.live_pairs, base);
        assert_eq!(ours.pairs(), w.live_pairs, "our index lost pairs");
        black_box(&ours);
        return Ok(());
    }
    let kind = Kind::parse(side).ok_or_else(|| format!("unknown side {side}"))?;
    let index = DynamoIndex::new(kind);
    let prompts: Vec<_> = w
        .prompts
        .iter()
        .map(|p| dynamo::prompt(&p.tokens))
        .collect();
    let mut builder = dynamo::EventBuilder::new(w.holders());
    let base = proc_status_bytes("VmRSS");
    let mut sender = PacedSender::new(&index);
    for b in &w.batches {
        for ev in builder.events(b, &prompts) {
            sender.send(ev);
        }
    }
    sender.finish();
    report(w.live_pairs, base);
    black_box(&index);
    Ok(())
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
