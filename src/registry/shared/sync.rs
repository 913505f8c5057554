//! What this replica must start or stop to match the registrations etcd holds: a plain state
//! machine fed with listings and watch events, so every rule here is tested without a runtime
//! or a server.
//!
//! The driver ([`super::etcd`]) asks [`SyncState::next_step`] what to do (list the prefix, or
//! watch it from the revision after the last one applied), hands back what etcd answered, and
//! sends the resulting [`Change`]s to the registry, which applies them idempotently: starting a
//! registration it already runs with the same configuration changes nothing, stopping one it does
//! not run is a no-op.

use std::collections::BTreeMap;

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
        }
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

    /// The whole prefix as of `revision`: everything not in it is stopped, everything new or
    /// changed is (re)started. Stops come first, so a changed registration releases its endpoint
    /// before its new configuration claims it.
    pub fn apply_list(&mut self, kvs: impl IntoIterator<Item = Kv>, revision: i64) -> Vec<Change> {
        let mut listed = BTreeMap::new();
        for kv in kvs {
            if let Some((key, config)) = self.decode(&kv.key, &kv.value) {
                let known = Known {
                    config,
                    mod_revision: kv.mod_revision,
                };
                listed.insert(key, known);
            }
        }
        let mut stops = Vec::new();
        let mut starts = Vec::new();
        for (key, old) in &self.known {
            match listed.get(key) {
                None => stops.push(Change::Stop(old.config.subscription_key())),
                Some(new) if new.config != old.config => {
                    stops.push(Change::Stop(old.config.subscription_key()));
                    starts.push(Change::Start(new.config.clone()));
                }
                Some(_) => {}
            }
        }
        for (key, new) in &listed {
            if !self.known.contains_key(key) {
                starts.push(Change::Start(new.config.clone()));
            }
        }
        self.known = listed;
        // A listing is the whole state at its revision, even one lower than before (an etcd
        // restored from an older backup or replaced by a new cluster).
        self.revision = revision;
        self.needs_list = false;
        stops.extend(starts);
        stops
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
        changes
    }

    /// A progress notification: etcd sends one only to a watcher that has been sent every event
    /// up to `header_revision`, so a later resume may start after it.
    pub fn progress(&mut self, header_revision: i64) {
        self.revision = self.revision.max(header_revision);
    }

    /// A watch was created and etcd reports its store at `header_revision`. A store behind what
    /// was applied is not the history this replica followed (a restore or a new cluster): the
    /// watch would wait for revisions that mean something else, so list again instead. Returns
    /// whether the watch may be used.
    pub fn watch_created(&mut self, header_revision: i64) -> bool {
        if header_revision < self.revision {
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
