//! Replicas beyond shared registrations: a new replica bootstraps from a peer's snapshot, and
//! every replica serves one (`Replica.Snapshot`, gRPC).
//!
//! Layout: [`format`] the stream's records and bounds; [`cut`] the peer's consistent cut and
//! its chunks; [`positions`] where each source resumes on the new replica; [`serve`] the gRPC
//! service; [`attempts`] the new replica's attempts and their back-off; [`pull`] one attempt
//! (receive, write, load); [`receive`] the stream's checks against this replica's bounds; [`failure`] why an
//! attempt failed; [`build`] the contexts made from the records as they arrive;
//! [`pending`] the data directory's "bootstrap pending" mark; [`progress`] the replica id and
//! bootstrap phase for `/health` and `/metrics`; [`complete`] whether a replica that started
//! empty after its bootstrap failed has caught up (`/health` degraded until then).
//!
//! A bootstrap runs when `bootstrap_from` is set and the data directory held nothing (recovery
//! found no registration and no context), or held a bootstrap that did not complete (its
//! pending mark): a replica with state of its own recovers it, exactly as without the option.
//! After the snapshot is loaded the replica restarts its subscriptions from the snapshot's
//! positions, and is ready once every one of them is live again (or after [`CATCH_UP_LIMIT`]).
//! The pending mark goes once the caught-up state is checkpointed (see
//! [`checkpoint_after_bootstrap`]).

pub mod attempts;
pub mod build;
#[cfg(test)]
mod build_tests;
pub mod complete;
pub mod cut;
#[cfg(test)]
mod cut_order_tests;
#[cfg(test)]
mod cut_tests;
pub mod failure;
pub mod format;
pub mod pending;
pub mod positions;
pub mod progress;
pub mod pull;
pub mod receive;
pub mod serve;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::durability::checkpoint::Checkpointer;
use crate::durability::recovery::Recovered;
use crate::gateway::readiness::Readiness;
use crate::registry::{ListServices, Registry, ServiceInfo};
use crate::storage::{KvStore, StorageError};
use crate::subscription::state::Phase as SubscriptionPhase;

use progress::{Phase, Progress};

/// The longest a bootstrapped replica waits for its subscriptions to be live before it reports
/// ready anyway (a publisher that sends nothing never makes its subscription live).
pub const CATCH_UP_LIMIT: Duration = Duration::from_secs(30);

/// The peer this start bootstraps from, if it does. `bootstrap_from` is set and either recovery
/// found nothing, or the directory holds a bootstrap that did not complete: then what recovery
/// found is partial, so it is taken out of `recovered` and cleared from the store. A data
/// directory with state of its own wins, with a log line.
pub fn plan<'a>(
    config: &'a Config,
    store: &dyn KvStore,
    recovered: &mut Recovered,
) -> Result<Option<&'a str>, StorageError> {
    let peer = config.replica.bootstrap_from.as_deref();
    if let Some(was) = pending::pending(store)? {
        tracing::warn!(
            pending_from = %was,
            registrations = recovered.registrations.len(),
            contexts = recovered.contexts.len(),
            "the data directory holds a bootstrap that did not complete: clearing it"
        );
        recovered.contexts.clear();
        recovered.registrations.clear();
        recovered.sources.clear();
        recovered.dropped.clear();
        recovered.pairs = 0;
        pull::clear(store)?;
        if peer.is_none() {
            tracing::warn!("bootstrap_from is no longer set: starting empty");
            pending::clear(store)?;
        }
        return Ok(peer);
    }
    let Some(peer) = peer else {
        return Ok(None);
    };
    if !recovered.registrations.is_empty() || !recovered.contexts.is_empty() {
        tracing::info!(
            peer,
            registrations = recovered.registrations.len(),
            contexts = recovered.contexts.len(),
            "the data directory holds state of its own: bootstrap_from is ignored"
        );
        return Ok(None);
    }
    Ok(Some(peer))
}

/// Whether every subscription has caught up with its publisher: live, nothing pending. One
/// whose replay could not reach its position (resyncing) has nothing more to wait for.
fn caught_up(services: &[ServiceInfo]) -> bool {
    services.iter().all(caught_up_one)
}

/// [`caught_up`] for one subscription.
fn caught_up_one(s: &ServiceInfo) -> bool {
    matches!(
        s.status.phase,
        Some(SubscriptionPhase::Live | SubscriptionPhase::Resyncing)
    ) && s.status.pending_batches == 0
}

/// Whether no subscription has a replay left to apply: [`caught_up`], or still connecting (it
/// consumed nothing and asked for no replay: its publisher has sent nothing it could replay).
fn replayed(services: &[ServiceInfo]) -> bool {
    services.iter().all(|s| {
        matches!(
            s.status.phase,
            Some(
                SubscriptionPhase::Live
                    | SubscriptionPhase::Resyncing
                    | SubscriptionPhase::Connecting
            )
        ) && s.status.pending_batches == 0
    })
}

/// Wait until the registrations are all known (`listed`: the first etcd listing applied, when
/// registrations are shared) and every subscription is live (at most [`CATCH_UP_LIMIT`] in
/// all), saying on `readiness` what it waits for. Used after a bootstrap, and after an empty
/// start that every attempt failed to avoid.
pub async fn catch_up(
    registry: &Addr<Registry>,
    readiness: &Readiness,
    progress: &Progress,
    listed: Option<watch::Receiver<bool>>,
) {
    let deadline = Instant::now() + CATCH_UP_LIMIT;
    if let Some(mut listed) = listed {
        readiness.set_starting("waiting for etcd's registrations");
        let wait = tokio::time::timeout_at(deadline.into(), listed.wait_for(|l| *l));
        if wait.await.is_err() {
            tracing::warn!(
                limit = ?CATCH_UP_LIMIT,
                "etcd's registrations not listed in time; reporting ready with those known"
            );
        }
    }
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
            "bootstrapped: replaying from the snapshot's positions, {live} of {} subscriptions live",
            services.len()
        ));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if progress.phase() == Phase::CatchingUp {
        progress.set_phase(Phase::Done);
    }
}

