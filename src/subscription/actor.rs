//! The subscription actor: a thin shell that feeds socket input to [`SeqState`], decodes what it
//! must apply, routes it to the context actors, and spawns the socket tasks.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::events::{DecodedBatch, IndexBatch, KvEvent};
use crate::index::ContextHandle;
use crate::index::Watermark;
use crate::index::actor::{Advance, ApplySequenced, DropSource, MAILBOX_CAPACITY};
use crate::index::{ContextDirectory, payload_digest};
use crate::model::{PublisherConfig, SubscriptionKey};

use super::hash_check::HashCheck;
use super::ingest::{Rejected, RoutedBatch, decode_and_route};
use super::marks::SourceMarks;
use super::route::{Refused, RouteLimits, Router};
use super::settings::SubscriptionSettings;
use super::socket::{self, FrameSink, LinkLoss, ReplayEvent};
use super::state::{Action, SeqState};
use super::status::StatusCell;
use super::warn_limit::WarnLimiter;

/// Live batches held while a replay runs, at most (vLLM's replay buffer holds 10 000 batches).
const MAX_HELD_DURING_REPLAY: usize = 20_000;

pub struct SubscriptionActor {
    config: Arc<PublisherConfig>,
    key: SubscriptionKey,
    seq: SeqState,
    router: Router,
    hash_check: HashCheck,
    contexts: ContextDirectory,
    status: StatusCell,
    settings: SubscriptionSettings,
    /// Per-kind rate limiting of this subscription's warnings (a bad peer repeats itself).
    warnings: WarnLimiter,
    /// Cancels the live task and any replay task when the subscription stops.
    cancel: CancellationToken,
    /// Identifies the current replay; answers of an abandoned replay are ignored.
    replay_generation: u64,
    replay_cancel: Option<CancellationToken>,
    /// The source's position for the contexts it fed (see [`PushMarks`]).
    marks: SourceMarks,
    /// Batches waiting for a context to take them (see `hand_off`).
    waiting_hand_offs: usize,
}

impl SubscriptionActor {
    pub fn new(
        config: Arc<PublisherConfig>,
        contexts: ContextDirectory,
        status: StatusCell,
        settings: SubscriptionSettings,
        resume_after: Option<Watermark>,
    ) -> Self {
        let stream_start = if config.publisher_type.is_engine() {
            0
        } else {
            1
        };
        let mut seq = SeqState::new(
            stream_start,
            !config.replay_endpoint.is_empty(),
            MAX_HELD_DURING_REPLAY,
        )
        .with_max_held_bytes(settings.max_held_bytes);
        if let Some(mark) = resume_after {
            seq.resume_verified(mark.seq, mark.digest);
        }
        let key = config.subscription_key();
        let mut router = Router::new(&config).with_limits(RouteLimits {
            max_contexts: settings.max_contexts,
            max_name_bytes: settings.max_name_bytes,
        });
        // Contexts recovered from disk that this source fed: its removals and clears must still
        // reach them (an adapter's context, a store's contexts), or their blocks would stay.
        for handle in contexts.all() {
            if handle.reader().fed_by(&key) {
                router.feed(handle.reader().key().clone());
            }
        }
        SubscriptionActor {
            key,
            router,
            hash_check: HashCheck::new(&config),
            seq,
            contexts,
            status,
            settings,
            warnings: WarnLimiter::new(settings.warn_interval),
            cancel: CancellationToken::new(),
            replay_generation: 0,
            replay_cancel: None,
            marks: SourceMarks::new(resume_after),
            waiting_hand_offs: 0,
            config,
        }
    }

    /// Bring every context this source fed up to the last batch it consumed (see
    /// [`PushMarks`]). Contexts that got ops of that batch already have its mark.
    fn push_marks(&mut self) {
        for (key, mark) in self.marks.due(self.router.fed_contexts()) {
            // Only a context of this source's profile is one it feeds (another one refused its
            // events).
            let Some(handle) = self
                .contexts
                .get(&key)
                .filter(|h| *h.reader().profile() == self.config.hash_profile)
            else {
                continue;
            };
            handle.addr().do_send(Advance {
                source: self.key.clone(),
                mark,
            });
        }
    }

