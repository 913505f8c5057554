//! What this replica must start or stop to match the registrations etcd holds: a plain state
//! machine fed with listings and watch events, so every rule here is tested without a runtime
//! or a server.
//!
//! The driver ([`super::etcd`]) asks [`SyncState::next_step`] what to do (list the prefix, or
//! watch it from the revision after the last one applied), hands back what etcd answered, and
//! sends the resulting [`Change`]s to the registry, which applies them idempotently: starting a
//! registration it already runs with the same configuration changes nothing, stopping one it does
//! not run is a no-op.
//!
//! A listing that does not continue the history this replica followed ([`super::reset`]) stops
//! nothing: what it lacks is *held*, still run, until etcd holds it again (written back, by this
//! replica or another) or an operator confirms the removal ([`SyncState::accept_held`]). Watch
//! events are the fleet's own changes in that history, so they apply as they come, the deletion
//! of the last registration included.

use std::collections::BTreeMap;

use super::reset::{History, Listed, Suspicion, judge};
use crate::durability::codec::decode_registration;
use crate::model::{PublisherConfig, SubscriptionKey};

/// The sub-prefix (below the configured prefix) that holds one key per registration.
pub const REGISTRATIONS: &str = "registrations/";
/// Under the prefix: the endpoint claims (see [`endpoint_key`]).
pub const ENDPOINTS: &str = "endpoints/";

/// Changes etcd reported, for the registry to apply in order. Defined here rather than beside its
/// handler so that the etcd driver names only the message, not the registry actor.
#[derive(actix::Message)]
#[rtype(result = "()")]
pub struct ApplyShared(pub Vec<Change>);

/// One change the registry must make.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    Start(PublisherConfig),
    Stop(SubscriptionKey),
}

/// One key-value pair as etcd reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub mod_revision: i64,
}

/// One watch event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Put(Kv),
    Delete { key: Vec<u8>, mod_revision: i64 },
}

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Read the whole prefix (at start, and after the watch history was compacted away).
    List,
    /// Watch the prefix from this revision on.
    Watch { from: i64 },
}

#[derive(Debug, Clone, PartialEq)]
struct Known {
    config: PublisherConfig,
    /// 0 for a registration recovered from the local store and not yet seen in etcd.
    mod_revision: i64,
    /// Run here although etcd does not hold it: a suspected reset removed it.
    held: bool,
}

#[derive(Debug)]
pub struct SyncState {
    /// The configured prefix followed by [`REGISTRATIONS`].
    prefix: Vec<u8>,
    known: BTreeMap<String, Known>,
    /// The store revision everything up to which has been applied (0: never listed).
    revision: i64,
    needs_list: bool,
    /// Values under the prefix that are not a registration (logged and ignored).
    invalid: u64,
    /// This replica's own registrations, to create in etcd at the first listing if it holds
    /// none (see the module doc of [`super`]).
    seed: Vec<PublisherConfig>,
    /// The history followed: from the store at start, then from each listing.
    followed: Option<History>,
    /// The history last handed out to be stored.
    persisted: Option<History>,
    /// Why registrations are held, while some are.
    suspicion: Option<Suspicion>,
    /// The latest suspected reset, until the driver takes it to count and log.
    detected: Option<Suspicion>,
}

impl SyncState {
    /// `local` are the registrations this replica already runs (recovered from its own store):
    /// the first listing stops those that etcd no longer holds.
    pub fn new(prefix: &str, local: impl IntoIterator<Item = PublisherConfig>) -> Self {
        let known = local
            .into_iter()
            .map(|config| {
                let key = config.subscription_key().to_string();
                let known = Known {
                    config,
                    mod_revision: 0,
                    held: false,
                };
                (key, known)
            })
            .collect();
        SyncState {
            prefix: registrations_prefix(prefix).into_bytes(),
            known,
            revision: 0,
            needs_list: true,
            invalid: 0,
            seed: Vec::new(),
            followed: None,
            persisted: None,
            suspicion: None,
            detected: None,
        }
    }

