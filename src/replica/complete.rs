//! Whether a replica that started empty after its bootstrap failed holds what its peers hold.
//!
//! Such a replica serves queries and ingests like any other, but it holds only what its
//! publishers' replay buffers give back, so until its subscriptions have caught up it answers
//! less than a replica that took its peer's snapshot. `/health` (and gRPC `Health`) say
//! degraded meanwhile, with the failed bootstrap and its last error, and
//! `conductor_replica_incomplete` is 1: an orchestrator can tell it from a complete replica.
//!
//! Caught up is what [`behind`] observes, checked from the moment the replica's static
//! registrations are started: (1) the registrations are known (with registrations shared
//! through etcd, its first listing is applied; without, at least one subscription runs, since
//! such a replica learns its registrations only from requests and cannot tell what its peers
//! hold while it has none), and (2) every running subscription is caught up as after a
//! bootstrap (`super::caught_up`): live or resynchronising, with no batch waiting in its
//! contexts. A new subscription becomes live only after its first batch: at the stream start
//! (nothing before it to replay), past it with a replay socket once the replay of the
//! publisher's buffer from the stream start has ended, or without a replay socket (no buffer to
//! replay). Resynchronising, its replay could not reach the stream start: the buffer gives
//! nothing more. A subscription still connecting (its publisher sent nothing since it started)
//! keeps the replica incomplete, since the buffer may hold batches it has not asked for. Once
//! complete the replica stays so: a later registration is ordinary ingest, as on any replica.

use std::fmt::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Addr;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::gateway::readiness::DegradedSource;
use crate::registry::{ListServices, Registry, ServiceInfo};

use super::failure::PullError;

/// Between two looks at the subscriptions.
const POLL: Duration = Duration::from_millis(100);

/// Whether this replica is incomplete, and why (see the module doc).
#[derive(Debug, Default)]
pub struct Completeness {
    state: Mutex<Option<Incomplete>>,
}

#[derive(Debug)]
struct Incomplete {
    /// The failed bootstrap.
    why: String,
    /// What it waits for, as [`behind`] last said.
    waiting: String,
}

impl Completeness {
    /// The bootstrap from `peer` failed for good after `attempts`, the last with `error`: the
    /// replica starts empty and is incomplete from now on.
    pub fn started_empty(&self, peer: &str, attempts: u64, error: &PullError) {
        let mut why = format!(
            "started empty: the bootstrap from {peer} failed ({attempts} attempts, the last: {error})"
        );
        if let Some(hint) = error.hint() {
            let _ = write!(why, "; {hint}");
        }
        *self.lock() = Some(Incomplete {
            why,
            waiting: "its subscriptions are not started yet".to_owned(),
        });
    }

    pub fn is_incomplete(&self) -> bool {
        self.lock().is_some()
    }

    fn waiting(&self, what: String) {
        if let Some(incomplete) = self.lock().as_mut() {
            incomplete.waiting = what;
        }
    }

