//! What Dynamo's indexers are fed: the block keys of a prompt and the `RouterEvent`s a worker
//! publishing through Dynamo emits (the indexers themselves are in `indexers.rs`).
//!
//! Block identities: the tree is keyed by Dynamo's local block hash of each block's token ids
//! (`compute_block_hash_for_seq`, no LoRA, no namespace) and events name blocks by a sequence
//! hash, for which we use Dynamo's own rolling hash of the local hashes
//! (`compute_seq_hash_for_block`), as a worker publishing through Dynamo would.

use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData,
    KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash, OverlapScores, RouterEvent,
    WorkerWithDpRank, compute_block_hash_for_seq, compute_seq_hash_for_block,
};

use crate::workload::{BLOCK_SIZE, Event, PublisherBatch, instance_of, rank_of};

/// One prompt's local and sequence hashes, computed once from its tokens.
pub struct PromptKeys {
    local: Vec<LocalBlockHash>,
    sequence: Vec<ExternalSequenceBlockHash>,
}

pub fn prompt(tokens: &[u32]) -> PromptKeys {
    let local = local_hashes(tokens);
    let sequence = compute_seq_hash_for_block(&local)
        .into_iter()
        .map(ExternalSequenceBlockHash)
        .collect();
    PromptKeys { local, sequence }
}

/// What a query from raw token ids computes before `find_matches`.
pub fn local_hashes(tokens: &[u32]) -> Vec<LocalBlockHash> {
    compute_block_hash_for_seq(tokens, BLOCK_SIZE as u32, BlockHashOptions::default())
}

fn worker_of(holder: usize) -> WorkerWithDpRank {
    WorkerWithDpRank::new(instance_of(holder) as u64, rank_of(holder) as u32)
}

/// Turns publisher batches into Dynamo events, numbering each worker's events in order.
pub struct EventBuilder {
    next_id: Vec<u64>,
}

impl EventBuilder {
    pub fn new(holders: usize) -> Self {
        EventBuilder {
            next_id: vec![0; holders],
        }
    }

    pub fn events(&mut self, batch: &PublisherBatch, prompts: &[PromptKeys]) -> Vec<RouterEvent> {
        let worker = worker_of(batch.holder);
        batch
            .events
            .iter()
            .map(|ev| {
                let data = match *ev {
                    Event::Store { prompt, start, end } => {
                        let keys = &prompts[prompt as usize];
                        let (start, end) = (start as usize, end as usize);
                        KvCacheEventData::Stored(KvCacheStoreData {
                            parent_hash: start.checked_sub(1).map(|p| keys.sequence[p]),
                            start_position: None,
                            blocks: (start..end)
                                .map(|i| KvCacheStoredBlockData {
                                    block_hash: keys.sequence[i],
                                    tokens_hash: keys.local[i],
                                    mm_extra_info: None,
                                })
                                .collect(),
                        })
                    }
                    Event::Remove { prompt, start, end } => {
                        KvCacheEventData::Removed(KvCacheRemoveData {
                            block_hashes: prompts[prompt as usize].sequence
                                [start as usize..end as usize]
                                .to_vec(),
                        })
                    }
                };
                let id = &mut self.next_id[batch.holder];
                *id += 1;
                RouterEvent::new(
                    worker.worker_id,
                    KvCacheEvent {
                        event_id: *id,
                        data,
                        dp_rank: worker.dp_rank,
                    },
                )
            })
            .collect()
    }
}

/// Matched blocks per holder, from Dynamo's scores.
pub fn overlap(scores: &OverlapScores, holders: usize) -> Vec<u32> {
    (0..holders)
        .map(|h| scores.scores.get(&worker_of(h)).copied().unwrap_or(0))
        .collect()
}
