//! Whether the service is ready, and if not, why: the servers answer from the moment recovery
//! has loaded the indexes, while subscriptions are still being restored, so a publisher that
//! misbehaves at start can never keep `/health` (or an operator) from getting an answer.

use std::sync::Mutex;

#[derive(Debug)]
pub struct Readiness {
    /// `None` once ready; otherwise what the service is still doing.
    starting: Mutex<Option<String>>,
}

impl Readiness {
    pub fn starting(reason: impl Into<String>) -> Self {
        Readiness {
            starting: Mutex::new(Some(reason.into())),
        }
    }

    pub fn set_starting(&self, reason: impl Into<String>) {
        *self.lock() = Some(reason.into());
    }

    pub fn set_ready(&self) {
        *self.lock() = None;
    }

    pub fn is_ready(&self) -> bool {
        self.lock().is_none()
    }

    /// What the service is still doing, while not ready.
    pub fn reason(&self) -> Option<String> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.starting.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reason_is_reported_until_ready() {
        let r = Readiness::starting("restoring 3 subscriptions");
        assert!(!r.is_ready());
        assert_eq!(r.reason().as_deref(), Some("restoring 3 subscriptions"));
        r.set_starting("starting static registrations");
        assert_eq!(r.reason().as_deref(), Some("starting static registrations"));
        r.set_ready();
        assert!(r.is_ready());
        assert_eq!(r.reason(), None);
    }
}