    fn perform(&mut self, actions: Vec<Action>, ctx: &mut Context<Self>) {
        for action in actions {
            match action {
                Action::Apply { seq, payload } => self.apply(seq, &payload, ctx),
                Action::DropSource { reason } => {
                    if let Some(suppressed) = self.warn_due("drop_source") {
                        tracing::warn!(service = %self.key, reason = reason.as_str(), suppressed, "dropping everything this source owns");
                    }
                    self.marks.dropped();
                    for handle in self.contexts.all() {
                        handle.addr().do_send(DropSource(self.key.clone()));
                    }
                }
                Action::RequestReplay { from_seq } => self.start_replay(from_seq, ctx),
            }
        }
        let (phase, last, counters) = (
            self.seq.phase(),
            self.seq.last_applied(),
            self.seq.counters(),
        );
        self.status.update(|s| {
            s.phase = Some(phase);
            s.last_seq = last;
            s.seq = counters;
        });
    }

    fn start_replay(&mut self, from_seq: u64, ctx: &mut Context<Self>) {
        if let Some(previous) = self.replay_cancel.take() {
            previous.cancel();
        }
        self.replay_generation += 1;
        let cancel = self.cancel.child_token();
        self.replay_cancel = Some(cancel.clone());
        if let Some(suppressed) = self.warn_due("replay_request") {
            tracing::info!(service = %self.key, from_seq, suppressed, "requesting replay");
        }
        let sink = ActorSink(ctx.address());
        let task = socket::run_replay(
            self.config.replay_endpoint.clone(),
            from_seq,
            self.replay_generation,
            sink,
            self.settings,
            cancel,
        );
        tokio::spawn(task);
    }

    /// Queue `msg` (which counts itself in flight) for its context. Once this source has more
    /// than [`MAILBOX_CAPACITY`] batches in flight, or the context's mailbox is full, the actor
    /// handles nothing else until the context applied this batch (`ctx.wait`): its own mailbox
    /// then fills, the socket tasks wait on it, and the publisher's socket buffers fill, so a
    /// context that falls behind holds at most that many batches of each source in memory. Order
    /// per context is kept: nothing later is sent before the waiting batch is in.
    ///
    /// The count is the source's own because actix's `try_send` refuses only after the same
    /// sender handle has overfilled the mailbox once, and each batch is sent through a fresh
    /// handle (measured: 296 of 300 batches in flight with `try_send` alone).
    fn hand_off(&mut self, handle: &ContextHandle, msg: ApplySequenced, ctx: &mut Context<Self>) {
        // Behind a waiting batch, every batch waits its turn: a later one must not overtake it
        // (the rest of this handler still runs while the wait is queued).
        let msg = if self.waiting_hand_offs > 0
            || self.status.in_flight().count() > MAILBOX_CAPACITY as u64
        {
            msg
        } else {
            match handle.addr().try_send(msg) {
                Ok(()) => return,
                Err(SendError::Full(msg)) => msg,
                // A context forgotten meanwhile (its last source left): nothing to apply.
                Err(SendError::Closed(_)) => return,
            }
        };
        self.status.update(|s| s.backpressure_waits += 1);
        self.waiting_hand_offs += 1;
        let send = handle.addr().send(msg);
        ctx.wait(actix::fut::wrap_future(send).map(|_, act: &mut Self, _| {
            act.waiting_hand_offs -= 1;
        }));
    }

