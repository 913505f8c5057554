//! The bootstrap's attempts: pull, and after a failure clear what the attempt wrote, wait a
//! back-off and pull again, until one completes or `bootstrap_attempts` have failed.
//!
//! Each attempt first marks the data directory "bootstrap pending" ([`super::pending`]), so a
//! process that dies at any point of it leaves a directory the next start recognises as partial.
//! The back-off doubles from [`FIRST_BACKOFF`] up to [`MAX_BACKOFF`]. Every failure is logged
//! with its reason and counted (`conductor_bootstrap_failures_total`), and `/health` says which
//! attempt failed, why, and when the next starts; the replica is never ready meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::durability::recovery::Recovered;
use crate::gateway::readiness::Readiness;
use crate::storage::KvStore;

use super::pending;
use super::progress::{Phase, Progress};
use super::pull::{self, PullError, Pulled};
use super::receive::Limits;

/// The wait after the first failed attempt; each further failure doubles it.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait between two attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// How the attempts ended.
pub enum Outcome {
    /// A snapshot is loaded: the replica starts from it.
    Loaded(Recovered),
    /// Every allowed attempt failed: the replica starts empty (its directory was cleared and
    /// is no longer marked pending). The attempts made and the last one's error.
    StartEmpty { attempts: u64, error: PullError },
    /// The service is shutting down; the directory stays marked pending.
    Stopped,
}

/// Where one bootstrap pulls from and how often it may try.
pub struct Attempts<'a> {
    pub peer: &'a str,
    pub token: Option<&'a [u8]>,
    /// The CA an `https://` peer is checked against (config `bootstrap_tls`).
    pub tls: Option<&'a tonic::transport::ClientTlsConfig>,
    /// Attempts before starting empty; 0: no limit.
    pub limit: u32,
    /// Each attempt's deadline and bounds.
    pub bounds: Limits,
}

/// The wait after the `failed`-th failed attempt (from 1).
pub fn backoff(failed: u32) -> Duration {
    let doublings = failed.saturating_sub(1).min(16);
    FIRST_BACKOFF
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF)
}

impl Attempts<'_> {
    /// Attempt until one loads a snapshot, the limit is reached, or `shutdown`.
    pub async fn run(
        &self,
        store: &Arc<dyn KvStore>,
        readiness: &Readiness,
        progress: &Progress,
        shutdown: &CancellationToken,
    ) -> Outcome {
        let peer = self.peer;
        loop {
            let attempt = progress.attempt();
            let started = Instant::now();
            let result = tokio::select! {
                r = self.attempt(attempt, store, readiness, progress) => r,
                _ = shutdown.cancelled() => return Outcome::Stopped,
            };
            let e = match result {
                Ok(pulled) => {
                    tracing::info!(
                        peer,
                        attempt,
                        peer_id = %pulled.peer_id,
                        contexts = pulled.recovered.contexts.len(),
                        registrations = pulled.recovered.registrations.len(),
                        pairs = pulled.recovered.pairs,
                        elapsed = ?started.elapsed(),
                        "bootstrapped from a peer's snapshot"
                    );
                    progress.set_phase(Phase::CatchingUp);
                    return Outcome::Loaded(pulled.recovered);
                }
                Err(e) => e,
            };
            progress.failed();
            if let Some(why) = e.abandoned() {
                progress.abandoned(why);
            }
            if self.limit != 0 && attempt >= u64::from(self.limit) {
                // The usual cause is a peer that refuses every snapshot for want of a token:
                // the log says so and how to fix it, beside the error.
                let hint = e.hint().map(|h| format!(" ({h})")).unwrap_or_default();
                tracing::error!(
                    peer,
                    attempts = attempt,
                    "bootstrap failed, starting empty: {e}{hint}; /health says degraded until \
                     every subscription has replayed what its publisher buffers"
                );
                // The failed attempt cleared what it wrote: the directory is empty and this
                // replica's own from now on.
                if let Err(e) = pending::clear(store.as_ref()) {
                    tracing::error!("cannot clear the bootstrap-pending mark: {e}");
                }
                progress.set_phase(Phase::Failed);
                return Outcome::StartEmpty {
                    attempts: attempt,
                    error: e,
                };
            }
            let wait = backoff(attempt.min(u64::from(u32::MAX)) as u32);
            tracing::warn!(
                peer,
                attempt,
                retry_in = ?wait,
                "bootstrap attempt failed, retrying: {e}"
            );
            progress.set_phase(Phase::Retrying);
            readiness.set_starting(format!(
                "bootstrapping from {peer}: attempt {attempt} failed ({e}); attempt {} in {} s",
                attempt + 1,
                wait.as_secs_f32()
            ));
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = shutdown.cancelled() => return Outcome::Stopped,
            }
        }
    }

    /// One pull, its progress on `readiness` meanwhile.
    async fn attempt(
        &self,
        attempt: u64,
        store: &Arc<dyn KvStore>,
        readiness: &Readiness,
        progress: &Progress,
    ) -> Result<Pulled, PullError> {
        let peer = self.peer;
        let which = if attempt == 1 {
            format!("bootstrapping from {peer}")
        } else {
            format!("bootstrapping from {peer} (attempt {attempt})")
        };
        readiness.set_starting(format!("{which}: connecting"));
        // Before the attempt's first write, on disk.
        let marked = {
            let (store, peer) = (store.clone(), peer.to_owned());
            tokio::task::spawn_blocking(move || pending::mark(store.as_ref(), &peer)).await
        };
        match marked {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(PullError::Load(e, peer.to_owned())),
            Err(e) => {
                let e = crate::storage::StorageError::Io(format!("marking the bootstrap: {e}"));
                return Err(PullError::Load(e, peer.to_owned()));
            }
        }
        let pull = pull::pull(peer, self.token, self.tls, store, progress, &self.bounds);
        tokio::pin!(pull);
        let mut ticker = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                result = &mut pull => return result,
                _ = ticker.tick() => {
                    let (received, expected) = progress.pairs();
                    let what = match progress.phase() {
                        Phase::Loading => "loading".to_owned(),
                        _ => format!("{received} of {expected} pairs received"),
                    };
                    readiness.set_starting(format!("{which}: {what}"));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_bound() {
        let waits: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }
}
