//! The subscription actor: a thin shell that feeds socket input to [`SeqState`], runs what it
//! must apply through the [`Ingest`] step, hands the batches to the context actors, and spawns
//! the socket tasks.
//!
//! A publisher that is away (its live connection lost, or never made) keeps its blocks for
//! `unreachable_grace`: a brief partition costs nothing. On its return, the last applied batch
//! is checked through the replay socket as after a restart of the Conductor, so a publisher that
//! restarted meanwhile is found and its stale blocks dropped. Past the grace its source is
//! dropped, and rebuilt from its replay buffer once it is back (see `docs/zmtp.md`).

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::index::ContextHandle;
use crate::index::Watermark;
use crate::index::actor::{Advance, ApplySequenced, DropSource, MAILBOX_CAPACITY};
use crate::index::{ContextDirectory, payload_digest};
use crate::model::{PublisherConfig, SubscriptionKey};

use super::ingest_step::{ContextBatch, Ingest, IngestStep, IngestWarning};
use super::marks::SourcePosition;
use super::route::RouteLimits;
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
    ingest: Ingest,
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
    /// Batches waiting for a context to take them (see `hand_off`).
    waiting_hand_offs: usize,
    /// The registration's incarnation (`durability::sources`).
    incarnation: u64,
    /// Ask for the publisher's whole buffer when the actor starts (a restored registration
    /// without a position).
    from_start: bool,
    /// How many times this subscription dropped its source.
    generation: u64,
    /// The mark of the last batch applied, to check on reconnect that the publisher still has it.
    last_mark: Option<Watermark>,
    /// Whether the live connection is up, and whether it ever was.
    connected: bool,
    ever_connected: bool,
    /// Bumped on every (re)connection: a grace timer of an earlier absence finds it changed.
    link_epoch: u64,
    /// The source was dropped for being away: rebuild it from the replay buffer on its return.
    rebuild_on_return: bool,
}

impl SubscriptionActor {
    pub fn new(
        config: Arc<PublisherConfig>,
        contexts: ContextDirectory,
        status: StatusCell,
        settings: SubscriptionSettings,
        incarnation: u64,
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
        let fed: Vec<_> = contexts
            .all()
            .into_iter()
            .filter(|handle| handle.reader().fed_by(&key))
            .map(|handle| handle.reader().key().clone())
            .collect();
        let limits = RouteLimits {
            max_contexts: settings.max_contexts,
            max_holders: settings.max_holders,
            max_name_bytes: settings.max_name_bytes,
        };
        SubscriptionActor {
            key,
            ingest: Ingest::new(config.clone(), limits, resume_after, fed),
            seq,
            contexts,
            status,
            settings,
            warnings: WarnLimiter::new(settings.warn_interval),
            cancel: CancellationToken::new(),
            replay_generation: 0,
            replay_cancel: None,
            waiting_hand_offs: 0,
            incarnation,
            from_start: false,
            generation: 0,
            last_mark: resume_after,
            connected: false,
            ever_connected: false,
            link_epoch: 0,
            rebuild_on_return: false,
            config,
        }
    }

    /// Start by replaying the publisher's whole buffer (see `from_start`).
    pub fn replay_from_start_at_start(&mut self) {
        self.from_start = true;
    }

    /// Recovery dropped this source's blocks (no valid position vouched for them): count it as
    /// a drop, and the source as rebuilding until its first batch.
    pub fn note_dropped_at_recovery(&mut self) {
        self.seq.note_dropped();
        self.generation += 1;
    }

    /// The publisher is away from now on: unless it is back within the grace, drop its source.
    fn start_grace(&mut self, ctx: &mut Context<Self>) {
        let epoch = self.link_epoch;
        ctx.run_later(self.settings.unreachable_grace, move |act, ctx| {
            act.grace_expired(epoch, ctx);
        });
    }

