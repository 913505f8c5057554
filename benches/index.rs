//! Index benchmarks: apply throughput, query latency (p50/p99, also under concurrent ingest),
//! the walk cost of a 1M-token full hit, and resident memory per (block, holder) pair.
//!
//! A printed summary comes first, then the criterion groups. Memory is measured in a child
//! process per configuration (this binary re-run with `INDEX_BENCH_MEM=pairs,holders_per_block`)
//! so that heap left over by earlier measurements cannot hide or inflate a figure.
//!
//! Query benchmarks use precomputed keys ([`HashList`]): hashing the prompt is the caller's
//! cost, measured with the hashing benchmarks; only the 1M-token case adds it, to compare the two.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput};
mod support;

use mooncake_conductor::events::{Holder, IndexBatch, IndexOp};
use mooncake_conductor::hashing::PrefixKeys;
use mooncake_conductor::index::{ContextIndex, HashList, IndexReader, QueryHits};
use mooncake_conductor::model::{BlockHash, ContextKey, GroupKind, SubscriptionKey, Tier};
use support::profile;

const MEM_ENV: &str = "INDEX_BENCH_MEM";
const BS: u32 = 16;
const OP_LEN: usize = 16;

fn new_index() -> ContextIndex {
    ContextIndex::new(ContextKey::new("", "bench-model", "", BS), profile())
}

use support::mix64 as mix;

fn keys(n: usize, salt: u64) -> Vec<BlockHash> {
    (0..n as u64)
        .map(|i| BlockHash(mix(i ^ (salt << 40))))
        .collect()
}

fn engine(i: usize, rank: u32) -> (SubscriptionKey, Holder) {
    let id = format!("inst-{i}");
    (
        SubscriptionKey::new(&id, "", rank),
        Holder::Engine {
            instance_id: id,
            dp_rank: rank,
            group: 0,
        },
    )
}

fn store(
    ix: &mut ContextIndex,
    source: &SubscriptionKey,
    holder: &Holder,
    tier: Tier,
    hashes: &[BlockHash],
) {
    let ops = hashes
        .chunks(OP_LEN)
        .map(|c| IndexOp::Store {
            holder: holder.clone(),
            tier,
            hashes: c.to_vec(),
        })
        .collect();
    ix.apply(&IndexBatch {
        source: source.clone(),
        ops,
    });
}

/// Ops of 16 blocks each, as engines publish them, for one holder.
fn store_batches(n_blocks: usize) -> Vec<IndexBatch> {
    let (source, holder) = engine(0, 0);
    keys(n_blocks, 1)
        .chunks(64 * OP_LEN)
        .map(|batch| IndexBatch {
            source: source.clone(),
            ops: batch
                .chunks(OP_LEN)
                .map(|c| IndexOp::Store {
                    holder: holder.clone(),
                    tier: Tier::Device,
                    hashes: c.to_vec(),
                })
                .collect(),
        })
        .collect()
}

/// 64 instances x 2 ranks with staggered device / cpu_local prefixes of a 128-block prompt,
/// shared cpu_share on the first 96 blocks and shared disk on all: every cursor walks to the end.
fn fleet() -> (ContextIndex, Vec<BlockHash>) {
    let mut ix = new_index();
    let prompt = keys(128, 7);
    for i in 0..64 {
        for rank in 0..2u32 {
            let (s, h) = engine(i, rank);
            let d = (i * 7 + rank as usize * 3) % 129;
            store(&mut ix, &s, &h, Tier::Device, &prompt[..d]);
            store(&mut ix, &s, &h, Tier::CpuLocal, &prompt[..(d + 8).min(128)]);
            // Each engine also holds blocks of other prompts.
            store(
                &mut ix,
                &s,
                &h,
                Tier::Device,
                &keys(512, 100 + i as u64 * 2 + u64::from(rank)),
            );
        }
    }
    let store_src = SubscriptionKey::new("mooncake-store", "", 0);
    let backend = Holder::Shared {
        backend_id: "backend-0".into(),
    };
    store(&mut ix, &store_src, &backend, Tier::CpuShare, &prompt[..96]);
    store(&mut ix, &store_src, &backend, Tier::Disk, &prompt);
    (ix, prompt)
}

