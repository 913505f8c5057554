//! Property test of order independence: an engine source (stores with and without tokens, some
//! with a parent the context never saw, removals, clears) and a Mooncake store source (objects
//! under the engine's hashes, the registered profile's and others, in two backends and both
//! shared tiers) give one index whatever the interleaving: engine first, store first, a random
//! order, and a random order with a checkpoint and restart at a random point. Each is compared
//! by its [`Dump`] and by the records its checkpoints leave, and the engine-first index with a
//! reference model of the keying rule.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use crate::events::{Holder, IndexBatch, IndexOp};
use crate::model::{SubscriptionKey, Tier};

use super::TierCounts;
use super::order_fixture::*;

#[derive(Debug, Clone)]
enum EngineOp {
    /// Blocks `from..to` with their tokens, chained to block `from - 1`.
    Chained {
        from: usize,
        to: usize,
        tier: Tier,
    },
    /// The same with a parent the context never saw (a subscriber that joined mid-stream).
    Unlinked {
        from: usize,
        to: usize,
        tier: Tier,
    },
    /// The same without tokens (the index cannot derive their keys).
    Tokenless {
        from: usize,
        to: usize,
        tier: Tier,
    },
    Remove {
        blocks: Vec<usize>,
        tier: Tier,
    },
    Clear,
}

#[derive(Debug, Clone)]
enum StoreOp {
    /// Objects named by hashes of [`pool`].
    Put {
        backend: usize,
        tier: Tier,
        hashes: Vec<usize>,
    },
    Remove {
        backend: usize,
        tier: Tier,
        hashes: Vec<usize>,
    },
    Clear {
        backend: usize,
    },
}

const BACKENDS: [&str; 2] = ["b0", "b1"];

/// What the store names objects by: the engine's hashes of the prompt's blocks, the registered
/// profile's, and hashes no block has.
fn pool() -> Vec<u64> {
    (0..N)
        .map(engine_hash)
        .chain((0..N).map(registered_hash))
        .chain([0x5555, 0x5556])
        .collect()
}

fn engine_tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(Tier::Device), Just(Tier::CpuLocal), Just(Tier::Disk)]
}

fn store_tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(Tier::CpuShare), Just(Tier::Disk)]
}

fn run_of_blocks() -> impl Strategy<Value = (usize, usize)> {
    (0..N, 1..=4usize).prop_map(|(from, len)| (from, (from + len).min(N)))
}

fn engine_op() -> impl Strategy<Value = EngineOp> {
    prop_oneof![
        6 => (run_of_blocks(), engine_tier())
            .prop_map(|((from, to), tier)| EngineOp::Chained { from, to, tier }),
        1 => (run_of_blocks(), engine_tier())
            .prop_map(|((from, to), tier)| EngineOp::Unlinked { from, to, tier }),
        1 => (run_of_blocks(), engine_tier())
            .prop_map(|((from, to), tier)| EngineOp::Tokenless { from, to, tier }),
        3 => (proptest::collection::vec(0..N, 1..4), engine_tier())
            .prop_map(|(blocks, tier)| EngineOp::Remove { blocks, tier }),
        1 => Just(EngineOp::Clear),
    ]
}

fn store_op() -> impl Strategy<Value = StoreOp> {
    let hashes = || proptest::collection::vec(0..2 * N + 2, 1..5);
    prop_oneof![
        6 => (0..2usize, store_tier(), hashes())
            .prop_map(|(backend, tier, hashes)| StoreOp::Put { backend, tier, hashes }),
        3 => (0..2usize, store_tier(), hashes())
            .prop_map(|(backend, tier, hashes)| StoreOp::Remove { backend, tier, hashes }),
        1 => (0..2usize).prop_map(|backend| StoreOp::Clear { backend }),
    ]
}

fn engine_batch(ops: &[EngineOp]) -> IndexBatch {
    let ops = ops
        .iter()
        .map(|op| match op {
            &EngineOp::Chained { from, to, tier } => chained(from, to, tier),
            &EngineOp::Unlinked { from, to, tier } => unlinked(from, to, tier),
            &EngineOp::Tokenless { from, to, tier } => IndexOp::StoreAliased {
                holder: engine(),
                tier,
                hashes: engine_hashes(from..to),
            },
            EngineOp::Remove { blocks, tier } => {
                let hashes: Vec<u64> = blocks.iter().map(|&b| engine_hash(b)).collect();
                removal(engine(), *tier, &hashes)
            }
            EngineOp::Clear => IndexOp::ClearHolder { holder: engine() },
        })
        .collect();
    batch(engine_source(), ops)
}

