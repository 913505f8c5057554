//! NVIDIA Dynamo's router index, driven the way its router drives it: a
//! `ConcurrentRadixTreeCompressed` whose `SyncIndexer::worker` loop runs on its own thread and
//! receives `RouterEvent`s over a channel; queries call `find_matches` on the shared tree from
//! the caller's thread.
//!
//! Block identities: the tree is keyed by Dynamo's local block hash of each block's token ids
//! (`compute_block_hash_for_seq`, no LoRA, no namespace) and events name blocks by a sequence
//! hash, for which we use Dynamo's own rolling hash of the local hashes
//! (`compute_seq_hash_for_block`), as a worker publishing through Dynamo would.

use std::sync::Arc;
use std::thread::JoinHandle;

use dynamo_kv_router::ConcurrentRadixTreeCompressed;
use dynamo_kv_router::indexer::{SyncIndexer, WorkerTask};
use dynamo_kv_router::protocols::{
    BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData,
    KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash, OverlapScores, RouterEvent,
    WorkerWithDpRank, compute_block_hash_for_seq, compute_seq_hash_for_block,
};

use crate::workload::{BLOCK_SIZE, Event, HOLDERS, PublisherBatch, instance_of, rank_of};

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
    pub fn new() -> Self {
        EventBuilder {
            next_id: vec![0; HOLDERS],
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

pub struct Dynamo {
    tree: Arc<ConcurrentRadixTreeCompressed>,
    tx: flume::Sender<WorkerTask>,
    worker: Option<JoinHandle<()>>,
}

impl Dynamo {
    /// `queue`: channel bound (`None`: unbounded, as the router's own queue).
    pub fn new(queue: Option<usize>) -> Self {
        let tree = Arc::new(ConcurrentRadixTreeCompressed::new());
        let (tx, rx) = match queue {
            Some(n) => flume::bounded(n),
            None => flume::unbounded(),
        };
        let backend = Arc::clone(&tree);
        let worker = std::thread::spawn(move || {
            if let Err(e) = backend.worker(rx, None) {
                panic!("dynamo worker loop failed: {e}");
            }
        });
        Dynamo {
            tree,
            tx,
            worker: Some(worker),
        }
    }

    pub fn send(&self, event: RouterEvent) {
        self.tx
            .send(WorkerTask::Event(event))
            .expect("the worker loop runs until Terminate");
    }

    /// Returns once the worker has applied everything sent before.
    pub fn flush(&self) {
        let (ack, done) = tokio::sync::oneshot::channel();
        self.tx
            .send(WorkerTask::Flush(ack))
            .expect("the worker loop runs until Terminate");
        done.blocking_recv()
            .expect("the worker answers every Flush");
    }

    pub fn find_matches(&self, local: &[LocalBlockHash]) -> OverlapScores {
        self.tree.find_matches(local, false)
    }

    pub fn query_tokens(&self, tokens: &[u32]) -> OverlapScores {
        self.tree.find_matches(&local_hashes(tokens), false)
    }
}

impl Drop for Dynamo {
    fn drop(&mut self) {
        let _ = self.tx.send(WorkerTask::Terminate);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// Matched blocks per holder, from Dynamo's scores.
pub fn overlap(scores: &OverlapScores) -> Vec<u32> {
    (0..HOLDERS)
        .map(|h| scores.scores.get(&worker_of(h)).copied().unwrap_or(0))
        .collect()
}
