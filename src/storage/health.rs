//! Whether checkpoints are landing. A failing write (a full disk, an I/O error) never stops the
//! service: queries and ingest go on from memory, the changes stay marked for the next round,
//! and `/health` and `/metrics` say that the disk is behind, and why, until a round succeeds.

use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct StorageHealth {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// The last failure, while the latest round had one.
    degraded: Option<String>,
    failures_total: u64,
}

impl StorageHealth {
    /// Record one checkpoint round: its failed writes and the first failure's text.
    pub fn record_round(&self, failed: usize, first_error: Option<String>) {
        let mut s = self.lock();
        s.failures_total += failed as u64;
        s.degraded = match (failed, first_error) {
            (0, _) => None,
            (n, e) => Some(format!(
                "{n} checkpoint writes failed, retried every round: {}",
                e.unwrap_or_default()
            )),
        };
    }

    /// Why the disk is behind, while it is.
    pub fn degraded(&self) -> Option<String> {
        self.lock().degraded.clone()
    }

    pub fn failures_total(&self) -> u64 {
        self.lock().failures_total
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_round_degrades_until_a_clean_one_and_failures_add_up() {
        let h = StorageHealth::default();
        assert_eq!(h.degraded(), None);
        h.record_round(2, Some("No space left on device".into()));
        let reason = h.degraded().unwrap();
        assert!(reason.contains("2 checkpoint writes failed") && reason.contains("No space"));
        h.record_round(1, Some("still full".into()));
        assert!(h.degraded().unwrap().contains("still full"));
        h.record_round(0, None);
        assert_eq!((h.degraded(), h.failures_total()), (None, 3));
    }
}
