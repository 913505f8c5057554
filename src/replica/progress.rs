//! What this replica is and how its bootstrap goes, for `/health` and `/metrics`.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where a bootstrap is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No `bootstrap_from`, or the data directory had state of its own.
    Off,
    Pulling,
    /// Recovering the received records.
    Loading,
    /// An attempt failed; the next one starts after a back-off.
    Retrying,
    /// Subscriptions replaying from the snapshot's positions.
    CatchingUp,
    Done,
    /// Every attempt failed; the replica started empty.
    Failed,
}

impl Phase {
    pub const ALL: [Phase; 7] = [
        Phase::Off,
        Phase::Pulling,
        Phase::Loading,
        Phase::Retrying,
        Phase::CatchingUp,
        Phase::Done,
        Phase::Failed,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Off => "off",
            Phase::Pulling => "pulling",
            Phase::Loading => "loading",
            Phase::Retrying => "retrying",
            Phase::CatchingUp => "catching_up",
            Phase::Done => "done",
            Phase::Failed => "failed",
        }
    }
}

/// This replica's identity and its bootstrap's progress; shared by the bootstrap and `/metrics`.
#[derive(Debug)]
pub struct Progress {
    replica_id: String,
    phase: Mutex<Phase>,
    pairs_expected: AtomicU64,
    pairs_received: AtomicU64,
    bytes_received: AtomicU64,
    attempts: AtomicU64,
    failures: AtomicU64,
    /// Failed attempts this replica gave up on: past the deadline, beyond its bounds.
    past_deadline: AtomicU64,
    over_limit: AtomicU64,
}

