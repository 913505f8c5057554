//! Durability costs with the real RocksDB store: checkpoint cost per 1 k changed blocks on a large
//! context, restart-to-ready (open + migrate + recover) with 1 M and 10 M indexed blocks, and the
//! on-disk size per (block, holder). A plain program (harness = false) printing a summary.
//!
//! `cargo bench --bench storage` (needs the `rocksdb` feature, on by default).
//! `STORAGE_BENCH_SIZES=1000000,10000000` picks the index sizes.
//! `STORAGE_BENCH_DIR=dir` keeps each filled store in `dir/pairs-N` and, when it is there
//! already, skips the fill and the checkpoint rounds and only restarts from it
//! (`STORAGE_BENCH_RESTARTS` times, default 1): for profiling and A/B runs of recovery, which
//! otherwise wait most of a minute per 10 M fill. A kept store of an older schema is migrated by
//! its first restart, whose open+migrate phase then includes the migration.
//! `STORAGE_BENCH_MIGRATION=1` measures migration 5 instead, per size: a schema 4 store of which
//! half the pairs are one chain (derived keys and aliases, dropped by the step) and half
//! published hashes, its restart with the migration, the restart after it, and the restart of a
//! store holding only the published hashes written directly.

use std::time::{Duration, Instant};

mod support;

use mooncake_conductor::durability::checkpoint::context_ops;
use mooncake_conductor::durability::recovery;
use mooncake_conductor::events::{BlockContents, Holder, IndexBatch, IndexOp};
use mooncake_conductor::hashing::derived;
use mooncake_conductor::index::{ContextIndex, Watermark};
use mooncake_conductor::model::{
    ContextKey, PublisherConfig, PublisherType, SubscriptionKey, Tier,
};
use mooncake_conductor::storage::rocks::RocksStore;
use mooncake_conductor::storage::{KvStore, migrations};
use support::{block, profile};

fn registration(i: u32) -> PublisherConfig {
    let endpoint = format!("tcp://127.0.0.1:{}", 20000 + i);
    support::registration(
        &format!("engine-{i}"),
        endpoint,
        PublisherType::Vllm,
        "bench",
    )
}

const SOURCES: u32 = 8;

/// One engine event storing blocks `range` as one chain, as engines publish them: the index keys
/// each block by its derived key and keeps the published hash as an alias, so every pair here
/// also costs an alias on disk and at recovery (the worst case: one holder per block).
fn store_batch(source: u32, range: std::ops::Range<u64>) -> IndexBatch {
    let parent = range.start.checked_sub(1).map(block);
    IndexBatch {
        source: SubscriptionKey::new(&format!("engine-{source}"), "", 0),
        ops: vec![IndexOp::StoreChained {
            holder: Holder::Engine {
                instance_id: format!("engine-{source}"),
                dp_rank: 0,
                group: 0,
            },
            tier: Tier::Device,
            hashes: range.clone().map(block).collect(),
            contents: BlockContents {
                parent,
                root: derived::ROOT,
                digests: range.map(|i| block(!i).0).collect(),
            },
        }],
    }
}

/// [`store_batch`] with the published hashes only, no contents: keyed by them (raw).
fn raw_batch(source: u32, range: std::ops::Range<u64>) -> IndexBatch {
    IndexBatch {
        source: SubscriptionKey::new(&format!("engine-{source}"), "", 0),
        ops: vec![IndexOp::Store {
            holder: Holder::Engine {
                instance_id: format!("engine-{source}"),
                dp_rank: 0,
                group: 0,
            },
            tier: Tier::Device,
            hashes: range.map(block).collect(),
        }],
    }
}

/// A store of `pairs` in 200 k chunks over the 8 sources: the first half of the chunks one
/// chain published by the odd sources (derived keys and aliases: each chunk's parent is the
/// last block of the chunk before), the rest by the even sources with published hashes only;
/// with `raw_only`, only the latter.
fn fill_mixed(path: &std::path::Path, pairs: u64, raw_only: bool) {
    let store = RocksStore::open(path).expect("open");
    migrations::migrate(&store, "bench").expect("migrate");
    let mut rounds = support::Rounds::new();
    for i in 0..SOURCES {
        rounds.register(&store, &registration(i));
    }
    let mut index = ContextIndex::new(ContextKey::new("", "bench", "", 16), profile());
    let chunk = 200_000;
    let chunks = pairs.div_ceil(chunk);
    for c in 0..chunks {
        let range = c * chunk..((c + 1) * chunk).min(pairs);
        let chained = c < chunks / 2;
        let source = 2 * (c % 4) as u32 + u32::from(chained);
        let batch = if chained {
            (!raw_only).then(|| store_batch(source, range))
        } else {
            Some(raw_batch(source, range))
        };
        if let Some(batch) = batch {
            let seq = c + 1;
            index.apply_sequenced(&batch, Watermark { seq, digest: seq });
            checkpoint(&mut index, &store, &mut rounds);
        }
    }
    store.compact().expect("compact");
}

