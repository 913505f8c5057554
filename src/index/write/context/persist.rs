//! How the writer produces what a checkpoint writes ([`crate::index::ContextChanges`]) and
//! keeps the positions of its sources; [`super::restore`] rebuilds a context from the records.
//! Both read and write the writer's private structure, so they are a part of [`super`], not of
//! [`crate::durability`], which sees only the records.
//!
//! A watermark is the position of a source: the last of its batches that reached this context,
//! whether or not it had ops for it (see [`ContextIndex::advance`]). Watermarks also make
//! re-delivery harmless: after a restart the subscription replays from its source record (the
//! position the source had when the last checkpoint round began, `durability::sources`), and a
//! context skips batches at or below its own.

use std::collections::HashMap;

use crate::events::IndexBatch;
use crate::model::SubscriptionKey;

use super::{ApplyReport, ContextIndex};
use crate::index::stored::image::{ContextChanges, HolderRecord, Watermark};

/// What the store holds of a context besides its pairs and aliases, as far as its writer knows.
pub(in crate::index) struct OnDisk {
    /// Rewrite the header, holder records, listings and watermarks whole (see
    /// [`ContextChanges::full`]).
    pub(super) full: bool,
    pub(super) attachments_changed: bool,
    pub(super) watermarks: HashMap<SubscriptionKey, Watermark>,
}

impl OnDisk {
    pub(super) fn new_context() -> Self {
        OnDisk {
            full: true,
            attachments_changed: false,
            watermarks: HashMap::new(),
        }
    }
}

impl ContextIndex {
    /// Apply a publisher batch unless this context already has it (seq at or below the
    /// source's watermark, as happens when a replay after a restart overlaps the checkpoint).
    pub fn apply_sequenced(&mut self, batch: &IndexBatch, mark: Watermark) -> Option<ApplyReport> {
        if self
            .watermarks
            .get(&batch.source)
            .is_some_and(|w| mark.seq <= w.seq)
        {
            return None;
        }
        self.set_watermark(&batch.source, mark);
        Some(self.apply(batch))
    }

    /// Every batch of `source` up to `mark` has reached this context: the source published on
    /// without ops for it (they went to its other contexts, or were ignored). Without this, a
    /// context idle for longer than the publisher's replay buffer would resume its source from a
    /// batch the buffer no longer holds, and the restart would drop all of the source's blocks.
    /// An older mark changes nothing.
    pub fn advance(&mut self, source: &SubscriptionKey, mark: Watermark) {
        if self
            .watermarks
            .get(source)
            .is_some_and(|w| w.seq >= mark.seq)
        {
            return;
        }
        self.set_watermark(source, mark);
    }

    /// The source's position here; a source with a position is one this context is fed by
    /// (see `Meta::sources`), so a subscription started over recovered state keeps advancing it.
    pub(super) fn set_watermark(&mut self, source: &SubscriptionKey, mark: Watermark) {
        if let Some(w) = self.watermarks.get_mut(source) {
            *w = mark;
            return;
        }
        self.watermarks.insert(source.clone(), mark);
        if !self.shared.meta.read().sources.contains(source) {
            self.shared.meta.write().sources.insert(source.clone());
        }
    }

    pub fn watermark(&self, source: &SubscriptionKey) -> Option<Watermark> {
        self.watermarks.get(source).copied()
    }

    /// Some source has a position here: it feeds this context (which then stays, even empty,
    /// as recovery keeps it: see `durability::recovery::settle`).
    pub fn is_fed(&self) -> bool {
        !self.watermarks.is_empty()
    }

