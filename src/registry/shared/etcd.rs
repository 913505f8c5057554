//! The etcd side of shared registrations: the compare-and-swap writes a register or unregister
//! makes, and the task that follows the prefix (list, then watch from the next revision;
//! reconnect with back-off; list again after a compaction) and hands the changes to the registry.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Recipient;
use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Identity,
    TlsOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use tokio_util::sync::CancellationToken;

use super::EtcdConfig;
use super::sync::{
    ApplyShared, Event, Kv, Step, SyncState, endpoint_key, registration_key, registrations_prefix,
};
use crate::durability::codec::{decode_registration, registration_value};
use crate::error::{Code, OpError};
use crate::model::{PublisherConfig, SubscriptionKey};

const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Each get of a transaction's answer, in order: the value and modification revision of the key,
/// `None` for a key that is absent.
fn got(resp: &etcd_client::TxnResponse) -> Vec<Option<(Vec<u8>, i64)>> {
    resp.op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(g) => Some(
                g.kvs()
                    .first()
                    .map(|kv| (kv.value().to_vec(), kv.mod_revision())),
            ),
            _ => None,
        })
        .collect()
}

/// A register whose key etcd already holds: the same configuration is `Unchanged`, any other
/// value a conflict naming what etcd holds.
fn held_outcome(config: &PublisherConfig, key: &str, held: &[u8]) -> Result<Created, OpError> {
    match decode_registration(held) {
        Ok(held) if held == *config => Ok(Created::Unchanged),
        Ok(held) => Err(OpError::invalid_registration(format!(
            "conflicting registration for service key: {} (etcd already holds it with endpoint \
             {}, model {:?}, type {})",
            config.subscription_key(),
            held.endpoint,
            held.model_name,
            held.publisher_type
        ))),
        Err(_) => Err(OpError::invalid_registration(format!(
            "conflicting registration for service key: {} (etcd holds a value at {key} that is \
             not a registration)",
            config.subscription_key()
        ))),
    }
}

/// What etcd said to a register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    Created,
    /// The key already held this exact configuration.
    Unchanged,
}

pub struct EtcdRegistry {
    config: EtcdConfig,
    options: ConnectOptions,
    client: Mutex<Option<Client>>,
    up: AtomicBool,
    revision: AtomicI64,
}

impl EtcdRegistry {
    /// Reads the TLS files (a start-up error names the one that cannot be read); connects lazily.
    pub fn new(config: EtcdConfig) -> Result<Arc<Self>, String> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            .with_keep_alive_while_idle(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if let Some(tls) = &config.tls {
            let read = |path: &std::path::Path| {
                std::fs::read(path)
                    .map_err(|e| format!("registry.etcd.tls: {}: {e}", path.display()))
            };
            let mut t = TlsOptions::new();
            if let Some(ca) = &tls.ca_file {
                t = t.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
                t = t.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            if let Some(domain) = &tls.domain {
                t = t.domain_name(domain.clone());
            }
            options = options.with_tls(t);
        }
        Ok(Arc::new(EtcdRegistry {
            config,
            options,
            client: Mutex::new(None),
            up: AtomicBool::new(false),
            revision: AtomicI64::new(0),
        }))
    }

    /// Whether the watch is established (etcd answers).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The etcd revision the registrations are synchronised to.
    pub fn revision(&self) -> i64 {
        self.revision.load(Ordering::Relaxed)
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms)
    }

    fn unavailable(&self, why: impl std::fmt::Display) -> OpError {
        OpError::unavailable(format!(
            "etcd ({}) is unavailable: {why}; registrations cannot change until it answers \
             (the known ones are still served)",
            self.config.endpoints.join(", ")
        ))
    }

