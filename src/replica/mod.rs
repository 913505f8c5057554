//! Replicas beyond shared registrations: a new replica bootstraps from a peer's snapshot, and
//! every replica serves one (`Replica.Snapshot`, gRPC).
//!
//! Layout: [`format`] the stream's records and bounds; [`cut`] the peer's consistent cut and
//! its chunks; [`serve`] the gRPC service; [`pull`] the new replica's side (receive, write,
//! load); [`build`] the contexts made from the records as they arrive; [`progress`] the
//! replica id and bootstrap phase for `/health` and `/metrics`.
//!
//! A bootstrap runs only when `bootstrap_from` is set and the data directory held nothing
//! (recovery found no registration and no context): a replica with state of its own recovers
//! it, exactly as without the option. After the snapshot is loaded the replica restarts its
//! subscriptions from the snapshot's watermarks like after its own restart, and is ready once
//! every one of them is live again (or after [`CATCH_UP_LIMIT`]).

pub mod build;
#[cfg(test)]
mod build_tests;
pub mod cut;
#[cfg(test)]
mod cut_tests;
pub mod format;
pub mod progress;
pub mod pull;
pub mod serve;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;

use crate::config::Config;
use crate::durability::recovery::Recovered;
use crate::gateway::readiness::Readiness;
use crate::registry::{ListServices, Registry};
use crate::storage::KvStore;
use crate::subscription::state::Phase as SubscriptionPhase;

use progress::{Phase, Progress};

/// The longest a bootstrapped replica waits for its subscriptions to be live before it reports
/// ready anyway (a publisher that sends nothing never makes its subscription live).
pub const CATCH_UP_LIMIT: Duration = Duration::from_secs(30);

/// The peer this start bootstraps from, if it does: `bootstrap_from` is set and recovery found
/// nothing. A data directory with state of its own wins, with a log line.
pub fn peer_to_pull<'a>(config: &'a Config, recovered: &Recovered) -> Option<&'a str> {
    let peer = config.bootstrap_from.as_deref()?;
    if !recovered.registrations.is_empty() || !recovered.contexts.is_empty() {
        tracing::info!(
            peer,
            registrations = recovered.registrations.len(),
            contexts = recovered.contexts.len(),
            "the data directory holds state of its own: bootstrap_from is ignored"
        );
        return None;
    }
    Some(peer)
}

/// Pull and load a snapshot from `peer`, reporting progress on `readiness`; `None` when it
/// failed (logged, the replica starts empty).
pub async fn bootstrap(
    peer: &str,
    token: Option<&[u8]>,
    store: &Arc<dyn KvStore>,
    readiness: &Readiness,
    progress: &Progress,
) -> Option<Recovered> {
    let started = Instant::now();
    progress.pulling(0);
    readiness.set_starting(format!("bootstrapping from {peer}: connecting"));
    let pull = pull::pull(peer, token, store, progress);
    tokio::pin!(pull);
    let mut ticker = tokio::time::interval(Duration::from_millis(100));
    let result = loop {
        tokio::select! {
            result = &mut pull => break result,
            _ = ticker.tick() => {
                let (received, expected) = progress.pairs();
                let what = match progress.phase() {
                    Phase::Loading => "loading".to_owned(),
                    _ => format!("{received} of {expected} pairs received"),
                };
                readiness.set_starting(format!("bootstrapping from {peer}: {what}"));
            }
        }
    };
    match result {
        Ok(pulled) => {
            tracing::info!(
                peer,
                peer_id = %pulled.peer_id,
                contexts = pulled.recovered.contexts.len(),
                registrations = pulled.recovered.registrations.len(),
                pairs = pulled.recovered.pairs,
                elapsed = ?started.elapsed(),
                "bootstrapped from a peer's snapshot"
            );
            progress.set_phase(Phase::CatchingUp);
            Some(pulled.recovered)
        }
        Err(e) => {
            tracing::error!("bootstrap failed, starting empty: {e}");
            progress.set_phase(Phase::Failed);
            None
        }
    }
}

/// Whether every subscription has caught up with its publisher: live, nothing pending. One
/// whose replay could not reach its watermark (resyncing) has nothing more to wait for.
fn caught_up(services: &[crate::registry::ServiceInfo]) -> bool {
    services.iter().all(|s| {
        matches!(
            s.status.phase,
            Some(SubscriptionPhase::Live | SubscriptionPhase::Resyncing)
        ) && s.status.pending_batches == 0
    })
}

/// Wait until the bootstrapped replica's subscriptions are live (at most [`CATCH_UP_LIMIT`]),
/// saying on `readiness` how many are.
pub async fn catch_up(registry: &Addr<Registry>, readiness: &Readiness, progress: &Progress) {
    let deadline = Instant::now() + CATCH_UP_LIMIT;
    loop {
        let Ok(services) = registry.send(ListServices).await else {
            break;
        };
        if caught_up(&services) {
            break;
        }
        if Instant::now() >= deadline {
            tracing::warn!(
                limit = ?CATCH_UP_LIMIT,
                "not every subscription is live after the bootstrap; reporting ready anyway"
            );
            break;
        }
        let live = services
            .iter()
            .filter(|s| s.status.phase == Some(SubscriptionPhase::Live))
            .count();
        readiness.set_starting(format!(
            "bootstrapped: replaying from the snapshot's watermarks, {live} of {} subscriptions live",
            services.len()
        ));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    progress.set_phase(Phase::Done);
}
