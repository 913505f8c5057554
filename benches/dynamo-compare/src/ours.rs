//! Everything that touches mooncake-conductor's API, in one place: how the workload's blocks get
//! our 64-bit keys, how engine events become index ops, and how a query is asked and read back.
//!
//! Engines publish their blocks' hashes under the registered hash profile (`vllm_v1`,
//! `sha256_cbor`, the low 64 bits of each chained digest) together with each block's token ids
//! and the parent's hash, as vLLM's `BlockStored` does; the index keys the blocks by the keys it
//! derives from those tokens and keeps the published hashes as aliases (removals name blocks by
//! them). A query from raw tokens derives the same keys; the "precomputed keys" figures walk
//! the derived keys computed ahead of time.

use mooncake_conductor::events::{BlockContents, Holder, IndexBatch, IndexOp};
use mooncake_conductor::gateway::grpc_wire::QueryReply;
use mooncake_conductor::gateway::pb;
use mooncake_conductor::hashing::chain::BlockHasher;
use mooncake_conductor::hashing::derived::{self, BlockRule, DerivedChain};
use mooncake_conductor::hashing::{HashProfile, PrefixKeys};
use mooncake_conductor::index::{ContextIndex, HashList, IndexReader, QueryHits};
use mooncake_conductor::model::{BlockHash, ContextKey, SubscriptionKey, Tier};

use prost::Message;

use crate::workload::{BLOCK_SIZE, Event, PublisherBatch, instance_of, rank_of};

/// One prompt's blocks as an engine publishes them, computed once from its tokens: the
/// published hashes and each block's content digest.
pub struct PromptKeys {
    hashes: Vec<BlockHash>,
    contents: Vec<u64>,
}

/// A query's keys computed ahead of time (the "by precomputed keys" figures).
pub struct QueryKeys(HashList);

/// One publisher batch as our index takes it.
pub struct Batch(IndexBatch);

pub struct Ours {
    index: ContextIndex,
    reader: IndexReader,
    hasher: BlockHasher,
    /// Per holder: the subscription that reports it and the holder it names.
    holders: Vec<(SubscriptionKey, Holder)>,
}

fn instance_id(instance: usize) -> String {
    format!("inst-{instance}")
}

impl Ours {
    /// An index of one context with `holders` ranks registered.
    pub fn new(holders: usize) -> Self {
        let profile = HashProfile::resolve(
            Some("vllm_v1"),
            Some("sha256_cbor"),
            Some("0"),
            Some("low64_be"),
        )
        .expect("the vllm_v1 / sha256_cbor profile is valid");
        let hasher = profile.hasher("", "");
        let mut index = ContextIndex::new(
            ContextKey::new("", "bench-model", "", BLOCK_SIZE as u32),
            profile,
        );
        let holders: Vec<(SubscriptionKey, Holder)> = (0..holders)
            .map(|h| {
                let id = instance_id(instance_of(h));
                let rank = rank_of(h) as u32;
                (
                    SubscriptionKey::new(&id, "", rank),
                    Holder::Engine {
                        instance_id: id,
                        dp_rank: rank, group: 0 },
                )
            })
            .collect();
        // The registrations: every rank is listed (and answered, with zeros) from the start.
        for (source, holder) in &holders {
            if let Holder::Engine {
                instance_id,
                dp_rank, .. } = holder
            {
                index.attach_rank(source, instance_id, *dp_rank);
            }
        }
        let reader = index.reader();
        Ours {
            index,
            reader,
            hasher,
            holders,
        }
    }

    /// [`Ours::new`] under a memory budget (see "Memory budget" in `docs/durability.md`): the
    /// index keeps its eviction order and charges its estimate on every batch.
    pub fn with_budget(holders: usize, max_index_bytes: u64, max_context_blocks: u64) -> Self {
        let mut ours = Ours::new(holders);
        let budget = std::sync::Arc::new(mooncake_conductor::index::Budget::new(
            max_index_bytes,
            max_context_blocks,
        ));
        ours.index.set_budget(budget);
        ours
    }

    /// Blocks the budget evicted.
    pub fn evicted(&self) -> u64 {
        self.index.evicted()
    }

    /// What an engine publishes for this prompt's blocks.
    pub fn prompt(&self, tokens: &[u32]) -> PromptKeys {
        let mut chain = self.hasher.chain(BLOCK_SIZE as u32, tokens);
        let hashes = (0..chain.num_blocks()).map(|i| chain.key(i)).collect();
        let contents = tokens
            .chunks_exact(BLOCK_SIZE)
            .map(|b| derived::content(b.iter().map(|&t| i64::from(t)), b.len(), 0))
            .collect();
        PromptKeys { hashes, contents }
    }

    /// The keys the index derives for this prompt, computed ahead of the walk.
    pub fn query_keys(&self, tokens: &[u32]) -> QueryKeys {
        let mut chain = DerivedChain::new(BlockRule::FullBlocks, BLOCK_SIZE as u32, tokens, "");
        QueryKeys(HashList {
            hashes: (0..chain.num_blocks()).map(|i| chain.key(i)).collect(),
            block_size: BLOCK_SIZE as u32,
        })
    }

