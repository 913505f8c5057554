//! The four indexes of the trace replay behind one trait, each driven as its router drives it:
//! events handed to writer threads over channels, queries walked on the caller's thread.
//!
//! - `ours`: `ContextIndex` applied by one writer thread (one `IndexBatch` per engine message,
//!   as a subscription hands it to its context), queries through an `IndexReader` by the derived
//!   keys computed ahead of time.
//! - `crtc`: Dynamo's `ConcurrentRadixTreeCompressed`, its `SyncIndexer::worker` loop on one
//!   thread fed `WorkerTask::Event`s over a `flume` channel.
//! - `crtc-pool4`: the same tree inside Dynamo's `ThreadPoolIndexer` with 4 event lanes (each
//!   engine's events stick to one lane).
//! - `positional4`: Dynamo's `PositionalIndexer` (jump size 32, strided search) inside a
//!   `ThreadPoolIndexer` with 4 lanes.
//!
//! Dynamo's indexes are queried with `find_matches` (no early exit) over the local block hashes
//! computed ahead of time; their events name blocks by Dynamo's rolling sequence hash.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake};
use std::thread::JoinHandle;

use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer, WorkerTask};
use dynamo_kv_router::nested_map::SearchMode;
use dynamo_kv_router::protocols::{
    ExternalSequenceBlockHash, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
    KvCacheStoredBlockData, LocalBlockHash, OverlapScores, RouterEvent, WorkerWithDpRank,
};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, PositionalIndexer};
use mooncake_conductor::events::{BlockContents, Holder, IndexBatch, IndexOp};
use mooncake_conductor::hashing::{PrefixKeys, derived};
use mooncake_conductor::index::{ContextIndex, IndexReader, QueryHits};
use mooncake_conductor::model::{BlockHash, ContextKey, SubscriptionKey, Tier};

use crate::trace_prep::{Prep, Step};
use crate::trace_sim::{BLOCK_SIZE, profile};

/// The indexes compared, by the names the report uses.
pub const KINDS: [&str; 4] = ["ours", "crtc", "crtc-pool4", "positional4"];

/// Lanes of Dynamo's `ThreadPoolIndexer` in the pooled variants.
pub const LANES: usize = 4;
/// `PositionalIndexer`'s jump size.
pub const JUMP: usize = 32;

/// One index as the replay drives it.
pub trait Side {
    /// One engine message (one admission's events), prepared outside the timed loop.
    type Payload: Send;
    fn payload(&mut self, step: &Step, prep: &Prep) -> Self::Payload;
    /// Hand a message to the writer(s); returns without waiting for it to be applied.
    fn send(&mut self, payload: Self::Payload);
    /// Walk the prompt `prompt` of `prep`; the answer is kept for [`Side::matched`].
    fn query(&mut self, prep: &Prep, prompt: usize);
    /// Blocks of the last query's prompt the last answer gives engine `engine`.
    fn matched(&self, engine: usize) -> u32;
    /// Returns once every message sent before is applied.
    fn flush(&mut self);
}

/// Our published-hash-keyed query: the derived keys computed ahead of time, borrowed.
struct Keys<'a>(&'a [BlockHash]);

impl PrefixKeys for Keys<'_> {
    fn num_blocks(&self) -> usize {
        self.0.len()
    }
    fn key(&mut self, i: usize) -> BlockHash {
        self.0.get(i).copied().unwrap_or(BlockHash(0))
    }
    fn covered(&self, n: usize) -> u64 {
        (n.min(self.0.len()) * BLOCK_SIZE) as u64
    }
    fn known(&self) -> &[BlockHash] {
        self.0
    }
}

enum OursMsg {
    Batch(IndexBatch),
    Flush(flume::Sender<()>),
}

pub struct Ours {
    reader: IndexReader,
    tx: flume::Sender<OursMsg>,
    writer: Option<JoinHandle<()>>,
    holders: Vec<(SubscriptionKey, Holder)>,
    names: Vec<String>,
    answer: QueryHits,
}

