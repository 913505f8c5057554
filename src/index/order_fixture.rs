//! The fixture of the order-independence tests (`order_tests`, `order_props`): one prompt that an
//! engine source and a Mooncake store source announce, their events, interleavings of the two,
//! and what is compared: a [`Dump`] of everything a client can ask, and the [`Records`] the
//! checkpoints leave in a store.

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
        group: 0,
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
    hasher
        .chain(BS, &tokens)
        .try_key(i)
        .expect("a complete block")
        .0
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

/// [`chained`] with a parent the context never saw, as a subscriber that joined mid-stream
/// receives it.
pub(super) fn unlinked(from: usize, to: usize, tier: Tier) -> IndexOp {
    let IndexOp::StoreChained {
        holder,
        hashes,
        contents,
        ..
    } = chained(from, to, tier)
    else {
        unreachable!("chained() makes a chained store")
    };
    IndexOp::StoreChained {
        holder,
        tier,
        hashes,
        contents: BlockContents {
            parent: Some(BlockHash(0xdead)),
            ..contents
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
                hashes
                    .iter()
                    .for_each(|h| *keys.entry(h.0).or_default() += 1);
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
            r.holder(h)
                .unwrap_or_else(|e| panic!("holder record {h:?}: {e}"));
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
