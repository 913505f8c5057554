//! Order independence: an engine source and a Mooncake store source that announce the same
//! blocks give the same index whatever the interleaving of their events (see "Keys" in the
//! module doc of [`super`]): same answers, counts, aliases and checkpoint records, also across
//! a checkpoint and restore between them. The fixture here is shared with the random
//! interleavings of `order_props`.

use std::collections::{BTreeMap, BTreeSet};

use crate::events::{BlockContents, Holder, IndexBatch, IndexOp};
use crate::hashing::{HashProfile, derived};
use crate::model::{BlockHash, ContextKey, SubscriptionKey, Tier};

use super::*;

pub(super) const BS: u32 = 4;
/// Blocks of the one prompt both sources announce.
pub(super) const N: usize = 10;

pub(super) fn profile() -> HashProfile {
    crate::hashing::profile::vllm_cbor_default()
}

pub(super) fn index() -> ContextIndex {
    ContextIndex::new(ContextKey::new("", "m", "", BS), profile())
}

pub(super) fn engine_source() -> SubscriptionKey {
    SubscriptionKey::new("i", "", 0)
}

pub(super) fn store_source() -> SubscriptionKey {
    SubscriptionKey::new("store", "", 0)
}

pub(super) fn engine() -> Holder {
    Holder::Engine {
        instance_id: "i".into(),
        dp_rank: 0,
    }
}

pub(super) fn backend(name: &str) -> Holder {
    Holder::Shared {
        backend_id: name.into(),
    }
}

pub(super) fn prompt() -> Vec<i32> {
    (0..N as i32 * BS as i32).map(|t| 100 + t).collect()
}

/// The engine's hash of block `i`: a recipe no registered profile reproduces (as vLLM with
/// `PYTHONHASHSEED` unset publishes), so only aliases tie it to the block's contents.
pub(super) fn engine_hash(i: usize) -> u64 {
    0xeeee_0000 + i as u64
}

pub(super) fn engine_hashes(range: std::ops::Range<usize>) -> Vec<BlockHash> {
    range.map(|i| BlockHash(engine_hash(i))).collect()
}

/// The key the index derives for block `i` of [`prompt`].
pub(super) fn derived_key(i: usize) -> u64 {
    let tokens = prompt();
    let bs = BS as usize;
    (0..=i).fold(derived::ROOT, |parent, b| {
        let block = tokens[b * bs..(b + 1) * bs].iter().map(|&t| i64::from(t));
        derived::link(parent, derived::content(block, bs, 0))
    })
}

/// The registered profile's hash of block `i` of [`prompt`]: what a store names an object by
/// when its engine hashed with the registered recipe.
pub(super) fn registered_hash(i: usize) -> u64 {
    let hasher = profile().hasher("", "");
    let tokens = prompt();
    hasher.chain(BS, &tokens).try_key(i).expect("a complete block").0
}

/// An engine event storing blocks `from..to` with their tokens, chained to block `from - 1`.
pub(super) fn chained(from: usize, to: usize, tier: Tier) -> IndexOp {
    let tokens = prompt();
    let bs = BS as usize;
    let digests = (from..to)
        .map(|b| {
            let block = tokens[b * bs..(b + 1) * bs].iter().map(|&t| i64::from(t));
            derived::content(block, bs, 0)
        })
        .collect();
    IndexOp::StoreChained {
        holder: engine(),
        tier,
        hashes: engine_hashes(from..to),
        contents: BlockContents {
            parent: (from > 0).then(|| BlockHash(engine_hash(from - 1))),
            root: derived::ROOT,
            digests,
        },
    }
}

/// Store objects named by published hashes.
pub(super) fn objects(name: &str, tier: Tier, hashes: &[u64]) -> IndexOp {
    IndexOp::StoreAliased {
        holder: backend(name),
        tier,
        hashes: hashes.iter().map(|&h| BlockHash(h)).collect(),
    }
}

pub(super) fn removal(holder: Holder, tier: Tier, hashes: &[u64]) -> IndexOp {
    IndexOp::Remove {
        holder,
        tier,
        hashes: hashes.iter().map(|&h| BlockHash(h)).collect(),
    }
}

pub(super) fn batch(source: SubscriptionKey, ops: Vec<IndexOp>) -> IndexBatch {
    IndexBatch { source, ops }
}

