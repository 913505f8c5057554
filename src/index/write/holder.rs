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
use crate::model::{GroupKind, SubscriptionKey};

use super::refs::RefList;
use crate::index::plan::Plan;
use crate::index::table::BlockRef;

/// A holder as identified inside one context: engine (instance, rank) or store backend, always
/// qualified by the subscription that reported it, so dropping a source drops exactly its blocks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(in crate::index) struct HolderKey {
    pub(in crate::index) source: SubscriptionKey,
    pub(in crate::index) holder: Holder,
}

pub(in crate::index) struct HolderState {
    pub(in crate::index) key: HolderKey,
    /// Blocks this holder has an entry on.
    pub(in crate::index) live: u64,
    /// Of `live`, blocks keyed by a published hash (see "Keys" in `src/index/README.md`).
    pub(in crate::index) raw_live: u64,
    /// Reverse index: the blocks this holder was added to, as table references (4 bytes where a
    /// key would take 8). Removals leave stale references behind (checked against the table when
    /// used: a reference may outlive its block and name a later one) and the list is compacted
    /// once stale ones outnumber live ones, so remove/clear/drop cost O(blocks the holder owns),
    /// amortized. Chunked ([`RefList`]) so that growing never copies the list or leaves freed
    /// buffers behind.
    pub(in crate::index) blocks: RefList,
    /// References of `blocks` whose pairs went since the list was last compacted (a removal's,
    /// an eviction's, a rekey's `Removed::at`): the list sheds them by subtraction, without a
    /// table lookup per reference (see [`RefList::compact_without`]).
    pub(in crate::index) gone: Vec<BlockRef>,
    /// `blocks[checkpointed..]` joined since the last checkpoint took its changes: they are part
    /// of the change set without a second copy in `ContextIndex::dirty` (see `persist`).
    pub(in crate::index) checkpointed: usize,
    /// Announcements beyond the first, per (block, tier bit): engines do not deduplicate (see
    /// "Repeated announcements" in `src/index/README.md`), so a block stored twice stays held
    /// after one removal. Only counts above one live here; the table's tier bit is the first
    /// copy, so the common count of one costs nothing.
    pub(in crate::index) repeats: HashMap<(u64, u8), u32>,
    /// No holder has this id (reclaimed, or left free by a reclaim before the checkpoint that
    /// was recovered); its id is in [`FreeIds`].
    pub(in crate::index) vacant: bool,
    /// The `raw_pairs` of this holder's record on disk; `None` while no record of it is written
    /// (or while its group kind changed since it was).
    pub(in crate::index) written: Option<u64>,
    /// The kind of an engine holder's KV-cache group (full attention unless its stores said
    /// otherwise; see `IndexOp::GroupKind`).
    pub(in crate::index) kind: GroupKind,
}

impl HolderState {
    pub(in crate::index) fn new(key: HolderKey) -> Self {
        HolderState {
            key,
            live: 0,
            raw_live: 0,
            blocks: RefList::default(),
            gone: Vec::new(),
            checkpointed: 0,
            repeats: HashMap::new(),
            vacant: false,
            written: None,
            kind: GroupKind::Full,
        }
    }

    /// The slot of an id no holder has (reclaimed before a checkpoint, see [`FreeIds`]).
    pub(in crate::index) fn vacant() -> Self {
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
pub(in crate::index) struct FreeIds {
    ready: Vec<u32>,
    waiting: Vec<(u32, Vec<Weak<Plan>>)>,
}

impl FreeIds {
    /// An id that may be given to a new holder, if any.
    pub(in crate::index) fn take(&mut self) -> Option<u32> {
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
    pub(in crate::index) fn release(&mut self, id: u32, plans: Vec<Weak<Plan>>) {
        if plans.is_empty() {
            self.ready.push(id);
        } else {
            self.waiting.push((id, plans));
        }
    }

    /// A slot left vacant before the last checkpoint: no plan of this process ever routed it.
    pub(in crate::index) fn vacant_at_recovery(&mut self, id: u32) {
        self.ready.push(id);
    }
}
