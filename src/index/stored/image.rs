//! The records a context hands to checkpoints and takes back at recovery; their bytes are
//! [`crate::durability::codec`]'s.
//!
//! A checkpoint of one context is what changed since the last one: the current tier bits of
//! every (holder, block) pair touched (0 = gone), the aliases changed, the holder records new,
//! changed (their raw pair count) or reclaimed, the rank listings when they changed, and per
//! source its position when it moved. All of it goes to disk in one atomic batch, so a watermark
//! is never paired with older or newer state than the one it describes. An idle context writes
//! nothing. The header and everything but the pairs and aliases are rewritten whole only for a
//! context this process created, and after a failed write (which may have carried any of it).

use sha2::{Digest, Sha256};

use crate::events::Holder;
use crate::hashing::HashProfile;
use crate::model::{ContextKey, SubscriptionKey};

/// The last publisher batch of one source that reached one context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Watermark {
    pub seq: u64,
    /// A digest of that batch's payload: after a restart, the publisher's replay of the same seq
    /// must carry the same bytes, or the publisher is another process and its old blocks are gone.
    pub digest: u64,
}

/// [`Watermark::digest`] of a publisher batch payload, stable across builds (the first 8 bytes of
/// SHA-256).
pub fn payload_digest(payload: &[u8]) -> u64 {
    let digest: [u8; 32] = Sha256::digest(payload).into();
    u64::from_be_bytes([
        digest[0], digest[1], digest[2], digest[3], digest[4], digest[5], digest[6], digest[7],
    ])
}

/// A holder as persisted: which source reported it, and the engine rank or store backend.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HolderRecord {
    pub id: u32,
    pub source: SubscriptionKey,
    pub holder: Holder,
    /// Of its pairs, those keyed by a published hash (see "Keys" in `src/index/README.md`);
    /// `None` in schema 1 records, whose pairs all are.
    pub raw_pairs: Option<u64>,
    /// The kind of an engine holder's KV-cache group (full attention in records from before
    /// schema 9, which had group 0 only).
    pub kind: crate::model::GroupKind,
}

/// Everything a checkpoint writes for one context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextChanges {
    pub key: ContextKey,
    pub profile: HashProfile,
    /// Write the header, and replace the holder records, listings and watermarks on disk by the
    /// ones here (a context this process created, or a retry after a failed write).
    pub full: bool,
    /// Holder records new or changed since the last checkpoint (all of them when `full`), in id
    /// order. A reused id's record replaces the reclaimed holder's.
    pub holders: Vec<HolderRecord>,
    /// Reclaimed holder ids whose records go (a reused one is also in `holders`).
    pub holders_gone: Vec<u32>,
    /// (holder id, block, tier bits now); bits 0 means the pair is gone.
    pub pairs: Vec<crate::index::PairBits>,
    /// (holder id, block, tier bit, announcements beyond the first) of the pairs in `pairs` that
    /// have more than one announcement in some tier, sorted like `pairs`.
    pub repeats: Vec<(u32, u64, u8, u32)>,
    /// Every (source, instance, rank) listing, sorted, when they changed (few: rewritten whole).
    pub attachments: Option<Vec<crate::index::Attachment>>,
    /// Per source whose position changed, sorted: the position, `None` for a source no longer
    /// here.
    pub watermarks: Vec<(SubscriptionKey, Option<Watermark>)>,
    /// Aliases changed since the last checkpoint: (engine hash, derived key now, `None` when
    /// dropped), sorted by hash.
    pub aliases: Vec<(u64, Option<u64>)>,
    /// The first changes of a context this process created (not recovered): the write must
    /// first delete whatever the store holds under the context's id.
    pub fresh: bool,
}

impl ContextChanges {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        !self.full
            && !self.fresh
            && self.holders.is_empty()
            && self.holders_gone.is_empty()
            && self.pairs.is_empty()
            && self.attachments.is_none()
            && self.watermarks.is_empty()
            && self.aliases.is_empty()
    }
}
