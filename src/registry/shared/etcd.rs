//! The etcd side of shared registrations: the compare-and-swap writes a register or unregister
//! makes, the reads the follower makes (the listing with the fleet's epoch, the epoch alone),
//! and the operator's commands to that follower ([`super::follow`], the task that follows the
//! prefix and hands the changes to the registry).

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, TlsOptions, Txn,
    TxnOp, TxnOpResponse,
};
use tokio::sync::{mpsc, oneshot};

use super::command::{Command, Reuploaded};
use super::report::ResetReport;
use super::reset::{Listed, epoch_key, new_epoch};
use super::sync::{Kv, endpoint_key, registration_key, registrations_prefix};
use super::{EtcdConfig, OnReset};
use crate::durability::codec::{decode_registration, registration_value};
use crate::error::OpError;
use crate::model::{PublisherConfig, SubscriptionKey};

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
    pub(super) config: EtcdConfig,
    options: ConnectOptions,
    client: Mutex<Option<Client>>,
    pub(super) up: AtomicBool,
    pub(super) revision: AtomicI64,
    /// What is held since a suspected reset, and how many were suspected.
    pub(super) report: ResetReport,
    commands: mpsc::UnboundedSender<Command>,
    /// The follower's end of `commands`, until it starts.
    pub(super) inbox: Mutex<Option<mpsc::UnboundedReceiver<Command>>>,
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
        let (commands, inbox) = mpsc::unbounded_channel();
        Ok(Arc::new(EtcdRegistry {
            config,
            options,
            client: Mutex::new(None),
            up: AtomicBool::new(false),
            revision: AtomicI64::new(0),
            report: ResetReport::default(),
            commands,
            inbox: Mutex::new(Some(inbox)),
        }))
    }

    /// What is held since a suspected reset, and the resets suspected so far.
    pub fn reset_report(&self) -> &ResetReport {
        &self.report
    }

    pub fn on_reset(&self) -> OnReset {
        self.config.on_reset
    }

    /// An operator's `POST /registry/reupload`: write every held registration back into etcd.
    pub async fn reupload_held(&self) -> Result<Reuploaded, OpError> {
        self.ask(Command::Reupload).await?
    }

    /// An operator's `POST /registry/accept`: etcd's listing is right, stop every held
    /// registration (and drop its blocks). The service keys stopped.
    pub async fn accept_held(&self) -> Result<Vec<String>, OpError> {
        self.ask(Command::Accept).await
    }

    /// The registry stopped `key` without etcd holding it (an unregister of a held
    /// registration): it is no longer held.
    pub fn forget_held(&self, key: SubscriptionKey) {
        let _ = self.commands.send(Command::Forget(key));
    }

    /// Hand a command to the follower and wait for its answer. The follower takes commands
    /// between watch responses and while it waits to reconnect, so the wait is bounded by
    /// a connection attempt.
    async fn ask<T>(
        &self,
        command: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, OpError> {
        let (reply, answer) = oneshot::channel();
        if self.commands.send(command(reply)).is_err() {
            return Err(OpError::unavailable("the etcd follower has stopped"));
        }
        let limit = self.timeout() * 3 + Duration::from_millis(self.config.connect_timeout_ms);
        match tokio::time::timeout(limit, answer).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(_)) => Err(OpError::unavailable("the etcd follower has stopped")),
            Err(_) => Err(self.unavailable(format!("no answer within {limit:?}"))),
        }
    }

    /// Whether the watch is established (etcd answers).
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// The etcd revision the registrations are synchronised to.
    pub fn revision(&self) -> i64 {
        self.revision.load(Ordering::Relaxed)
    }

    pub(super) fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.request_timeout_ms)
    }

    pub(super) fn unavailable(&self, why: impl std::fmt::Display) -> OpError {
        OpError::unavailable(format!(
            "etcd ({}) is unavailable: {why}; registrations cannot change until it answers \
             (the known ones are still served)",
            self.config.endpoints.join(", ")
        ))
    }

    pub(super) async fn client(&self) -> Result<Client, String> {
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

    /// The registrations under the prefix and the fleet's epoch, read in one transaction (so at
    /// one revision), with what etcd's header says of the history they belong to.
    pub(super) async fn list(&self) -> Result<(Vec<Kv>, Listed), String> {
        let prefix = registrations_prefix(&self.config.prefix);
        let txn = Txn::new().and_then([
            TxnOp::get(prefix, Some(GetOptions::new().with_prefix())),
            TxnOp::get(epoch_key(&self.config.prefix), None),
        ]);
        let resp = self.txn(txn).await.map_err(|e| e.message)?;
        let mut gets = resp.op_responses().into_iter().filter_map(|op| match op {
            TxnOpResponse::Get(g) => Some(g),
            _ => None,
        });
        let (Some(registrations), Some(epoch)) = (gets.next(), gets.next()) else {
            return Err("etcd answered the listing without its two reads".into());
        };
        let kvs = (registrations.kvs().iter())
            .map(|kv| Kv {
                key: kv.key().to_vec(),
                value: kv.value().to_vec(),
                mod_revision: kv.mod_revision(),
            })
            .collect();
        let epoch = epoch.kvs().first();
        let epoch = epoch.map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
        let header = resp.header();
        let listed = Listed {
            revision: header.map_or(0, |h| h.revision()),
            cluster_id: header.map_or(0, |h| h.cluster_id()),
            epoch,
        };
        Ok((kvs, listed))
    }

    /// The fleet's epoch and etcd's header alone: checked before a watch resumes.
    pub(super) async fn read_epoch(&self) -> Result<Listed, String> {
        let txn = Txn::new().and_then([TxnOp::get(epoch_key(&self.config.prefix), None)]);
        let resp = self.txn(txn).await.map_err(|e| e.message)?;
        let epoch = got(&resp).into_iter().next().flatten();
        let header = resp.header();
        Ok(Listed {
            revision: header.map_or(0, |h| h.revision()),
            cluster_id: header.map_or(0, |h| h.cluster_id()),
            epoch: epoch.map(|(value, _)| String::from_utf8_lossy(&value).into_owned()),
        })
    }

    /// Write a new epoch into an etcd that holds none (only if still absent: replicas racing
    /// here agree on the first one); the epoch etcd holds afterwards.
    pub(super) async fn ensure_epoch(&self) -> Result<String, String> {
        let key = epoch_key(&self.config.prefix);
        let epoch = new_epoch();
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key.clone(), epoch.clone(), None)])
            .or_else([TxnOp::get(key, None)]);
        let resp = self.txn(txn).await.map_err(|e| e.message)?;
        if resp.succeeded() {
            return Ok(epoch);
        }
        match got(&resp).into_iter().next().flatten() {
            Some((value, _)) => Ok(String::from_utf8_lossy(&value).into_owned()),
            None => Err("the epoch changed while it was being written; retry".into()),
        }
    }
}