/// The checkpoints of a bootstrapped replica: none until no subscription has a replay left to
/// apply ([`replayed`], without a limit: until then a restart bootstraps again), then rounds until one
/// succeeds, which makes the directory's state complete on its own (every context the replay
/// brought back is in it, each at its source's position), so the pending mark goes; then the
/// periodic rounds. Before that round a restart could not resume from the directory alone: the
/// exported contexts' watermarks may be past a batch that created a context the snapshot lacks.
pub async fn checkpoint_after_bootstrap(
    mut checkpointer: Checkpointer,
    registry: Addr<Registry>,
    store: Arc<dyn KvStore>,
    interval: Duration,
    shutdown: CancellationToken,
) -> Checkpointer {
    loop {
        let done = match registry.send(ListServices).await {
            Ok(services) => replayed(&services),
            Err(_) => return checkpointer,
        };
        if done {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = shutdown.cancelled() => return checkpointer,
        }
    }
    loop {
        let report = checkpointer.checkpoint().await;
        if report.failed == 0 {
            let cleared = {
                let store = store.clone();
                tokio::task::spawn_blocking(move || pending::clear(store.as_ref())).await
            };
            match cleared {
                Ok(Ok(())) => {
                    tracing::info!(
                        contexts = report.contexts,
                        pairs = report.pairs,
                        "bootstrap complete: the caught-up state is checkpointed"
                    );
                    break;
                }
                Ok(Err(e)) => tracing::warn!("cannot clear the bootstrap-pending mark: {e}"),
                Err(e) => tracing::warn!("cannot clear the bootstrap-pending mark: {e}"),
            }
        } else {
            tracing::warn!(
                failed = report.failed,
                "the first checkpoint after the bootstrap failed; retrying (until it succeeds, a \
                 restart bootstraps again)"
            );
        }
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.cancelled() => return checkpointer,
        }
    }
    checkpointer.run(interval, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durability::recovery::Phases;
    use crate::storage::memory::MemoryStore;
    use crate::storage::{Cf, KvOp};

    fn config(peer: Option<&str>) -> Config {
        let text = match peer {
            Some(p) => {
                format!(r#"{{"bootstrap_from": "{p}", "bootstrap_allow_plain_http": true}}"#)
            }
            None => "{}".to_owned(),
        };
        Config::parse(&text, "test").expect("config")
    }

    /// A store and a recovery holding one registration and one pair.
    fn with_state() -> (MemoryStore, Recovered) {
        let store = MemoryStore::default();
        let pair = KvOp::Put {
            cf: Cf::Pairs,
            key: vec![7; 20],
            value: vec![1],
        };
        store.write(vec![pair]).expect("write");
        let recovered = Recovered {
            contexts: vec![super::cut_tests::busy_context_of("m", 1)],
            registrations: vec![crate::durability::recovery::RestoredRegistration {
                config: super::cut_tests::registration(0),
                restored: crate::durability::sources::Restored {
                    incarnation: 1,
                    resume: None,
                    dropped: false,
                },
            }],
            sources: Default::default(),
            dropped: Vec::new(),
            pairs: 1,
            tuning: crate::hashing::derived::ChainTuning::DEFAULT,
            phases: Phases::default(),
        };
        (store, recovered)
    }

    #[test]
    fn a_pending_bootstrap_is_cleared_and_attempted_again() {
        let (store, mut recovered) = with_state();
        pending::mark(&store, "http://old:1").expect("mark");
        let config = config(Some("http://peer:1"));
        let peer = plan(&config, &store, &mut recovered).expect("plan");
        assert_eq!(peer, Some("http://peer:1"));
        assert!(recovered.contexts.is_empty() && recovered.registrations.is_empty());
        assert_eq!(store.get(Cf::Pairs, &[7; 20]).expect("read"), None);
        assert!(
            pending::pending(&store).expect("read").is_some(),
            "until it completes"
        );
    }

    #[test]
    fn a_pending_bootstrap_without_a_peer_any_more_starts_empty() {
        let (store, mut recovered) = with_state();
        pending::mark(&store, "http://old:1").expect("mark");
        assert_eq!(
            plan(&config(None), &store, &mut recovered).expect("plan"),
            None
        );
        assert!(recovered.contexts.is_empty() && recovered.registrations.is_empty());
        assert_eq!(store.get(Cf::Pairs, &[7; 20]).expect("read"), None);
        assert_eq!(pending::pending(&store).expect("read"), None);
    }

    #[test]
    fn state_of_its_own_wins_and_an_empty_directory_bootstraps() {
        let (store, mut recovered) = with_state();
        let config = config(Some("http://peer:1"));
        assert_eq!(plan(&config, &store, &mut recovered).expect("plan"), None);
        assert_eq!(recovered.registrations.len(), 1, "kept");
        assert!(store.get(Cf::Pairs, &[7; 20]).expect("read").is_some());
        let mut empty = Recovered {
            contexts: Vec::new(),
            registrations: Vec::new(),
            sources: Default::default(),
            dropped: Vec::new(),
            pairs: 0,
            tuning: crate::hashing::derived::ChainTuning::DEFAULT,
            phases: Phases::default(),
        };
        let store = MemoryStore::default();
        let peer = plan(&config, &store, &mut empty).expect("plan");
        assert_eq!(peer, Some("http://peer:1"));
    }
}