impl Ours {
    pub fn new(engines: usize) -> Ours {
        let mut index = ContextIndex::new(
            ContextKey::new("", "trace-model", "", BLOCK_SIZE as u32),
            profile(),
        );
        let names: Vec<String> = (0..engines)
            .map(crate::trace_sim::fleet::Fleet::instance)
            .collect();
        let holders: Vec<_> = (names.iter())
            .map(|id| {
                let source = SubscriptionKey::new(id, "", 0);
                index.attach_rank(&source, id, 0);
                let holder = Holder::Engine {
                    instance_id: id.clone(),
                    dp_rank: 0, group: 0 };
                (source, holder)
            })
            .collect();
        let reader = index.reader();
        let (tx, rx) = flume::unbounded();
        let writer = std::thread::spawn(move || {
            while let Ok(msg) = rx.recv() {
                match msg {
                    OursMsg::Batch(b) => drop(index.apply(&b)),
                    OursMsg::Flush(ack) => drop(ack.send(())),
                }
            }
        });
        Ours {
            reader,
            tx,
            writer: Some(writer),
            holders,
            names,
            answer: QueryHits::default(),
        }
    }
}

impl Side for Ours {
    type Payload = IndexBatch;

    fn payload(&mut self, step: &Step, prep: &Prep) -> IndexBatch {
        let (source, holder) = &self.holders[step.engine];
        let mut ops: Vec<IndexOp> = (step.removed.iter())
            .map(|&key| IndexOp::Remove {
                holder: holder.clone(),
                tier: Tier::Device,
                hashes: vec![BlockHash(key)],
            })
            .collect();
        if let Some((first, n)) = step.stored {
            let p = &prep.prompts[step.prompt];
            let blocks = first..first + n;
            ops.push(IndexOp::StoreChained {
                holder: holder.clone(),
                tier: Tier::Device,
                hashes: p.published[blocks.clone()]
                    .iter()
                    .map(|&h| BlockHash(h))
                    .collect(),
                contents: BlockContents {
                    parent: first.checked_sub(1).map(|i| BlockHash(p.published[i])),
                    root: derived::ROOT,
                    digests: p.digests[blocks].to_vec(),
                },
            });
        }
        IndexBatch {
            source: source.clone(),
            ops,
        }
    }

    fn send(&mut self, payload: IndexBatch) {
        self.tx.send(OursMsg::Batch(payload)).expect("writer runs");
    }

    fn query(&mut self, prep: &Prep, prompt: usize) {
        let mut keys = Keys(&prep.prompts[prompt].derived);
        self.reader.query_into(&mut keys, None, &mut self.answer);
    }

    fn matched(&self, engine: usize) -> u32 {
        let tokens = self
            .answer
            .hits
            .get(&self.names[engine])
            .map_or(0, |h| h.device);
        (tokens / BLOCK_SIZE as u64) as u32
    }

    fn flush(&mut self) {
        let (ack, done) = flume::bounded(1);
        self.tx.send(OursMsg::Flush(ack)).expect("writer runs");
        done.recv().expect("the writer acknowledges");
    }
}

impl Drop for Ours {
    fn drop(&mut self) {
        let (tx, _) = flume::unbounded();
        drop(std::mem::replace(&mut self.tx, tx));
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// Dynamo's events of one admission, numbered per engine.
struct Events {
    next_id: Vec<u64>,
}

impl Events {
    fn build(&mut self, step: &Step, prep: &Prep) -> Vec<RouterEvent> {
        let mut out = Vec::with_capacity(step.removed.len() + 1);
        let mut push = |data, next_id: &mut u64| {
            *next_id += 1;
            let event = KvCacheEvent {
                event_id: *next_id,
                data,
                dp_rank: 0,
            };
            out.push(RouterEvent::new(step.engine as u64, event));
        };
        let id = &mut self.next_id[step.engine];
        for key in &step.removed {
            let seq = prep.sequence_of[key];
            let data = KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: vec![ExternalSequenceBlockHash(seq)],
            });
            push(data, id);
        }
        if let Some((first, n)) = step.stored {
            let p = &prep.prompts[step.prompt];
            let blocks = (first..first + n)
                .map(|i| KvCacheStoredBlockData {
                    block_hash: ExternalSequenceBlockHash(p.sequence[i]),
                    tokens_hash: p.local[i],
                    mm_extra_info: None,
                })
                .collect();
            let data = KvCacheEventData::Stored(KvCacheStoreData {
                parent_hash: first
                    .checked_sub(1)
                    .map(|i| ExternalSequenceBlockHash(p.sequence[i])),
                start_position: None,
                blocks,
            });
            push(data, id);
        }
        out
    }
}

