//! Churn soak with the real RocksDB store: 1,000 instances registered, fed and unregistered in
//! turn, each under a fresh id, beside steady instances and a store whose backends come and go,
//! with a checkpoint after every round as the service takes them. Prints, every 100 rounds, the
//! holders, the bytes a round's checkpoint wrote, the store's size on disk (flushed and
//! compacted) and the process's resident memory, then checks that each stayed flat; a restart at the end must recover exactly
//! the live state. A plain program (harness = false); exits non-zero when a bound is broken.
//!
//! Measured (1,000 rounds, 4 steady instances, dev build): 6 holders from round 100 to 1,000,
//! 5,073 checkpoint bytes per round, 405 stored keys (12,084 B), 0.01 MiB of table files and
//! 17.4 MiB resident from round 200 on, 0 B written by 50 idle rounds. Before holders were
//! reclaimed and idle checkpoints skipped: 2,004 holders, 291,495 B per round and rising,
//! 2,403 keys, 53 MiB resident, 15 MB written by the 50 idle rounds.
//!
//! `cargo bench --bench churn` (needs the `rocksdb` feature, on by default).
//! `CHURN_ROUNDS=1000` picks the number of churned instances.

mod support;

use mooncake_conductor::durability::checkpoint::context_ops;
use mooncake_conductor::durability::recovery;
use mooncake_conductor::events::{Holder, IndexBatch, IndexOp};
use mooncake_conductor::index::{ContextIndex, Watermark};
use mooncake_conductor::model::{
    BlockHash, ContextKey, PublisherConfig, PublisherType, SubscriptionKey, Tier,
};
use mooncake_conductor::storage::rocks::RocksStore;
use mooncake_conductor::storage::{KvOp, KvStore, migrations};
use support::profile;

/// Instances registered for the whole run.
const STEADY: u32 = 4;
/// Blocks each churned instance stores: a system prompt every instance shares, and its own.
const SYSTEM: u64 = 16;
const OWN: u64 = 48;
/// Blocks each steady instance and the store add (and take away) per round.
const WINDOW: u64 = 8;

fn source(instance: &str) -> SubscriptionKey {
    SubscriptionKey::new(instance, "default", 0)
}

fn registration(instance: &str, kind: PublisherType) -> PublisherConfig {
    let endpoint = format!("tcp://127.0.0.1:1/{instance}");
    support::registration(instance, endpoint, kind, "churn")
}

fn engine(instance: &str) -> Holder {
    Holder::Engine {
        instance_id: instance.into(),
        dp_rank: 0,
        group: 0,
    }
}

fn blocks(range: std::ops::Range<u64>) -> Vec<BlockHash> {
    range.map(BlockHash).collect()
}

fn op(store: bool, holder: Holder, tier: Tier, hashes: Vec<BlockHash>) -> IndexOp {
    if store {
        IndexOp::Store {
            holder,
            tier,
            hashes,
        }
    } else {
        IndexOp::Remove {
            holder,
            tier,
            hashes,
        }
    }
}