/// The workload the walk's interned holder sets target: 64 instances x 2 ranks all hold the same
/// 32-block system prompt on device, each followed by its own 96-block conversation; the query is
/// the system prompt plus (inst-0, rank 0)'s conversation, 128 blocks = 2,048 tokens. A store
/// backend holds the whole query prompt on disk, so every cursor stays alive (in its disk phase)
/// to the end: all 128 ranks are walked over all 128 blocks, while the block's holder set changes
/// only once, at block 32.
fn system_prompt_fleet() -> (ContextIndex, Vec<BlockHash>) {
    let mut ix = new_index();
    let system = keys(32, 5);
    let mut prompt = system.clone();
    for i in 0..64 {
        for rank in 0..2u32 {
            let (s, h) = engine(i, rank);
            let own = keys(96, 1000 + i as u64 * 2 + u64::from(rank));
            store(&mut ix, &s, &h, Tier::Device, &system);
            store(&mut ix, &s, &h, Tier::Device, &own);
            if i == 0 && rank == 0 {
                prompt.extend_from_slice(&own);
            }
        }
    }
    let store_src = SubscriptionKey::new("mooncake-store", "", 0);
    let backend = Holder::Shared {
        backend_id: "backend-0".into(),
    };
    store(&mut ix, &store_src, &backend, Tier::Disk, &prompt);
    (ix, prompt)
}

fn query_latency(reader: &IndexReader, prompt: &[BlockHash]) -> (Duration, Duration) {
    let mut samples = Vec::with_capacity(20_000);
    for _ in 0..20_000 {
        let mut k = HashList {
            hashes: prompt.to_vec(),
            block_size: BS,
        };
        let t = Instant::now();
        black_box(reader.query(&mut k, None));
        samples.push(t.elapsed());
    }
    percentiles(samples)
}

fn query_into_latency(reader: &IndexReader, prompt: &[BlockHash]) -> (Duration, Duration) {
    let mut samples = Vec::with_capacity(20_000);
    let mut out = QueryHits::default();
    for _ in 0..20_000 {
        let mut k = HashList {
            hashes: prompt.to_vec(),
            block_size: BS,
        };
        let t = Instant::now();
        reader.query_into(&mut k, None, &mut out);
        samples.push(t.elapsed());
        black_box(&out);
    }
    percentiles(samples)
}

/// `holders` engine holders each storing the same `blocks`-block prefix, one op of 16 blocks
/// after another: every store after the first holder's changes a block's holder set.
fn shared_store_batches(holders: usize, blocks: usize) -> Vec<IndexBatch> {
    let prefix = keys(blocks, 3);
    (0..holders)
        .map(|i| {
            let (source, holder) = engine(i / 2, (i % 2) as u32);
            IndexBatch {
                source,
                ops: prefix
                    .chunks(OP_LEN)
                    .map(|c| IndexOp::Store {
                        holder: holder.clone(),
                        tier: Tier::Device,
                        hashes: c.to_vec(),
                    })
                    .collect(),
            }
        })
        .collect()
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 - 1.0) * q) as usize];
    (at(0.50), at(0.99))
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Child process: fill `pairs` (block, holder) pairs, `k` holders per block, and print the
/// resident bytes per pair. Spec `pairs,k`: the holders of a 16-block op are k consecutive ones
/// of 128 engine holders (as when a fleet shares prefixes). Spec `pairs,k,scattered`: every
/// block gets its own random k of 1,024 holders, so nearly every block has a holder set no other
/// block has (the worst case for interned sets). Spec `pairs,k,hybrid`: as `pairs,k`, and each
/// rank is a window-first hybrid whose window group also keeps the last 2 blocks of each op
/// (a window of 2 blocks' worth); spec `pairs,k,hybrid-full`: its second group keeps every
/// block (two full-attention groups of an n:1 layer pattern).
fn mem_child(spec: &str) {
    let mut it = spec.split(',');
    let pairs = it.next().and_then(|v| v.parse().ok()).unwrap_or(1_000_000);
    let k: usize = it.next().and_then(|v| v.parse().ok()).unwrap_or(1);
    let layout = it.next().unwrap_or("");
    let scattered = layout == "scattered";
    let second_group = match layout {
        "hybrid" => Some(2),
        "hybrid-full" => Some(OP_LEN),
        _ => None,
    };
    let n_holders = if scattered { 1024 } else { 128 };
    let k = k.clamp(1, n_holders);
    let blocks = pairs / k;
    let holders: Vec<(SubscriptionKey, Holder)> = (0..n_holders)
        .map(|i| engine(i / 2, (i % 2) as u32))
        .collect();
    let before = rss_bytes();
    let mut ix = new_index();
    let mut chunk = Vec::with_capacity(OP_LEN);
    let put = |ix: &mut ContextIndex, holder: usize, hashes: &[BlockHash]| {
        let (s, h) = &holders[holder];
        let op = IndexOp::Store {
            holder: h.clone(),
            tier: Tier::Device,
            hashes: hashes.to_vec(),
        };
        ix.apply(&IndexBatch {
            source: s.clone(),
            ops: vec![op],
        });
    };
    if scattered {
        for b in 0..blocks as u64 {
            let r = mix(b ^ 0xabcd);
            // An odd step is coprime with the power-of-two holder count: k distinct holders.
            let (first, step) = (r as usize % n_holders, ((r >> 32) as usize % n_holders) | 1);
            for j in 0..k {
                put(
                    &mut ix,
                    (first + j * step) % n_holders,
                    &[BlockHash(mix(b))],
                );
            }
        }
    } else {
        for start in (0..blocks).step_by(OP_LEN) {
            chunk.clear();
            chunk.extend((start..(start + OP_LEN).min(blocks)).map(|b| BlockHash(mix(b as u64))));
            for j in 0..k {
                let h = (start / OP_LEN + j) % n_holders;
                put(&mut ix, h, &chunk);
                if let Some(kept) = second_group {
                    let (source, holder) = &holders[h];
                    let Holder::Engine {
                        instance_id,
                        dp_rank,
                        ..
                    } = holder
                    else {
                        continue;
                    };
                    let group = Holder::Engine {
                        instance_id: instance_id.clone(),
                        dp_rank: *dp_rank,
                        group: 1,
                    };
                    let kind = if kept == OP_LEN {
                        GroupKind::Full
                    } else {
                        GroupKind::SlidingWindow { window: 2 * BS }
                    };
                    let ops = vec![
                        IndexOp::GroupKind {
                            holder: group.clone(),
                            kind,
                        },
                        IndexOp::Store {
                            holder: group,
                            tier: Tier::Device,
                            hashes: chunk[chunk.len().saturating_sub(kept)..].to_vec(),
                        },
                    ];
                    ix.apply(&IndexBatch {
                        source: source.clone(),
                        ops,
                    });
                }
            }
        }
    }
    let after = rss_bytes();
    let stats = ix.stats();
    println!(
        "{} {} {:.1}",
        stats.holder_blocks,
        stats.blocks,
        (after.saturating_sub(before)) as f64 / stats.holder_blocks.max(1) as f64
    );
    black_box(&ix);
}

