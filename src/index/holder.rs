//! One context's holders as its writer keeps them: who each one is, the per-holder state stores
//! and removes maintain (reverse list, live and raw pair counts, repeat counts), and how ids are
//! given out and reclaimed.
//!
//! A holder that owns nothing and whose rank no source lists (an instance unregistered, a store
//! backend emptied) is reclaimed: it leaves the metadata, the query plan and the next
//! checkpoint, and its id goes to a later holder once no running query can still route it (see
//! [`FreeIds`]). So months of instances coming and going leave the holder table, the plans and
//! the checkpoints the size of the holders that exist.

use std::collections::HashMap;
use std::sync::Weak;

use crate::events::Holder;
use crate::model::SubscriptionKey;

use super::context::ContextIndex;
use super::plan::Plan;
use super::refs::RefList;
use super::table::MAX_HOLDERS;

/// A holder as identified inside one context: engine (instance, rank) or store backend, always
/// qualified by the subscription that reported it, so dropping a source drops exactly its blocks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct HolderKey {
    pub(super) source: SubscriptionKey,
    pub(super) holder: Holder,
}

pub(super) struct HolderState {
    pub(super) key: HolderKey,
    /// Blocks this holder has an entry on.
    pub(super) live: u64,
    /// Of `live`, blocks keyed by a published hash (see "Keys" in the module doc).
    pub(super) raw_live: u64,
    /// Reverse index: the blocks this holder was added to, as table references (4 bytes where a
    /// key would take 8). Removals leave stale references behind (checked against the table when
    /// used: a reference may outlive its block and name a later one) and the list is compacted
    /// once stale ones outnumber live ones, so remove/clear/drop cost O(blocks the holder owns),
    /// amortized. Chunked ([`RefList`]) so that growing never copies the list or leaves freed
    /// buffers behind.
    pub(super) blocks: RefList,
    /// `blocks[checkpointed..]` joined since the last checkpoint took its changes: they are part
    /// of the change set without a second copy in `ContextIndex::dirty` (see `persist`).
    pub(super) checkpointed: usize,
    /// Announcements beyond the first, per (block, tier bit): engines do not deduplicate (see
    /// "Repeated announcements" in the module doc), so a block stored twice stays held after one
    /// removal. Only counts above one live here; the table's tier bit is the first copy, so the
    /// common count of one costs nothing.
    pub(super) repeats: HashMap<(u64, u8), u32>,
    /// No holder has this id (reclaimed, or left free by a reclaim before the checkpoint that
    /// was recovered); its id is in [`FreeIds`].
    pub(super) vacant: bool,
    /// The `raw_pairs` of this holder's record on disk; `None` while no record of it is written.
    pub(super) written: Option<u64>,
}

impl HolderState {
    pub(super) fn new(key: HolderKey) -> Self {
        HolderState {
            key,
            live: 0,
            raw_live: 0,
            blocks: RefList::default(),
            checkpointed: 0,
            repeats: HashMap::new(),
            vacant: false,
            written: None,
        }
    }

    /// The slot of an id no holder has (reclaimed before a checkpoint, see [`FreeIds`]).
    pub(super) fn vacant() -> Self {
        let mut state = HolderState::new(HolderKey {
            source: SubscriptionKey::new("", "", 0),
            holder: Holder::Shared {
                backend_id: String::new(),
            },
        });
        state.vacant = true;
        state
    }
}

/// Ids of reclaimed holders and when each may name another holder.
///
/// A query walks with the plan it fetched at its start, which routes table entries by holder id
/// (`plan`). An id that named holder A in that plan must not name a new holder B while the walk
/// runs, or B's blocks would count for A's cursor. So a reclaimed id waits until every plan that
/// was alive right after its reclaim has been dropped: plans built later never route it (the
/// reclaim removed it from the metadata first), and the cached plan itself went with that
/// metadata change, so only walks already running can hold the others.
#[derive(Default)]
pub(super) struct FreeIds {
    ready: Vec<u32>,
    waiting: Vec<(u32, Vec<Weak<Plan>>)>,
}

impl FreeIds {
    /// An id that may be given to a new holder, if any.
    pub(super) fn take(&mut self) -> Option<u32> {
        if self.ready.is_empty() {
            let FreeIds { ready, waiting } = self;
            waiting.retain(|(id, plans)| {
                let done = plans.iter().all(|p| p.strong_count() == 0);
                if done {
                    ready.push(*id);
                }
                !done
            });
        }
        self.ready.pop()
    }

    /// `id` was reclaimed; `plans` were alive right after the reclaim's metadata change.
    pub(super) fn release(&mut self, id: u32, plans: Vec<Weak<Plan>>) {
        if plans.is_empty() {
            self.ready.push(id);
        } else {
            self.waiting.push((id, plans));
        }
    }

    /// A slot left vacant before the last checkpoint: no plan of this process ever routed it.
    pub(super) fn vacant_at_recovery(&mut self, id: u32) {
        self.ready.push(id);
    }
}

