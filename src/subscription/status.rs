//! What a subscription reports about itself: phase, last seq, and counters for metrics and
//! `/services/status`. The actor updates it after every batch; readers clone it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::events::InFlight;

use super::state::{Phase, SeqCounters};

/// Whether the publisher's hashes match the registered profile (see `hash_check`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HashCheckState {
    /// No block could be recomputed yet.
    #[default]
    Unverified,
    Ok,
    Mismatch,
}

impl HashCheckState {
    pub const fn as_str(self) -> &'static str {
        match self {
            HashCheckState::Unverified => "unverified",
            HashCheckState::Ok => "ok",
            HashCheckState::Mismatch => "mismatch",
        }
    }
}

/// A snapshot of one subscription's health.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubscriptionStatus {
    pub phase: Option<Phase>,
    pub connected: bool,
    pub last_seq: Option<u64>,
    pub seq: SeqCounters,
    /// Messages that were not `[topic, seq, payload]`.
    pub frame_errors: u64,
    /// Messages (live or replayed) refused for announcing more than the configured bound; each
    /// one dropped its connection.
    pub oversized_messages: u64,
    /// Live connections that ended (closed, broken, oversized or silent) and were reconnected.
    pub disconnects: u64,
    /// Of those, connections to a publisher that went silent: no answer to our PINGs within
    /// `publisher_timeout_ms`, or to the kernel's keepalive probes.
    pub timeouts: u64,
    /// Times the publisher stayed without a live connection past
    /// `publisher_unreachable_grace_ms` and its source was dropped.
    pub unreachable_drops: u64,
    /// Payloads whose envelope could not be decoded.
    pub decode_errors: u64,
    /// Single events rejected inside otherwise good batches.
    pub invalid_events: u64,
    /// Batches stamped with a DP rank other than the registration's.
    pub rank_mismatches: u64,
    /// Events applied, by kind (`stored`, `removed`, `cleared`).
    pub events: BTreeMap<&'static str, u64>,
    /// Events skipped on purpose, by reason.
    pub ignored: BTreeMap<&'static str, u64>,
    /// Events refused by a bound (tenant, block size, name length, contexts per source), by the
    /// field or limit they broke.
    pub refused: BTreeMap<&'static str, u64>,
    /// Routed ops refused because the target context has another hash profile.
    pub profile_conflicts: u64,
    /// Blocks of events that leave their extras out (vLLM `extra_keys` absent or `nil`) and
    /// that the registered profile did not prove plain: kept under their published hashes
    /// (see `plain_proof`).
    pub blocks_kept_as_published: u64,
    pub hash_check: HashCheckState,
    pub hash_check_ok: u64,
    pub hash_check_mismatch: u64,
    /// Mismatches among the last recomputed blocks (`hash_check::WINDOW`), as a fraction.
    pub hash_check_mismatch_rate: f64,
    /// The recipe the engine hashes with (see `hash_check`), once known.
    pub engine_recipe: Option<String>,
    /// Unix time (ms) of the last applied batch's publisher timestamp, for lag.
    pub last_batch_ts_ms: Option<u64>,
    /// Batches handed to contexts and not yet applied by them (read when the snapshot is
    /// taken): how far the contexts this source feeds are behind it.
    pub pending_batches: u64,
    /// Times a batch found a context's mailbox full and the subscription waited for it
    /// (back-pressure, see `actor`).
    pub backpressure_waits: u64,
}

impl SubscriptionStatus {
    pub fn phase_name(&self) -> &'static str {
        self.phase.map_or("connecting", Phase::as_str)
    }
}

/// Shared cell the actor writes and everyone else reads.
#[derive(Debug, Clone, Default)]
pub struct StatusCell(Arc<Mutex<SubscriptionStatus>>, InFlight);

impl StatusCell {
    pub fn get(&self) -> SubscriptionStatus {
        let mut s = self.0.lock().unwrap_or_else(|p| p.into_inner()).clone();
        s.pending_batches = self.1.count();
        s
    }

    /// The count of this subscription's batches in contexts' mailboxes.
    pub fn in_flight(&self) -> &InFlight {
        &self.1
    }

    pub fn update(&self, f: impl FnOnce(&mut SubscriptionStatus)) {
        f(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()));
    }
}
