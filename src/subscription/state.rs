//! The sequence state machine of one publisher stream, without any I/O.
//!
//! The publisher numbers its batches (vLLM and SGLang from 0 in every process, the Mooncake store
//! from 1). The subscription applies batches strictly in order and never keeps entries it cannot
//! vouch for:
//!
//! * `seq == last + 1`: apply. `seq <= last` while live: a duplicate when equal, otherwise the
//!   publisher restarted, so everything this source owns is dropped before the new stream applies.
//! * a gap (`seq > last + 1`), or a first batch past the stream start when a replay socket exists:
//!   ask the publisher's replay socket for `last + 1..`, apply replayed batches in order until the
//!   end marker, hold live batches meanwhile and apply them afterwards without double-applying.
//! * a gap that cannot be filled (no replay socket, replay starts too late, replay failed or timed
//!   out): drop the source and continue from the live stream.
//!
//! Every decision is returned as [`Action`]s; the actor shell performs them.

use std::collections::VecDeque;

use bytes::Bytes;

/// What the shell must do next, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Decode and apply this batch.
    Apply { seq: u64, payload: Bytes },
    /// Remove everything this source owns from every context (its state is unknown or stale).
    DropSource { reason: DropReason },
    /// Ask the replay socket for every buffered batch from `from_seq` on.
    RequestReplay { from_seq: u64 },
}

/// Why a source's entries were dropped (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    PublisherRestarted,
    GapWithoutReplay,
    ReplayIncomplete,
    ReplayFailed,
    ReplayOverflow,
    PublisherUnreachable,
}

impl DropReason {
    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::PublisherRestarted => "publisher_restarted",
            DropReason::GapWithoutReplay => "gap_without_replay",
            DropReason::ReplayIncomplete => "replay_incomplete",
            DropReason::ReplayFailed => "replay_failed",
            DropReason::ReplayOverflow => "replay_overflow",
            DropReason::PublisherUnreachable => "publisher_unreachable",
        }
    }
}

/// The externally visible phase of a subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No batch seen yet.
    Connecting,
    Live,
    /// Waiting for the publisher's replay of a gap.
    Replaying,
    /// The source was dropped; its entries are being rebuilt from the live stream.
    Resyncing,
}

impl Phase {
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Connecting => "connecting",
            Phase::Live => "live",
            Phase::Replaying => "replaying",
            Phase::Resyncing => "resyncing",
        }
    }
}

/// Counters the state machine itself can know.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SeqCounters {
    pub applied: u64,
    pub duplicates: u64,
    pub gaps: u64,
    pub restarts: u64,
    pub replays_ok: u64,
    pub replays_failed: u64,
    pub sources_dropped: u64,
}

/// A replay in progress.
#[derive(Debug)]
struct Replay {
    /// The next seq the replay must deliver.
    expected: u64,
    /// Live batches that arrived while replaying, in arrival order.
    held: VecDeque<(u64, Bytes)>,
    /// Payload bytes of `held`.
    held_bytes: usize,
    /// The replay skipped batches (the publisher's buffer no longer held them).
    incomplete: bool,
    /// The source holds nothing of this stream (it was just dropped): a first batch past the
    /// stream start is what the buffer still holds, with nothing left to drop.
    fresh: bool,
}

/// The per-stream sequence state (see the module doc).
#[derive(Debug)]
pub struct SeqState {
    /// The first seq of a fresh publisher process (0 for engines, 1 for the Mooncake store).
    stream_start: u64,
    has_replay: bool,
    /// Live batches held during a replay at most; beyond that the replay is abandoned.
    max_held: usize,
    /// Payload bytes of the held batches at most; beyond that the replay is abandoned too.
    max_held_bytes: usize,
    last: Option<u64>,
    /// After a restart of the Conductor: the last applied batch and its payload digest, to be
    /// compared with the publisher's replay of the same seq (another process = other bytes).
    verify: Option<(u64, u64)>,
    replay: Option<Replay>,
    resyncing: bool,
    counters: SeqCounters,
}

impl SeqState {
    pub fn new(stream_start: u64, has_replay: bool, max_held: usize) -> Self {
        SeqState {
            stream_start,
            has_replay,
            max_held,
            max_held_bytes: usize::MAX,
            last: None,
            verify: None,
            replay: None,
            resyncing: false,
            counters: SeqCounters::default(),
        }
    }