fn scores_matched(scores: &OverlapScores, engine: usize) -> u32 {
    let worker = WorkerWithDpRank::new(engine as u64, 0);
    scores.scores.get(&worker).copied().unwrap_or(0)
}

/// The tree with its own worker loop on one thread.
pub struct Crtc {
    tree: Arc<ConcurrentRadixTreeCompressed>,
    tx: flume::Sender<WorkerTask>,
    worker: Option<JoinHandle<()>>,
    events: Events,
    answer: OverlapScores,
}

impl Crtc {
    pub fn new(engines: usize) -> Crtc {
        let tree = Arc::new(ConcurrentRadixTreeCompressed::new());
        let (tx, rx) = flume::unbounded();
        let backend = Arc::clone(&tree);
        let worker = std::thread::spawn(move || {
            backend.worker(rx, None).expect("dynamo worker loop");
        });
        Crtc {
            tree,
            tx,
            worker: Some(worker),
            events: Events {
                next_id: vec![0; engines],
            },
            answer: OverlapScores::default(),
        }
    }
}

impl Side for Crtc {
    type Payload = Vec<RouterEvent>;

    fn payload(&mut self, step: &Step, prep: &Prep) -> Vec<RouterEvent> {
        self.events.build(step, prep)
    }

    fn send(&mut self, payload: Vec<RouterEvent>) {
        for ev in payload {
            self.tx.send(WorkerTask::Event(ev)).expect("worker runs");
        }
    }

    fn query(&mut self, prep: &Prep, prompt: usize) {
        self.answer = self.tree.find_matches(&prep.prompts[prompt].local, false);
    }

    fn matched(&self, engine: usize) -> u32 {
        scores_matched(&self.answer, engine)
    }

    fn flush(&mut self) {
        let (ack, done) = tokio::sync::oneshot::channel();
        self.tx.send(WorkerTask::Flush(ack)).expect("worker runs");
        done.blocking_recv().expect("the worker answers a flush");
    }
}

impl Drop for Crtc {
    fn drop(&mut self) {
        let _ = self.tx.send(WorkerTask::Terminate);
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// A backend inside Dynamo's `ThreadPoolIndexer` ([`LANES`] lanes).
pub struct Pool<T: SyncIndexer> {
    pool: ThreadPoolIndexer<T>,
    events: Events,
    answer: OverlapScores,
}

impl Pool<ConcurrentRadixTreeCompressed> {
    pub fn crtc(engines: usize) -> Self {
        Pool::with(ConcurrentRadixTreeCompressed::new(), engines)
    }
}

impl Pool<PositionalIndexer> {
    pub fn positional(engines: usize) -> Self {
        Pool::with(
            PositionalIndexer::new_with_mode(JUMP, SearchMode::Strided),
            engines,
        )
    }
}

impl<T: SyncIndexer> Pool<T> {
    fn with(backend: T, engines: usize) -> Self {
        Pool {
            pool: ThreadPoolIndexer::new(backend, LANES, BLOCK_SIZE as u32),
            events: Events {
                next_id: vec![0; engines],
            },
            answer: OverlapScores::default(),
        }
    }
}

impl<T: SyncIndexer> Side for Pool<T> {
    type Payload = Vec<RouterEvent>;

    fn payload(&mut self, step: &Step, prep: &Prep) -> Vec<RouterEvent> {
        self.events.build(step, prep)
    }

    fn send(&mut self, payload: Vec<RouterEvent>) {
        for ev in payload {
            self.pool.enqueue_event(ev).expect("lanes run");
        }
    }

    fn query(&mut self, prep: &Prep, prompt: usize) {
        // What the pool's `find_matches` does: inline on the caller's thread.
        let local: &[LocalBlockHash] = &prep.prompts[prompt].local;
        self.answer = self.pool.backend().find_matches(local, false);
    }

    fn matched(&self, engine: usize) -> u32 {
        scores_matched(&self.answer, engine)
    }

    fn flush(&mut self) {
        block_on(self.pool.flush_and_wait()).expect("every lane flushes");
    }
}

/// Poll a future to completion on this thread (the pool's flush waits on oneshot channels,
/// which need no runtime).
fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}
