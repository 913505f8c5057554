//! How a context interns its holders and reclaims the idle ones (the holder records themselves,
//! and the id allocator, are `crate::index::write::holder`'s).

use crate::events::Holder;
use crate::index::table::MAX_HOLDERS;
use crate::index::write::holder::{HolderKey, HolderState};
use crate::model::{GroupKind, SubscriptionKey};

use super::ContextIndex;

/// Holders of a source [`ContextIndex::listed_holder`] compares before hashing the whole key.
const LISTED_SCAN: usize = 8;

impl ContextIndex {
    /// The id of `holder` reported by `source`, interned on first use: a reclaimed id whose old
    /// plans are gone, else the next one. `None` when the table is at its id limit.
    pub(in crate::index) fn intern(
        &mut self,
        source: &SubscriptionKey,
        holder: &Holder,
    ) -> Option<u32> {
        if let Some(id) = self.listed_holder(source, holder) {
            return Some(id);
        }
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
                group,
            } = holder
            {
                let ranks = meta.ranks.entry(instance_id.clone()).or_default();
                ranks.entry(*dp_rank).or_default().holders.push(id);
                super::groups::set_layout(&mut meta.groups, id, *group, GroupKind::Full);
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

    /// The id of `holder` of `source` when it is among the first [`LISTED_SCAN`] holders the
    /// source reported. Every batch looks its holder up: this spares it a clone and a hash of
    /// the whole key (engines report one holder per source). Exact: `by_source` lists every id
    /// `holder_ids` names for the source, and a reclaimed id is vacant or has another key.
    pub(in crate::index) fn listed_holder(
        &self,
        source: &SubscriptionKey,
        holder: &Holder,
    ) -> Option<u32> {
        let ids = self.by_source.get(source)?;
        ids.iter().take(LISTED_SCAN).copied().find(|&id| {
            self.holders
                .get(id as usize)
                .is_some_and(|state| !state.vacant && state.key.holder == *holder)
        })
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
                ..
            } => !self
                .attached
                .get(&state.key.source)
                .is_some_and(|l| l.iter().any(|(i, r)| i == instance_id && r == dp_rank)),
        }
    }

    /// Reclaim every holder that owns nothing and that no source lists (see [`crate::index::write::holder::FreeIds`]), so
    /// holders of instances long gone stay in no checkpoint and no plan. Returns how many.
    pub(in crate::index) fn reclaim_idle(&mut self) -> usize {
        let ids: Vec<u32> = (0..self.holders.len() as u32)
            .filter(|&id| self.reclaimable(id))
            .collect();
        self.reclaim(&ids);
        ids.len()
    }

    /// Reclaim the holders of `source` that can go (after it detached: all of them).
    pub(in crate::index) fn reclaim_source(&mut self, source: &SubscriptionKey) {
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
                meta.groups.remove(&id);
                if let Holder::Engine {
                    instance_id,
                    dp_rank,
                    ..
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