    /// Bound the bytes of live batches held during a replay, not only their count.
    pub fn with_max_held_bytes(mut self, max_held_bytes: usize) -> Self {
        self.max_held_bytes = max_held_bytes;
        self
    }

    /// Resume after a restart of the Conductor: batches up to `last_applied` are already in the
    /// recovered index, so the next batch must be `last_applied + 1`.
    pub fn resume_from(&mut self, last_applied: u64) {
        self.last = Some(last_applied);
    }

    /// [`SeqState::resume_from`], and check through the replay socket that the publisher is still
    /// the process that sent batch `last_applied` (whose payload digest was `digest`).
    pub fn resume_verified(&mut self, last_applied: u64, digest: u64) {
        self.last = Some(last_applied);
        self.verify = Some((last_applied, digest));
    }

    /// The source's blocks were dropped outside the stream (by recovery): count it, and show
    /// the source as rebuilding until its first batch.
    pub fn note_dropped(&mut self) {
        self.counters.sources_dropped += 1;
        self.resyncing = true;
    }

    /// The next batch this stream needs, when one is known (for the first replay request after
    /// a resume, before any live batch arrived).
    pub fn next_needed(&self) -> Option<u64> {
        self.last.map(|l| l.saturating_add(1))
    }

    pub fn last_applied(&self) -> Option<u64> {
        self.last
    }

    pub fn counters(&self) -> SeqCounters {
        self.counters
    }

    pub fn phase(&self) -> Phase {
        if self.replay.is_some() {
            Phase::Replaying
        } else if self.resyncing {
            Phase::Resyncing
        } else if self.last.is_none() {
            Phase::Connecting
        } else {
            Phase::Live
        }
    }

    pub fn is_replaying(&self) -> bool {
        self.replay.is_some()
    }

    /// Start a replay without a live trigger (after recovery: ask for what was missed while down).
    pub fn begin_catch_up(&mut self) -> Vec<Action> {
        // With a digest to verify, ask for the last applied batch itself as well.
        let from = match self.verify {
            Some((seq, _)) => Some(seq),
            None => self.next_needed(),
        };
        match (self.has_replay, self.replay.is_some(), from) {
            (true, false, Some(from_seq)) => {
                self.replay = Some(Replay {
                    expected: from_seq,
                    held: VecDeque::new(),
                    held_bytes: 0,
                    incomplete: false,
                    fresh: false,
                });
                vec![Action::RequestReplay { from_seq }]
            }
            _ => Vec::new(),
        }
    }

    /// Start by asking for the publisher's whole buffer, from the stream start (a recorder wants
    /// what was published before it joined too). Nothing without a replay socket, or once a
    /// batch was seen or a replay runs.
    pub fn begin_from_start(&mut self) -> Vec<Action> {
        if !self.has_replay || self.replay.is_some() || self.last.is_some() {
            return Vec::new();
        }
        self.replay = Some(Replay {
            expected: self.stream_start,
            held: VecDeque::new(),
            held_bytes: 0,
            incomplete: false,
            fresh: false,
        });
        vec![Action::RequestReplay {
            from_seq: self.stream_start,
        }]
    }

    /// The publisher stayed unreachable past its grace: what it owns can no longer be vouched for.
    /// Drop it (if it owns anything) and forget the position, so that the stream is taken up
    /// afresh when the publisher is back (`begin_from_start`, or the first live batch). A replay
    /// in progress is abandoned with it.
    pub fn on_unreachable(&mut self) -> Vec<Action> {
        self.verify = None;
        self.replay = None;
        let mut actions = Vec::new();
        if self.last.take().is_some() {
            self.drop_source(DropReason::PublisherUnreachable, &mut actions);
        }
        actions
    }

    /// A batch from the live stream.
    pub fn on_live(&mut self, seq: u64, payload: Bytes) -> Vec<Action> {
        if let Some(replay) = &mut self.replay {
            let bytes = replay.held_bytes.saturating_add(payload.len());
            if replay.held.len() >= self.max_held || bytes > self.max_held_bytes {
                return self.abandon_replay(DropReason::ReplayOverflow, Some((seq, payload)));
            }
            replay.held_bytes = bytes;
            replay.held.push_back((seq, payload));
            return Vec::new();
        }
        let mut actions = Vec::new();
        self.accept_live(seq, payload, &mut actions);
        actions
    }