/// Which source each of `e + s` batches comes from (true: the engine) when `order` picks the next
/// one: its choices in turn, the other source once one has none left, engine first after it ends.
pub(super) fn schedule(e: usize, s: usize, order: &[bool]) -> Vec<bool> {
    let (mut e, mut s) = (e, s);
    let mut choices = order.iter().copied();
    let mut out = Vec::with_capacity(e + s);
    while e + s > 0 {
        let engine = match choices.next() {
            Some(pick) => (pick && e > 0) || s == 0,
            None => e > 0,
        };
        if engine {
            e -= 1;
        } else {
            s -= 1;
        }
        out.push(engine);
    }
    out
}

/// Apply two sources' batches in the interleaving `order` names (see [`schedule`]).
pub(super) fn interleave(
    ix: &mut ContextIndex,
    engine: &[IndexBatch],
    store: &[IndexBatch],
    order: &[bool],
) {
    let (mut e, mut s) = (engine.iter(), store.iter());
    for from_engine in schedule(engine.len(), store.len(), order) {
        let next = if from_engine { e.next() } else { s.next() };
        if let Some(b) = next {
            ix.apply(b);
        }
    }
}

/// Every interleaving of `a` batches of one source with `b` of another.
pub(super) fn interleavings(a: usize, b: usize) -> Vec<Vec<bool>> {
    if a == 0 || b == 0 {
        return vec![vec![a > 0; a + b]];
    }
    let mut out = Vec::new();
    for mut rest in interleavings(a - 1, b) {
        rest.insert(0, true);
        out.push(rest);
    }
    for mut rest in interleavings(a, b - 1) {
        rest.insert(0, false);
        out.push(rest);
    }
    out
}

/// Everything a client or a checkpoint can tell about a context, holder ids aside (they are
/// numbered in order of first appearance).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Dump {
    pub view: ContextView,
    /// Blocks, (block, holder) pairs, holders, pairs keyed by a published hash.
    pub counts: (u64, u64, u64, u64),
    /// Per (source, holder, tier): table key → announcements.
    pub held: BTreeMap<(SubscriptionKey, Holder, Tier), BTreeMap<u64, u32>>,
    pub aliases: Vec<(u64, u64)>,
    /// Every prefix of the prompt, from tokens and by the engine's hashes; then the store's
    /// other hashes by hash.
    pub answers: Vec<QueryHits>,
}

/// The [`Dump`] of `ix` after reclaiming idle holders (which only a checkpoint does otherwise).
pub(super) fn dump(ix: &mut ContextIndex, other_hashes: &[u64]) -> Dump {
    ix.reclaim_idle();
    let snapshot = ContextSnapshot::of(ix);
    let mut held: BTreeMap<_, BTreeMap<u64, u32>> = BTreeMap::new();
    for b in &snapshot.batches {
        for op in &b.ops {
            if let IndexOp::Store {
                holder,
                tier,
                hashes,
            } = op
            {
                let keys = held
                    .entry((b.source.clone(), holder.clone(), *tier))
                    .or_default();
                hashes.iter().for_each(|h| *keys.entry(h.0).or_default() += 1);
            }
        }
    }
    let tokens = prompt();
    let reader = ix.reader();
    let mut answers: Vec<QueryHits> = (0..=N)
        .map(|n| reader.query_tokens(&tokens[..n * BS as usize], "", None))
        .collect();
    answers.extend((0..=N).map(|n| {
        let hashes: Vec<u64> = (0..n).map(engine_hash).collect();
        reader.query_hashes(&hashes, None)
    }));
    answers.push(reader.query_hashes(other_hashes, None));
    let s = ix.stats();
    Dump {
        view: ix.view(),
        counts: (s.blocks, s.holder_blocks, s.holders, s.raw_pairs),
        held,
        aliases: snapshot.aliases,
        answers,
    }
}

/// What a store holds of one context after the checkpoints written to it, as
/// `durability::checkpoint` writes them (a pair's record carries its repeat counts).
#[derive(Default)]
pub(super) struct Records {
    holders: BTreeMap<u32, HolderRecord>,
    attachments: Vec<Attachment>,
    pairs: BTreeMap<(u32, u64), u8>,
    repeats: BTreeMap<(u32, u64, u8), u32>,
    aliases: BTreeMap<u64, u64>,
    key: Option<(ContextKey, HashProfile)>,
}

