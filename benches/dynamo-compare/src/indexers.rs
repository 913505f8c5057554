//! Dynamo's three production indexers behind one face, each driven through its public API as
//! Dynamo's router drives it:
//!
//! - `crtc`: a `ConcurrentRadixTreeCompressed` whose `SyncIndexer::worker` loop runs on one
//!   thread we spawn, fed `WorkerTask::Event`s over a `flume` channel; queries call
//!   `find_matches` on the shared tree from the caller's thread.
//! - `pool4`: `ThreadPoolIndexer<ConcurrentRadixTreeCompressed>` with 4 lanes (the router's
//!   default `router_event_threads`): events go through `enqueue_event`, sticky per (worker,
//!   rank); queries run inline through `KvIndexerInterface::find_matches_for_request`.
//! - `positional`: `ThreadPoolIndexer<PositionalIndexer>` with 4 lanes and a jump size of 32
//!   (strided search), driven the same way.
//!
//! "By keys" queries call the backend's `SyncIndexer::find_matches` directly, which is what the
//! thread pool's `find_matches` runs inline (without boxing a future and cloning the keys).

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::JoinHandle;

use dynamo_kv_router::indexer::{KvIndexerInterface, KvRouterError, SyncIndexer, WorkerTask};
use dynamo_kv_router::nested_map::SearchMode;
use dynamo_kv_router::protocols::{LocalBlockHash, OverlapScores, RouterEvent};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, PositionalIndexer, ThreadPoolIndexer};

use crate::dynamo::local_hashes;
use crate::measure::{task_cpu_secs, task_ids};
use crate::workload::BLOCK_SIZE;

/// Lanes of the thread-pool indexers: Dynamo's default `router_event_threads`.
pub const LANES: usize = 4;
/// Jump size of the positional indexer (the value Dynamo's own tests and docs use).
pub const JUMP: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Crtc,
    Pool,
    Positional,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Crtc, Kind::Pool, Kind::Positional];

    /// Short name: table column, JSON key, child-process argument.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Crtc => "crtc",
            Kind::Pool => "pool4",
            Kind::Positional => "positional",
        }
    }

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == s)
    }

    pub fn describe(self) -> &'static str {
        match self {
            Kind::Crtc => "ConcurrentRadixTreeCompressed, SyncIndexer::worker on 1 thread",
            Kind::Pool => "ThreadPoolIndexer<ConcurrentRadixTreeCompressed>, 4 lanes",
            Kind::Positional => "ThreadPoolIndexer<PositionalIndexer>, 4 lanes, jump 32",
        }
    }
}

enum Inner {
    Crtc {
        tree: Arc<ConcurrentRadixTreeCompressed>,
        tx: flume::Sender<WorkerTask>,
        worker: Option<JoinHandle<()>>,
    },
    Pool(ThreadPoolIndexer<ConcurrentRadixTreeCompressed>),
    Positional(ThreadPoolIndexer<PositionalIndexer>),
}

pub struct DynamoIndex {
    pub kind: Kind,
    inner: Inner,
    /// Thread ids of the threads that apply events (the worker loop or the lanes).
    workers: Vec<u32>,
}

impl DynamoIndex {
    pub fn new(kind: Kind) -> Self {
        // The threads the constructor spawns are the ones that apply events: no other thread
        // of this process starts meanwhile.
        let before = task_ids();
        let inner = match kind {
            Kind::Crtc => {
                let tree = Arc::new(ConcurrentRadixTreeCompressed::new());
                let (tx, rx) = flume::unbounded();
                let backend = Arc::clone(&tree);
                let worker = std::thread::spawn(move || {
                    if let Err(e) = backend.worker(rx, None) {
                        panic!("dynamo worker loop failed: {e}");
                    }
                });
                Inner::Crtc {
                    tree,
                    tx,
                    worker: Some(worker),
                }
            }
            Kind::Pool => Inner::Pool(ThreadPoolIndexer::new(
                ConcurrentRadixTreeCompressed::new(),
                LANES,
                BLOCK_SIZE as u32,
            )),
            Kind::Positional => Inner::Positional(ThreadPoolIndexer::new(
                PositionalIndexer::new_with_mode(JUMP, SearchMode::Strided),
                LANES,
                BLOCK_SIZE as u32,
            )),
        };
        let mut workers = task_ids();
        workers.retain(|t| !before.contains(t));
        DynamoIndex {
            kind,
            inner,
            workers,
        }
    }

    pub fn send(&self, event: RouterEvent) {
        match &self.inner {
            Inner::Crtc { tx, .. } => tx
                .send(WorkerTask::Event(event))
                .expect("the worker loop runs until Terminate"),
            Inner::Pool(p) => p.enqueue_event(event).expect("the lanes run"),
            Inner::Positional(p) => p.enqueue_event(event).expect("the lanes run"),
        }
    }

    /// Returns once everything sent before is applied.
    pub fn flush(&self) {
        self.barrier().wait();
    }

