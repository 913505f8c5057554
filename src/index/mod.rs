//! Per-context prefix indexes.
//!
//! # Layout
//!
//! - [`context`]: [`ContextIndex`], the plain struct that is a context's single writer (apply
//!   batches, attach/detach sources, snapshots). Unit-tested without any runtime.
//! - `table`: the sharded block table, 64-bit block key → compact holder set (one inline entry,
//!   or the value of an interned set shared by every block with the same entries).
//! - `plan`: the walk's plan and answer template, cached until the metadata changes.
//! - [`query`]: the prefix walk and the answer types ([`QueryHits`], [`HashList`]).
//! - [`handle`]: [`IndexReader`], the read handle queries and the global view use.
//! - [`actor`]: [`ContextActor`], a thin actix shell forwarding one call per message, and
//!   [`ContextHandle`] (its address plus the read handle).
//!
//! # Data model
//!
//! A holder is an engine (instance, rank) or a store backend, each qualified by the subscription
//! (source) that reported it: `Holder::Engine{instance, rank}` from source S and
//! `Holder::Shared{backend_id}` from S are interned once as a `u32` holder id (never reused
//! within a context, so a query's plan stays valid while it walks). A block key maps to a small
//! set of `holder_id << 4 | tier bits` entries: inline for one holder, else a 32-bit id of an
//! interned, immutable, refcounted set of sorted entries, the same id for every block with the
//! same entries (see "Interned holder sets" below). Engines hold
//! device, cpu_local and (rank-local) disk; store backends hold cpu_share and (shared) disk; a
//! store into any other tier is counted in `invalid_ops` and ignored. Each holder keeps a
//! reverse list of its blocks (32-bit table references), so remove, clear, drop-source and detach
//! cost O(blocks that holder owns), never a scan of the context. Stores and removes have set
//! semantics.
//!
//! A rank is listed (reported in `instances()` and queried) while at least one source attached
//! it: a registration via `attach_rank`, or an engine source storing blocks for it (which covers
//! adapter contexts fed by a base registration). `drop_source` keeps the listing,
//! `detach_source` removes it.
//!
//! # Query semantics (`spec/python-api.md` query())
//!
//! For each selected instance (all, or the filter) and each listed rank, one cursor walks the
//! prompt's blocks in four phases, device → cpu_local → cpu_share → disk, never going back. A
//! phase accepts block `c` when the block is held in that phase's tier *or any earlier one*,
//! counting for this rank: device and cpu_local (and engine disk) of the rank's own (instance,
//! rank) holders, cpu_share and disk of any store backend in the context. The cursor stays in the
//! earliest phase that accepts the block; a phase that rejects it ends with the count
//! `covered(c)` and the next phase tries the same block. After the disk phase rejects a block,
//! nothing later counts. So each phase's count is the longest prefix made only of blocks
//! available from that tier or an earlier one, which is exactly what the response fields mean
//! ("prefix tokens accessible using device and local CPU memory", …), and the counts are
//! cumulative: `device <= cpu_local <= cpu_share <= disk`.
//!
//! Why an earlier tier also satisfies a later phase: the reference's walk tests only the phase's
//! own tier, so a prompt `[device, cpu, device]` would report cpu = 2 blocks although all three
//! blocks are loadable from device or local CPU memory. With nested tier sets the cursor still
//! never goes back (the sets grow with the phase), every count keeps its documented meaning, and
//! a block in several tiers is still consumed once, by the earliest phase that accepts it.
//!
//! Instance figures are the max over the instance's ranks, `dp[rank]` is the rank's device
//! count, `longest_matched = disk`; listed ranks without any match appear with zeros. Token
//! counts come from `PrefixKeys::covered`, so complete-block (`vllm_v1`), partial-final-block
//! (`sglang`) and bigram-position (`sglang_bigram`) counting need nothing here. An unknown
//! filter or an empty prompt answers without error and without creating state. Rank keys are
//! `u32` in [`InstanceHits`]; transports render them as decimal strings.
//!
//! # Reads do not wait for writes, and hashing never runs under a lock
//!
//! The walk is block-major: all live cursors advance together, so block `i` is hashed (by
//! `PrefixKeys::key(i)`) once, and only when some cursor still needs it; when every cursor has
//! stopped, no further key is requested and the lazy chain never hashes the tail. Each block
//! lookup takes the read lock of one of 64 table shards for the duration of the map probe (and,
//! when the block's set differs from the previous block's, the read of that set's entries under
//! the set lists' lock, which the writer takes only to add or free a set), and releases it before
//! the next `key(i + 1)` call; fetching the cached plan takes the small metadata lock once.
//! Hashing therefore never holds a lock, and the writer (one actor per context) is blocked at
//! most for a single block probe.
//!
//! A query thus reads each block at the moment it gets there rather than one consistent
//! snapshot; it is never torn inside a block. This is the same freshness a snapshot taken at
//! query start would have, and it costs nothing on the write path.
//!
//! Alternatives considered: a single `RwLock` around the map would make every concurrent reader
//! bounce one cache line per block; holding one lock for the whole walk would put hashing under
//! the lock (the reference's weakness); hashing in growing batches before locking wastes hashes
//! past the first miss; copy-on-write snapshots would cost a copy per write batch on a map of
//! millions of blocks. Measured with `benches/index.rs` (release, 2 shared cores): a full-hit walk
//! costs about 40 ns per block including the shard lock (1M tokens, 62,500 blocks: ~2.5 ms, while
//! hashing them costs ~10 ms), and a 2k-token query over 64 instances x 2 ranks takes ~85 us at
//! p50 alone and 86-114 us with a writer applying ~8 M block ops/s to the same context.

pub mod actor;
pub mod context;
pub mod handle;
pub mod persist;
mod plan;
pub mod query;
mod refs;
mod table;

#[cfg(test)]
mod model_check;
#[cfg(test)]
mod tests;

pub use actor::{
    ApplyBatch, AttachRank, ContextActor, ContextHandle, DetachOutcome, DetachSource, DropSource,
    GetStats, Snapshot,
};
pub use context::{ApplyReport, ContextIndex, ContextSnapshot};
pub use handle::{ContextView, IndexReader, IndexStats};
pub use persist::{ContextChanges, HolderRecord, Restorer, Watermark};
pub use query::{HashList, InstanceHits, QueryHits, TierCounts};