/// [`Records`] with holder ids replaced by the holders they name.
pub(super) type CanonicalRecords = (
    BTreeSet<(SubscriptionKey, Holder, Option<u64>)>,
    Vec<Attachment>,
    BTreeSet<(SubscriptionKey, Holder, u64, u8)>,
    BTreeSet<(SubscriptionKey, Holder, u64, u8, u32)>,
    BTreeMap<u64, u64>,
);

impl Records {
    /// Take `ix`'s changes and write them.
    pub(super) fn checkpoint(&mut self, ix: &mut ContextIndex) -> ContextChanges {
        let changes = ix.take_changes();
        self.write(&changes);
        changes
    }

    fn write(&mut self, c: &ContextChanges) {
        if c.fresh {
            *self = Records::default();
        }
        self.key = Some((c.key.clone(), c.profile.clone()));
        if c.full {
            self.holders.clear();
        }
        for id in &c.holders_gone {
            self.holders.remove(id);
        }
        for h in &c.holders {
            self.holders.insert(h.id, h.clone());
        }
        if let Some(a) = &c.attachments {
            self.attachments = a.clone();
        }
        for p in &c.pairs {
            self.repeats
                .retain(|&(h, b, _), _| (h, b) != (p.holder, p.block));
            if p.bits == 0 {
                self.pairs.remove(&(p.holder, p.block));
            } else {
                self.pairs.insert((p.holder, p.block), p.bits);
            }
        }
        for &(h, b, bit, n) in &c.repeats {
            self.repeats.insert((h, b, bit), n);
        }
        for &(hash, key) in &c.aliases {
            match key {
                Some(key) => self.aliases.insert(hash, key),
                None => self.aliases.remove(&hash),
            };
        }
    }

    pub(super) fn canonical(&self) -> CanonicalRecords {
        let who = |id: u32| {
            let h = &self.holders[&id];
            (h.source.clone(), h.holder.clone())
        };
        (
            self.holders
                .values()
                .map(|h| (h.source.clone(), h.holder.clone(), h.raw_pairs))
                .collect(),
            self.attachments.clone(),
            self.pairs
                .iter()
                .map(|(&(id, block), &bits)| {
                    let (s, h) = who(id);
                    (s, h, block, bits)
                })
                .collect(),
            self.repeats
                .iter()
                .map(|(&(id, block, bit), &n)| {
                    let (s, h) = who(id);
                    (s, h, block, bit, n)
                })
                .collect(),
            self.aliases.clone(),
        )
    }

    /// The context a restart rebuilds from these records.
    pub(super) fn restore(&self) -> ContextIndex {
        let (key, profile) = self.key.clone().expect("a checkpoint was written");
        let mut r = Restorer::new(key, profile);
        for h in self.holders.values() {
            assert!(r.holder(h), "holder record {h:?}");
        }
        for a in &self.attachments {
            r.attach(&a.source, &a.instance_id, a.dp_rank);
        }
        r.aliases(self.aliases.iter().map(|(&h, &k)| (h, k)).collect());
        for (&(id, block), &bits) in &self.pairs {
            assert!(r.pair(id, block, bits));
        }
        for (&(id, block, bit), &n) in &self.repeats {
            assert!(r.repeat(id, block, bit, n));
        }
        r.finish()
    }
}

/// The store's other hashes the dumps also query.
fn others() -> Vec<u64> {
    vec![registered_hash(5), registered_hash(6), 0x5555]
}

/// Both sources' batches for the unit cases: the engine stores the prompt on device, evicts
/// its tail and moves a block to local CPU; the store holds objects under the engine's hashes
/// (announced twice, in two tiers, one removed), one under the registered profile's hash and one
/// no engine announces.
fn sources() -> (Vec<IndexBatch>, Vec<IndexBatch>) {
    let e = |ops| batch(engine_source(), ops);
    let s = |ops| batch(store_source(), ops);
    let h = engine_hash;
    let engine = vec![
        e(vec![chained(0, 4, Tier::Device)]),
        e(vec![
            chained(4, 8, Tier::Device),
            removal(engine(), Tier::Device, &[h(6), h(7)]),
        ]),
        e(vec![
            removal(engine(), Tier::Device, &[h(5)]),
            chained(5, 6, Tier::CpuLocal),
        ]),
    ];
    let store = vec![
        s(vec![objects("b0", Tier::CpuShare, &[h(0), h(1), h(2)])]),
        s(vec![
            objects("b0", Tier::CpuShare, &[h(2), h(3), h(6)]),
            objects("b1", Tier::Disk, &[h(6), h(7), registered_hash(8)]),
        ]),
        s(vec![
            removal(backend("b0"), Tier::CpuShare, &[h(2)]),
            objects("b0", Tier::CpuShare, &[h(7), 0x5555]),
        ]),
        s(vec![removal(backend("b1"), Tier::Disk, &[h(7)])]),
    ];
    (engine, store)
}