impl Progress {
    pub fn new(replica_id: String) -> Self {
        Progress {
            replica_id,
            phase: Mutex::new(Phase::Off),
            pairs_expected: AtomicU64::new(0),
            pairs_received: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            attempts: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            past_deadline: AtomicU64::new(0),
            over_limit: AtomicU64::new(0),
        }
    }

    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    pub fn phase(&self) -> Phase {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_phase(&self, phase: Phase) {
        *self.phase.lock().unwrap_or_else(|p| p.into_inner()) = phase;
    }

    /// An attempt starts; its number (from 1).
    pub fn attempt(&self) -> u64 {
        self.pairs_expected.store(0, Ordering::Relaxed);
        self.pairs_received.store(0, Ordering::Relaxed);
        self.set_phase(Phase::Pulling);
        self.attempts.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// An attempt failed.
    pub fn failed(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A failed attempt was abandoned by this replica: `"deadline"` or `"limit"`.
    pub fn abandoned(&self, why: &str) {
        let counter = match why {
            "deadline" => &self.past_deadline,
            _ => &self.over_limit,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// (attempts started, attempts failed).
    pub fn attempts(&self) -> (u64, u64) {
        (
            self.attempts.load(Ordering::Relaxed),
            self.failures.load(Ordering::Relaxed),
        )
    }

    pub fn pulling(&self, pairs_expected: u64) {
        self.pairs_expected.store(pairs_expected, Ordering::Relaxed);
        self.pairs_received.store(0, Ordering::Relaxed);
        self.set_phase(Phase::Pulling);
    }

    /// One more chunk: its pairs and its encoded size.
    pub fn received(&self, pairs: u64, bytes: u64) {
        self.pairs_received.fetch_add(pairs, Ordering::Relaxed);
        self.bytes_received.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn loading(&self) {
        self.set_phase(Phase::Loading);
    }

    /// (received, expected) pairs.
    pub fn pairs(&self) -> (u64, u64) {
        (
            self.pairs_received.load(Ordering::Relaxed),
            self.pairs_expected.load(Ordering::Relaxed),
        )
    }
}

impl crate::metrics::Section for Progress {
    /// The Prometheus text of this replica's gauges.
    fn render(&self, w: &mut String) {
        let id = self.replica_id.replace('\\', "\\\\").replace('"', "\\\"");
        let _ = writeln!(
            w,
            "# HELP conductor_replica_info This replica's id (config `replica_id`, else the host name)\n\
             # TYPE conductor_replica_info gauge\nconductor_replica_info{{replica_id=\"{id}\"}} 1"
        );
        let now = self.phase();
        let _ = writeln!(
            w,
            "# HELP conductor_bootstrap_state 1 for the phase the bootstrap from a peer is in\n\
             # TYPE conductor_bootstrap_state gauge"
        );
        for phase in Phase::ALL {
            let _ = writeln!(
                w,
                "conductor_bootstrap_state{{state=\"{}\"}} {}",
                phase.as_str(),
                (phase == now) as u8
            );
        }
        let (received, expected) = self.pairs();
        let _ = writeln!(
            w,
            "# HELP conductor_bootstrap_pairs_received Pairs received from the peer's snapshot\n\
             # TYPE conductor_bootstrap_pairs_received gauge\nconductor_bootstrap_pairs_received {received}\n\
             # HELP conductor_bootstrap_pairs_expected Pairs the peer's snapshot announced\n\
             # TYPE conductor_bootstrap_pairs_expected gauge\nconductor_bootstrap_pairs_expected {expected}\n\
             # HELP conductor_bootstrap_bytes_received Bytes of snapshot chunks received from the peer\n\
             # TYPE conductor_bootstrap_bytes_received gauge\nconductor_bootstrap_bytes_received {}",
            self.bytes_received.load(Ordering::Relaxed)
        );
        let (attempts, failures) = self.attempts();
        let _ = writeln!(
            w,
            "# HELP conductor_bootstrap_attempts_total Snapshot pulls started from the peer\n\
             # TYPE conductor_bootstrap_attempts_total counter\nconductor_bootstrap_attempts_total {attempts}\n\
             # HELP conductor_bootstrap_failures_total Snapshot pulls that failed (each is retried, see docs/replicas.md)\n\
             # TYPE conductor_bootstrap_failures_total counter\nconductor_bootstrap_failures_total {failures}"
        );
        let _ = writeln!(
            w,
            "# HELP conductor_bootstrap_abandoned_total Failed snapshot pulls abandoned by this replica: past bootstrap_deadline_ms, or beyond its bounds (docs/replicas.md)\n\
             # TYPE conductor_bootstrap_abandoned_total counter\n\
             conductor_bootstrap_abandoned_total{{reason=\"deadline\"}} {}\n\
             conductor_bootstrap_abandoned_total{{reason=\"limit\"}} {}",
            self.past_deadline.load(Ordering::Relaxed),
            self.over_limit.load(Ordering::Relaxed)
        );
    }
}

/// The configured id, else the host name, else one made of the process id.
pub fn replica_id(configured: Option<&str>) -> String {
    if let Some(id) = configured {
        return id.to_owned();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("replica-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Section;

    #[test]
    fn metrics_name_the_replica_and_the_one_current_phase() {
        let p = Progress::new("a\"b".into());
        assert_eq!(p.attempt(), 1);
        p.failed();
        assert_eq!(p.attempt(), 2);
        p.pulling(10);
        p.received(4, 100);
        let mut text = String::new();
        p.render(&mut text);
        assert!(text.contains("conductor_replica_info{replica_id=\"a\\\"b\"} 1"));
        assert!(text.contains("conductor_bootstrap_state{state=\"pulling\"} 1"));
        assert!(text.contains("conductor_bootstrap_state{state=\"off\"} 0"));
        assert!(text.contains("conductor_bootstrap_pairs_received 4"));
        assert!(text.contains("conductor_bootstrap_pairs_expected 10"));
        assert!(text.contains("conductor_bootstrap_bytes_received 100"));
        assert!(text.contains("conductor_bootstrap_attempts_total 2"));
        assert!(text.contains("conductor_bootstrap_failures_total 1"));
        p.abandoned("deadline");
        let mut text = String::new();
        p.render(&mut text);
        assert!(text.contains("conductor_bootstrap_abandoned_total{reason=\"deadline\"} 1"));
        assert!(text.contains("conductor_bootstrap_abandoned_total{reason=\"limit\"} 0"));
    }

    #[test]
    fn a_configured_id_wins() {
        assert_eq!(replica_id(Some("r1")), "r1");
        assert!(!replica_id(None).is_empty());
    }
}