fn summary() {
    println!("== index summary ==");
    // Apply throughput: 2M block stores into one context, ops of 16.
    let batches = store_batches(2_000_000);
    let mut ix = new_index();
    let t = Instant::now();
    for b in &batches {
        ix.apply(b);
    }
    let dt = t.elapsed();
    println!(
        "apply: 2M block stores (ops of {OP_LEN}) in {dt:?} = {:.1} M stores/s",
        2.0 / dt.as_secs_f64()
    );
    drop(ix);

    // Apply throughput when blocks are shared: 128 holders storing one 16k-block prefix.
    let batches = shared_store_batches(128, 16_384);
    let mut ix = new_index();
    let t = Instant::now();
    for b in &batches {
        ix.apply(b);
    }
    let dt = t.elapsed();
    println!(
        "apply: 128 holders x 16,384 shared blocks (ops of {OP_LEN}) in {dt:?} = {:.1} M stores/s",
        128.0 * 16_384.0 / 1e6 / dt.as_secs_f64()
    );
    drop(ix);

    // Query latency, 2k-token prompt, 64 instances x 2 ranks, shared 32-block system prompt.
    let (ix, prompt) = system_prompt_fleet();
    let (p50, p99) = query_latency(&ix.reader(), &prompt);
    println!(
        "query 2k tokens x 64 inst x 2 ranks, shared 32-block system prompt (keys precomputed): p50 {p50:?} p99 {p99:?}"
    );

    // Answer building alone: an empty prompt lists all 64 x 2 ranks with zeros.
    let (p50, p99) = query_latency(&ix.reader(), &[]);
    println!(
        "query empty prompt x 64 inst x 2 ranks (plan and answer only): p50 {p50:?} p99 {p99:?}"
    );
    let (p50, p99) = query_into_latency(&ix.reader(), &prompt);
    println!(
        "query 2k tokens, system prompt, written into the previous answer (query_into): p50 {p50:?} p99 {p99:?}"
    );
    drop(ix);

    // Query latency, 2k-token prompt, 64 instances x 2 ranks, staggered prefixes: the holder
    // set changes at almost every block.
    let (ix, prompt) = fleet();
    let (p50, p99) = query_latency(&ix.reader(), &prompt);
    println!(
        "query 2k tokens x 64 inst x 2 ranks, staggered prefixes (keys precomputed): p50 {p50:?} p99 {p99:?}"
    );
    drop(ix);

    // The same under a concurrent writer storing and removing in the same context.
    let (mut ix, prompt) = fleet();
    let reader = ix.reader();
    let stop = AtomicBool::new(false);
    let (samples, writes) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let (src, holder) = engine(999, 0);
            let churn = keys(4096, 99);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                store(&mut ix, &src, &holder, Tier::Device, &churn);
                let op = IndexOp::Remove {
                    holder: holder.clone(),
                    tier: Tier::Device,
                    hashes: churn.clone(),
                };
                ix.apply(&IndexBatch {
                    source: src.clone(),
                    ops: vec![op],
                });
                n += 2 * churn.len() as u64;
            }
            n
        });
        let mut samples = Vec::with_capacity(20_000);
        let t0 = Instant::now();
        for _ in 0..20_000 {
            let mut k = HashList {
                hashes: prompt.clone(),
                block_size: BS,
            };
            let t = Instant::now();
            black_box(reader.query(&mut k, None));
            samples.push(t.elapsed());
        }
        let elapsed = t0.elapsed();
        stop.store(true, Ordering::Relaxed);
        let n = writer.join().unwrap_or(0);
        (samples, n as f64 / elapsed.as_secs_f64() / 1e6)
    });
    let (p50, p99) = percentiles(samples);
    println!(
        "  ... with a concurrent writer ({writes:.1} M block ops/s meanwhile): p50 {p50:?} p99 {p99:?}"
    );

    // 1M-token full hit, one instance x one rank.
    let (ix, tokens, hasher) = million();
    let reader = ix.reader();
    let full: Vec<BlockHash> = {
        let mut chain = hasher.chain(BS, &tokens);
        (0..chain.num_blocks()).map(|i| chain.key(i)).collect()
    };
    let mut walk = Vec::new();
    let mut hashed = Vec::new();
    for _ in 0..10 {
        let mut k = HashList {
            hashes: full.clone(),
            block_size: BS,
        };
        let t = Instant::now();
        let hits = reader.query(&mut k, None);
        walk.push(t.elapsed());
        assert_eq!(hits.hits["inst-0"].device, 1_000_000);
        let mut chain = hasher.chain(BS, &tokens);
        let t = Instant::now();
        black_box(reader.query(&mut chain, None));
        hashed.push(t.elapsed());
    }
    let (walk50, _) = percentiles(walk);
    let (hashed50, _) = percentiles(hashed);
    println!(
        "query 1M tokens full hit (62,500 blocks): walk {walk50:?}; hashing + walk {hashed50:?}"
    );
    drop(reader);

    // The same rank as a window-first hybrid: its window group (2 blocks) keeps the last two
    // blocks, so the answer is the engine's fixed point over both groups, looked up block by
    // block (docs/engine-events.md, "Cache groups").
    let mut ix = ix;
    let (s, h) = engine(0, 0);
    let Holder::Engine { instance_id, .. } = h else {
        unreachable!("an engine holder")
    };
    let window = Holder::Engine {
        instance_id,
        dp_rank: 0,
        group: 1,
    };
    ix.apply(&IndexBatch {
        source: s,
        ops: vec![
            IndexOp::GroupKind {
                holder: window.clone(),
                kind: GroupKind::SlidingWindow { window: 2 * BS },
            },
            IndexOp::Store {
                holder: window,
                tier: Tier::Device,
                hashes: full[full.len() - 2..].to_vec(),
            },
        ],
    });
    let reader = ix.reader();
    let mut hybrid = Vec::new();
    for _ in 0..10 {
        let mut k = HashList {
            hashes: full.clone(),
            block_size: BS,
        };
        let t = Instant::now();
        let hits = reader.query(&mut k, None);
        hybrid.push(t.elapsed());
        assert_eq!(hits.hits["inst-0"].device, 1_000_000);
    }
    let (hybrid50, _) = percentiles(hybrid);
    println!("query 1M tokens full hit, window-first hybrid rank: walk {hybrid50:?}");

    for (pairs, k, layout) in [
        (1_000_000, 1, ""),
        (1_000_000, 2, ""),
        (1_000_000, 4, ""),
        (1_000_000, 128, ""),
        (10_000_000, 1, ""),
        (10_000_000, 4, ""),
        (1_000_000, 2, "scattered"),
        (1_000_000, 4, "scattered"),
        (1_000_000, 1, "hybrid"),
        (1_000_000, 4, "hybrid"),
        (1_000_000, 1, "hybrid-full"),
        (1_000_000, 4, "hybrid-full"),
    ] {
        let out = std::env::current_exe().ok().and_then(|exe| {
            std::process::Command::new(exe)
                .env(MEM_ENV, format!("{pairs},{k},{layout}"))
                .output()
                .ok()
        });
        let text = out
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        let f: Vec<&str> = text.split_whitespace().collect();
        if let [pairs, blocks, per] = f.as_slice() {
            println!(
                "memory: {pairs} (block, holder) pairs on {blocks} blocks ({k} holder(s)/block {layout}): {per} B/pair"
            );
        } else {
            println!("memory: {pairs} pairs, {k}/block: measurement failed ({text:?})");
        }
    }
    println!("===================");
}