    fn grace_expired(&mut self, epoch: u64, ctx: &mut Context<Self>) {
        if epoch != self.link_epoch || self.connected {
            return; // it came back meanwhile
        }
        // A replay still running belongs to the dropped state: its answers are ignored.
        if let Some(replay) = self.replay_cancel.take() {
            replay.cancel();
            self.replay_generation += 1;
        }
        let actions = self.seq.on_unreachable();
        if actions.is_empty() {
            return; // it owns nothing
        }
        self.rebuild_on_return = true;
        self.status.update(|s| s.unreachable_drops += 1);
        if let Some(suppressed) = self.warn_due("unreachable") {
            tracing::warn!(
                service = %self.key, endpoint = %self.config.endpoint, suppressed,
                grace = ?self.settings.unreachable_grace,
                "publisher unreachable past its grace; dropping its blocks until it is back"
            );
        }
        self.perform(actions, ctx);
    }

    /// The live connection is up. After an absence, check through the replay socket that the
    /// publisher is still the process that sent our last batch (as after a restart of the
    /// Conductor), or rebuild its source if it was dropped meanwhile.
    fn on_connected(&mut self, ctx: &mut Context<Self>) {
        self.link_epoch += 1;
        self.connected = true;
        let reconnect = std::mem::replace(&mut self.ever_connected, true);
        self.status.update(|s| s.connected = true);
        let rebuild = std::mem::take(&mut self.rebuild_on_return);
        if self.config.replay_endpoint.is_empty() || self.seq.is_replaying() {
            return;
        }
        let actions = if rebuild {
            self.seq.begin_from_start()
        } else if let Some(mark) = self
            .last_mark
            .filter(|m| reconnect && self.seq.last_applied() == Some(m.seq))
        {
            self.seq.resume_verified(mark.seq, mark.digest);
            self.seq.begin_catch_up()
        } else {
            return;
        };
        self.perform(actions, ctx);
    }