/// Bytes of one write's keys and values.
fn bytes_of(ops: &[KvOp]) -> usize {
    ops.iter()
        .map(|op| match op {
            KvOp::Put { key, value, .. } => key.len() + value.len(),
            KvOp::Delete { key, .. } => key.len(),
            KvOp::DeleteRange { from, to, .. } => from.len() + to.len(),
        })
        .sum()
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Bytes of the store's table files (its content once flushed; RocksDB's info log and manifest,
/// which record every flush and compaction, left out).
fn sst_bytes(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().ends_with(".sst"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// Live keys in every column family, and their bytes.
fn stored(store: &RocksStore) -> (u64, u64) {
    let (mut keys, mut bytes) = (0u64, 0u64);
    for cf in mooncake_conductor::storage::Cf::ALL {
        store
            .scan_prefix(cf, b"", &mut |k, v| {
                keys += 1;
                bytes += (k.len() + v.len()) as u64;
                Ok(())
            })
            .expect("scan");
    }
    (keys, bytes)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

struct Run {
    index: ContextIndex,
    seq: u64,
}

impl Run {
    fn apply(&mut self, source: &SubscriptionKey, ops: Vec<IndexOp>) {
        self.seq += 1;
        let batch = IndexBatch {
            source: source.clone(),
            ops,
        };
        let mark = Watermark {
            seq: self.seq,
            digest: self.seq,
        };
        self.index.apply_sequenced(&batch, mark);
    }

    /// One round: instance `r` registers and is fed, instance `r - 1` unregisters, the steady
    /// instances and the store move their windows.
    fn round(&mut self, store: &RocksStore, r: u64, rounds: &mut support::Rounds) {
        let name = format!("churn-{r}");
        self.index.attach_rank(&source(&name), &name, 0);
        let own = 1_000_000 + r * 1_000;
        self.apply(
            &source(&name),
            vec![
                op(true, engine(&name), Tier::Device, blocks(1..1 + SYSTEM)),
                op(true, engine(&name), Tier::Device, blocks(own..own + OWN)),
                op(
                    false,
                    engine(&name),
                    Tier::Device,
                    blocks(own..own + OWN / 4),
                ),
            ],
        );
        if r > 0 {
            let gone = format!("churn-{}", r - 1);
            self.index.detach_source(&source(&gone));
            let _ = rounds.unregister(store, &source(&gone));
        }
        for s in 0..STEADY {
            let name = format!("steady-{s}");
            let base = 10_000_000 * (u64::from(s) + 1);
            let new = base + r * WINDOW;
            let mut ops = vec![op(
                true,
                engine(&name),
                Tier::CpuLocal,
                blocks(new..new + WINDOW),
            )];
            if r >= 10 {
                let old = new - 10 * WINDOW;
                ops.push(op(
                    false,
                    engine(&name),
                    Tier::CpuLocal,
                    blocks(old..old + WINDOW),
                ));
            }
            self.apply(&source(&name), ops);
        }
        // The store: a backend per round, the previous one emptied.
        let backend = |r: u64| Holder::Shared {
            backend_id: format!("backend-{r}"),
        };
        let mut ops = vec![op(true, backend(r), Tier::CpuShare, blocks(1..1 + WINDOW))];
        if r > 0 {
            ops.push(IndexOp::ClearHolder {
                holder: backend(r - 1),
            });
        }
        self.apply(&source("store"), ops);
    }
}

/// A checkpoint round as the service writes it (the context's changes and the source records
/// that moved); the bytes of the context's part.
fn checkpoint(index: &mut ContextIndex, store: &RocksStore, rounds: &mut support::Rounds) -> usize {
    let changes = index.take_changes();
    let bytes = bytes_of(&context_ops(&changes));
    rounds.round(changes, index, store);
    bytes
}

struct Sample {
    round: u64,
    holders: u64,
    pairs: u64,
    checkpoint: usize,
    disk: u64,
    rss: u64,
    stored: (u64, u64),
}

fn main() {
    let rounds: u64 = std::env::var("CHURN_ROUNDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("data");
    let store = RocksStore::open(&path).expect("open");
    migrations::migrate(&store, "churn").expect("migrate");
    let mut checkpoints = support::Rounds::new();
    for s in 0..STEADY {
        let name = format!("steady-{s}");
        checkpoints.register(&store, &registration(&name, PublisherType::Vllm));
    }
    checkpoints.register(&store, &registration("store", PublisherType::Mooncake));
    let mut run = Run {
        index: ContextIndex::new(ContextKey::new("default", "churn", "", 16), profile()),
        seq: 0,
    };
    for s in 0..STEADY {
        let name = format!("steady-{s}");
        run.index.attach_rank(&source(&name), &name, 0);
    }
    let mut samples = Vec::new();
    let mut window_bytes = 0usize;
    let mut most_holders = 0u64;
    println!(
        "round  holders  pairs  checkpoint B/round  stored               SST MiB  RSS MiB  (all files)"
    );
    for r in 0..rounds {
        let name = format!("churn-{r}");
        checkpoints.register(&store, &registration(&name, PublisherType::Vllm));
        run.round(&store, r, &mut checkpoints);
        window_bytes += checkpoint(&mut run.index, &store, &mut checkpoints);
        let stats = run.index.stats();
        most_holders = most_holders.max(stats.holders);
        if (r + 1) % 100 == 0 {
            // RocksDB keeps writes in its memtable and log until they fill its write buffer
            // (64 MiB); flushed and compacted, the store shows the size of what it holds, and
            // the memory ours.
            let logged = store.disk_bytes();
            store.compact().expect("compact");
            let s = Sample {
                round: r + 1,
                holders: stats.holders,
                pairs: stats.holder_blocks,
                checkpoint: window_bytes / 100,
                disk: sst_bytes(&path),
                rss: rss_bytes(),
                stored: stored(&store),
            };
            println!(
                "{:5}  {:7}  {:5}  {:18}  {:4} keys {:6} B  {:8.3}  {:7.1}  ({:.2} MiB before the flush)",
                s.round,
                s.holders,
                s.pairs,
                s.checkpoint,
                s.stored.0,
                s.stored.1,
                mib(s.disk),
                mib(s.rss),
                mib(logged),
            );
            samples.push(s);
            window_bytes = 0;
        }
    }
    // Idle: nothing changes, so nothing is written.
    let idle: usize = (0..50)
        .map(|_| checkpoint(&mut run.index, &store, &mut checkpoints))
        .sum();
    store.compact().expect("compact");
    let compacted = sst_bytes(&path);
    let live = run.index.stats();
    drop(store);
    let store = RocksStore::open(&path).expect("reopen");
    let recovered = recovery::recover(&store).expect("recover");
    let back = recovered
        .contexts
        .first()
        .map(|c| c.stats())
        .unwrap_or_default();
    println!(
        "most holders at once: {most_holders}; idle checkpoints: {idle} B in 50 rounds; \
         disk after compaction: {:.2} MiB; recovered: {} holders, {} pairs (live: {}, {})",
        mib(compacted),
        back.holders,
        back.holder_blocks,
        live.holders,
        live.holder_blocks,
    );

    // The bounds: holders never exceed the instances and backends alive at once, and the
    // checkpoint bytes, the disk and the memory of the last 100 rounds are those of the second.
    let mut broken = Vec::new();
    let alive_at_once = u64::from(STEADY) + 2 + 2;
    if most_holders > alive_at_once {
        broken.push(format!("holders reached {most_holders} > {alive_at_once}"));
    }
    if let (Some(early), Some(late)) = (samples.get(1), samples.last()) {
        if late.checkpoint as f64 > 1.1 * early.checkpoint as f64 {
            broken.push(format!(
                "checkpoint bytes grew: {} -> {} B/round",
                early.checkpoint, late.checkpoint
            ));
        }
        if late.disk as f64 > 1.25 * early.disk as f64 {
            broken.push(format!(
                "disk grew: {:.2} -> {:.2} MiB",
                mib(early.disk),
                mib(late.disk)
            ));
        }
        if late.rss > early.rss + (2 << 20) {
            broken.push(format!(
                "memory grew: {:.1} -> {:.1} MiB",
                mib(early.rss),
                mib(late.rss)
            ));
        }
        if late.stored != early.stored {
            broken.push(format!("stored: {:?} -> {:?}", early.stored, late.stored));
        }
        if late.pairs != early.pairs {
            broken.push(format!("pairs: {} -> {}", early.pairs, late.pairs));
        }
    }
    if idle != 0 {
        broken.push(format!("idle checkpoints wrote {idle} B"));
    }
    if (back.holders, back.holder_blocks, back.blocks)
        != (live.holders, live.holder_blocks, live.blocks)
    {
        broken.push("recovery differs from the live state".into());
    }
    if !broken.is_empty() {
        eprintln!("bounds broken: {}", broken.join("; "));
        std::process::exit(1);
    }
    println!("all bounds hold");
}
