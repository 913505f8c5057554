//! One context's holders as its writer keeps them: who each one is, and the per-holder state
//! stores and removes maintain (reverse list, live and raw pair counts, repeat counts).

use std::collections::HashMap;

use crate::events::Holder;
use crate::model::SubscriptionKey;

use super::refs::RefList;

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
}