fn million() -> (
    ContextIndex,
    Vec<i32>,
    mooncake_conductor::hashing::chain::BlockHasher,
) {
    let tokens: Vec<i32> = (0..1_000_000).map(|t| (mix(t) % 50_000) as i32).collect();
    let hasher = profile().hasher("", "");
    let full: Vec<BlockHash> = {
        let mut chain = hasher.chain(BS, &tokens);
        (0..chain.num_blocks()).map(|i| chain.key(i)).collect()
    };
    let mut ix = new_index();
    let (s, h) = engine(0, 0);
    store(&mut ix, &s, &h, Tier::Device, &full);
    (ix, tokens, hasher)
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("apply");
    let n = 1 << 16;
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("store_64k_blocks_ops_of_16", |b| {
        let batches = store_batches(n);
        b.iter_batched(
            new_index,
            |mut ix| {
                for batch in &batches {
                    ix.apply(batch);
                }
                ix
            },
            BatchSize::LargeInput,
        )
    });
    let shared = shared_store_batches(128, 512);
    g.throughput(Throughput::Elements(128 * 512));
    g.bench_function("store_128_holders_x_512_shared_blocks", |b| {
        b.iter_batched(
            new_index,
            |mut ix| {
                for batch in &shared {
                    ix.apply(batch);
                }
                ix
            },
            BatchSize::LargeInput,
        )
    });
    g.finish();

    let mut g = c.benchmark_group("query");
    let (sys_ix, sys_prompt) = system_prompt_fleet();
    let sys_reader = sys_ix.reader();
    g.bench_function("2k_tokens_64x2_ranks_system_prompt", |b| {
        b.iter_batched(
            || HashList {
                hashes: sys_prompt.clone(),
                block_size: BS,
            },
            |mut k| sys_reader.query(&mut k, None),
            BatchSize::SmallInput,
        )
    });
    let mut out = QueryHits::default();
    g.bench_function("2k_tokens_64x2_ranks_system_prompt_into", |b| {
        b.iter_batched(
            || HashList {
                hashes: sys_prompt.clone(),
                block_size: BS,
            },
            |mut k| sys_reader.query_into(&mut k, None, &mut out),
            BatchSize::SmallInput,
        )
    });
    let (ix, prompt) = fleet();
    let reader = ix.reader();
    g.bench_function("2k_tokens_64x2_ranks", |b| {
        b.iter_batched(
            || HashList {
                hashes: prompt.clone(),
                block_size: BS,
            },
            |mut k| reader.query(&mut k, None),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("2k_tokens_one_instance_filter", |b| {
        b.iter_batched(
            || HashList {
                hashes: prompt.clone(),
                block_size: BS,
            },
            |mut k| reader.query(&mut k, Some("inst-40")),
            BatchSize::SmallInput,
        )
    });
    let (ix, tokens, hasher) = million();
    let reader = ix.reader();
    let full: Vec<BlockHash> = {
        let mut chain = hasher.chain(BS, &tokens);
        (0..chain.num_blocks()).map(|i| chain.key(i)).collect()
    };
    g.sample_size(10);
    g.bench_function("1m_tokens_full_hit_walk", |b| {
        b.iter_batched(
            || HashList {
                hashes: full.clone(),
                block_size: BS,
            },
            |mut k| reader.query(&mut k, None),
            BatchSize::LargeInput,
        )
    });
    g.bench_function("1m_tokens_full_hit_hash_and_walk", |b| {
        b.iter(|| reader.query(&mut hasher.chain(BS, &tokens), None))
    });
    g.finish();
}

fn main() {
    if let Ok(spec) = std::env::var(MEM_ENV) {
        mem_child(&spec);
        return;
    }
    summary();
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
}