    fn accept_live(&mut self, seq: u64, payload: Bytes, actions: &mut Vec<Action>) {
        match self.last {
            None if seq > self.stream_start && self.has_replay => {
                self.start_replay(self.stream_start, seq, payload, actions);
            }
            None => self.apply(seq, payload, actions),
            // Nothing follows seq u64::MAX (the position migration 5 gives a source to rebuild):
            // a batch 0 after it is a new stream, not the next batch.
            Some(last) if last.checked_add(1) == Some(seq) => self.apply(seq, payload, actions),
            Some(last) if seq == last => self.counters.duplicates += 1,
            Some(last) if seq < last => {
                // The publisher restarted: its previous process's blocks are gone.
                self.counters.restarts += 1;
                self.drop_source(DropReason::PublisherRestarted, actions);
                self.last = None;
                self.accept_live(seq, payload, actions);
            }
            Some(last) => {
                self.counters.gaps += 1;
                if self.has_replay {
                    self.start_replay(after(last), seq, payload, actions);
                } else {
                    self.drop_source(DropReason::GapWithoutReplay, actions);
                    self.apply(seq, payload, actions);
                }
            }
        }
    }

    fn start_replay(&mut self, from_seq: u64, seq: u64, payload: Bytes, actions: &mut Vec<Action>) {
        let held_bytes = payload.len();
        let mut held = VecDeque::new();
        held.push_back((seq, payload));
        self.replay = Some(Replay {
            expected: from_seq,
            held,
            held_bytes,
            incomplete: false,
            fresh: false,
        });
        actions.push(Action::RequestReplay { from_seq });
    }

