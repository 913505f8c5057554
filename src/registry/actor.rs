//! The registry actor and its messages.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use actix::prelude::*;

use crate::error::OpError;
use crate::gateway::registration::FieldNames;
use crate::index::actor::{AttachRank, DetachSource, GetStats};
use crate::model::{PublisherConfig, SubscriptionKey};
use crate::subscription::actor::{Stop, SubscriptionActor};
use crate::subscription::settings::SubscriptionSettings;
use crate::subscription::status::{StatusCell, SubscriptionStatus};

use super::contexts::ContextDirectory;
use super::policy::{Refusal, RegistrationPolicy};
use super::subscriptions::SubscriptionDirectory;
use crate::storage::KvStore;
use crate::storage::checkpoint::{delete_registration, put_registration};

/// One registered service.
struct ServiceEntry {
    config: Arc<PublisherConfig>,
    status: StatusCell,
    actor: Addr<SubscriptionActor>,
}

pub struct Registry {
    contexts: ContextDirectory,
    subscriptions: SubscriptionDirectory,
    /// Ordered by the rendered service key, the order `list_services` reports.
    services: BTreeMap<String, ServiceEntry>,
    /// One endpoint feeds one subscription.
    endpoints: HashMap<String, SubscriptionKey>,
    settings: SubscriptionSettings,
    /// Registrations are written here before they are acknowledged, so they survive a restart.
    store: Arc<dyn KvStore>,
    policy: RegistrationPolicy,
    /// Registrations refused by the policy, by label (`conductor_registrations_refused_total`).
    refused: BTreeMap<&'static str, u64>,
}

impl Registry {
    pub fn new(
        contexts: ContextDirectory,
        subscriptions: SubscriptionDirectory,
        settings: SubscriptionSettings,
        store: Arc<dyn KvStore>,
    ) -> Self {
        Registry {
            contexts,
            subscriptions,
            services: BTreeMap::new(),
            endpoints: HashMap::new(),
            settings,
            store,
            policy: RegistrationPolicy::default(),
            refused: BTreeMap::new(),
        }
    }

    pub fn with_policy(mut self, policy: RegistrationPolicy) -> Self {
        self.policy = policy;
        self
    }

    fn refuse(&mut self, refusal: Refusal) -> OpError {
        *self.refused.entry(refusal.label).or_default() += 1;
        refusal.error
    }

    fn register(
        &mut self,
        config: PublisherConfig,
        names: FieldNames,
        resume_after: Option<crate::index::Watermark>,
    ) -> Result<RegisterOutcome, OpError> {
        if let Err(refusal) = self.policy.check(&config, names) {
            return Err(self.refuse(refusal));
        }
        let key = config.subscription_key();
        let key_text = key.to_string();
        if let Some(existing) = self.services.get(&key_text) {
            return if *existing.config == config {
                Ok(RegisterOutcome::Unchanged)
            } else {
                Err(OpError::invalid_registration(format!(
                    "conflicting registration for service key: {key_text}"
                )))
            };
        }
        if let Some(owner) = self.endpoints.get(&config.endpoint) {
            return Err(OpError::invalid_registration(format!(
                "conflicting active registration for endpoint: {} (used by {owner})",
                config.endpoint
            )));
        }
        if let Err(refusal) = self.policy.check_capacity(self.services.len()) {
            return Err(self.refuse(refusal));
        }
        let context_key = config.context_key();
        // A failed write must leave no trace: the rank is attached only once the registration
        // is on disk, and a context this call created is dropped again.
        let mut attach = None;
        if config.publisher_type.is_engine() {
            let existed = self.contexts.get(&context_key).is_some();
            let handle = self
                .contexts
                .get_or_create(&context_key, &config.hash_profile)
                .map_err(|c| OpError::invalid_registration(c.to_string()))?;
            attach = Some((handle, existed));
        } else if let Some(handle) = self.contexts.get(&context_key) {
            // A store registration never creates a context, but must agree with one that exists.
            let existing = handle.reader().profile();
            if *existing != config.hash_profile {
                return Err(OpError::invalid_registration(format!(
                    "context {context_key} is bound to hash profile {existing}; this registration uses {}",
                    config.hash_profile
                )));
            }
        }
        if let Err(e) = put_registration(self.store.as_ref(), &config) {
            if let Some((_, false)) = attach {
                self.contexts.remove(&context_key);
            }
            return Err(OpError::internal(format!(
                "cannot persist the registration: {e}"
            )));
        }
        if let Some((handle, _)) = attach {
            handle.addr().do_send(AttachRank {
                source: key.clone(),
                instance_id: config.instance_id.clone(),
                dp_rank: config.dp_rank,
            });
        }
        let config = Arc::new(config);
        let status = StatusCell::default();
        let actor = {
            let (config, contexts, status, settings) = (
                config.clone(),
                self.contexts.clone(),
                status.clone(),
                self.settings,
            );
            SubscriptionActor::start_in_arbiter(&self.contexts.arbiters().pick(), move |_| {
                SubscriptionActor::new(config, contexts, status, settings, resume_after)
            })
        };
        tracing::info!(service = %key_text, endpoint = %config.endpoint, kind = %config.publisher_type, "registered");
        self.subscriptions.insert(key.clone(), actor.clone());
        self.endpoints.insert(config.endpoint.clone(), key);
        self.services.insert(
            key_text,
            ServiceEntry {
                config,
                status,
                actor,
            },
        );
        Ok(RegisterOutcome::Created)
    }
}