fn migration(pairs: u64) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (mixed, raw) = (dir.path().join("mixed"), dir.path().join("raw"));
    fill_mixed(&mixed, pairs, false);
    let (before, _, loaded, _) = restart(&mixed);
    println!("pairs={pairs} schema 5 restart before the migration={before:?} (loaded {loaded})");
    {
        let store = RocksStore::open(&mixed).expect("open");
        store
            .write(vec![migrations::version_op(4)])
            .expect("version");
    }
    let (migrating, _, kept, _) = restart(&mixed);
    println!("  restart with migration 5={migrating:?} (kept {kept} pairs)");
    fill_mixed(&raw, pairs, true);
    // Alternated, as restarts are load-sensitive.
    for round in 0..3 {
        let (after, _, again, _) = restart(&mixed);
        assert_eq!(again, kept, "a later restart loads what the first kept");
        let (direct, _, written, _) = restart(&raw);
        assert_eq!(
            written, kept,
            "the migration keeps exactly the published hashes"
        );
        println!(
            "  round {round}: restart after it={after:?}, of the same pairs written \
             directly={direct:?} (ratio {:.2})",
            after.as_secs_f64() / direct.as_secs_f64(),
        );
    }
    println!(
        "  disk {:.1} MiB against {:.1} MiB",
        dir_bytes(&mixed) as f64 / (1 << 20) as f64,
        dir_bytes(&raw) as f64 / (1 << 20) as f64,
    );
}

/// A checkpoint round as the service writes it: the context's changes and the source records.
fn checkpoint(
    index: &mut ContextIndex,
    store: &dyn KvStore,
    rounds: &mut support::Rounds,
) -> usize {
    let changes = index.take_changes();
    rounds.round(changes, index, store)
}

/// Fill a context with `pairs` (block, holder) pairs spread over 8 engines, checkpointing every
/// 200 k changes like the running service would.
fn fill(store: &dyn KvStore, pairs: u64, rounds: &mut support::Rounds) -> ContextIndex {
    let mut index = ContextIndex::new(ContextKey::new("", "bench", "", 16), profile());
    let mut seq = 0;
    let chunk = 200_000;
    let mut start = 0;
    while start < pairs {
        let end = (start + chunk).min(pairs);
        seq += 1;
        let batch = store_batch((seq % SOURCES as u64) as u32, start..end);
        index.apply_sequenced(&batch, Watermark { seq, digest: seq });
        checkpoint(&mut index, store, rounds);
        start = end;
    }
    index
}

