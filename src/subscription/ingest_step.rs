//! One subscription's ingest, without any I/O: a payload in, the index batches for its contexts,
//! the status change and the warnings out. The actor shell hands the batches to the context
//! actors, applies the status change, and rate-limits the warnings.
//!
//! The step owns everything the pipeline remembers between batches: the router (which contexts
//! this source fed), the runtime hash check, and the source's marks (see [`SourceMarks`]).

use crate::events::{DecodedBatch, IgnoreReason, IndexBatch, IndexOp, KvEvent};
use crate::index::Watermark;
use crate::model::{ContextKey, PublisherConfig, SubscriptionKey};
use crate::wire::EnvelopeError;

use super::hash_check::HashCheck;
use super::ingest::{Rejected, RoutedBatch, decode_and_route};
use super::marks::SourceMarks;
use super::route::{Refused, RouteLimits, Router};
use super::status::{HashCheckState, SubscriptionStatus};

/// The ingest state of one subscription.
pub struct Ingest {
    key: SubscriptionKey,
    config: std::sync::Arc<PublisherConfig>,
    router: Router,
    hash_check: HashCheck,
    marks: SourceMarks,
}

/// What one payload gives: the batches to hand off (in order), the status change, the warnings.
#[derive(Debug)]
pub struct IngestStep {
    /// The batch's position, sent along with its ops.
    pub mark: Watermark,
    pub batches: Vec<ContextBatch>,
    pub status: StatusChange,
    pub warnings: Vec<IngestWarning>,
}

/// The ops of one batch for one context.
#[derive(Debug)]
pub struct ContextBatch {
    pub context: ContextKey,
    pub batch: IndexBatch,
}

/// Something a warning is due for (the shell logs it, rate-limited per [`IngestWarning::kind`]).
#[derive(Debug, Clone, PartialEq)]
pub enum IngestWarning {
    Undecodable(EnvelopeError),
    /// An engine batch from another DP rank than registered (the rank it names).
    OtherRank(Option<u32>),
    /// Events refused by a bound: how many of this batch broke `field`, and the first one's detail.
    Refused {
        field: &'static str,
        count: u64,
        example: String,
    },
}

impl IngestWarning {
    /// The rate-limiting kind of this warning.
    pub fn kind(&self) -> &'static str {
        match self {
            IngestWarning::Undecodable(_) => "undecodable",
            IngestWarning::OtherRank(_) => "rank_mismatch",
            IngestWarning::Refused { field, .. } => field,
        }
    }
}

/// How one payload changes the subscription's status.
#[derive(Debug, Clone, PartialEq)]
pub enum StatusChange {
    /// The envelope did not decode: counted, nothing else changes.
    Undecodable,
    /// Another DP rank's batch, rejected whole: counted, nothing else changes.
    OtherRank,
    Applied(AppliedBatch),
}

/// The counters a decoded batch moves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppliedBatch {
    pub counts: EventCounts,
    pub ignored: Vec<IgnoreReason>,
    /// Events refused, by field.
    pub refused: Vec<(&'static str, u64)>,
    /// Blocks sent by published hash because their event left its extras out unproven.
    pub kept_as_published: u64,
    pub hash_check: HashCheckSummary,
    pub engine_recipe: Option<String>,
    pub last_batch_ts_ms: Option<u64>,
}

/// The runtime hash check's figures after a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HashCheckSummary {
    pub state: HashCheckState,
    pub ok: u64,
    pub mismatch: u64,
    pub mismatch_rate: f64,
}

/// Events of one batch, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EventCounts {
    pub stored: u64,
    pub removed: u64,
    pub cleared: u64,
    pub invalid: u64,
    /// Routed ops refused because the target context has another hash profile (counted by the
    /// shell, which is the one that finds the context).
    pub profile_conflicts: u64,
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

impl StatusChange {
    /// A routed batch found its context bound to another profile.
    pub fn profile_conflict(&mut self) {
        if let StatusChange::Applied(applied) = self {
            applied.counts.profile_conflicts += 1;
        }
    }

    pub fn apply(self, s: &mut SubscriptionStatus) {
        let applied = match self {
            StatusChange::Undecodable => {
                s.decode_errors += 1;
                return;
            }
            StatusChange::OtherRank => {
                s.rank_mismatches += 1;
                return;
            }
            StatusChange::Applied(applied) => applied,
        };
        let counts = applied.counts;
        *s.events.entry("stored").or_default() += counts.stored;
        *s.events.entry("removed").or_default() += counts.removed;
        *s.events.entry("cleared").or_default() += counts.cleared;
        s.invalid_events += counts.invalid;
        s.profile_conflicts += counts.profile_conflicts;
        for reason in applied.ignored {
            *s.ignored.entry(reason.as_str()).or_default() += 1;
        }
        for &(field, count) in &applied.refused {
            *s.refused.entry(field).or_default() += count;
        }
        s.blocks_kept_as_published += applied.kept_as_published;
        let check = applied.hash_check;
        s.hash_check = check.state;
        s.hash_check_ok = check.ok;
        s.hash_check_mismatch = check.mismatch;
        s.hash_check_mismatch_rate = check.mismatch_rate;
        s.engine_recipe = applied.engine_recipe;
        s.last_batch_ts_ms = applied.last_batch_ts_ms;
    }
}