    /// Marks the end of what was sent so far; [`Barrier::wait`] returns once it is applied.
    /// Sending more in between keeps the lanes busy while the sender waits.
    pub fn barrier(&self) -> Barrier<'_> {
        match &self.inner {
            Inner::Crtc { tx, .. } => {
                let (ack, done) = tokio::sync::oneshot::channel();
                tx.send(WorkerTask::Flush(ack))
                    .expect("the worker loop runs until Terminate");
                Barrier::Crtc(done)
            }
            Inner::Pool(p) => Barrier::started(Box::pin(p.flush_and_wait())),
            Inner::Positional(p) => Barrier::started(Box::pin(p.flush_and_wait())),
        }
    }

    /// The walk alone, over precomputed local hashes.
    pub fn find_matches(&self, local: &[LocalBlockHash]) -> OverlapScores {
        match &self.inner {
            Inner::Crtc { tree, .. } => tree.find_matches(local, false),
            Inner::Pool(p) => p.backend().find_matches(local, false),
            Inner::Positional(p) => p.backend().find_matches(local, false),
        }
    }

    /// The whole query from raw token ids, as the router asks it: a fresh `OverlapScores`.
    pub fn query_tokens(&self, tokens: &[u32]) -> OverlapScores {
        match &self.inner {
            Inner::Crtc { tree, .. } => tree.find_matches(&local_hashes(tokens), false),
            Inner::Pool(p) => block_on(p.find_matches_for_request(tokens, None, None, None))
                .expect("inline reads do not fail"),
            Inner::Positional(p) => block_on(p.find_matches_for_request(tokens, None, None, None))
                .expect("inline reads do not fail"),
        }
    }

    /// How many event-applying threads the constructor started (1 for `crtc`, the lanes
    /// otherwise).
    pub fn event_threads(&self) -> usize {
        self.workers.len()
    }

    /// CPU seconds the event-applying threads ran so far.
    pub fn worker_cpu_secs(&self) -> f64 {
        self.workers.iter().map(|&t| task_cpu_secs(t)).sum()
    }
}

impl Drop for DynamoIndex {
    fn drop(&mut self) {
        if let Inner::Crtc { tx, worker, .. } = &mut self.inner {
            let _ = tx.send(WorkerTask::Terminate);
            if let Some(w) = worker.take() {
                let _ = w.join();
            }
        }
    }
}

type FlushFuture<'a> = Pin<Box<dyn Future<Output = Result<(), KvRouterError>> + 'a>>;

/// A flush mark sent to every event thread of an index.
pub enum Barrier<'a> {
    Crtc(tokio::sync::oneshot::Receiver<()>),
    Pool(FlushFuture<'a>),
    Done,
}

impl<'a> Barrier<'a> {
    /// Polls the thread pool's flush once: that sends the marks to its lanes.
    fn started(mut f: FlushFuture<'a>) -> Self {
        WAKER.with(|w| match f.as_mut().poll(&mut Context::from_waker(w)) {
            Poll::Ready(r) => {
                r.expect("the lanes run");
                Barrier::Done
            }
            Poll::Pending => Barrier::Pool(f),
        })
    }

    pub fn wait(self) {
        match self {
            Barrier::Crtc(done) => done
                .blocking_recv()
                .expect("the worker answers every Flush"),
            Barrier::Pool(f) => block_on(f).expect("the lanes run"),
            Barrier::Done => {}
        }
    }
}

/// Sends events to an index keeping at most about two chunks of them queued: after each chunk
/// a barrier is marked, and the sender waits for the previous chunk's barrier. Without this,
/// a sender outruns the event threads and the queues grow without bound.
pub struct PacedSender<'a> {
    index: &'a DynamoIndex,
    sent: usize,
    pending: Option<Barrier<'a>>,
}

/// Events per chunk.
const CHUNK: usize = 2_048;

impl<'a> PacedSender<'a> {
    pub fn new(index: &'a DynamoIndex) -> Self {
        PacedSender {
            index,
            sent: 0,
            pending: None,
        }
    }

    pub fn send(&mut self, event: RouterEvent) {
        self.index.send(event);
        self.sent += 1;
        if self.sent.is_multiple_of(CHUNK) {
            let next = self.index.barrier();
            if let Some(previous) = self.pending.replace(next) {
                previous.wait();
            }
        }
    }

    /// Waits until everything sent is applied.
    pub fn finish(mut self) {
        if let Some(p) = self.pending.take() {
            p.wait();
        }
        self.index.flush();
    }
}

struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    /// One waker per thread, so that polling a ready future allocates nothing.
    static WAKER: Waker = Waker::from(Arc::new(Unpark(std::thread::current())));
}

/// Runs a future on this thread: Dynamo's inline reads are ready on the first poll; a flush
/// parks until the lanes answer.
pub fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    WAKER.with(|w| {
        let mut cx = Context::from_waker(w);
        loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                return v;
            }
            std::thread::park();
        }
    })
}