    /// The history this replica's store says it followed (see [`super::marker`]).
    pub fn with_history(mut self, history: Option<History>) -> Self {
        self.followed.clone_from(&history);
        self.persisted = history;
        self
    }

    /// Registrations to create in etcd if its first listing holds none.
    pub fn with_seed(mut self, seed: Vec<PublisherConfig>) -> Self {
        self.seed = seed;
        self
    }

    /// Before applying a listing: the seed to create first, when the listing is empty (the
    /// caller creates them and lists again); otherwise nothing, and the seed is dropped: only a
    /// first listing that finds etcd empty uploads anything.
    pub fn take_seed(&mut self, listing_is_empty: bool) -> Vec<PublisherConfig> {
        let seed = std::mem::take(&mut self.seed);
        if listing_is_empty { seed } else { Vec::new() }
    }

    /// A seed whose upload failed (etcd went away): tried again at the next listing.
    pub fn restore_seed(&mut self, seed: Vec<PublisherConfig>) {
        self.seed = seed;
    }

    pub fn next_step(&self) -> Step {
        if self.needs_list {
            Step::List
        } else {
            Step::Watch {
                from: self.revision + 1,
            }
        }
    }

    pub fn revision(&self) -> i64 {
        self.revision
    }

    pub fn registrations(&self) -> usize {
        self.known.len()
    }

    pub fn invalid(&self) -> u64 {
        self.invalid
    }

    /// The whole prefix as `listed` describes it: everything not in it is stopped, everything new
    /// or changed is (re)started. Stops come first, so a changed registration releases its
    /// endpoint before its new configuration claims it. A listing that does not continue the
    /// followed history (see [`super::reset::judge`]) stops nothing: what it lacks is held.
    pub fn apply_list(&mut self, kvs: impl IntoIterator<Item = Kv>, listed: Listed) -> Vec<Change> {
        let mut etcd = BTreeMap::new();
        for kv in kvs {
            if let Some((key, config)) = self.decode(&kv.key, &kv.value) {
                let known = Known {
                    config,
                    mod_revision: kv.mod_revision,
                    held: false,
                };
                etcd.insert(key, known);
            }
        }
        let suspicion = self.judge_listing(&etcd, &listed);
        let mut stops = Vec::new();
        let mut starts = Vec::new();
        let new_starts: Vec<Change> = (etcd.iter())
            .filter(|(key, _)| !self.known.contains_key(*key))
            .map(|(_, new)| Change::Start(new.config.clone()))
            .collect();
        let mut held = BTreeMap::new();
        for (key, old) in std::mem::take(&mut self.known) {
            match etcd.get(&key) {
                None if old.held || suspicion.is_some() => {
                    held.insert(key, Known { held: true, ..old });
                }
                None => stops.push(Change::Stop(old.config.subscription_key())),
                Some(new) if new.config != old.config => {
                    stops.push(Change::Stop(old.config.subscription_key()));
                    starts.push(Change::Start(new.config.clone()));
                }
                Some(_) => {}
            }
        }
        starts.extend(new_starts);
        self.known = etcd;
        self.known.extend(held);
        // Even one lower than before: a listing is the whole state etcd now holds, and the
        // watch goes on from it.
        self.revision = listed.revision;
        self.needs_list = false;
        let cluster_id = match (listed.cluster_id, &self.followed) {
            (0, Some(h)) => h.cluster_id,
            (id, _) => id,
        };
        self.followed = Some(History {
            epoch: listed.epoch,
            cluster_id,
            revision: listed.revision,
        });
        if let Some(s) = suspicion {
            self.detected = Some(s.clone());
            if self.known.values().any(|k| k.held) {
                self.suspicion = Some(s);
            }
        }
        self.settle();
        stops.extend(starts);
        stops
    }