fn dir_bytes(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Open, migrate and recover the store in `path`: the restart-to-ready time, and the blocks and
/// (block, holder) pairs of the recovered context, with the pairs the scan loaded.
fn restart(path: &std::path::Path) -> (Duration, (u64, u64), u64, usize) {
    let t = Instant::now();
    let store = RocksStore::open(path).expect("open for recovery");
    migrations::migrate(&store, "bench").expect("migrate");
    let opened = t.elapsed();
    let recovered = recovery::recover(&store).expect("recover");
    let ready = t.elapsed();
    let p = recovered.phases;
    println!(
        "  restart phases: open+migrate={opened:?} scan={:?} build={:?} settle={:?}",
        p.scan, p.build, p.settle
    );
    let back = recovered
        .contexts
        .first()
        .map(|c| c.stats())
        .unwrap_or_default();
    (
        ready,
        (back.blocks, back.holder_blocks),
        recovered.pairs,
        recovered.contexts.len(),
    )
}

fn main() {
    let sizes: Vec<u64> = std::env::var("STORAGE_BENCH_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1_000_000, 10_000_000]);
    let kept = std::env::var_os("STORAGE_BENCH_DIR").map(std::path::PathBuf::from);
    let restarts: usize = std::env::var("STORAGE_BENCH_RESTARTS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1);
    if std::env::var_os("STORAGE_BENCH_MIGRATION").is_some() {
        sizes.into_iter().for_each(migration);
        return;
    }
    for pairs in sizes {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = match &kept {
            Some(kept) => kept.join(format!("pairs-{pairs}")),
            None => dir.path().join("data"),
        };
        // What the filled index held, written beside a kept store: a later run checks its
        // recovery against it without filling again.
        let expected_file = path.with_extension("expected");
        if let Some(expected) = std::fs::read_to_string(&expected_file)
            .ok()
            .filter(|_| kept.is_some())
        {
            let want: Vec<u64> = expected
                .split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect();
            for _ in 0..restarts {
                let (ready, back, loaded, contexts) = restart(&path);
                assert_eq!(
                    [back.0, back.1][..],
                    want[..],
                    "recovery lost or invented pairs"
                );
                println!(
                    "pairs={pairs} (kept store) restart-to-ready={ready:?} (loaded {loaded} \
                     pairs, {contexts} contexts)"
                );
            }
            continue;
        }
        if kept.is_some() {
            // A kept store without its counts is a fill that did not finish: start over.
            let _ = std::fs::remove_dir_all(&path);
        }
        let started = Instant::now();
        let mut rounds = support::Rounds::new();
        let mut index = {
            let store = RocksStore::open(&path).expect("open");
            migrations::migrate(&store, "bench").expect("migrate");
            for i in 0..SOURCES {
                rounds.register(&store, &registration(i));
            }
            let index = fill(&store, pairs, &mut rounds);
            store.compact().expect("compact");
            index
        };
        let fill_time = started.elapsed();
        let disk = dir_bytes(&path);

        // Checkpoint cost per 1 k changed blocks on this large context (half stores of new
        // blocks, half removals), 200 rounds, half of them (see below) the context's changes
        // alone.
        let store = RocksStore::open(&path).expect("reopen");
        let mut checkpoints = rounds;
        let mut rounds: Vec<Duration> = Vec::new();
        let mut context_only: Vec<Duration> = Vec::new();
        for r in 0..200u64 {
            let base = pairs + r * 1_000;
            let mut batch = store_batch(0, base..base + 500);
            batch.ops.push(IndexOp::Remove {
                holder: Holder::Engine {
                    instance_id: "engine-0".into(),
                    dp_rank: 0,
                    group: 0,
                },
                tier: Tier::Device,
                hashes: (r * 500..r * 500 + 500)
                    .map(|i| block(i * SOURCES as u64))
                    .collect(),
            });
            index.apply_sequenced(
                &batch,
                Watermark {
                    seq: 1_000_000 + r,
                    digest: r,
                },
            );
            // Odd rounds write as the schema 6 service did, the context's changes alone, for a
            // side-by-side figure of what the source records and the round add.
            let t = Instant::now();
            if r % 2 == 0 {
                checkpoint(&mut index, &store, &mut checkpoints);
                rounds.push(t.elapsed());
            } else {
                let changes = index.take_changes();
                store
                    .write(context_ops(&changes))
                    .expect("checkpoint write");
                context_only.push(t.elapsed());
            }
        }
        context_only.sort();
        println!(
            "  checkpoint/1k changed, alternated: round with source records p50={:?}, context's \
             changes alone p50={:?}",
            {
                let mut r = rounds.clone();
                r.sort();
                r[r.len() / 2]
            },
            context_only[context_only.len() / 2],
        );
        drop(store);
        rounds.sort();
        let mean = rounds.iter().sum::<Duration>() / rounds.len() as u32;

        // Restart to ready: open, migrate and recover every context into memory.
        let (ready, back, loaded, contexts) = restart(&path);
        let live = index.stats();
        assert_eq!(
            back,
            (live.blocks, live.holder_blocks),
            "recovery lost or invented pairs"
        );
        if kept.is_some() {
            std::fs::write(&expected_file, format!("{} {}", back.0, back.1))
                .expect("write the expected counts");
        }
        println!(
            "pairs={pairs} fill+checkpoint={:.1}s disk={:.1} MiB ({:.1} B/pair) \
             checkpoint/1k changed: mean={:?} p50={:?} p99={:?} restart-to-ready={:?} (loaded {loaded} pairs, {} contexts)",
            fill_time.as_secs_f64(),
            disk as f64 / (1 << 20) as f64,
            disk as f64 / pairs as f64,
            mean,
            rounds[rounds.len() / 2],
            rounds[rounds.len() * 99 / 100],
            ready,
            contexts,
        );
    }
}