/// Engine first: every store object names a block whose alias exists.
fn engine_first() -> ContextIndex {
    let (engine, store) = sources();
    let mut ix = index();
    interleave(&mut ix, &engine, &store, &[true; 3]);
    ix
}

#[test]
fn a_store_object_before_its_engine_block_is_the_same_block() {
    let h = engine_hash;
    let run = |engine_first: bool| {
        let mut ix = index();
        let engine = [batch(
            engine_source(),
            vec![
                chained(0, 4, Tier::Device),
                removal(engine(), Tier::Device, &[h(2), h(3)]),
            ],
        )];
        let store = [batch(
            store_source(),
            vec![objects("b0", Tier::CpuShare, &[h(0), h(1), h(2), h(3)])],
        )];
        interleave(&mut ix, &engine, &store, &[engine_first]);
        ix
    };
    let (mut a, mut b) = (run(true), run(false));
    for ix in [&a, &b] {
        assert_eq!(ix.prefix_count(), 4, "four blocks, whoever announced first");
        assert_eq!(ix.stats().holder_blocks, 6);
        let hits = ix.reader().query_tokens(&prompt()[..16], "", None);
        let rank = hits.hits["i"].rank_matches[&0];
        assert_eq!((rank.device, rank.cpu_share), (8, 16));
    }
    assert_eq!(dump(&mut a, &[]), dump(&mut b, &[]));
}

#[test]
fn every_interleaving_of_two_sources_gives_the_same_index() {
    let (engine, store) = sources();
    let mut want = engine_first();
    let want_dump = dump(&mut want, &others());
    let mut want_records = Records::default();
    want_records.checkpoint(&mut want);
    let orders = interleavings(engine.len(), store.len());
    assert_eq!(orders.len(), 35);
    for order in orders {
        let mut ix = index();
        interleave(&mut ix, &engine, &store, &order);
        assert_eq!(dump(&mut ix, &others()), want_dump, "order {order:?}");
        let mut records = Records::default();
        records.checkpoint(&mut ix);
        assert_eq!(
            records.canonical(),
            want_records.canonical(),
            "order {order:?}"
        );
    }
    // What the sources left: blocks 0-1 on device and in b0, 2-4 on device (3 in b0 too),
    // 5 in local CPU, 6 in b0 and b1, 7 in b0, and the two objects no engine block names.
    let held = &want_dump.held;
    let key = derived_key;
    let b0 = &held[&(store_source(), backend("b0"), Tier::CpuShare)];
    let want_b0: BTreeMap<u64, u32> = [0, 1, 2, 3, 6, 7]
        .map(key)
        .into_iter()
        .chain([0x5555])
        .map(|k| (k, 1))
        .collect();
    assert_eq!(b0, &want_b0, "block 2 announced twice, removed once");
    let b1 = &held[&(store_source(), backend("b1"), Tier::Disk)];
    assert_eq!(b1.keys().copied().collect::<Vec<_>>(), {
        let mut k = vec![key(6), registered_hash(8)];
        k.sort_unstable();
        k
    });
    assert_eq!(want_dump.counts.3, 2, "two pairs under published hashes");
}