impl ContextIndex {
    /// The id of `holder` reported by `source`, interned on first use: a reclaimed id whose old
    /// plans are gone, else the next one. `None` when the table is at its id limit.
    pub(super) fn intern(&mut self, source: &SubscriptionKey, holder: &Holder) -> Option<u32> {
        let key = HolderKey {
            source: source.clone(),
            holder: holder.clone(),
        };
        if let Some(&id) = self.holder_ids.get(&key) {
            return Some(id);
        }
        let reused = self.free_ids.take();
        if reused.is_none() && self.holders.len() >= MAX_HOLDERS {
            return None;
        }
        let id = reused.unwrap_or(self.holders.len() as u32);
        {
            let mut meta = self.shared.meta.write();
            let shared = matches!(holder, Holder::Shared { .. });
            match meta.shared.get_mut(id as usize) {
                Some(slot) => *slot = shared,
                None => meta.shared.push(shared),
            }
            meta.holders += 1;
            if !meta.sources.contains(source) {
                meta.sources.insert(source.clone());
            }
            if let Holder::Engine {
                instance_id,
                dp_rank,
            } = holder
            {
                let ranks = meta.ranks.entry(instance_id.clone()).or_default();
                ranks.entry(*dp_rank).or_default().holders.push(id);
            }
        }
        let state = HolderState::new(key.clone());
        match self.holders.get_mut(id as usize) {
            Some(slot) => *slot = state,
            None => self.holders.push(state),
        }
        self.holder_ids.insert(key, id);
        self.by_source.entry(source.clone()).or_default().push(id);
        Some(id)
    }

    /// Whether holder `id` can go: it owns nothing, and it is not an engine rank its source
    /// lists (a registered rank keeps its holder, which will store again; an adapter context's
    /// rank stays listed by the engine source that stored there until that source detaches).
    fn reclaimable(&self, id: u32) -> bool {
        let Some(state) = self.holders.get(id as usize) else {
            return false;
        };
        if state.vacant || state.live > 0 || !state.repeats.is_empty() {
            return false;
        }
        match &state.key.holder {
            Holder::Shared { .. } => true,
            Holder::Engine {
                instance_id,
                dp_rank,
            } => !self
                .attached
                .get(&state.key.source)
                .is_some_and(|l| l.iter().any(|(i, r)| i == instance_id && r == dp_rank)),
        }
    }

    /// Reclaim every holder that owns nothing and that no source lists (see [`FreeIds`]), so
    /// holders of instances long gone stay in no checkpoint and no plan. Returns how many.
    pub(super) fn reclaim_idle(&mut self) -> usize {
        let ids: Vec<u32> = (0..self.holders.len() as u32)
            .filter(|&id| self.reclaimable(id))
            .collect();
        self.reclaim(&ids);
        ids.len()
    }

    /// Reclaim the holders of `source` that can go (after it detached: all of them).
    pub(super) fn reclaim_source(&mut self, source: &SubscriptionKey) {
        let ids: Vec<u32> = self
            .by_source
            .get(source)
            .map(|ids| {
                ids.iter()
                    .copied()
                    .filter(|&id| self.reclaimable(id))
                    .collect()
            })
            .unwrap_or_default();
        self.reclaim(&ids);
    }

    fn reclaim(&mut self, ids: &[u32]) {
        if ids.is_empty() {
            return;
        }
        {
            let mut meta = self.shared.meta.write();
            for &id in ids {
                let state = &mut self.holders[id as usize];
                self.holder_ids.remove(&state.key);
                if let Some(list) = self.by_source.get_mut(&state.key.source) {
                    list.retain(|&i| i != id);
                    if list.is_empty() {
                        self.by_source.remove(&state.key.source);
                    }
                }
                if let Some(slot) = meta.shared.get_mut(id as usize) {
                    *slot = false;
                }
                meta.holders = meta.holders.saturating_sub(1);
                if let Holder::Engine {
                    instance_id,
                    dp_rank,
                } = &state.key.holder
                    && let Some(ranks) = meta.ranks.get_mut(instance_id)
                {
                    if let Some(entry) = ranks.get_mut(dp_rank) {
                        entry.holders.retain(|&h| h != id);
                        if !entry.listed() && entry.holders.is_empty() {
                            ranks.remove(dp_rank);
                        }
                    }
                    if ranks.is_empty() {
                        meta.ranks.remove(instance_id);
                    }
                }
                // Its record goes at the next checkpoint (a delete of one never written is free).
                self.holders_gone.push(id);
                // Stale references only: the holder owns nothing.
                *state = HolderState::vacant();
            }
        }
        // Plans built from here on route none of these ids; the ones alive now may be in a walk.
        let plans = self.shared.meta.plans_alive();
        for &id in ids {
            self.free_ids.release(id, plans.clone());
        }
    }
}