    /// A batch the replay socket delivered; `digest` is its payload digest.
    pub fn on_replayed(&mut self, seq: u64, payload: Bytes, digest: u64) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.replay.is_none() {
            return actions; // a late answer to a replay already given up: ignore it
        }
        if let Some((verify_seq, verify_digest)) = self.verify.take() {
            if seq == verify_seq && digest == verify_digest {
                // The same publisher process: everything up to here is already indexed.
                if let Some(replay) = &mut self.replay {
                    replay.expected = after(seq);
                }
                return actions;
            }
            if seq == verify_seq {
                // Another process reuses the seq: it restarted while we were down. What was
                // recovered for this source is gone, and the new process's stream is replayed
                // from its start (what its buffer holds), not from our old position.
                self.counters.restarts += 1;
                self.drop_source(DropReason::PublisherRestarted, &mut actions);
                self.last = None;
                if let Some(replay) = &mut self.replay {
                    replay.expected = self.stream_start;
                    replay.fresh = true;
                }
                actions.push(Action::RequestReplay {
                    from_seq: self.stream_start,
                });
                return actions;
            }
            // The buffer no longer reaches our position: what was recovered for this source
            // cannot be vouched for, and the buffer holds nothing older than this batch.
            if let Some(replay) = &mut self.replay {
                replay.expected = after(seq);
                replay.incomplete = true;
            }
            self.drop_source(DropReason::ReplayIncomplete, &mut actions);
            self.apply(seq, payload, &mut actions);
            return actions;
        }
        let Some(replay) = &mut self.replay else {
            return actions;
        };
        if seq < replay.expected || self.last.is_some_and(|last| seq <= last) {
            return actions; // already applied
        }
        let fresh = std::mem::take(&mut replay.fresh);
        if seq > replay.expected {
            // The publisher's buffer no longer holds what we missed: the source state is unknown
            // (unless it was just dropped and holds nothing of this stream).
            replay.expected = after(seq);
            replay.incomplete = true;
            if !fresh {
                self.drop_source(DropReason::ReplayIncomplete, &mut actions);
            }
            self.apply(seq, payload, &mut actions);
            return actions;
        }
        replay.expected = after(seq);
        self.apply(seq, payload, &mut actions);
        actions
    }

    /// The replay's end marker arrived: apply what was held, then go live.
    pub fn on_replay_end(&mut self) -> Vec<Action> {
        let Some(replay) = self.replay.take() else {
            return Vec::new();
        };
        let mut actions = Vec::new();
        if self.verify.take().is_some() {
            // The publisher's buffer did not hold our last batch: after our restart, its identity
            // cannot be checked, so what was recovered for it is dropped.
            self.counters.replays_failed += 1;
            self.drop_source(DropReason::ReplayIncomplete, &mut actions);
            self.last = None;
            for (seq, payload) in replay.held {
                self.accept_live(seq, payload, &mut actions);
            }
            return actions;
        }
        // The replay brought the source up to the held batches: it is rebuilt as far as the
        // buffer allows (a further drop below marks it rebuilding again).
        if self.last.is_some() {
            self.resyncing = false;
        }
        let next = self.last.map_or(self.stream_start, after);
        // The first held batch must follow what the replay delivered; if the replay stopped short,
        // the batches between are lost for good.
        let stopped_short = replay.held.front().is_some_and(|(seq, _)| *seq > next);
        if replay.incomplete || stopped_short {
            self.counters.replays_failed += 1;
        } else {
            self.counters.replays_ok += 1;
        }
        // Held batches the replay already delivered are skipped; a regression among the held
        // batches themselves is a publisher restart and goes through the live rules.
        let replay_last = self.last;
        let mut previous: Option<u64> = None;
        let mut first = true;
        for (seq, payload) in replay.held {
            let regression = previous.is_some_and(|p| seq < p);
            previous = Some(seq);
            if !regression && replay_last.is_some_and(|l| seq <= l) {
                self.counters.duplicates += 1;
                continue;
            }
            if first && stopped_short {
                self.drop_source(DropReason::ReplayIncomplete, &mut actions);
                self.apply(seq, payload, &mut actions);
            } else if first {
                self.accept_live(seq, payload, &mut actions);
            } else {
                self.accept_live_after_replay(seq, payload, &mut actions);
            }
            first = false;
        }
        actions
    }

    /// Held batches after the first: a further gap among them cannot be replayed again without
    /// risking a loop, so it drops the source.
    fn accept_live_after_replay(&mut self, seq: u64, payload: Bytes, actions: &mut Vec<Action>) {
        match self.last {
            Some(last) if last.checked_add(1).is_some_and(|next| seq > next) => {
                self.counters.gaps += 1;
                self.drop_source(DropReason::GapWithoutReplay, actions);
                self.apply(seq, payload, actions);
            }
            _ => self.accept_live(seq, payload, actions),
        }
    }

    /// The replay failed (timeout, socket error, malformed answer).
    pub fn on_replay_failed(&mut self) -> Vec<Action> {
        if self.replay.is_none() {
            return Vec::new();
        }
        self.abandon_replay(DropReason::ReplayFailed, None)
    }

    fn abandon_replay(&mut self, reason: DropReason, extra: Option<(u64, Bytes)>) -> Vec<Action> {
        self.verify = None;
        let mut actions = Vec::new();
        let Some(replay) = self.replay.take() else {
            return actions;
        };
        self.counters.replays_failed += 1;
        self.drop_source(reason, &mut actions);
        // Follow the live stream from the first held batch on.
        let mut held: Vec<(u64, Bytes)> = replay.held.into_iter().collect();
        held.extend(extra);
        let mut it = held.into_iter();
        if let Some((seq, payload)) = it.next() {
            self.apply(seq, payload, &mut actions);
        }
        for (seq, payload) in it {
            self.accept_live_after_replay(seq, payload, &mut actions);
        }
        actions
    }

    fn apply(&mut self, seq: u64, payload: Bytes, actions: &mut Vec<Action>) {
        self.last = Some(seq);
        self.counters.applied += 1;
        if self.replay.is_none() && !matches!(actions.last(), Some(Action::DropSource { .. })) {
            self.resyncing = false;
        }
        actions.push(Action::Apply { seq, payload });
    }

    fn drop_source(&mut self, reason: DropReason, actions: &mut Vec<Action>) {
        self.counters.sources_dropped += 1;
        self.resyncing = true;
        actions.push(Action::DropSource { reason });
    }
}

/// The seq after `seq`; nothing follows `u64::MAX`, which stays its own successor (a batch with
/// that seq is then already applied, never applied again: see `on_replayed`).
fn after(seq: u64) -> u64 {
    seq.saturating_add(1)
}