fn store_batch(ops: &[StoreOp]) -> IndexBatch {
    let pool = pool();
    let named = |hashes: &[usize]| -> Vec<u64> { hashes.iter().map(|&i| pool[i]).collect() };
    let ops = ops
        .iter()
        .map(|op| match op {
            StoreOp::Put {
                backend,
                tier,
                hashes,
            } => objects(BACKENDS[*backend], *tier, &named(hashes)),
            StoreOp::Remove {
                backend,
                tier,
                hashes,
            } => removal(backend_holder(*backend), *tier, &named(hashes)),
            StoreOp::Clear { backend } => IndexOp::ClearHolder {
                holder: backend_holder(*backend),
            },
        })
        .collect();
    batch(store_source(), ops)
}

fn backend_holder(i: usize) -> Holder {
    backend(BACKENDS[i])
}

/// The keying rule written plainly: announcements counted per (source, holder, tier, published
/// hash); a hash is keyed by its block's derived key once an engine store with tokens linked it
/// (its parent known, or none), whenever that was, else by itself.
#[derive(Default)]
struct Model {
    facts: BTreeMap<(SubscriptionKey, Holder, Tier, u64), u32>,
    linked: [bool; N],
    listed: bool,
}

impl Model {
    fn store(&mut self, source: SubscriptionKey, holder: Holder, tier: Tier, hashes: &[u64]) {
        for &h in hashes {
            *self
                .facts
                .entry((source.clone(), holder.clone(), tier, h))
                .or_default() += 1;
        }
    }

    fn remove(&mut self, source: SubscriptionKey, holder: Holder, tier: Tier, hashes: &[u64]) {
        for &h in hashes {
            let fact = (source.clone(), holder.clone(), tier, h);
            if let Some(n) = self.facts.get_mut(&fact) {
                *n -= 1;
                if *n == 0 {
                    self.facts.remove(&fact);
                }
            }
        }
    }

    fn clear(&mut self, holder: &Holder) {
        self.facts.retain(|f, _| &f.1 != holder);
    }

    fn engine(&mut self, ops: &[EngineOp]) {
        let hashes = |r: std::ops::Range<usize>| r.map(engine_hash).collect::<Vec<_>>();
        for op in ops {
            match op {
                &EngineOp::Chained { from, to, tier } => {
                    self.listed = true;
                    if from == 0 || self.linked[from - 1] {
                        self.linked[from..to].iter_mut().for_each(|l| *l = true);
                    }
                    self.store(engine_source(), engine(), tier, &hashes(from..to));
                }
                &EngineOp::Unlinked { from, to, tier }
                | &EngineOp::Tokenless { from, to, tier } => {
                    self.listed = true;
                    self.store(engine_source(), engine(), tier, &hashes(from..to));
                }
                EngineOp::Remove { blocks, tier } => {
                    let named: Vec<u64> = blocks.iter().map(|&b| engine_hash(b)).collect();
                    self.remove(engine_source(), engine(), *tier, &named);
                }
                EngineOp::Clear => self.clear(&engine()),
            }
        }
    }

    fn store_ops(&mut self, ops: &[StoreOp]) {
        let pool = pool();
        let named = |hashes: &[usize]| -> Vec<u64> { hashes.iter().map(|&i| pool[i]).collect() };
        for op in ops {
            match op {
                StoreOp::Put {
                    backend,
                    tier,
                    hashes,
                } => self.store(
                    store_source(),
                    backend_holder(*backend),
                    *tier,
                    &named(hashes),
                ),
                StoreOp::Remove {
                    backend,
                    tier,
                    hashes,
                } => self.remove(
                    store_source(),
                    backend_holder(*backend),
                    *tier,
                    &named(hashes),
                ),
                StoreOp::Clear { backend } => self.clear(&backend_holder(*backend)),
            }
        }
    }

    fn key(&self, hash: u64) -> u64 {
        match (0..N).find(|&i| engine_hash(i) == hash) {
            Some(i) if self.linked[i] => derived_key(i),
            _ => hash,
        }
    }

    fn held(&self) -> BTreeMap<(SubscriptionKey, Holder, Tier), BTreeMap<u64, u32>> {
        let mut out: BTreeMap<_, BTreeMap<u64, u32>> = BTreeMap::new();
        for ((s, h, t, hash), n) in &self.facts {
            *out.entry((s.clone(), h.clone(), *t))
                .or_default()
                .entry(self.key(*hash))
                .or_default() += n;
        }
        out
    }

    /// Blocks, (block, holder) pairs, pairs keyed by a published hash.
    fn counts(&self) -> (u64, u64, u64) {
        let derived: BTreeSet<u64> = (0..N).map(derived_key).collect();
        let pairs: BTreeSet<(&Holder, u64)> = self
            .facts
            .keys()
            .map(|(_, h, _, hash)| (h, self.key(*hash)))
            .collect();
        let blocks: BTreeSet<u64> = pairs.iter().map(|&(_, k)| k).collect();
        let raw = pairs.iter().filter(|(_, k)| !derived.contains(k)).count();
        (blocks.len() as u64, pairs.len() as u64, raw as u64)
    }

