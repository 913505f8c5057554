//! Whether the service is ready, and if not, why: the servers answer from the moment recovery
//! has loaded the indexes, while subscriptions are still being restored, so a publisher that
//! misbehaves at start can never keep `/health` (or an operator) from getting an answer.

use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

/// A part of the service that may have `/health` (and gRPC `Health`) say degraded while it
/// serves. The gateway asks it without knowing what it is, as it renders a `metrics::Section`,
/// so that the modules above the gateway (the replica's bootstrap) report through it.
pub trait DegradedSource: Send + Sync {
    /// Why the service is degraded, while it is.
    fn degraded(&self) -> Option<String>;
}

#[derive(Debug)]
pub struct Readiness {
    /// `None` once ready; otherwise what the service is still doing.
    starting: Mutex<Option<String>>,
    ready: Notify,
}

impl Readiness {
    pub fn starting(reason: impl Into<String>) -> Self {
        Readiness {
            starting: Mutex::new(Some(reason.into())),
            ready: Notify::new(),
        }
    }

    /// Wait until ready, at most `limit`; whether it is ready. Restoring subscriptions takes
    /// milliseconds, so a registration sent right after a restart waits for it rather than
    /// failing.
    pub async fn wait_ready(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.ready.notified();
            if self.is_ready() {
                return true;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.is_ready();
            }
        }
    }

    pub fn set_starting(&self, reason: impl Into<String>) {
        *self.lock() = Some(reason.into());
    }

    pub fn set_ready(&self) {
        *self.lock() = None;
        self.ready.notify_waiters();
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

    #[tokio::test]
    async fn a_waiter_is_released_when_ready_and_gives_up_at_its_limit() {
        let r = std::sync::Arc::new(Readiness::starting("restoring 1 subscriptions"));
        assert!(!r.wait_ready(Duration::from_millis(20)).await);
        let waiter = {
            let r = r.clone();
            tokio::spawn(async move { r.wait_ready(Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        r.set_ready();
        assert!(waiter.await.expect("waiter"));
        assert!(r.wait_ready(Duration::ZERO).await);
    }
}