    fn complete(&self) {
        *self.lock() = None;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Incomplete>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Look at the subscriptions until the replica has caught up ([`behind`] says nothing), then
    /// mark it complete; returns at once on a complete replica, and at `shutdown`. `listed`:
    /// with registrations shared through etcd, set once its first listing is applied.
    pub async fn watch(
        self: Arc<Self>,
        registry: Addr<Registry>,
        listed: Option<watch::Receiver<bool>>,
        shutdown: CancellationToken,
    ) {
        while self.is_incomplete() {
            let Ok(services) = registry.send(ListServices).await else {
                return;
            };
            let listed = listed.as_ref().map(|l| *l.borrow());
            match behind(&services, listed) {
                None => {
                    tracing::info!(
                        subscriptions = services.len(),
                        "caught up after the empty start: every subscription has replayed what \
                         its publisher buffers"
                    );
                    self.complete();
                }
                Some(what) => self.waiting(what),
            }
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

/// What an empty replica still waits for before it has caught up (see the module doc); `None`
/// once it has. `listed`: `None` without registrations shared through etcd, else whether its
/// first listing is applied.
pub fn behind(services: &[ServiceInfo], listed: Option<bool>) -> Option<String> {
    match listed {
        Some(false) => return Some("waiting for etcd's registrations".to_owned()),
        None if services.is_empty() => {
            return Some(
                "no registration yet (without shared registrations it cannot tell what its \
                 peers hold)"
                    .to_owned(),
            );
        }
        _ => {}
    }
    let caught_up = services.iter().filter(|s| super::caught_up_one(s)).count();
    (caught_up < services.len()).then(|| {
        format!(
            "{caught_up} of {} subscriptions have replayed what their publishers buffer",
            services.len()
        )
    })
}

impl DegradedSource for Completeness {
    fn degraded(&self) -> Option<String> {
        let state = self.lock();
        let incomplete = state.as_ref()?;
        Some(format!(
            "{}; it holds only what its publishers' replay buffers give back until its \
             subscriptions catch up: {}",
            incomplete.why, incomplete.waiting
        ))
    }
}

impl crate::metrics::Section for Completeness {
    fn render(&self, w: &mut String) {
        let _ = writeln!(
            w,
            "# HELP conductor_replica_incomplete 1 while this replica, started empty after its bootstrap failed, has not caught up with its publishers (docs/replicas.md)\n\
             # TYPE conductor_replica_incomplete gauge\nconductor_replica_incomplete {}",
            self.is_incomplete() as u8
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Section;
    use crate::subscription::state::Phase;

    fn service(phase: Option<Phase>, pending: u64) -> ServiceInfo {
        let mut s = ServiceInfo {
            config: Arc::new(super::super::cut_tests::registration(0)),
            status: Default::default(),
        };
        s.status.phase = phase;
        s.status.pending_batches = pending;
        s
    }

    #[test]
    fn caught_up_needs_known_registrations_and_every_subscription_replayed() {
        let live = || service(Some(Phase::Live), 0);
        assert!(behind(&[], None).unwrap().contains("no registration yet"));
        assert!(behind(&[live()], Some(false)).unwrap().contains("etcd"));
        assert_eq!(
            behind(&[], Some(true)),
            None,
            "etcd lists none: nothing to hold"
        );
        assert_eq!(behind(&[live()], None), None);
        assert_eq!(behind(&[service(Some(Phase::Resyncing), 0)], None), None);
        for not_yet in [
            service(None, 0),
            service(Some(Phase::Connecting), 0),
            service(Some(Phase::Replaying), 0),
            service(Some(Phase::Live), 1),
        ] {
            let why = behind(&[live(), not_yet], Some(true)).expect("behind");
            assert!(why.starts_with("1 of 2 subscriptions"), "{why}");
        }
    }

    #[test]
    fn degraded_and_the_gauge_until_complete() {
        let c = Completeness::default();
        let gauge = |c: &Completeness| {
            let mut text = String::new();
            c.render(&mut text);
            text.lines().last().unwrap_or_default().to_owned()
        };
        assert_eq!(
            (c.degraded(), gauge(&c).as_str()),
            (None, "conductor_replica_incomplete 0")
        );
        let refused = PullError::Refused {
            peer: "http://peer:1".into(),
            code: tonic::Code::PermissionDenied,
            reason: "PermissionDenied: snapshot export is disabled".into(),
        };
        c.started_empty("http://peer:1", 2, &refused);
        c.waiting("0 of 1 subscriptions".into());
        let why = c.degraded().expect("degraded");
        for part in [
            "the bootstrap from http://peer:1 failed (2 attempts, the last: peer http://peer:1 \
             refused the snapshot",
            "snapshot export is disabled",
            "set the same auth_token on every replica",
            "0 of 1 subscriptions",
        ] {
            assert!(why.contains(part), "{part} in {why}");
        }
        assert_eq!(gauge(&c), "conductor_replica_incomplete 1");
        c.complete();
        assert_eq!(
            (c.degraded(), gauge(&c).as_str()),
            (None, "conductor_replica_incomplete 0")
        );
    }
}