    /// Decode one batch and hand its ops to the contexts. A bad payload is counted and dropped;
    /// it never disturbs what is already indexed.
    fn apply(&mut self, seq: u64, payload: &[u8], ctx: &mut Context<Self>) {
        let mark = Watermark {
            seq,
            digest: payload_digest(payload),
        };
        // Consumed whatever follows: a batch that cannot be decoded or applies nothing moves
        // the source's position all the same.
        self.marks.consumed(mark);
        let mut counts = EventCounts::default();
        let (key, hash_check) = (&self.key, &mut self.hash_check);
        let inspect = |batch: &DecodedBatch| {
            for message in &batch.invalid {
                tracing::debug!(service = %key, seq, "invalid event skipped: {message}");
            }
            observe_hashes(hash_check, batch);
            counts = EventCounts::of(batch);
        };
        let batch = match decode_and_route(&self.config, &mut self.router, payload, inspect) {
            Ok(batch) => batch,
            Err(Rejected::Undecodable(e)) => {
                if let Some(suppressed) = self.warn_due("undecodable") {
                    tracing::warn!(service = %self.key, seq, error = %e, suppressed, "undecodable batch dropped");
                }
                self.status.update(|s| s.decode_errors += 1);
                return;
            }
            Err(Rejected::OtherRank(batch_rank)) => {
                if let Some(suppressed) = self.warn_due("rank_mismatch") {
                    tracing::warn!(
                        service = %self.key, seq, ?batch_rank, suppressed,
                        "batch from another DP rank than registered; rejected whole"
                    );
                }
                self.status.update(|s| s.rank_mismatches += 1);
                return;
            }
        };
        let RoutedBatch {
            ts,
            routed,
            ignored,
        } = batch;
        let refused = self.router.take_refused();
        self.report_refused(seq, &refused);
        for (context, ops) in routed {
            match self
                .contexts
                .get_or_create(&context, &self.config.hash_profile)
            {
                Ok(handle) => {
                    // Adapter contexts list this rank by themselves: an engine store lists its
                    // (instance, rank) in the context it lands in.
                    let msg = ApplySequenced {
                        batch: IndexBatch {
                            source: self.key.clone(),
                            ops,
                        },
                        mark,
                        in_flight: Some(self.status.in_flight().guard()),
                    };
                    self.hand_off(&handle, msg, ctx);
                    self.marks.sent(&context, seq);
                }
                Err(conflict) => {
                    if let Some(suppressed) = self.warn_due("profile_conflict") {
                        tracing::warn!(service = %self.key, suppressed, "{conflict}; events for it are skipped");
                    }
                    counts.profile_conflicts += 1;
                }
            }
        }
        let hash_check = self.hash_check.summary();
        let engine_recipe = self.hash_check.engine_recipe();
        self.status.update(|s| {
            *s.events.entry("stored").or_default() += counts.stored;
            *s.events.entry("removed").or_default() += counts.removed;
            *s.events.entry("cleared").or_default() += counts.cleared;
            s.invalid_events += counts.invalid;
            s.profile_conflicts += counts.profile_conflicts;
            for reason in &ignored {
                *s.ignored.entry(reason.as_str()).or_default() += 1;
            }
            (
                s.hash_check,
                s.hash_check_ok,
                s.hash_check_mismatch,
                s.hash_check_mismatch_rate,
            ) = hash_check;
            s.engine_recipe = engine_recipe;
            s.last_batch_ts_ms = timestamp_ms(ts, self.config.publisher_type.is_engine());
        });
    }