    /// Every source with a holder or a listing here, sorted.
    pub fn sources_present(&self) -> Vec<SubscriptionKey> {
        let mut all: Vec<SubscriptionKey> = self
            .holders
            .iter()
            .filter(|h| !h.vacant)
            .map(|h| h.key.source.clone())
            .chain(self.attached.keys().cloned())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// Take what changed since the last call (reclaiming idle holders first, see `holder`). If
    /// writing it fails, hand the pairs back with [`ContextIndex::mark_dirty`] so the next
    /// checkpoint writes them again.
    pub fn take_changes(&mut self) -> ContextChanges {
        self.reclaim_idle();
        let mut touched = std::mem::take(&mut self.dirty);
        // Pairs stores created since the last call: the tails of the reverse lists. A reference
        // there whose pair is gone again needs nothing: its removal was recorded in `dirty`.
        for (id, state) in self.holders.iter_mut().enumerate() {
            let id = id as u32;
            let tail = state.blocks.iter_from(state.checkpointed);
            let table = &self.shared.table;
            touched.extend(tail.filter_map(|r| table.held_key(r, id).map(|k| (id, k))));
            state.checkpointed = state.blocks.len();
        }
        touched.sort_unstable();
        touched.dedup();
        let pairs: Vec<crate::index::PairBits> = touched
            .into_iter()
            .map(|(id, block)| crate::index::PairBits {
                holder: id,
                block,
                bits: self.shared.table.read(block).holder_bits(block, id),
            })
            .collect();
        let mut repeats = Vec::new();
        for &crate::index::PairBits {
            holder: id,
            block,
            bits,
        } in &pairs
        {
            let Some(state) = self.holders.get(id as usize) else {
                continue;
            };
            if bits == 0 || state.repeats.is_empty() {
                continue;
            }
            for tier in crate::model::Tier::ALL {
                let bit = crate::index::table::tier_bit(tier);
                if let Some(&n) = state.repeats.get(&(block, bit)).filter(|_| bits & bit != 0) {
                    repeats.push((id, block, bit, n));
                }
            }
        }
        let full = std::mem::take(&mut self.on_disk.full);
        let holders = self
            .holders
            .iter_mut()
            .enumerate()
            .filter(|(_, h)| !h.vacant)
            .filter_map(|(id, h)| {
                let now = Some(h.raw_live);
                if !full && h.written == now {
                    return None;
                }
                h.written = now;
                Some(HolderRecord {
                    id: id as u32,
                    source: h.key.source.clone(),
                    holder: h.key.holder.clone(),
                    raw_pairs: now,
                    kind: h.kind,
                })
            })
            .collect();
        let mut holders_gone = std::mem::take(&mut self.holders_gone);
        holders_gone.sort_unstable();
        holders_gone.dedup();
        let mut changed = std::mem::take(&mut self.alias_dirty);
        changed.sort_unstable();
        changed.dedup();
        let current = self.shared.aliases.resolve(changed.iter().copied());
        let aliases = changed.into_iter().zip(current).collect();
        let listings_changed = std::mem::take(&mut self.on_disk.attachments_changed);
        let attachments = (full || listings_changed).then(|| self.attachments());
        let watermarks = self.watermark_changes(full);
        ContextChanges {
            key: self.key().clone(),
            profile: self.profile().clone(),
            full,
            holders,
            holders_gone,
            pairs,
            repeats,
            attachments,
            watermarks,
            aliases,
            fresh: !std::mem::replace(&mut self.persisted, true),
        }
    }

    /// The positions that differ from the ones on disk (all of them when `full`), which they
    /// then are.
    fn watermark_changes(&mut self, full: bool) -> Vec<(SubscriptionKey, Option<Watermark>)> {
        let on_disk = &self.on_disk.watermarks;
        let mut out: Vec<(SubscriptionKey, Option<Watermark>)> = self
            .watermarks
            .iter()
            .filter(|&(s, w)| full || on_disk.get(s) != Some(w))
            .map(|(s, w)| (s.clone(), Some(*w)))
            .collect();
        if !full {
            out.extend(
                on_disk
                    .keys()
                    .filter(|s| !self.watermarks.contains_key(*s))
                    .map(|s| (s.clone(), None)),
            );
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        self.on_disk.watermarks = self.watermarks.clone();
        out
    }

    /// Put pairs and aliases back for the next checkpoint (its write failed); the next one also
    /// rewrites the holders, listings and watermarks whole, whatever the failed one carried.
    pub fn mark_dirty(
        &mut self,
        pairs: impl IntoIterator<Item = (u32, u64)>,
        aliases: impl IntoIterator<Item = u64>,
        fresh: bool,
    ) {
        self.dirty.extend(pairs);
        self.alias_dirty.extend(aliases);
        self.on_disk.full = true;
        if fresh {
            self.persisted = false;
        }
    }

    /// Whether anything changed since the last [`ContextIndex::take_changes`] (holders it would
    /// reclaim aside).
    pub fn has_changes(&self) -> bool {
        !self.dirty.is_empty()
            || !self.alias_dirty.is_empty()
            || !self.holders_gone.is_empty()
            || self.on_disk.full
            || self.on_disk.attachments_changed
            || self.on_disk.watermarks != self.watermarks
            || self.holders.iter().any(|h| {
                h.checkpointed < h.blocks.len() || (!h.vacant && h.written != Some(h.raw_live))
            })
    }
}
