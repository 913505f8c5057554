//! The memory budget's side of a context (see "Memory budget" in `docs/durability.md`): the
//! eviction order of its blocks, its charge in the shared [`Budget`], and eviction itself, which
//! removes a block for every holder at once and records each removed pair for the next
//! checkpoint like any removal, so that a restart finds the index as small as it was.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::ContextIndex;
use crate::index::budget::{self, Budget, Charge};
use crate::index::table::{ALL_TIERS, entry_bits, entry_id};
use crate::index::write::evict_order::EvictOrder;
use crate::index::write::store_run::StoreRun;

/// Keys in the eviction order beyond twice the blocks before it drops removed ones.
const ORDER_SLACK: usize = 4096;

/// What a context under a budget keeps (none without one: an unbounded context pays nothing).
pub(in crate::index) struct Bounded {
    charge: Charge,
    order: EvictOrder,
    /// Keys to evict, reused from round to round.
    victims: Vec<u64>,
    /// (holder id, block, tier bits) of the victims, reused.
    entries: Vec<(u32, u64, u8)>,
}

impl ContextIndex {
    /// Bound this context by `budget` (a service's contexts share one): from now on it keeps
    /// the order its blocks go in, charges its estimate, and evicts past either bound, at once
    /// if it is already past one (a context recovered under a smaller bound). Blocks it already
    /// holds have no recorded age: they go first, in table order.
    pub fn set_budget(&mut self, budget: Arc<Budget>) {
        if !budget.is_bounded() {
            self.bounded = None;
            return;
        }
        self.bounded = Some(Bounded {
            charge: Charge::new(budget),
            order: self.order_of_table(),
            victims: Vec::new(),
            entries: Vec::new(),
        });
        self.enforce_budget();
    }

    /// Blocks evicted from this context by the budget.
    pub fn evicted(&self) -> u64 {
        self.shared.evicted.load(Ordering::Relaxed)
    }

    /// Every block of the table as unlinked runs, one per shard, in table order.
    fn order_of_table(&self) -> EvictOrder {
        let mut order = EvictOrder::default();
        for shard in self.shared.table.shards() {
            let mut keys: Vec<u64> = Vec::new();
            // A block of several holders comes once per entry, one after the other.
            shard.for_each(|key, _| {
                if keys.last() != Some(&key) {
                    keys.push(key)
                }
            });
            order.push_run(keys, None, None);
        }
        order
    }

    /// Whether stores must record the runs they make new (see `StoreRun::track`).
    pub(super) fn tracks_order(&self) -> bool {
        self.bounded.is_some()
    }

    /// Append the runs the applied stores of `run` made new to the eviction order.
    pub(super) fn order_new_runs(&mut self, run: &mut StoreRun) {
        let Some(bounded) = self.bounded.as_mut() else {
            return;
        };
        run.take_new_runs(|keys, last, parent| bounded.order.push_run(keys, last, parent));
    }

    /// Charge this context's estimate and evict down to the low-water mark of a bound it is
    /// past (see [`Budget::target`]).
    pub(super) fn enforce_budget(&mut self) {
        let Some(bounded) = self.bounded.as_mut() else {
            return;
        };
        let shared = &self.shared;
        let blocks = shared.blocks.load(Ordering::Relaxed);
        let pairs = shared.holder_blocks.load(Ordering::Relaxed);
        bounded.charge.set(budget::estimate(blocks, pairs));
        let target = bounded.charge.budget.target(blocks, bounded.charge.bytes());
        if bounded.order.len() > 2 * blocks as usize + ORDER_SLACK {
            let table = &shared.table;
            bounded.order.compact(|k| table.contains(k));
        }
        let Some((target, bound)) = target else {
            return;
        };
        let mut victims = std::mem::take(&mut bounded.victims);
        let mut evicted = 0;
        let mut rebuilt = false;
        loop {
            let blocks = self.shared.blocks.load(Ordering::Relaxed);
            if blocks <= target {
                break;
            }
            let Some(bounded) = self.bounded.as_mut() else {
                break;
            };
            bounded
                .order
                .next_victims((blocks - target) as usize, &mut victims);
            if victims.is_empty() {
                // Blocks the order does not list (moved by a re-key): list the table once more.
                if rebuilt {
                    break;
                }
                rebuilt = true;
                let order = self.order_of_table();
                if let Some(bounded) = self.bounded.as_mut() {
                    bounded.order = order;
                }
                continue;
            }
            evicted += self.evict_keys(&victims);
        }
        let shared = &self.shared;
        shared.evicted.fetch_add(evicted, Ordering::Relaxed);
        let (blocks, pairs) = (
            shared.blocks.load(Ordering::Relaxed),
            shared.holder_blocks.load(Ordering::Relaxed),
        );
        if let Some(bounded) = self.bounded.as_mut() {
            bounded.victims = victims;
            bounded.charge.set(budget::estimate(blocks, pairs));
            (bounded.charge.budget).note_evicted(&shared.key, evicted, bound);
        }
    }

    /// Remove every holder's every tier (and every repeated announcement) from each block of
    /// `keys` that the table holds; returns the blocks removed. Each removed pair is recorded for
    /// the next checkpoint, as a removal's is. A later removal of such a block finds nothing and
    /// changes nothing; a later store makes it new again.
    fn evict_keys(&mut self, keys: &[u64]) -> u64 {
        let Some(bounded) = self.bounded.as_mut() else {
            return 0;
        };
        let mut entries = std::mem::take(&mut bounded.entries);
        entries.clear();
        let table = &self.shared.table;
        for &key in keys {
            table
                .read(key)
                .visit(key, |e| entries.push((entry_id(e), key, entry_bits(e))));
        }
        let mut w = table.writer();
        let (mut gone_blocks, mut gone_pairs, mut gone_raw) = (0u64, 0u64, 0u64);
        for &(id, key, bits) in &entries {
            let (removed, at) = table.remove_at(&mut w, key, id, bits);
            self.dirty.push((id, key));
            gone_blocks += u64::from(removed.block_gone);
            let Some(state) = self.holders.get_mut(id as usize) else {
                continue;
            };
            if !state.repeats.is_empty() {
                for bit in (0..4)
                    .map(|i| 1u8 << i)
                    .filter(|b| bits & b & ALL_TIERS != 0)
                {
                    state.repeats.remove(&(key, bit));
                }
            }
            if removed.holder_gone {
                state.gone.push(at);
                gone_pairs += 1;
                state.live = state.live.saturating_sub(1);
                // Whether this pair was keyed by a published hash is not kept per pair: the
                // holder's count stays as it was unless it now exceeds what it holds, so a query
                // keeps walking the registered chain beside the derived one rather than miss.
                if state.raw_live > state.live {
                    gone_raw += state.raw_live - state.live;
                    state.raw_live = state.live;
                }
            }
        }
        drop(w);
        let shared = &self.shared;
        shared.raw_pairs.fetch_sub(gone_raw, Ordering::Relaxed);
        shared.blocks.fetch_sub(gone_blocks, Ordering::Relaxed);
        shared
            .holder_blocks
            .fetch_sub(gone_pairs, Ordering::Relaxed);
        let mut ids: Vec<u32> = entries.iter().map(|&(id, _, _)| id).collect();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            self.compact_refs(id);
        }
        if let Some(bounded) = self.bounded.as_mut() {
            bounded.entries = entries;
        }
        gone_blocks
    }
}