    /// Whether a listing continues the followed history; `None` when it does.
    fn judge_listing(&self, etcd: &BTreeMap<String, Known>, listed: &Listed) -> Option<Suspicion> {
        let followed = self.followed.as_ref().map(|h| History {
            revision: h.revision.max(self.revision),
            ..h.clone()
        });
        let regressed =
            self.known.iter().find_map(|(key, old)| {
                let new = etcd.get(key)?;
                (!old.held && old.mod_revision > new.mod_revision && new.mod_revision > 0)
                    .then_some((key.as_str(), new.mod_revision, old.mod_revision))
            });
        let running = self.known.values().any(|k| !k.held);
        judge(
            followed.as_ref(),
            listed,
            regressed,
            etcd.is_empty() && running,
        )
    }

    /// Take the epoch this replica wrote (or found written) into an etcd that listed none.
    pub fn adopt_epoch(&mut self, epoch: String) {
        if let Some(h) = &mut self.followed {
            h.epoch = Some(epoch);
        }
    }

    /// Whether etcd, read again before a watch resumes, still holds the followed history; when
    /// not, the next step lists (and judges the listing).
    pub fn resumes(&mut self, now: &Listed) -> bool {
        let followed = self.followed.as_ref().map(|h| History {
            revision: h.revision.max(self.revision),
            ..h.clone()
        });
        if judge(followed.as_ref(), now, None, false).is_some() {
            self.needs_list = true;
            return false;
        }
        true
    }

    /// Drop the suspicion once nothing is held any more.
    fn settle(&mut self) {
        if !self.known.values().any(|k| k.held) {
            self.suspicion = None;
        }
    }

    /// Registrations run here that etcd does not hold, since a suspected reset.
    pub fn held(&self) -> Vec<PublisherConfig> {
        let held = self.known.values().filter(|k| k.held);
        held.map(|k| k.config.clone()).collect()
    }

    /// Why registrations are held, while some are.
    pub fn suspicion(&self) -> Option<&Suspicion> {
        self.suspicion.as_ref()
    }

    /// The latest suspected reset, once (to count and log).
    pub fn take_detected(&mut self) -> Option<Suspicion> {
        self.detected.take()
    }

    /// An operator confirmed what etcd holds: every held registration is stopped.
    pub fn accept_held(&mut self) -> Vec<Change> {
        let held: Vec<String> = (self.known.iter())
            .filter(|(_, k)| k.held)
            .map(|(key, _)| key.clone())
            .collect();
        let mut stops = Vec::new();
        for key in held {
            if let Some(k) = self.known.remove(&key) {
                stops.push(Change::Stop(k.config.subscription_key()));
            }
        }
        self.settle();
        stops
    }

    /// The registry stopped a held registration itself (an unregister etcd had nothing to
    /// delete for): it is no longer held.
    pub fn forget_held(&mut self, key: &SubscriptionKey) {
        let name = key.to_string();
        if self.known.get(&name).is_some_and(|k| k.held) {
            self.known.remove(&name);
        }
        self.settle();
    }

    /// The history to store, when it changed and nothing is held: a store never records a
    /// history that lacks registrations it still runs, so a restart judges the same listing
    /// the same way.
    pub fn take_persist(&mut self) -> Option<History> {
        if self.known.values().any(|k| k.held) {
            return None;
        }
        let followed = self.followed.as_ref()?;
        followed.epoch.as_ref()?;
        let history = History {
            revision: followed.revision.max(self.revision),
            ..followed.clone()
        };
        if self.persisted.as_ref() == Some(&history) {
            return None;
        }
        self.persisted = Some(history.clone());
        Some(history)
    }