    async fn client(&self) -> Result<Client, String> {
        if let Some(c) = self.client.lock().ok().and_then(|c| c.clone()) {
            return Ok(c);
        }
        let connect = Client::connect(&self.config.endpoints, Some(self.options.clone()));
        let client = match tokio::time::timeout(self.timeout(), connect).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(e.to_string()),
            Err(_) => return Err(format!("no connection within {:?}", self.timeout())),
        };
        if let Ok(mut slot) = self.client.lock() {
            *slot = Some(client.clone());
        }
        Ok(client)
    }

    async fn txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, OpError> {
        let mut kv = self
            .client()
            .await
            .map_err(|e| self.unavailable(e))?
            .kv_client();
        match tokio::time::timeout(self.timeout(), kv.txn(txn)).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(self.unavailable(e)),
            Err(_) => Err(self.unavailable(format!("no answer within {:?}", self.timeout()))),
        }
    }

    /// Create the registration's key and claim its endpoint, both only if absent (compare on
    /// their create revisions, in one transaction). A present key with the same configuration is
    /// `Unchanged`, with another one a conflict; an endpoint claimed by a registration that still
    /// exists is refused as the replica refuses an endpoint it consumes itself.
    pub async fn create(&self, config: &PublisherConfig) -> Result<Created, OpError> {
        let prefix = &self.config.prefix;
        let key = registration_key(prefix, &config.subscription_key());
        let claim = endpoint_key(prefix, &config.endpoint);
        let service = config.subscription_key().to_string();
        // A key or claim that changes between the compare and the read is retried.
        for _ in 0..3 {
            let txn = Txn::new()
                .when([
                    Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                    Compare::create_revision(claim.clone(), CompareOp::Equal, 0),
                ])
                .and_then([
                    TxnOp::put(key.clone(), registration_value(config), None),
                    TxnOp::put(claim.clone(), service.clone(), None),
                ])
                .or_else([
                    TxnOp::get(key.clone(), None),
                    TxnOp::get(claim.clone(), None),
                ]);
            let resp = self.txn(txn).await?;
            if resp.succeeded() {
                return Ok(Created::Created);
            }
            let mut read = got(&resp).into_iter();
            if let Some(Some((existing, _))) = read.next() {
                return held_outcome(config, &key, &existing);
            }
            let Some(Some((owner, claimed_at))) = read.next() else {
                continue;
            };
            let owner = String::from_utf8_lossy(&owner).into_owned();
            let owner_key = format!("{}{owner}", registrations_prefix(prefix));
            // A claim whose registration is gone (deleted by hand) is stale: take it over, unless
            // its owner registers again or another replica takes it first.
            let take_over = Txn::new()
                .when([
                    Compare::mod_revision(claim.clone(), CompareOp::Equal, claimed_at),
                    Compare::create_revision(owner_key.clone(), CompareOp::Equal, 0),
                    Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                ])
                .and_then([
                    TxnOp::put(key.clone(), registration_value(config), None),
                    TxnOp::put(claim.clone(), service.clone(), None),
                ])
                .or_else([TxnOp::get(owner_key, None)]);
            let resp = self.txn(take_over).await?;
            if resp.succeeded() {
                return Ok(Created::Created);
            }
            if let Some(Some(_)) = got(&resp).first() {
                return Err(OpError::invalid_registration(format!(
                    "conflicting active registration for endpoint: {} (used by {owner}, \
                     registered in etcd)",
                    config.endpoint
                )));
            }
        }
        Err(self.unavailable(format!(
            "{key} changed while it was being registered; retry"
        )))
    }

    /// Delete the registration's key, and its endpoint's claim if the claim is its own; `false`
    /// when the key did not exist.
    pub async fn delete(&self, key: &SubscriptionKey) -> Result<bool, OpError> {
        let prefix = &self.config.prefix;
        let name = registration_key(prefix, key);
        for _ in 0..3 {
            let read = Txn::new().and_then([TxnOp::get(name.clone(), None)]);
            let Some(Some((value, revision))) = got(&self.txn(read).await?).into_iter().next()
            else {
                return Ok(false);
            };
            let mut ops = vec![TxnOp::delete(name.clone(), None)];
            if let Ok(config) = decode_registration(&value) {
                let claim = endpoint_key(prefix, &config.endpoint);
                ops.push(TxnOp::txn(
                    Txn::new()
                        .when([Compare::value(
                            claim.clone(),
                            CompareOp::Equal,
                            key.to_string(),
                        )])
                        .and_then([TxnOp::delete(claim, None)]),
                ));
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    name.clone(),
                    CompareOp::Equal,
                    revision,
                )])
                .and_then(ops);
            if self.txn(txn).await?.succeeded() {
                return Ok(true);
            }
        }
        Err(self.unavailable(format!(
            "{name} changed while it was being unregistered; retry"
        )))
    }

    /// Follow the prefix until `stop`: every change is applied by the registry, in etcd's order.
    /// `synced` runs once, after the first listing has been applied (see
    /// [`super::marker`]).
    pub async fn run(
        self: Arc<Self>,
        mut state: SyncState,
        registry: impl Into<Recipient<ApplyShared>>,
        stop: CancellationToken,
        synced: Box<dyn FnOnce() + Send>,
    ) {
        let registry = registry.into();
        let mut synced = Some(synced);
        let mut backoff = Duration::from_millis(100);
        loop {
            let outcome = tokio::select! {
                _ = stop.cancelled() => return,
                r = self.follow(&mut state, &registry, &mut synced) => r,
            };
            match outcome {
                Ok(()) => backoff = Duration::from_millis(100),
                Err(Broken::RegistryGone) => return,
                Err(Broken::Etcd(e)) => {
                    if self.up.swap(false, Ordering::Relaxed) {
                        tracing::warn!(
                            registrations = state.registrations(),
                            revision = state.revision(),
                            "etcd unavailable ({e}); serving the known registrations, changes \
                             are refused until it returns"
                        );
                    } else {
                        tracing::debug!("etcd still unavailable: {e}");
                    }
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        }
    }

    /// One connection's worth: list if needed, then watch until the stream breaks (an error) or
    /// must be replaced by a listing (`Ok`).
    async fn follow(
        &self,
        state: &mut SyncState,
        registry: &Recipient<ApplyShared>,
        synced: &mut Option<Box<dyn FnOnce() + Send>>,
    ) -> Result<(), Broken> {
        let client = self.client().await.map_err(Broken::Etcd)?;
        let prefix = registrations_prefix(&self.config.prefix);
        if state.next_step() == Step::List {
            let mut kv = client.kv_client();
            let get = kv.get(prefix.clone(), Some(GetOptions::new().with_prefix()));
            let resp = match tokio::time::timeout(self.timeout(), get).await {
                Ok(r) => r.map_err(|e| Broken::Etcd(e.to_string()))?,
                Err(_) => return Err(Broken::Etcd("listing timed out".into())),
            };
            let seed = state.take_seed(resp.kvs().is_empty());
            if !seed.is_empty() {
                self.upload(state, seed).await?;
                // Listed again, now with them.
                return Ok(());
            }
            let revision = resp.header().map_or(0, |h| h.revision());
            let kvs = resp.kvs().iter().map(|kv| Kv {
                key: kv.key().to_vec(),
                value: kv.value().to_vec(),
                mod_revision: kv.mod_revision(),
            });
            let changes = state.apply_list(kvs.collect::<Vec<_>>(), revision);
            tracing::info!(
                registrations = state.registrations(),
                revision,
                changes = changes.len(),
                "etcd registrations listed"
            );
            self.apply(registry, changes, state).await?;
            if let Some(synced) = synced.take() {
                synced();
            }
        }
        let Step::Watch { from } = state.next_step() else {
            return Ok(());
        };
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from)
            .with_progress_notify();
        let mut watch = client.watch_client();
        let stream = watch.watch(prefix, Some(options));
        // Bounded by the connect timeout: while etcd is away this is the call that waits.
        let connect = Duration::from_millis(self.config.connect_timeout_ms);
        let mut stream = match tokio::time::timeout(connect, stream).await {
            Ok(r) => r.map_err(|e| Broken::Etcd(e.to_string()))?,
            Err(_) => return Err(Broken::Etcd("watch not created in time".into())),
        };
        loop {
            let resp = match stream.message().await {
                Ok(Some(resp)) => resp,
                Ok(None) => return Err(Broken::Etcd("the watch stream ended".into())),
                Err(e) => return Err(Broken::Etcd(e.to_string())),
            };
            let header_revision = resp.header().map_or(0, |h| h.revision());
            tracing::debug!(
                header_revision,
                created = resp.created(),
                events = resp.events().len(),
                "etcd watch response"
            );
            if resp.compact_revision() > 0 || resp.canceled() {
                tracing::warn!(
                    compacted_to = resp.compact_revision(),
                    reason = resp.cancel_reason(),
                    "etcd watch history is gone; listing the registrations again"
                );
                state.resync();
                return Ok(());
            }
            if resp.created() {
                if !state.watch_created(header_revision) {
                    tracing::warn!(
                        header_revision,
                        applied = state.revision(),
                        "etcd is behind the revision already applied (restored or replaced); \
                         listing the registrations again"
                    );
                    return Ok(());
                }
                if !self.up.swap(true, Ordering::Relaxed) {
                    tracing::info!(
                        from,
                        registrations = state.registrations(),
                        "etcd registrations synchronised; watching"
                    );
                }
            }
            if resp.created() {
                continue;
            }
            if resp.events().is_empty() {
                state.progress(header_revision);
                self.revision.store(state.revision(), Ordering::Relaxed);
                continue;
            }
            let events = resp.events().iter().filter_map(|e| {
                let kv = e.kv()?;
                Some(match e.event_type() {
                    EventType::Put => Event::Put(Kv {
                        key: kv.key().to_vec(),
                        value: kv.value().to_vec(),
                        mod_revision: kv.mod_revision(),
                    }),
                    EventType::Delete => Event::Delete {
                        key: kv.key().to_vec(),
                        mod_revision: kv.mod_revision(),
                    },
                })
            });
            let changes = state.apply_events(events.collect::<Vec<_>>());
            self.apply(registry, changes, state).await?;
        }
    }

    /// Create this replica's own registrations in an etcd that holds none (a replica switched
    /// to etcd), as registers would; one etcd refuses is logged and left out, and if etcd goes
    /// away meanwhile the seed waits for the next listing.
    async fn upload(
        &self,
        state: &mut SyncState,
        seed: Vec<PublisherConfig>,
    ) -> Result<(), Broken> {
        tracing::info!(
            registrations = seed.len(),
            "etcd holds no registrations yet: uploading this replica's own"
        );
        for (i, config) in seed.iter().enumerate() {
            match self.create(config).await {
                Ok(_) => {}
                Err(e) if e.code != Code::ConductorUnavailable => tracing::warn!(
                    service = %config.subscription_key(),
                    "own registration not uploaded to etcd: {}",
                    e.message
                ),
                Err(e) => {
                    state.restore_seed(seed[i..].to_vec());
                    return Err(Broken::Etcd(e.message));
                }
            }
        }
        Ok(())
    }

    async fn apply(
        &self,
        registry: &Recipient<ApplyShared>,
        changes: Vec<super::sync::Change>,
        state: &SyncState,
    ) -> Result<(), Broken> {
        if !changes.is_empty() {
            registry
                .send(ApplyShared(changes))
                .await
                .map_err(|_| Broken::RegistryGone)?;
        }
        self.revision.store(state.revision(), Ordering::Relaxed);
        Ok(())
    }
}

enum Broken {
    Etcd(String),
    RegistryGone,
}
