//! Per-context prefix indexes.
//!
//! # Layout
//!
//! - [`context`]: [`ContextIndex`], the plain struct that is a context's single writer (apply
//!   batches, attach/detach sources, snapshots). Unit-tested without any runtime.
//! - `table`: the sharded block table, 64-bit block key → compact holder set.
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
//! set of `holder_id << 4 | tier bits` entries, inline for one holder. Engines hold
//! device, cpu_local and (rank-local) disk; store backends hold cpu_share and (shared) disk; a
//! store into any other tier is counted in `invalid_ops` and ignored. Each holder keeps a
//! reverse list of its blocks (32-bit table references), so remove, clear, drop-source and detach
//! cost O(blocks that holder owns), never a scan of the context.
//!
//! # Keys
//!
//! Engine blocks are keyed by a key the index derives from what the event publishes
//! ([`crate::hashing::derived`]): the parent's derived key linked with the block's content (its
//! token ids, their count, and extras such as multimodal items), starting at a root that carries
//! the cache salt. The engine's own hashes become aliases (`aliases`: engine hash → derived key,
//! one map per context, persisted): removals, the parent of the next event, Mooncake store
//! objects and queries by hash name blocks by them. So an answer is exact whatever recipe the
//! engine hashes with (vLLM with `PYTHONHASHSEED` unset, a LoRA path, SGLang's adapter
//! namespace), and a query from tokens costs one fast multiply chain per block instead of
//! SHA-256.
//!
//! A block the index cannot derive is kept under its published hash ("raw"): an event whose
//! parent this context never saw (a subscriber that joined mid-stream; guessing the parent would
//! risk a false hit), a store object whose hash has no alias yet, and schema 1 data. Those keys
//! are what the registered profile computes when it matches the engine, so while any raw pair
//! exists (`Shared::raw_pairs`, counted per holder) a query from tokens also walks the
//! registered profile's chain as each block's second key ([`crate::hashing::PrefixKeys::alt_key`])
//! and a block counts when held under either. Raw and derived keys are both 64-bit and meet only
//! by a 2^-64 chance.
//!
//! # Repeated announcements
//!
//! Stores and removes are counted per (holder, tier, block), not merged: a store adds one, a
//! remove takes one away, and the holder holds the block in that tier while its count is above
//! zero; clearing or dropping a holder resets its counts. vLLM's block pool does not deduplicate
//! (two identical prompts scheduled together both cache, and so both announce, the same hashes;
//! evicting one copy announces a removal while the other copy stays usable), and its offloading
//! tiers re-announce shared hashes and leave the counting to consumers; `src/wire/README.md` has
//! the rule of each publisher. The table keeps one tier bit per (holder, block), which is the
//! first announcement; only counts above one are kept, in a per-holder side map
//! (`HolderState::repeats`), so the common count of one costs no memory. Checkpoints write a
//! count beside a pair's tier bits only when it is above one.
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
//! lookup takes the read lock of one of 64 table shards for the duration of the map probe and the
//! scan of that block's few entries, and releases it before the next `key(i + 1)` call; planning
//! the query takes the small metadata lock once. Hashing therefore never holds a lock, and the
//! writer (one actor per context) is blocked at most for a single block probe.
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
mod aliases;
pub mod context;
pub mod handle;
mod keying;
pub mod persist;
mod prompt_keys;
pub mod query;
mod refs;
mod table;

#[cfg(test)]
mod keys_tests;
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