impl Ingest {
    /// `fed`: contexts recovered from disk that this source fed. Its removals and clears must
    /// still reach them (an adapter's context, a store's contexts), or their blocks would stay.
    pub fn new(
        config: std::sync::Arc<PublisherConfig>,
        limits: RouteLimits,
        resume_after: Option<Watermark>,
        fed: impl IntoIterator<Item = ContextKey>,
    ) -> Self {
        let mut router = Router::new(&config).with_limits(limits);
        for context in fed {
            router.feed(context);
        }
        Ingest {
            key: config.subscription_key(),
            hash_check: HashCheck::new(&config),
            marks: SourceMarks::new(resume_after),
            router,
            config,
        }
    }

    /// Decode the batch at `mark` and route its ops. A bad payload gives no batches and is
    /// counted; it never disturbs what is already indexed.
    pub fn step(&mut self, mark: Watermark, payload: &[u8]) -> IngestStep {
        // Consumed whatever follows: a batch that cannot be decoded or applies nothing moves
        // the source's position all the same.
        self.marks.consumed(mark);
        let mut counts = EventCounts::default();
        let (key, seq, hash_check) = (&self.key, mark.seq, &mut self.hash_check);
        let inspect = |batch: &DecodedBatch| {
            for message in &batch.invalid {
                tracing::debug!(service = %key, seq, "invalid event skipped: {message}");
            }
            observe_hashes(hash_check, batch);
            counts = EventCounts::of(batch);
        };
        let rejected = |status, warning| IngestStep {
            mark,
            batches: Vec::new(),
            status,
            warnings: vec![warning],
        };
        let RoutedBatch {
            ts,
            routed,
            ignored,
        } = match decode_and_route(&self.config, &mut self.router, payload, inspect) {
            Ok(batch) => batch,
            Err(Rejected::Undecodable(e)) => {
                return rejected(StatusChange::Undecodable, IngestWarning::Undecodable(e));
            }
            Err(Rejected::OtherRank(rank)) => {
                return rejected(StatusChange::OtherRank, IngestWarning::OtherRank(rank));
            }
        };
        let warnings = refused_by_field(&self.router.take_refused());
        let refused = warnings
            .iter()
            .filter_map(|w| match w {
                IngestWarning::Refused { field, count, .. } => Some((*field, *count)),
                _ => None,
            })
            .collect();
        let batches = routed
            .into_iter()
            .map(|(context, ops)| ContextBatch {
                context,
                batch: self.batch(ops),
            })
            .collect();
        let check = &self.hash_check;
        let (state, ok, mismatch, mismatch_rate) = check.summary();
        IngestStep {
            mark,
            batches,
            status: StatusChange::Applied(AppliedBatch {
                counts,
                ignored,
                refused,
                kept_as_published: self.router.take_kept_as_published(),
                hash_check: HashCheckSummary {
                    state,
                    ok,
                    mismatch,
                    mismatch_rate,
                },
                engine_recipe: check.engine_recipe(),
                last_batch_ts_ms: timestamp_ms(ts, self.config.publisher_type.is_engine()),
            }),
            warnings,
        }
    }

    fn batch(&self, ops: Vec<IndexOp>) -> IndexBatch {
        IndexBatch {
            source: self.key.clone(),
            ops,
        }
    }

    /// The batch of `step` for `context` reached the context's mailbox.
    pub fn delivered(&mut self, context: &ContextKey, seq: u64) {
        self.marks.sent(context, seq);
    }

    /// The source was dropped from every context.
    pub fn source_dropped(&mut self) {
        self.marks.dropped();
    }

    /// The last batch consumed (`None` before the first batch of a stream).
    pub fn position(&self) -> Option<Watermark> {
        self.marks.position()
    }

    /// The fed contexts that were not sent the current mark, with that mark (see `PushMarks`);
    /// each is taken as sent.
    pub fn due_marks(&mut self) -> Vec<(ContextKey, Watermark)> {
        self.marks.due(self.router.fed_contexts())
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

/// Refused events counted by field, in the order the fields first appear, each with the first
/// refusal of the batch as its example.
fn refused_by_field(refused: &[Refused]) -> Vec<IngestWarning> {
    let mut by_field: Vec<IngestWarning> = Vec::new();
    for r in refused {
        let known = by_field.iter_mut().find_map(|w| match w {
            IngestWarning::Refused { field, count, .. } if *field == r.field => Some(count),
            _ => None,
        });
        match known {
            Some(count) => *count += 1,
            None => by_field.push(IngestWarning::Refused {
                field: r.field,
                count: 1,
                example: r.detail.clone(),
            }),
        }
    }
    by_field
}

/// Engines stamp seconds (float), the Mooncake store milliseconds.
fn timestamp_ms(ts: f64, seconds: bool) -> Option<u64> {
    let ms = if seconds { ts * 1000.0 } else { ts };
    (ms.is_finite() && ms >= 0.0 && ms < u64::MAX as f64).then_some(ms as u64)
}

#[cfg(test)]
#[path = "ingest_step_tests.rs"]
mod tests;