/// Engines registered by URL, shared by every replica: one key per engine under
/// `<prefix>engines/`, outside the registrations the followers watch (docs/engine-discovery.md,
/// "Replicas"). The values are the engines module's records; this layer only stores them.
impl EtcdRegistry {
    fn engines_prefix(&self) -> String {
        format!("{}engines/", self.config.prefix)
    }

    /// Put an engine's record under `name`.
    pub async fn put_engine(&self, name: &str, value: Vec<u8>) -> Result<(), OpError> {
        let key = format!("{}{name}", self.engines_prefix());
        self.txn(Txn::new().and_then([TxnOp::put(key, value, None)]))
            .await
            .map(|_| ())
    }

    /// Delete an engine's record.
    pub async fn delete_engine(&self, name: &str) -> Result<(), OpError> {
        let key = format!("{}{name}", self.engines_prefix());
        self.txn(Txn::new().and_then([TxnOp::delete(key, None)]))
            .await
            .map(|_| ())
    }

    /// Whether an engine's record is there.
    pub async fn engine_listed(&self, name: &str) -> Result<bool, OpError> {
        let key = format!("{}{name}", self.engines_prefix());
        let get = TxnOp::get(key, Some(GetOptions::new().with_count_only()));
        let resp = self.txn(Txn::new().and_then([get])).await?;
        Ok(resp.op_responses().iter().any(|op| match op {
            TxnOpResponse::Get(g) => g.count() > 0,
            _ => false,
        }))
    }

    /// Every engine record, by name.
    pub async fn list_engines(&self) -> Result<Vec<(String, Vec<u8>)>, OpError> {
        let prefix = self.engines_prefix();
        let get = TxnOp::get(prefix.clone(), Some(GetOptions::new().with_prefix()));
        let resp = self.txn(Txn::new().and_then([get])).await?;
        let mut out = Vec::new();
        for op in resp.op_responses() {
            if let TxnOpResponse::Get(g) = op {
                for kv in g.kvs() {
                    let name = kv.key().strip_prefix(prefix.as_bytes()).unwrap_or_default();
                    out.push((
                        String::from_utf8_lossy(name).into_owned(),
                        kv.value().to_vec(),
                    ));
                }
            }
        }
        Ok(out)
    }
}
