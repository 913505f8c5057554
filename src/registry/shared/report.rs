//! What a replica says about a suspected etcd reset, for `/health` (degraded, with the reason),
//! `/metrics` and `/services/status`: written by the task that follows etcd, read by the gateway.

use std::sync::Mutex;

use super::OnReset;
use super::reset::{ResetReason, Suspicion};

/// Registrations this replica runs although etcd does not hold them, since a suspected reset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub reason: ResetReason,
    pub detail: String,
    /// Their service keys, in order.
    pub services: Vec<String>,
    /// Unix milliseconds of the listing that first held them.
    pub since_ms: u64,
    pub on_reset: OnReset,
    /// Registrations etcd refused to take back, with its answer.
    pub refused: Vec<(String, String)>,
}

impl Held {
    /// The `/health` reason: what happened, what is held, and what comes next.
    pub fn describe(&self) -> String {
        let next = match self.on_reset {
            OnReset::Reupload if self.refused.is_empty() => {
                "writing them back into etcd".to_owned()
            }
            OnReset::Reupload => {
                let refused: Vec<String> = (self.refused.iter())
                    .map(|(service, error)| format!("{service}: {error}"))
                    .collect();
                format!(
                    "etcd refused to take back {}; POST /registry/accept removes what is held",
                    refused.join("; ")
                )
            }
            OnReset::Hold => "POST /registry/reupload writes them back, POST /registry/accept \
                              confirms their removal"
                .to_owned(),
        };
        // The service keys are in `/services/status`, which `auth_reads` protects; `/health`
        // is open to any prober.
        format!(
            "suspected etcd reset ({}): {}; still serving {} registration(s) etcd does not \
             hold (listed in /services/status); {next}",
            self.reason,
            self.detail,
            self.services.len(),
        )
    }
}

#[derive(Debug, Default)]
struct State {
    held: Option<Held>,
    /// Suspected resets so far, by [`ResetReason::ALL`]'s order.
    detected: [u64; ResetReason::ALL.len()],
}

#[derive(Debug, Default)]
pub struct ResetReport {
    state: Mutex<State>,
}

impl ResetReport {
    /// One more suspected reset.
    pub fn count(&self, reason: ResetReason) {
        let i = ResetReason::ALL.iter().position(|r| *r == reason);
        if let Some(i) = i {
            self.lock().detected[i] += 1;
        }
    }

    /// Suspected resets so far, for every reason (0 included, so a rate has a series to use).
    pub fn detected(&self) -> Vec<(ResetReason, u64)> {
        let detected = self.lock().detected;
        ResetReason::ALL.into_iter().zip(detected).collect()
    }

    /// What is held now (`services` empty: nothing, whatever `suspicion` says).
    pub fn update(&self, suspicion: Option<&Suspicion>, services: Vec<String>, on_reset: OnReset) {
        let mut state = self.lock();
        let (Some(suspicion), false) = (suspicion, services.is_empty()) else {
            state.held = None;
            return;
        };
        let since_ms = match &state.held {
            Some(held) => held.since_ms,
            None => now_ms(),
        };
        let refused = (state.held.take())
            .map(|h| h.refused)
            .unwrap_or_default()
            .into_iter()
            .filter(|(service, _)| services.contains(service))
            .collect();
        state.held = Some(Held {
            reason: suspicion.reason,
            detail: suspicion.detail.clone(),
            services,
            since_ms,
            on_reset,
            refused,
        });
    }

    /// The outcome of writing the held registrations back: those etcd refused.
    pub fn refused(&self, refused: Vec<(String, String)>) {
        if let Some(held) = &mut self.lock().held {
            held.refused = refused;
        }
    }

    pub fn held(&self) -> Option<Held> {
        self.lock().held.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost() -> Suspicion {
        Suspicion {
            reason: ResetReason::HistoryLost,
            detail: "etcd no longer holds the epoch".into(),
        }
    }

    #[test]
    fn held_registrations_are_described_until_none_is_left() {
        let report = ResetReport::default();
        assert_eq!(report.held(), None);
        report.update(Some(&lost()), vec!["a|default|0".into()], OnReset::Hold);
        let held = report.held().unwrap();
        let text = held.describe();
        assert!(
            text.contains("history_lost") && text.contains("1 registration"),
            "{text}"
        );
        assert!(
            !text.contains("a|default|0"),
            "service keys stay out of /health: {text}"
        );
        assert!(text.contains("POST /registry/reupload"), "{text}");
        // Still held later: the same start time.
        report.update(Some(&lost()), vec!["a|default|0".into()], OnReset::Hold);
        assert_eq!(report.held().unwrap().since_ms, held.since_ms);
        report.update(Some(&lost()), Vec::new(), OnReset::Hold);
        assert_eq!(report.held(), None);
    }

    #[test]
    fn refusals_are_reported_for_what_is_still_held() {
        let report = ResetReport::default();
        let both = vec!["a|default|0".to_owned(), "b|default|0".to_owned()];
        report.update(Some(&lost()), both, OnReset::Reupload);
        assert!(
            report
                .held()
                .unwrap()
                .describe()
                .contains("writing them back")
        );
        report.refused(vec![("b|default|0".into(), "endpoint taken".into())]);
        let text = report.held().unwrap().describe();
        assert!(text.contains("b|default|0: endpoint taken"), "{text}");
        report.update(Some(&lost()), vec!["a|default|0".into()], OnReset::Reupload);
        assert!(report.held().unwrap().refused.is_empty());
    }

    #[test]
    fn resets_are_counted_by_reason() {
        let report = ResetReport::default();
        report.count(ResetReason::RevisionBackwards);
        report.count(ResetReason::RevisionBackwards);
        let detected = report.detected();
        assert_eq!(detected.len(), ResetReason::ALL.len());
        assert!(detected.contains(&(ResetReason::RevisionBackwards, 2)));
        assert!(detected.contains(&(ResetReason::HistoryLost, 0)));
    }
}
