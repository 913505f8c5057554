//! The actix shell around [`ContextIndex`]: the context's only writer. Each handler forwards one
//! call; queries do not come here at all but go through the [`IndexReader`] in [`ContextHandle`].

use actix::dev::ToEnvelope;
use actix::prelude::*;

use crate::events::{InFlightGuard, IndexBatch};
use crate::hashing::PrefixKeys;
use crate::model::{ContextKey, SubscriptionKey};

use super::answer::QueryHits;
use super::read::handle::{ContextView, IndexReader, IndexStats};
use super::stored::image::{ContextChanges, Watermark};
use super::stored::snapshot::ContextSnapshot;
use super::write::context::{ApplyReport, ContextIndex};

pub struct ContextActor {
    pub(super) index: ContextIndex,
}

impl ContextActor {
    pub fn new(index: ContextIndex) -> Self {
        ContextActor { index }
    }
}

/// Messages a context's mailbox holds before senders that use `send` or `try_send` wait: the
/// ingest path does (see the subscription actor), so a context that falls behind slows its
/// sources down (and shows as their `pending_batches`) instead of queueing without bound.
pub const MAILBOX_CAPACITY: usize = 64;

/// Test builds only (the `failpoints` feature): `CONDUCTOR_TEST_APPLY_DELAY_MS` makes every
/// context sleep that long per batch it applies, so the integration tests can watch a context
/// fall behind its source. The binary users run does not read the variable.
#[cfg(feature = "failpoints")]
fn test_apply_delay() -> Option<std::time::Duration> {
    static DELAY: std::sync::OnceLock<Option<std::time::Duration>> = std::sync::OnceLock::new();
    *DELAY.get_or_init(|| {
        std::env::var("CONDUCTOR_TEST_APPLY_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(std::time::Duration::from_millis)
    })
}

#[cfg(not(feature = "failpoints"))]
#[inline(always)]
fn test_apply_delay() -> Option<std::time::Duration> {
    None
}

impl Actor for ContextActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(MAILBOX_CAPACITY);
    }
}

/// Apply one batch from one source.
#[derive(Debug, Message)]
#[rtype(result = "ApplyReport")]
pub struct ApplyBatch(pub IndexBatch);

/// List a rank on behalf of a source (registration, or an engine source feeding this context).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct AttachRank {
    pub source: SubscriptionKey,
    pub instance_id: String,
    pub dp_rank: u32,
}

/// Remove every block of a source (publisher restart, unrecoverable gap); ranks stay listed.
/// Replies with the (block, holder) pairs removed.
#[derive(Debug, Message)]
#[rtype(result = "u64")]
pub struct DropSource(pub SubscriptionKey);

/// Unregister: drop the source's blocks and unlist its ranks. Replies with the pairs removed and
/// whether the context is now empty and detached (then its owner may stop and forget it).
#[derive(Debug, Message)]
#[rtype(result = "DetachOutcome")]
pub struct DetachSource(pub SubscriptionKey);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetachOutcome {
    pub removed: u64,
    /// Empty, no rank listed, and no other source feeds it: the context can go.
    pub empty_and_detached: bool,
}

#[derive(Debug, Message)]
#[rtype(result = "IndexStats")]
pub struct GetStats;

/// The KV-cache groups of the context's hybrid ranks, with their block counts.
#[derive(Debug, Message)]
#[rtype(result = "Vec<crate::index::GroupCount>")]
pub struct GetGroups;

/// A replayable copy of the whole context, taken between two batches.
#[derive(Debug, Message)]
#[rtype(result = "ContextSnapshot")]
pub struct Snapshot;

/// Apply one publisher batch unless this context already has it (see `persist`).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ApplySequenced {
    pub batch: IndexBatch,
    pub mark: Watermark,
    /// Counts the batch as in flight (sent, not yet applied) until it is dropped after
    /// handling: the sender's view of how far behind this context is.
    pub in_flight: Option<InFlightGuard>,
}

/// Every batch of `source` up to `mark` has reached this context (see
/// [`ContextIndex::advance`]).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Advance {
    pub source: SubscriptionKey,
    pub mark: Watermark,
}

/// Take the changes since the last checkpoint.
#[derive(Debug, Message)]
#[rtype(result = "ContextChanges")]
pub struct TakeChanges;