impl Actor for Registry {
    type Context = Context<Self>;
}

/// Register a validated publisher; `resume_after` is the last applied seq recovered from disk.
#[derive(Message)]
#[rtype(result = "Result<RegisterOutcome, OpError>")]
pub struct Register {
    pub config: PublisherConfig,
    /// How the caller names its fields, for the policy's errors.
    pub names: FieldNames,
    pub resume_after: Option<crate::index::Watermark>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterOutcome {
    Created,
    /// An identical registration already existed; nothing changed.
    Unchanged,
}

/// Stop consuming a service and remove what it owned.
#[derive(Message)]
#[rtype(result = "Result<(), OpError>")]
pub struct Unregister(pub SubscriptionKey);

/// Every service with its current status, ordered by service key.
#[derive(Message)]
#[rtype(result = "Vec<ServiceInfo>")]
pub struct ListServices;

#[derive(Debug, Clone)]
pub struct ServiceInfo {
    pub config: Arc<PublisherConfig>,
    pub status: SubscriptionStatus,
}

/// Registrations refused by the policy so far, by label.
#[derive(Message)]
#[rtype(result = "BTreeMap<&'static str, u64>")]
pub struct Refusals;

/// Stop every subscription (service shutdown). Replies once all have stopped.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ShutdownAll;

impl Handler<Register> for Registry {
    type Result = ResponseFuture<Result<RegisterOutcome, OpError>>;

    fn handle(&mut self, msg: Register, _ctx: &mut Context<Self>) -> Self::Result {
        let context = msg.config.context_key();
        let outcome = self.register(msg.config, msg.names, msg.resume_after);
        // The rank listing was queued to the context; a round trip behind it means the caller
        // sees its instance in the global view as soon as registration answers.
        let barrier = matches!(outcome, Ok(RegisterOutcome::Created))
            .then(|| self.contexts.get(&context))
            .flatten();
        Box::pin(async move {
            if let Some(handle) = barrier {
                let _ = handle.send(GetStats).await;
            }
            outcome
        })
    }
}

impl Handler<Unregister> for Registry {
    // Atomic: no other registration change runs until the source is gone from every context, so
    // a re-registration of the same key cannot have its fresh rank listing detached.
    type Result = AtomicResponse<Self, Result<(), OpError>>;

    fn handle(&mut self, msg: Unregister, _ctx: &mut Context<Self>) -> Self::Result {
        let key = msg.0;
        let key_text = key.to_string();
        let outcome = if !self.services.contains_key(&key_text) {
            Err(OpError::not_found(format!("service not found: {key}")))
        } else {
            // Forget it on disk first: if that fails, nothing changed and the caller may retry.
            delete_registration(self.store.as_ref(), &key).map_err(|e| {
                OpError::internal(format!("cannot delete the persisted registration: {e}"))
            })
        };
        let entry = match outcome.map(|()| self.services.remove(&key_text)) {
            Ok(Some(entry)) => entry,
            Ok(None) => {
                let missing = OpError::not_found(format!("service not found: {key}"));
                return AtomicResponse::new(Box::pin(async move { Err(missing) }.into_actor(self)));
            }
            Err(e) => return AtomicResponse::new(Box::pin(async move { Err(e) }.into_actor(self))),
        };
        self.endpoints.remove(&entry.config.endpoint);
        self.subscriptions.remove(&key);
        let contexts = self.contexts.clone();
        let work = async move {
            // Stop first so no batch of this source can arrive after its blocks are removed.
            let _ = entry.actor.send(Stop).await;
            for handle in contexts.all() {
                match handle.send(DetachSource(key.clone())).await {
                    Ok(outcome) if outcome.empty_and_detached => {
                        // The actor stops once the last handle to it is dropped.
                        contexts.remove(handle.key());
                    }
                    Ok(_) => {}
                    Err(e) => {
                        return Err(OpError::internal(format!(
                            "context {} unavailable: {e}",
                            handle.key()
                        )));
                    }
                }
            }
            tracing::info!(service = %key, "unregistered");
            Ok(())
        };
        AtomicResponse::new(Box::pin(work.into_actor(self)))
    }
}

impl Handler<ListServices> for Registry {
    type Result = Vec<ServiceInfo>;

    fn handle(&mut self, _: ListServices, _ctx: &mut Context<Self>) -> Vec<ServiceInfo> {
        self.services
            .values()
            .map(|e| ServiceInfo {
                config: e.config.clone(),
                status: e.status.get(),
            })
            .collect()
    }
}

impl Handler<Refusals> for Registry {
    type Result = MessageResult<Refusals>;

    fn handle(&mut self, _: Refusals, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(self.refused.clone())
    }
}

impl Handler<ShutdownAll> for Registry {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: ShutdownAll, _ctx: &mut Context<Self>) -> Self::Result {
        let actors: Vec<_> = self.services.values().map(|e| e.actor.clone()).collect();
        Box::pin(async move {
            for actor in actors {
                let _ = actor.send(Stop).await;
            }
        })
    }
}
