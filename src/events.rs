//! Normalized events: what the wire decoders produce and what the index consumes.
//!
//! Layout of the flow: `wire::*` turns a publisher payload into a [`DecodedBatch`] of [`KvEvent`]s
//! (hashes already projected to [`BlockHash`], media already mapped to [`Tier`]); the subscription
//! turns those into one [`IndexBatch`] per context and hands it to that context's single writer.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::model::{BlockHash, GroupKind, SubscriptionKey, Tier};

/// Token ids a `BlockStored` carried, kept for the runtime hash-profile check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventTokens {
    /// One id per token (vLLM, SGLang).
    Flat(Vec<i64>),
    /// SGLang EAGLE/bigram keys: one `(t[i], t[i+1])` pair per logical position.
    Bigram(Vec<(i64, i64)>),
}

/// Blocks an engine (vLLM / SGLang) stored on one of its own tiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineStored {
    pub hashes: Vec<BlockHash>,
    pub parent: Option<BlockHash>,
    pub tokens: Option<EventTokens>,
    /// Tokens (or bigram positions) per block in this event.
    pub block_size: u32,
    /// The adapter named by the event; `None`/`""` means the base model.
    pub lora_name: Option<String>,
    /// SGLang's `cache_salt`, or the salt vLLM puts in the first block's extra keys.
    pub cache_salt: Option<String>,
    /// Per block, a digest of its other extra keys (multimodal items, prompt embeddings), 0 for
    /// none; empty when no block has any. They keep such blocks apart from plain ones.
    pub extras: Vec<u64>,
    /// Whether the event says everything besides its tokens and adapter that entered its hashes:
    /// SGLang's schema writes `cache_salt` whenever it is set, vLLM's `extra_keys` is optional
    /// and an event without it (absent or `nil`) leaves a salt or other extras unsaid. Blocks
    /// of an event that does not carry them are keyed by derived keys only when the registered
    /// profile proves them plain (`docs/engine-events.md`, "Events without their extras").
    pub extras_carried: bool,
    pub tier: Tier,
    /// The KV-cache group (`group_idx`, 0 when absent) and its kind.
    pub group: CacheGroup,
}

/// One KV-cache group of an engine: vLLM numbers its groups from 0 (group 0 is the kind of the
/// model's first layer) and names each group's kind on its stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CacheGroup {
    pub idx: u32,
    pub kind: GroupKind,
}

/// Blocks an engine evicted from one of its tiers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineRemoved {
    pub hashes: Vec<BlockHash>,
    pub tier: Tier,
    /// The KV-cache group (`group_idx`, 0 when absent).
    pub group: u32,
}

/// A Mooncake store object event (RFC #1527 maps). The context comes from the event itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreObject {
    pub backend_id: String,
    pub object_key: String,
    pub tenant_id: String,
    pub model_name: Option<String>,
    pub lora_name: Option<String>,
    pub block_size: Option<u32>,
    /// `CpuShare` or `Disk`.
    pub tier: Tier,
    pub hashes: Vec<BlockHash>,
}

/// One decoded, admitted event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    Stored(EngineStored),
    Removed(EngineRemoved),
    /// The engine dropped its whole prefix cache (`AllBlocksCleared`).
    AllCleared,
    StoreStored(StoreObject),
    StoreRemoved(StoreObject),
    /// The store dropped everything of one backend for one tenant.
    StoreCleared {
        backend_id: String,
        tenant_id: String,
    },
}

/// Why an event was skipped on purpose (counted, never an error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IgnoreReason {
    /// A medium that maps to no tier.
    UnknownMedium,
    /// A KV-cache group the registration's `cache_group` leaves out, or beyond the most one
    /// engine may have (`MAX_CACHE_GROUPS`).
    OtherCacheGroup,
    /// An adapter other than the one a LoRA-specific registration accepts.
    OtherLora,
    /// A `BlockStored` whose block size differs from the registration's.
    BlockSizeMismatch,
    /// A store event without the model or block size that would name its context.
    NoContext,
}

impl IgnoreReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            IgnoreReason::UnknownMedium => "unknown_medium",
            IgnoreReason::OtherCacheGroup => "other_cache_group",
            IgnoreReason::OtherLora => "other_lora",
            IgnoreReason::BlockSizeMismatch => "block_size_mismatch",
            IgnoreReason::NoContext => "no_context",
        }
    }
}