#[test]
fn an_engine_block_stored_unlinked_and_linked_is_one_pair_in_either_order() {
    // The same engine's blocks 2-3 once without a known parent (as after joining mid-stream)
    // and once chained; a second engine source (another rank's subscription) links them.
    let other = SubscriptionKey::new("j", "", 0);
    let other_engine = Holder::Engine {
        instance_id: "j".into(),
        dp_rank: 0,
    };
    let unlinked = || {
        let IndexOp::StoreChained {
            hashes, contents, ..
        } = chained(2, 4, Tier::Device)
        else {
            unreachable!()
        };
        IndexOp::StoreChained {
            holder: engine(),
            tier: Tier::Device,
            hashes,
            contents: BlockContents {
                parent: Some(BlockHash(0xdead)),
                ..contents
            },
        }
    };
    let linked = |holder: Holder| {
        let IndexOp::StoreChained {
            hashes, contents, ..
        } = chained(0, 4, Tier::Device)
        else {
            unreachable!()
        };
        IndexOp::StoreChained {
            holder,
            tier: Tier::Device,
            hashes,
            contents,
        }
    };
    let a = [batch(engine_source(), vec![unlinked()])];
    let b = [batch(other.clone(), vec![linked(other_engine.clone())])];
    let mut dumps = Vec::new();
    for order in interleavings(1, 1) {
        let mut ix = index();
        interleave(&mut ix, &a, &b, &order);
        assert_eq!(ix.prefix_count(), 4, "order {order:?}");
        assert_eq!(ix.stats().raw_pairs, 0, "order {order:?}");
        dumps.push(dump(&mut ix, &[]));
    }
    assert_eq!(dumps[0], dumps[1]);
    // One holder, its unlinked and its linked announcements of one block: two announcements of
    // one pair, so two removals take it away.
    let mut ix = index();
    ix.apply(&batch(engine_source(), vec![unlinked()]));
    ix.apply(&batch(engine_source(), vec![linked(engine())]));
    assert_eq!((ix.prefix_count(), ix.stats().holder_blocks), (4, 4));
    assert_eq!(ix.announcements(0, derived_key(2), table::DEVICE), 2);
    for left in [4, 3] {
        ix.apply(&batch(
            engine_source(),
            vec![removal(engine(), Tier::Device, &[engine_hash(2)])],
        ));
        assert_eq!(ix.stats().holder_blocks, left);
    }
}

#[test]
fn a_restart_between_the_sources_gives_the_uninterrupted_index() {
    let (engine, store) = sources();
    let mut want = engine_first();
    let want_dump = dump(&mut want, &others());
    let mut want_records = Records::default();
    want_records.checkpoint(&mut want);
    for order in [[false, false, true, false], [false, true, false, false]] {
        // The first four batches, a checkpoint, a restart from its records, then the rest in
        // the other order.
        let mut before = index();
        let taken: Vec<bool> = order.to_vec();
        let (e, s) = (
            taken.iter().filter(|&&x| x).count(),
            taken.iter().filter(|&&x| !x).count(),
        );
        interleave(&mut before, &engine[..e], &store[..s], &taken);
        let mut records = Records::default();
        records.checkpoint(&mut before);
        let mut after = records.restore();
        assert_eq!(dump(&mut after, &others()), dump(&mut before, &others()));
        interleave(&mut after, &engine[e..], &store[s..], &[true; 3]);
        assert_eq!(dump(&mut after, &others()), want_dump, "order {order:?}");
        records.checkpoint(&mut after);
        assert_eq!(records.canonical(), want_records.canonical());
        assert_eq!(dump(&mut records.restore(), &others()), want_dump);
    }
}

#[test]
fn re_keying_writes_only_the_pairs_it_moved() {
    let mut ix = index();
    // A large context of objects no engine names, and four that an engine names later.
    let unrelated: Vec<u64> = (0..2000).map(|i| 0x7000_0000 + i).collect();
    ix.apply(&batch(
        store_source(),
        vec![
            objects("b0", Tier::CpuShare, &unrelated),
            objects("b0", Tier::CpuShare, &engine_hashes(0..4).iter().map(|h| h.0).collect::<Vec<_>>()),
        ],
    ));
    let mut records = Records::default();
    records.checkpoint(&mut ix);
    ix.apply(&batch(engine_source(), vec![chained(0, 4, Tier::Device)]));
    let changes = records.checkpoint(&mut ix);
    // The engine's four pairs, and per moved pair its old key going and its new one coming.
    assert_eq!(changes.pairs.len(), 4 + 2 * 4);
    assert_eq!(changes.aliases.len(), 4);
    assert_eq!(ix.stats().raw_pairs, 2000);
    assert_eq!(dump(&mut records.restore(), &[]), dump(&mut ix, &[]));
}