/// Everything the context holds, as [`ContextIndex::export_changes`] (a peer's bootstrap).
#[derive(Debug, Message)]
#[rtype(result = "ContextChanges")]
pub struct ExportState;

/// A checkpoint write failed: these pairs and aliases must be written by the next one.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct MarkDirty {
    pub pairs: Vec<(u32, u64)>,
    pub aliases: Vec<u64>,
    /// The failed write was the context's first (see [`ContextChanges::fresh`]).
    pub fresh: bool,
}

impl Handler<ApplySequenced> for ContextActor {
    type Result = ();
    fn handle(&mut self, msg: ApplySequenced, _: &mut Self::Context) {
        if let Some(delay) = test_apply_delay() {
            std::thread::sleep(delay);
        }
        self.index.apply_sequenced(&msg.batch, msg.mark);
    }
}

impl Handler<Advance> for ContextActor {
    type Result = ();
    fn handle(&mut self, msg: Advance, _: &mut Self::Context) {
        self.index.advance(&msg.source, msg.mark);
    }
}

impl Handler<TakeChanges> for ContextActor {
    type Result = MessageResult<TakeChanges>;
    fn handle(&mut self, _: TakeChanges, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.index.take_changes())
    }
}

impl Handler<MarkDirty> for ContextActor {
    type Result = ();
    fn handle(&mut self, msg: MarkDirty, _: &mut Self::Context) {
        self.index.mark_dirty(msg.pairs, msg.aliases, msg.fresh);
    }
}

impl Handler<ApplyBatch> for ContextActor {
    type Result = MessageResult<ApplyBatch>;
    fn handle(&mut self, msg: ApplyBatch, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.index.apply(&msg.0))
    }
}

impl Handler<AttachRank> for ContextActor {
    type Result = ();
    fn handle(&mut self, msg: AttachRank, _: &mut Self::Context) {
        self.index
            .attach_rank(&msg.source, &msg.instance_id, msg.dp_rank);
    }
}

impl Handler<DropSource> for ContextActor {
    type Result = u64;
    fn handle(&mut self, msg: DropSource, _: &mut Self::Context) -> u64 {
        self.index.drop_source(&msg.0)
    }
}

impl Handler<DetachSource> for ContextActor {
    type Result = MessageResult<DetachSource>;
    fn handle(&mut self, msg: DetachSource, _: &mut Self::Context) -> Self::Result {
        let removed = self.index.detach_source(&msg.0);
        MessageResult(DetachOutcome {
            removed,
            empty_and_detached: self.index.is_empty_and_detached() && !self.index.is_fed(),
        })
    }
}

impl Handler<GetStats> for ContextActor {
    type Result = MessageResult<GetStats>;
    fn handle(&mut self, _: GetStats, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.index.stats())
    }
}

impl Handler<GetGroups> for ContextActor {
    type Result = MessageResult<GetGroups>;
    fn handle(&mut self, _: GetGroups, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.index.group_counts())
    }
}

impl Handler<Snapshot> for ContextActor {
    type Result = MessageResult<Snapshot>;
    fn handle(&mut self, _: Snapshot, _: &mut Self::Context) -> Self::Result {
        MessageResult(ContextSnapshot::of(&self.index))
    }
}

impl Handler<ExportState> for ContextActor {
    type Result = MessageResult<ExportState>;
    fn handle(&mut self, _: ExportState, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.index.export_changes())
    }
}

/// What the rest of the service holds for one context: the writer's address for changes and the
/// read handle for queries. `Clone + Send + Sync`.
/// A message that may skip the mailbox's bound ([`ContextHandle::notify`]): small, and at most a
/// few per source or per checkpoint round, so it cannot queue without bound the way batches
/// could; and its sender must not wait for a context that is behind (a drop, a position, a retry).
pub trait Control: Message + Send + 'static {}

impl Control for AttachRank {}
impl Control for DropSource {}
impl Control for Advance {}
impl Control for MarkDirty {}

#[derive(Clone)]
pub struct ContextHandle {
    addr: Addr<ContextActor>,
    reader: IndexReader,
}

impl ContextHandle {
    /// Start the actor on the current actix arbiter. Must run inside an actix `System` (see
    /// `Actor::start`); use [`ContextHandle::start_in_arbiter`] from elsewhere.
    pub fn start(index: ContextIndex) -> Self {
        let reader = index.reader();
        ContextHandle {
            addr: ContextActor::new(index).start(),
            reader,
        }
    }