    /// Events of one watch response, in order. Events at or below the revision already applied
    /// (a resumed watch may repeat the last one) change nothing. The response's header revision
    /// is deliberately not taken: etcd reports its current store revision there, which can be
    /// ahead of events still to come on this watch (a watcher catching up from an older start
    /// revision); see [`SyncState::progress`].
    pub fn apply_events(&mut self, events: impl IntoIterator<Item = Event>) -> Vec<Change> {
        let mut changes = Vec::new();
        for event in events {
            let (key, mod_revision) = match &event {
                Event::Put(kv) => (&kv.key, kv.mod_revision),
                Event::Delete { key, mod_revision } => (key, *mod_revision),
            };
            if mod_revision <= self.revision {
                continue;
            }
            self.revision = mod_revision;
            let Some(name) = self.service_name(key) else {
                continue;
            };
            let new = match &event {
                Event::Put(kv) => self.decode(&kv.key, &kv.value).map(|(_, config)| Known {
                    config,
                    mod_revision,
                    held: false,
                }),
                Event::Delete { .. } => None,
            };
            match (self.known.remove(&name), new) {
                (None, None) => {}
                (None, Some(new)) => {
                    changes.push(Change::Start(new.config.clone()));
                    self.known.insert(name, new);
                }
                (Some(old), None) => changes.push(Change::Stop(old.config.subscription_key())),
                (Some(old), Some(new)) => {
                    if old.config != new.config {
                        changes.push(Change::Stop(old.config.subscription_key()));
                        changes.push(Change::Start(new.config.clone()));
                    }
                    self.known.insert(name, new);
                }
            }
        }
        self.settle();
        changes
    }

    /// A progress notification: etcd sends one only to a watcher that has been sent every event
    /// up to `header_revision`, so a later resume may start after it.
    pub fn progress(&mut self, header_revision: i64) {
        self.revision = self.revision.max(header_revision);
    }

    /// A watch was created and etcd reports its store at `header_revision`, as `cluster_id`. A
    /// store behind what was applied, or another cluster, is not the history this replica
    /// followed (a restore or a new cluster): the watch would wait for revisions that mean
    /// something else, so list again instead (and judge the listing). Returns whether the
    /// watch may be used.
    pub fn watch_created(&mut self, header_revision: i64, cluster_id: u64) -> bool {
        let followed = self.followed.as_ref().map_or(0, |h| h.cluster_id);
        let other_cluster = followed != 0 && cluster_id != 0 && followed != cluster_id;
        if header_revision < self.revision || other_cluster {
            self.needs_list = true;
            return false;
        }
        true
    }

    /// The watch cannot resume (its start revision was compacted, or etcd cancelled it): the next
    /// step lists the prefix again and diffs against what runs.
    pub fn resync(&mut self) {
        self.needs_list = true;
    }

    /// The service key text a key under the prefix names, if it is under it.
    fn service_name(&self, key: &[u8]) -> Option<String> {
        let rest = key.strip_prefix(self.prefix.as_slice())?;
        std::str::from_utf8(rest).ok().map(str::to_owned)
    }

    /// A registration whose value decodes and whose key is its own service key; anything else
    /// under the prefix is counted and logged, never applied.
    fn decode(&mut self, key: &[u8], value: &[u8]) -> Option<(String, PublisherConfig)> {
        let name = self.service_name(key)?;
        match decode_registration(value) {
            Ok(config) if config.subscription_key().to_string() == name => Some((name, config)),
            Ok(config) => {
                self.invalid += 1;
                tracing::warn!(key = %name, holds = %config.subscription_key(), "etcd key does not match the registration it holds; ignored");
                None
            }
            Err(e) => {
                self.invalid += 1;
                tracing::warn!(key = %name, "etcd value is not a registration ({e}); ignored");
                None
            }
        }
    }
}

/// The etcd key prefix under which registrations live.
pub fn registrations_prefix(prefix: &str) -> String {
    format!("{prefix}{REGISTRATIONS}")
}

/// The etcd key of one registration.
pub fn registration_key(prefix: &str, key: &SubscriptionKey) -> String {
    format!("{}{key}", registrations_prefix(prefix))
}

/// The etcd key that claims one publisher endpoint for the registration its value names (the
/// service key text). A register writes it in the same transaction as the registration, so two
/// replicas registering two keys on one endpoint at once cannot both succeed; it lives outside
/// [`REGISTRATIONS`], so the watch never sees it.
pub fn endpoint_key(prefix: &str, endpoint: &str) -> String {
    format!("{prefix}{ENDPOINTS}{endpoint}")
}

#[cfg(test)]
#[path = "sync_tests.rs"]
mod tests;