    /// Bring every context this source fed up to the last batch it consumed (see
    /// [`PushMarks`]). Contexts that got ops of that batch already have its mark.
    fn push_marks(&mut self) {
        for (key, mark) in self.ingest.due_marks() {
            // Only a context of this source's profile is one it feeds (another one refused its
            // events).
            let Some(handle) = self
                .contexts
                .get(&key)
                .filter(|h| *h.reader().profile() == self.config.hash_profile)
            else {
                continue;
            };
            handle.notify(Advance {
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
                    self.ingest.source_dropped();
                    self.generation += 1;
                    for handle in self.contexts.all() {
                        handle.notify(DropSource(self.key.clone()));
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
            match handle.try_send(msg) {
                Ok(()) => return,
                Err(SendError::Full(msg)) => msg,
                // A context forgotten meanwhile (its last source left): nothing to apply.
                Err(SendError::Closed(_)) => return,
            }
        };
        self.status.update(|s| s.backpressure_waits += 1);
        self.waiting_hand_offs += 1;
        let send = handle.queue(msg);
        ctx.wait(actix::fut::wrap_future(send).map(|_, act: &mut Self, _| {
            act.waiting_hand_offs -= 1;
        }));
    }

    /// Run one batch through the ingest step and perform what it returns: hand each context its
    /// ops, log the warnings due, update the status once.
    fn apply(&mut self, seq: u64, payload: &[u8], ctx: &mut Context<Self>) {
        let mark = Watermark {
            seq,
            digest: payload_digest(payload),
        };
        self.last_mark = Some(mark);
        let IngestStep {
            batches,
            mut status,
            warnings,
            ..
        } = self.ingest.step(mark, payload);
        for warning in &warnings {
            self.warn(seq, warning);
        }
        for ContextBatch { context, batch } in batches {
            match self
                .contexts
                .get_or_create(&context, &self.config.hash_profile)
            {
                Ok(handle) => {
                    // Adapter contexts list this rank by themselves: an engine store lists its
                    // (instance, rank) in the context it lands in.
                    let msg = ApplySequenced {
                        batch,
                        mark,
                        in_flight: Some(self.status.in_flight().guard()),
                    };
                    self.hand_off(&handle, msg, ctx);
                    self.ingest.delivered(&context, seq);
                }
                Err(conflict) => {
                    if let Some(suppressed) = self.warn_due("profile_conflict") {
                        tracing::warn!(service = %self.key, suppressed, "{conflict}; events for it are skipped");
                    }
                    status.profile_conflict();
                }
            }
        }
        self.status.update(|s| status.apply(s));
    }

    fn warn(&mut self, seq: u64, warning: &IngestWarning) {
        let Some(suppressed) = self.warn_due(warning.kind()) else {
            return;
        };
        match warning {
            IngestWarning::Undecodable(e) => {
                tracing::warn!(service = %self.key, seq, error = %e, suppressed, "undecodable batch dropped");
            }
            IngestWarning::OtherRank(batch_rank) => tracing::warn!(
                service = %self.key, seq, ?batch_rank, suppressed,
                "batch from another DP rank than registered; rejected whole"
            ),
            IngestWarning::Refused {
                field,
                count,
                example,
            } => tracing::warn!(
                service = %self.key, seq, field, count, suppressed,
                "events refused: {example}"
            ),
        }
    }

    /// `Some(suppressed)` when a warning of `kind` may be logged now (see [`WarnLimiter`]).
    fn warn_due(&mut self, kind: &'static str) -> Option<u64> {
        self.warnings.check(kind, Instant::now())
    }
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
        // After recovery, ask for what was published while the Conductor was down (all the
        // publisher buffers, for a source restored without a position).
        let actions = if self.from_start {
            self.seq.begin_from_start()
        } else {
            self.seq.begin_catch_up()
        };
        self.perform(actions, ctx);
        // Recovered blocks of a publisher that never comes back do not stay for ever either.
        self.start_grace(ctx);
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
#[rtype(result = "SourcePosition")]
pub struct PushMarks;

/// The subscription's identity for a checkpoint round's end: (incarnation, generation).
#[derive(Message)]
#[rtype(result = "(u64, u64)")]
pub struct Identity;

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

    fn handle(&mut self, _: Connected, ctx: &mut Context<Self>) {
        self.on_connected(ctx);
    }
}

impl Handler<LinkLost> for SubscriptionActor {
    type Result = ();

    fn handle(&mut self, msg: LinkLost, ctx: &mut Context<Self>) {
        let loss = msg.0;
        self.status.update(|s| {
            s.connected = false;
            s.disconnects += 1;
            s.oversized_messages += u64::from(loss.oversized);
            s.timeouts += u64::from(loss.timed_out);
        });
        // The first loss of a connection starts the grace; a failed handshake while away does
        // not start it again.
        if std::mem::replace(&mut self.connected, false) {
            self.start_grace(ctx);
        }
        let kind = match (loss.oversized, loss.timed_out) {
            (true, _) => "oversized",
            (_, true) => "timeout",
            _ => "link",
        };
        if let Some(suppressed) = self.warn_due(kind) {
            if loss.timed_out {
                tracing::warn!(
                    service = %self.key, endpoint = %self.config.endpoint, reason = %loss.reason, suppressed,
                    "publisher silent past publisher_timeout_ms; reconnecting, its blocks kept for the grace"
                );
            } else {
                tracing::warn!(
                    service = %self.key, endpoint = %self.config.endpoint, reason = %loss.reason, suppressed,
                    "publisher connection dropped; reconnecting"
                );
            }
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
    type Result = MessageResult<PushMarks>;

    fn handle(&mut self, _: PushMarks, _ctx: &mut Context<Self>) -> Self::Result {
        self.push_marks();
        MessageResult(SourcePosition {
            incarnation: self.incarnation,
            generation: self.generation,
            mark: self.ingest.position(),
        })
    }
}

impl Handler<Identity> for SubscriptionActor {
    type Result = MessageResult<Identity>;

    fn handle(&mut self, _: Identity, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult((self.incarnation, self.generation))
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