    /// Start the actor on `arbiter` (any thread may call this).
    pub fn start_in_arbiter(arbiter: &actix::ArbiterHandle, index: ContextIndex) -> Self {
        let reader = index.reader();
        let addr = ContextActor::start_in_arbiter(arbiter, move |_| ContextActor::new(index));
        ContextHandle { addr, reader }
    }

    pub fn key(&self) -> &ContextKey {
        self.reader.key()
    }

    pub fn reader(&self) -> &IndexReader {
        &self.reader
    }

    /// Query without touching the mailbox (see [`IndexReader::query`]).
    pub fn query<K: PrefixKeys + ?Sized>(
        &self,
        keys: &mut K,
        instance_filter: Option<&str>,
    ) -> QueryHits {
        self.reader.query(keys, instance_filter)
    }

    pub fn view(&self) -> ContextView {
        self.reader.view()
    }

    /// Queue a message unless the mailbox is full (or the actor stopped): then it comes back.
    pub fn try_send<M>(&self, msg: M) -> Result<(), SendError<M>>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        ContextActor: Handler<M>,
        <ContextActor as Actor>::Context: ToEnvelope<ContextActor, M>,
    {
        self.addr.try_send(msg)
    }

    /// Queue a control message past a full mailbox, without waiting (see [`Control`]).
    pub fn notify<M>(&self, msg: M)
    where
        M: Control,
        M::Result: Send,
        ContextActor: Handler<M>,
        <ContextActor as Actor>::Context: ToEnvelope<ContextActor, M>,
    {
        self.addr.do_send(msg)
    }

    /// Queue `msg` now, and return the wait for its reply. Unlike [`ContextHandle::send`], the
    /// message is in the mailbox on return (or, when this handle's sender is parked on a full
    /// mailbox, held by the returned future), so that nothing queued afterwards overtakes it.
    pub fn queue<M>(
        &self,
        msg: M,
    ) -> impl std::future::Future<Output = Result<M::Result, MailboxError>> + 'static
    where
        M: Message + Send + 'static,
        M::Result: Send,
        ContextActor: Handler<M>,
        <ContextActor as Actor>::Context: ToEnvelope<ContextActor, M>,
    {
        self.addr.send(msg)
    }

    /// Send a message to the writer and wait for its reply (back-pressure when the mailbox is
    /// full; an error only when the actor has stopped).
    pub async fn send<M>(&self, msg: M) -> Result<M::Result, MailboxError>
    where
        M: Message + Send + 'static,
        M::Result: Send,
        ContextActor: Handler<M>,
        <ContextActor as Actor>::Context: ToEnvelope<ContextActor, M>,
    {
        self.addr.send(msg).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Holder, IndexOp};
    use crate::model::{BlockHash, Tier};

    /// A batch queued for later waiting, then a drop of its source: the drop must find the
    /// batch applied, whatever the caller does with the wait meanwhile (the subscription waits
    /// for it only after the rest of its handler ran).
    #[test]
    fn a_queued_batch_is_in_the_mailbox_before_anything_sent_after_it() {
        actix_rt::System::new().block_on(async {
            let key = ContextKey::new("", "m", "", 16);
            let profile = crate::hashing::profile::vllm_cbor_default();
            let handle = ContextHandle::start(ContextIndex::new(key, profile));
            let source = SubscriptionKey::new("a", "", 0);
            let batch = IndexBatch {
                source: source.clone(),
                ops: vec![IndexOp::Store {
                    holder: Holder::Engine {
                        instance_id: "a".into(),
                        dp_rank: 0,
                        group: 0,
                    },
                    tier: Tier::Device,
                    hashes: vec![BlockHash(1), BlockHash(2)],
                }],
            };
            let wait = handle.queue(ApplySequenced {
                batch,
                mark: Watermark { seq: 1, digest: 1 },
                in_flight: None,
            });
            handle.notify(DropSource(source));
            wait.await.expect("actor alive");
            let stats = handle.send(GetStats).await.expect("actor alive");
            assert_eq!(stats.holder_blocks, 0, "the drop came after the batch");
        });
    }
}