    /// Rank (i, 0)'s counts for a prompt whose block `c` is held when any of `names(c)` is: the
    /// walk of `docs/python-api.md`, query(), one phase after another, never back.
    fn walk(&self, n: usize, names: impl Fn(usize) -> Vec<u64>) -> Option<TierCounts> {
        if !self.listed {
            return None;
        }
        let held = |c: usize, phase: usize| {
            let names = names(c);
            // Every holder counts for rank (i, 0): its own engine holder and the store's.
            self.facts
                .keys()
                .any(|(_, _, tier, hash)| tier.index() <= phase && names.contains(&self.key(*hash)))
        };
        let mut counts = [0u64; 4];
        let mut c = 0;
        for (phase, count) in counts.iter_mut().enumerate() {
            while c < n && held(c, phase) {
                c += 1;
            }
            *count = c as u64 * u64::from(BS);
        }
        Some(TierCounts {
            device: counts[0],
            cpu_local: counts[1],
            cpu_share: counts[2],
            disk: counts[3],
        })
    }
}

/// Rank (i, 0)'s counts in an answer.
fn rank(hits: &super::QueryHits) -> Option<TierCounts> {
    hits.hits.get("i").map(|row| row.rank_matches[&0])
}

fn check(
    engine_ops: &[Vec<EngineOp>],
    store_ops: &[Vec<StoreOp>],
    order: &[bool],
    cut: usize,
    order_after: &[bool],
) -> Result<(), TestCaseError> {
    let engine: Vec<IndexBatch> = engine_ops.iter().map(|ops| engine_batch(ops)).collect();
    let store: Vec<IndexBatch> = store_ops.iter().map(|ops| store_batch(ops)).collect();
    let others: Vec<u64> = pool()[N..].to_vec();
    let finish = |ix: &mut super::ContextIndex| {
        let mut records = Records::default();
        records.checkpoint(ix);
        (dump(ix, &others), records)
    };
    let mut want_ix = index();
    interleave(&mut want_ix, &engine, &store, &[]);
    let (want, want_records) = finish(&mut want_ix);
    let want_records = want_records.canonical();

    for (what, order) in [("store first", vec![false; 64]), ("random", order.to_vec())] {
        let mut ix = index();
        interleave(&mut ix, &engine, &store, &order);
        let (got, records) = finish(&mut ix);
        prop_assert_eq!(&got, &want, "{}: dump", what);
        prop_assert_eq!(
            records.canonical(),
            want_records.clone(),
            "{}: records",
            what
        );
    }

    // A checkpoint and restart after `cut` batches of the random order, the rest in another.
    let steps = schedule(engine.len(), store.len(), order);
    let cut = cut.min(steps.len());
    let e = steps[..cut].iter().filter(|&&x| x).count();
    let s = cut - e;
    let mut before = index();
    interleave(&mut before, &engine[..e], &store[..s], &steps[..cut]);
    let mut records = Records::default();
    records.checkpoint(&mut before);
    let mut after = records.restore();
    prop_assert_eq!(
        dump(&mut after, &others),
        dump(&mut before, &others),
        "restored"
    );
    interleave(&mut after, &engine[e..], &store[s..], order_after);
    prop_assert_eq!(&dump(&mut after, &others), &want, "after a restart");
    records.checkpoint(&mut after);
    prop_assert_eq!(records.canonical(), want_records, "records after a restart");
    prop_assert_eq!(
        &dump(&mut records.restore(), &others),
        &want,
        "restored again"
    );

    // The reference model.
    let mut model = Model::default();
    engine_ops.iter().for_each(|ops| model.engine(ops));
    store_ops.iter().for_each(|ops| model.store_ops(ops));
    prop_assert_eq!(&want.held, &model.held(), "announcements by key");
    let (blocks, pairs, raw) = model.counts();
    prop_assert_eq!(
        (want.counts.0, want.counts.1, want.counts.3),
        (blocks, pairs, raw)
    );
    let registered: Vec<u64> = (0..N).map(registered_hash).collect();
    for n in 0..=N {
        let from_tokens = model.walk(n, |c| vec![derived_key(c), registered[c]]);
        prop_assert_eq!(rank(&want.answers[n]), from_tokens, "tokens, {} blocks", n);
        let by_hash = model.walk(n, |c| vec![model.key(engine_hash(c)), engine_hash(c)]);
        prop_assert_eq!(
            rank(&want.answers[N + 1 + n]),
            by_hash,
            "by hash, {} blocks",
            n
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 192, ..ProptestConfig::default() })]

    #[test]
    fn any_interleaving_of_an_engine_and_a_store_gives_one_index(
        engine_ops in proptest::collection::vec(proptest::collection::vec(engine_op(), 1..=2), 0..8),
        store_ops in proptest::collection::vec(proptest::collection::vec(store_op(), 1..=2), 0..8),
        order in proptest::collection::vec(any::<bool>(), 16),
        cut in 0..=16usize,
        order_after in proptest::collection::vec(any::<bool>(), 16),
    ) {
        check(&engine_ops, &store_ops, &order, cut, &order_after)?;
    }
}
