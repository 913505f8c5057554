//! What a context's single writer shares with any number of concurrent readers.

use crate::hashing::derived::ChainTuning;
use std::sync::atomic::AtomicU64;

use crate::cache_line::CacheLine;

use crate::hashing::HashProfile;
use crate::model::ContextKey;

use super::aliases::Aliases;
use super::plan::MetaLock;
use super::table::Table;

/// State shared between the single writer ([`super::ContextIndex`]) and any number of readers.
/// The counters the writer updates per batch, and `raw_pairs` which every query reads, each sit
/// on their own cache lines (see [`CacheLine`]).
pub(crate) struct Shared {
    pub key: ContextKey,
    pub profile: HashProfile,
    /// What this context's derived keys are made with (see [`ChainTuning`]).
    pub tuning: ChainTuning,
    pub table: Table,
    /// Registered ranks and the holder ids behind each (instance, rank); small, read once per
    /// query to fetch the walk's plan.
    pub meta: MetaLock,
    /// Distinct blocks (in any tier). Written only by the writer; relaxed is enough for metrics
    /// and the global view, which are point-in-time figures anyway.
    pub blocks: CacheLine<AtomicU64>,
    /// (block, holder) pairs.
    pub holder_blocks: CacheLine<AtomicU64>,
    /// Ops refused as invalid (e.g. an engine storing into cpu_share), counted not failed.
    pub invalid_ops: CacheLine<AtomicU64>,
    /// Engine hash → derived key.
    pub aliases: Aliases,
    /// Pairs keyed by a published hash rather than a derived key (see "Keys" in
    /// `src/index/README.md`): while there are any, a query from tokens also walks the
    /// registered profile's chain.
    pub raw_pairs: CacheLine<AtomicU64>,
    /// Blocks whose contents came with an unknown parent, so they are keyed by their hash (or
    /// its alias's key, see "Order of sources" in `src/index/README.md`).
    pub unlinked: CacheLine<AtomicU64>,
    /// Blocks the memory budget evicted (see `context::evict`).
    pub evicted: CacheLine<AtomicU64>,
}