/// One decoded payload. Bad events are reported in `invalid` and skipped; their siblings stay in
/// `events`, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DecodedBatch {
    /// The batch timestamp (seconds for engines, milliseconds for the Mooncake store).
    pub ts: f64,
    /// The DP rank the publisher stamped on the batch, if any.
    pub dp_rank: Option<u32>,
    pub events: Vec<KvEvent>,
    pub ignored: Vec<IgnoreReason>,
    /// One message per rejected event, naming its index and the offending field.
    pub invalid: Vec<String>,
}

/// The most KV-cache groups one engine may have: hybrid models have a handful (one per layer
/// kind, or per n:1 pattern); a group index beyond it is ignored and counted.
pub const MAX_CACHE_GROUPS: u32 = 64;

/// Who holds a block, as the ingestion layer names it. Inside a context, an engine holder is one
/// (instance, rank, KV-cache group); a shared holder is one store backend as reported by one
/// subscription. Group 0 of a single-group model is the holder of every model before hybrids.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Holder {
    Engine {
        instance_id: String,
        dp_rank: u32,
        group: u32,
    },
    Shared {
        backend_id: String,
    },
}

/// What lets the index key published blocks itself (`hashing::derived`): the blocks' contents
/// and the engine's hash of the block before them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockContents {
    /// The engine's hash of the block before the first, `None` at the start of a sequence.
    pub parent: Option<BlockHash>,
    /// `derived::root(salt)`: the parent key when `parent` is `None`.
    pub root: u64,
    /// One `derived::content` digest per published hash, in order.
    pub digests: Vec<u64>,
}

/// One change to a context index. Stores are counted: storing a block twice needs two removes
/// before it goes (see `index`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IndexOp {
    /// Blocks keyed by the given 64-bit hashes themselves (as the registered profile computes
    /// them; also what a snapshot replays).
    Store {
        holder: Holder,
        tier: Tier,
        hashes: Vec<BlockHash>,
    },
    /// Engine blocks with their contents: keyed by the key the index derives, with `hashes`
    /// kept as aliases. A parent the index never saw leaves the blocks keyed by `hashes`.
    StoreChained {
        holder: Holder,
        tier: Tier,
        hashes: Vec<BlockHash>,
        contents: BlockContents,
    },
    /// Blocks named by published hashes only (store objects, engine events without tokens):
    /// keyed by the derived key an alias names, else by the hash.
    StoreAliased {
        holder: Holder,
        tier: Tier,
        hashes: Vec<BlockHash>,
    },
    /// Published hashes, resolved like `StoreAliased`.
    Remove {
        holder: Holder,
        tier: Tier,
        hashes: Vec<BlockHash>,
    },
    /// Remove every block of this holder in every tier.
    ClearHolder { holder: Holder },
    /// The kind of an engine holder's KV-cache group, as its stores name it (the default is
    /// full attention): the answer applies that kind's reuse rule to the holder's blocks.
    GroupKind { holder: Holder, kind: GroupKind },
    /// Blocks of a group that skips some blocks of the range it stores (a sliding window's or a
    /// Mamba group's null blocks): keyed like `StoreChained` over the whole range, and stored
    /// only where `present` says.
    StoreSparse {
        holder: Holder,
        tier: Tier,
        hashes: Vec<BlockHash>,
        contents: BlockContents,
        present: Vec<bool>,
    },
}

/// Everything one subscription changes in one context for one publisher batch, applied in order
/// by the context's single writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexBatch {
    pub source: SubscriptionKey,
    pub ops: Vec<IndexOp>,
}

/// A count of messages sent and not yet handled: each [`InFlightGuard`] counts one until it is
/// dropped (with the message it travels in, once handled).
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<AtomicU64>);

impl InFlight {
    pub fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }

    pub fn guard(&self) -> InFlightGuard {
        self.0.fetch_add(1, Ordering::Relaxed);
        InFlightGuard(self.0.clone())
    }
}

#[derive(Debug)]
pub struct InFlightGuard(Arc<AtomicU64>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}
