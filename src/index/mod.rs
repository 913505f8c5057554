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
//!
//! Layers, lowest first: a file uses only its own layer or earlier ones, which
//! `scripts/check-deps.py` checks.
//! - [`table`], [`alias_table`], [`aliases`], [`budget`], [`sorted_map`]: the block table, the
//!   alias map, the memory bounds, the map answers are built in
//! - [`answer`]: the answer types
//! - [`plan`]: the context's metadata and the walk's cached plan and answer template
//! - [`shared`]: what the writer shares with its readers
//! - [`read`]: the query walk
//! - [`write`], [`stored`]: the single writer, and the records it hands to checkpoints and
//!   snapshots (each needs the other: a context produces its records, an export reads a context)
//! - [`actor`]: the actor shell of a context and its messages
//! - [`directory`]: every live context

pub mod actor;
mod alias_table;
mod aliases;
mod answer;
pub mod budget;
pub mod directory;
mod plan;
pub(crate) mod read;
mod shared;
pub mod sorted_map;
pub(crate) mod stored;
mod table;
pub(crate) mod write;

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
    GetGroups, GetStats, Snapshot,
};
pub use answer::{AnswerView, Certainty, FlatAnswer, InstanceHits, QueryHits, RowView, TierCounts};
pub use budget::Budget;
pub use directory::{ArbiterPool, ContextDirectory, ProfileConflict};
pub use plan::{GroupLayout, RankStatus};
pub use read::handle::{ContextView, IndexReader, IndexStats};
pub use read::query::HashList;
pub use sorted_map::SortedMap;
pub use stored::image::{ContextChanges, HolderRecord, Watermark, payload_digest};
pub use stored::records::{Attachment, PairBits};
pub use stored::snapshot::ContextSnapshot;
pub use write::context::groups::GroupCount;
pub use write::context::restore::{AliasLoader, PairBatch, Restorer};
pub use write::context::{ApplyReport, ContextIndex};

// The public modules keep their paths (`crate::index::query`, ...).
pub use read::{handle, query};
pub use stored::export;
pub use write::context;