    /// Count refused events by field, and warn once per interval per field, with the first
    /// refusal of this batch as the example.
    fn report_refused(&mut self, seq: u64, refused: &[Refused]) {
        if refused.is_empty() {
            return;
        }
        let mut by_field: Vec<(&'static str, u64, &str)> = Vec::new();
        for r in refused {
            match by_field.iter_mut().find(|(f, _, _)| *f == r.field) {
                Some((_, n, _)) => *n += 1,
                None => by_field.push((r.field, 1, &r.detail)),
            }
        }
        for &(field, count, example) in &by_field {
            if let Some(suppressed) = self.warn_due(field) {
                tracing::warn!(
                    service = %self.key, seq, field, count, suppressed,
                    "events refused: {example}"
                );
            }
        }
        self.status.update(|s| {
            for &(field, count, _) in &by_field {
                *s.refused.entry(field).or_default() += count;
            }
        });
    }

    /// `Some(suppressed)` when a warning of `kind` may be logged now (see [`WarnLimiter`]).
    fn warn_due(&mut self, kind: &'static str) -> Option<u64> {
        self.warnings.check(kind, Instant::now())
    }
}

/// Show the runtime profile check the blocks a batch stores (a clear resets it).
fn observe_hashes(hash_check: &mut HashCheck, batch: &DecodedBatch) {
    for event in &batch.events {
        match event {
            KvEvent::Stored(stored) => hash_check.observe_stored(stored),
            KvEvent::AllCleared => hash_check.forget_all(),
            _ => {}
        }
    }
}

#[derive(Default)]
struct EventCounts {
    stored: u64,
    removed: u64,
    cleared: u64,
    invalid: u64,
    profile_conflicts: u64,
}

impl EventCounts {
    fn of(batch: &DecodedBatch) -> Self {
        let mut counts = EventCounts {
            invalid: batch.invalid.len() as u64,
            ..Default::default()
        };
        for event in &batch.events {
            match event {
                KvEvent::Stored(_) | KvEvent::StoreStored(_) => counts.stored += 1,
                KvEvent::Removed(_) | KvEvent::StoreRemoved(_) => counts.removed += 1,
                KvEvent::AllCleared | KvEvent::StoreCleared { .. } => counts.cleared += 1,
            }
        }
        counts
    }
}

/// Engines stamp seconds (float), the Mooncake store milliseconds.
fn timestamp_ms(ts: f64, seconds: bool) -> Option<u64> {
    let ms = if seconds { ts * 1000.0 } else { ts };
    (ms.is_finite() && ms >= 0.0 && ms < u64::MAX as f64).then_some(ms as u64)
}

impl Actor for SubscriptionActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Never let the mailbox grow without bound: socket tasks await each hand-off.
        ctx.set_mailbox_capacity(256);
        let sink = ActorSink(ctx.address());
        tokio::spawn(socket::run_live(
            self.config.endpoint.clone(),
            sink,
            self.settings,
            self.cancel.clone(),
        ));
        // After recovery, ask for what was published while the Conductor was down.
        let actions = self.seq.begin_catch_up();
        self.perform(actions, ctx);
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        self.cancel.cancel();
    }
}

/// A live message from the SUB socket.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LiveFrames(pub Vec<Bytes>);

#[derive(Message)]
#[rtype(result = "()")]
pub struct Connected;

/// The live connection ended; the socket task reconnects by itself.
#[derive(Message)]
#[rtype(result = "()")]
pub struct LinkLost(pub LinkLoss);

#[derive(Message)]
#[rtype(result = "()")]
pub struct Replayed {
    pub generation: u64,
    pub event: ReplayEvent,
}

/// Stop consuming: cancel the socket tasks and stop the actor. Replies once stopped.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

/// Send every context this source fed, and that got no ops of the source's later batches, the
/// mark of the last batch the source consumed ([`Advance`]). Replies once the marks are in the
/// contexts' mailboxes, behind every op this source sent them: a checkpoint that asks a context
/// for its changes after the reply records the source's position with exactly the ops that
/// reached the context up to it, so no context lags its source (the checkpoint asks every
/// subscription first, see `durability::checkpoint`).
#[derive(Message)]
#[rtype(result = "()")]
pub struct PushMarks;

impl Handler<LiveFrames> for SubscriptionActor {
    type Result = ();

