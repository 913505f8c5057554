//! Per-context prefix indexes: one writer per context ([`ContextIndex`], driven by its
//! [`ContextActor`]) and any number of readers ([`IndexReader`]) whose block lookups take no
//! lock.
//!
//! The design (data model, keys, segments, the block table and its lock-free readers, holder
//! sets, aliases, order of sources, query semantics, the walk, apply, memory budget,
//! persistence records), a map of every file, and the numbered invariants with the test that
//! checks each are in `README.md` in this folder (`src/index/README.md`); measurements are in
//! `docs/performance.md`.
//!
//! Entry points: [`ContextIndex::apply`] (the writer), [`IndexReader::query_tokens`],
//! [`IndexReader::query_hashes`] and [`IndexReader::query_into`] (readers), [`Restorer`]
//! (rebuilding a context from checkpoint records), [`ContextDirectory`] (every live context).

pub mod actor;
mod alias_table;
mod aliases;
mod answer;
pub mod budget;
pub mod context;
mod cursors;
pub mod directory;
mod evict_order;
pub mod export;
pub mod handle;
mod holder;
mod image;
mod keying;
mod lookahead;
mod plan;
mod prompt_keys;
pub mod query;
mod records;
mod refs;
mod shared;
mod snapshot;
pub mod sorted_map;
mod store_run;
mod table;

#[cfg(test)]
mod keys_tests;
#[cfg(test)]
mod model_check;
#[cfg(test)]
mod order_fixture;
#[cfg(test)]
mod order_props;
#[cfg(test)]
mod order_tests;
#[cfg(test)]
mod tests;

pub use actor::{
    ApplyBatch, AttachRank, ContextActor, ContextHandle, DetachOutcome, DetachSource, DropSource,
    GetStats, Snapshot,
};
pub use answer::{InstanceHits, QueryHits, TierCounts};
pub use budget::Budget;
pub use context::restore::{AliasLoader, PairBatch, Restorer};
pub use context::{ApplyReport, ContextIndex};
pub use directory::{ArbiterPool, ContextDirectory, ProfileConflict};
pub use handle::{ContextView, IndexReader, IndexStats};
pub use image::{ContextChanges, HolderRecord, Watermark, payload_digest};
pub use query::HashList;
pub use records::{Attachment, PairBits};
pub use snapshot::ContextSnapshot;
pub use sorted_map::SortedMap;