    /// One engine message: one chained store (hashes, parent hash, block contents) or one
    /// removal by hash per event, on the device tier.
    pub fn batch(&self, batch: &PublisherBatch, prompts: &[PromptKeys]) -> Batch {
        let (source, holder) = &self.holders[batch.holder];
        let ops = batch
            .events
            .iter()
            .map(|ev| match *ev {
                Event::Store { prompt, start, end } => {
                    let p = &prompts[prompt as usize];
                    let (start, end) = (start as usize, end as usize);
                    IndexOp::StoreChained {
                        holder: holder.clone(),
                        tier: Tier::Device,
                        hashes: p.hashes[start..end].to_vec(),
                        contents: BlockContents {
                            parent: start.checked_sub(1).map(|i| p.hashes[i]),
                            root: derived::ROOT,
                            digests: p.contents[start..end].to_vec(),
                        },
                    }
                }
                Event::Remove { prompt, start, end } => IndexOp::Remove {
                    holder: holder.clone(),
                    tier: Tier::Device,
                    hashes: prompts[prompt as usize].hashes[start as usize..end as usize].to_vec(),
                },
            })
            .collect();
        Batch(IndexBatch {
            source: source.clone(),
            ops,
        })
    }

    pub fn apply(&mut self, batch: &Batch) {
        self.index.apply(&batch.0);
    }

    /// (block, holder) pairs the index holds.
    pub fn pairs(&self) -> u64 {
        self.index.stats().holder_blocks
    }

    pub fn query(&self, keys: &mut QueryKeys) -> QueryHits {
        self.reader.query(&mut keys.0, None)
    }

    /// [`Self::query`] into a reused answer, as a router's request loop would ask.
    pub fn query_into(&self, keys: &mut QueryKeys, out: &mut QueryHits) {
        self.reader.query_into(&mut keys.0, None, out)
    }

    /// [`Self::query_tokens`] into a reused answer.
    pub fn query_tokens_into(&self, tokens: &[u32], out: &mut QueryHits) {
        self.reader.query_tokens_into(tokens, "", None, out)
    }

    /// The whole query from raw token ids: keys are computed (lazily, as the walk asks for them)
    /// inside the call.
    pub fn query_tokens(&self, tokens: &[u32]) -> QueryHits {
        self.reader.query_tokens(tokens, "", None)
    }

    /// See [`service_call`].
    pub fn service_query(&self, tokens: &[u32]) -> Vec<u8> {
        service_call(&self.reader, tokens)
    }

    /// A reader for another thread, which queries while this one applies.
    pub fn reader(&self) -> OursReader {
        OursReader(self.reader.clone())
    }
}

/// What the service's gRPC `Query` handler does for one request once it is decoded: the
/// query from token ids (no salt, the empty instance filter of a request that sets none) into
/// a fresh answer, encoded as the `QueryResponse` it sends. Returns the encoded bytes. The
/// handler encodes the answer while the walk lends it (`query_tokens_with`), then tonic copies
/// the reply into its frame, as `encode_to_vec` copies it here.
fn service_call(reader: &IndexReader, tokens: &[u32]) -> Vec<u8> {
    reader
        .query_tokens_with(tokens, "", Some(""), QueryReply::answer)
        .encode_to_vec()
}

/// Our index's read side, shareable with a thread other than the writer's.
pub struct OursReader(IndexReader);

impl OursReader {
    /// See [`service_call`].
    pub fn service_query(&self, tokens: &[u32]) -> Vec<u8> {
        service_call(&self.0, tokens)
    }
}

/// Matched device blocks per holder, from an encoded `QueryResponse` (the service call's
/// answer), decoded with the contract's generated types.
pub fn overlap_encoded(bytes: &[u8], holders: usize) -> Vec<u32> {
    let reply = pb::QueryResponse::decode(bytes).expect("the service encodes a valid reply");
    assert_eq!(reply.ret, 0, "the query failed: {:?}", reply.error);
    (0..holders)
        .map(|h| {
            let tokens = reply
                .hits
                .get(&instance_id(instance_of(h)))
                .and_then(|row| row.rank_matches.get(&rank_of(h).to_string()))
                .map_or(0, |c| c.device);
            (tokens / BLOCK_SIZE as i64) as u32
        })
        .collect()
}

/// Matched device blocks per holder, from an answer.
pub fn overlap(hits: &QueryHits, holders: usize) -> Vec<u32> {
    let mut out = vec![0u32; holders];
    for (h, slot) in out.iter_mut().enumerate() {
        let tokens = hits
            .hits
            .get(&instance_id(instance_of(h)))
            .and_then(|row| row.rank_matches.get(&(rank_of(h) as u32)))
            .map_or(0, |c| c.device);
        *slot = (tokens / BLOCK_SIZE as u64) as u32;
    }
    out
}

/// Device tokens of one holder in an answer (for the single-holder long query).
pub fn device_tokens(hits: &QueryHits, holder: usize) -> u64 {
    hits.hits
        .get(&instance_id(instance_of(holder)))
        .and_then(|row| row.rank_matches.get(&(rank_of(holder) as u32)))
        .map_or(0, |c| c.device)
}