    fn handle(&mut self, msg: LiveFrames, ctx: &mut Context<Self>) {
        match socket::parse_frames(&msg.0) {
            Ok(frame) => {
                let actions = self.seq.on_live(frame.seq, frame.payload);
                self.perform(actions, ctx);
            }
            Err(e) => {
                tracing::debug!(service = %self.key, error = e.as_str(), "malformed message dropped");
                self.status.update(|s| s.frame_errors += 1);
            }
        }
    }
}

impl Handler<Connected> for SubscriptionActor {
    type Result = ();

    fn handle(&mut self, _: Connected, _ctx: &mut Context<Self>) {
        self.status.update(|s| s.connected = true);
    }
}

impl Handler<LinkLost> for SubscriptionActor {
    type Result = ();

    fn handle(&mut self, msg: LinkLost, _ctx: &mut Context<Self>) {
        let loss = msg.0;
        self.status.update(|s| {
            s.connected = false;
            s.disconnects += 1;
            s.oversized_messages += u64::from(loss.oversized);
        });
        let kind = if loss.oversized { "oversized" } else { "link" };
        if let Some(suppressed) = self.warn_due(kind) {
            tracing::warn!(
                service = %self.key, endpoint = %self.config.endpoint, reason = %loss.reason, suppressed,
                "publisher connection dropped; reconnecting"
            );
        }
    }
}

impl Handler<Replayed> for SubscriptionActor {
    type Result = ();

    fn handle(&mut self, msg: Replayed, ctx: &mut Context<Self>) {
        if msg.generation != self.replay_generation {
            return;
        }
        let actions = match msg.event {
            ReplayEvent::Frames(frames) => match socket::parse_frames(&frames) {
                Ok(frame) => {
                    let digest = payload_digest(&frame.payload);
                    self.seq.on_replayed(frame.seq, frame.payload, digest)
                }
                Err(e) => {
                    if let Some(suppressed) = self.warn_due("replay_malformed") {
                        tracing::warn!(service = %self.key, error = e.as_str(), suppressed, "malformed replay message");
                    }
                    self.status.update(|s| s.frame_errors += 1);
                    self.seq.on_replay_failed()
                }
            },
            ReplayEvent::End => {
                self.replay_cancel = None;
                self.seq.on_replay_end()
            }
            ReplayEvent::Failed { reason, oversized } => {
                if let Some(suppressed) = self.warn_due("replay_failed") {
                    tracing::warn!(service = %self.key, %reason, suppressed, "replay failed");
                }
                self.replay_cancel = None;
                let actions = self.seq.on_replay_failed();
                // One update with the failed replay counted, so that no reader sees the
                // oversized answer without the replay it failed.
                let counters = self.seq.counters();
                self.status.update(|s| {
                    s.oversized_messages += u64::from(oversized);
                    s.seq = counters;
                });
                actions
            }
        };
        self.perform(actions, ctx);
    }
}

impl Handler<Stop> for SubscriptionActor {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) {
        // The final checkpoint runs after every subscription stopped.
        self.push_marks();
        self.cancel.cancel();
        ctx.stop();
    }
}

impl Handler<PushMarks> for SubscriptionActor {
    type Result = ();

    fn handle(&mut self, _: PushMarks, _ctx: &mut Context<Self>) {
        self.push_marks();
    }
}

/// Socket tasks deliver into the actor's mailbox, awaiting each send (back-pressure).
struct ActorSink(Addr<SubscriptionActor>);

impl FrameSink for ActorSink {
    async fn live(&self, frames: Vec<Bytes>) -> bool {
        self.0.send(LiveFrames(frames)).await.is_ok()
    }

    async fn connected(&self) -> bool {
        self.0.send(Connected).await.is_ok()
    }

    async fn link_lost(&self, loss: LinkLoss) -> bool {
        self.0.send(LinkLost(loss)).await.is_ok()
    }

    async fn replay(&self, generation: u64, event: ReplayEvent) -> bool {
        self.0.send(Replayed { generation, event }).await.is_ok()
    }
}
