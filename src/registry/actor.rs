//! The registry actor and its messages: a shell over [`RegistryState`] that does the I/O (the
//! registrations on disk and in etcd, the subscription actors, the contexts' rank listings).

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;

use crate::error::OpError;
use crate::index::ContextDirectory;
use crate::index::actor::{AttachRank, DetachSource, GetStats};
use crate::model::{FieldNames, PYTHON_NAMES, PublisherConfig, SubscriptionKey};
use crate::subscription::actor::{Stop, SubscriptionActor};
use crate::subscription::directory::SubscriptionDirectory;
use crate::subscription::settings::SubscriptionSettings;
use crate::subscription::status::{StatusCell, SubscriptionStatus};

pub use super::state::RegisterOutcome;

use super::policy::RegistrationPolicy;
use super::shared::etcd::{Created, EtcdRegistry};
use super::shared::sync::{ApplyShared, Change};
use super::state::{RegistryState, agree};
use crate::durability::sources::{
    Restored, delete_registration, put_registration, restore_registration,
};
use crate::storage::KvStore;

type LocalWork = LocalReply<()>;
type Step = std::pin::Pin<Box<dyn ActorFuture<Registry, Output = ()>>>;

pub struct Registry {
    contexts: ContextDirectory,
    subscriptions: SubscriptionDirectory,
    state: RegistryState<Addr<SubscriptionActor>>,
    settings: SubscriptionSettings,
    /// Registrations are written here before they are acknowledged, so they survive a restart.
    store: Arc<dyn KvStore>,
    /// Registrations shared with other replicas: requests write through etcd first.
    shared: Option<Arc<EtcdRegistry>>,
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
            state: RegistryState::default(),
            settings,
            store,
            shared: None,
        }
    }

    pub fn with_shared(mut self, shared: Arc<EtcdRegistry>) -> Self {
        self.shared = Some(shared);
        self
    }

    pub fn with_policy(mut self, policy: RegistrationPolicy) -> Self {
        self.state = self.state.with_policy(policy);
        self
    }

    /// Every check a registration must pass here, without changing anything: `Some` when an
    /// identical one already runs.
    fn check(
        &mut self,
        config: &PublisherConfig,
        names: FieldNames,
    ) -> Result<Option<RegisterOutcome>, OpError> {
        let bound = self.contexts.get(&config.context_key());
        let bound = bound.as_ref().map(|handle| handle.reader().profile());
        self.state.check(config, names, bound)
    }

    fn register(
        &mut self,
        config: PublisherConfig,
        names: FieldNames,
        restored: Option<Restored>,
    ) -> Result<RegisterOutcome, OpError> {
        if let Some(outcome) = self.check(&config, names)? {
            return Ok(outcome);
        }
        let key = config.subscription_key();
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
            agree(&config, handle.reader().profile())?;
        }
        let written = match restored {
            Some(r) => restore_registration(self.store.as_ref(), &config, r.incarnation)
                .map(|()| r.incarnation),
            None => put_registration(self.store.as_ref(), &config),
        };
        let incarnation = match written {
            Ok(incarnation) => incarnation,
            Err(e) => {
                if let Some((_, false)) = attach {
                    self.contexts.remove(&context_key);
                }
                return Err(OpError::internal(format!(
                    "cannot persist the registration: {e}"
                )));
            }
        };
        let resume_after = restored.and_then(|r| r.resume);
        let dropped_at_recovery = restored.is_some_and(|r| r.dropped);
        if let Some((handle, _)) = attach {
            handle.notify(AttachRank {
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
                let mut actor = SubscriptionActor::new(
                    config,
                    contexts,
                    status,
                    settings,
                    incarnation,
                    resume_after,
                );
                if dropped_at_recovery {
                    actor.note_dropped_at_recovery();
                }
                if restored.is_some() && resume_after.is_none() {
                    // Restored without a position: its publisher's whole buffer is asked for at
                    // once, not after a live batch an idle publisher may never send.
                    actor.replay_from_start_at_start();
                }
                actor
            })
        };
        tracing::info!(service = %key, endpoint = %config.endpoint, kind = %config.publisher_type, "registered");
        self.subscriptions.insert(key, actor.clone());
        self.state.insert(config, status, actor);
        Ok(RegisterOutcome::Created)
    }
}

impl Actor for Registry {
    type Context = Context<Self>;
}

/// Register a validated publisher; `restored`: recovered from disk, with its incarnation and
/// the position its source resumes from (`None`: a new registration).
#[derive(Message)]
#[rtype(result = "Result<RegisterOutcome, OpError>")]
pub struct Register {
    pub config: PublisherConfig,
    /// How the caller names its fields, for the policy's errors.
    pub names: FieldNames,
    pub restored: Option<Restored>,
    pub origin: Origin,
}

/// Where a registration comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A request or a static entry: with shared registrations, written through etcd first.
    Request,
    /// Recovered from this replica's own store at start: applied here only.
    Restore,
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

impl Registry {
    /// The reply to a register: once created, a round trip behind the rank listing queued to the
    /// context, so that the caller sees its instance in the global view as soon as it answers.
    fn registered_reply(
        &self,
        context: crate::model::ContextKey,
        outcome: Result<RegisterOutcome, OpError>,
    ) -> LocalReply<RegisterOutcome> {
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

    /// Forget a running service here (its subscription, its persisted copy, its blocks). The
    /// synchronous part is done on return; the returned work stops the subscription and detaches
    /// the source from every context.
    fn begin_unregister(&mut self, key: SubscriptionKey) -> Result<LocalWork, OpError> {
        if !self.state.contains(&key) {
            return Err(OpError::not_found(format!("service not found: {key}")));
        }
        // Forget it on disk first: if that fails, nothing changed and the caller may retry.
        delete_registration(self.store.as_ref(), &key).map_err(|e| {
            OpError::internal(format!("cannot delete the persisted registration: {e}"))
        })?;
        let Some(entry) = self.state.remove(&key) else {
            return Err(OpError::not_found(format!("service not found: {key}")));
        };
        self.subscriptions.remove(&key);
        let contexts = self.contexts.clone();
        Ok(Box::pin(async move {
            // Stop first so no batch of this source can arrive after its blocks are removed.
            let _ = entry.subscription.send(Stop).await;
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
        }))
    }
}

type LocalReply<T> = std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, OpError>>>>;

impl Handler<Register> for Registry {
    type Result = ResponseActFuture<Self, Result<RegisterOutcome, OpError>>;

    fn handle(&mut self, msg: Register, _ctx: &mut Context<Self>) -> Self::Result {
        let context = msg.config.context_key();
        let shared = self
            .shared
            .clone()
            .filter(|_| msg.origin == Origin::Request);
        let Some(shared) = shared else {
            let outcome = self.register(msg.config, msg.names, msg.restored);
            return Box::pin(self.registered_reply(context, outcome).into_actor(self));
        };
        // Checked here first, so that etcd is not given what this replica would refuse.
        match self.check(&msg.config, msg.names) {
            Ok(None) => {}
            Ok(Some(outcome)) => return Box::pin(fut::ready(Ok(outcome))),
            Err(e) => return Box::pin(fut::ready(Err(e))),
        }
        let config = msg.config.clone();
        let write = async move { shared.create(&config).await };
        Box::pin(write.into_actor(self).then(move |written, act, _| {
            // Once etcd holds it, the registration is everyone's: a local failure here is
            // retried when the watch delivers it.
            let outcome = written.and_then(|created| {
                let local = act.register(msg.config, msg.names, None)?;
                Ok(match created {
                    Created::Created => local,
                    Created::Unchanged => RegisterOutcome::Unchanged,
                })
            });
            act.registered_reply(context, outcome).into_actor(act)
        }))
    }
}

impl Handler<Unregister> for Registry {
    // Atomic: no other registration change runs until the source is gone from every context, so
    // a re-registration of the same key cannot have its fresh rank listing detached.
    type Result = AtomicResponse<Self, Result<(), OpError>>;

    fn handle(&mut self, msg: Unregister, _ctx: &mut Context<Self>) -> Self::Result {
        let key = msg.0;
        let Some(shared) = self.shared.clone() else {
            let work: LocalWork = match self.begin_unregister(key) {
                Ok(work) => work,
                Err(e) => Box::pin(async move { Err(e) }),
            };
            return AtomicResponse::new(Box::pin(work.into_actor(self)));
        };
        let delete_key = key.clone();
        let follower = shared.clone();
        let delete = async move { shared.delete(&delete_key).await };
        AtomicResponse::new(Box::pin(delete.into_actor(self).then(
            move |deleted, act, _| {
                let work: LocalWork = match deleted {
                    Err(e) => Box::pin(async move { Err(e) }),
                    Ok(existed) => match act.begin_unregister(key.clone()) {
                        // Run here but not in etcd: held since a suspected reset, and now gone.
                        Ok(work) if !existed => {
                            follower.forget_held(key);
                            work
                        }
                        Ok(work) => work,
                        // Deleted in etcd, not running here yet: nothing more to stop.
                        Err(_) if existed => Box::pin(async { Ok(()) }),
                        Err(e) => Box::pin(async move { Err(e) }),
                    },
                };
                work.into_actor(act)
            },
        )))
    }
}

impl Handler<ApplyShared> for Registry {
    // Atomic and in order: a changed registration is a stop then a start of one key.
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, msg: ApplyShared, _ctx: &mut Context<Self>) -> Self::Result {
        let mut steps: Step = Box::pin(fut::ready(()));
        for change in msg.0 {
            steps = Box::pin(steps.then(move |(), act: &mut Registry, _| -> Step {
                match change {
                    Change::Start(config) => {
                        let key = config.subscription_key();
                        if let Err(e) = act.register(config, PYTHON_NAMES, None) {
                            tracing::error!(service = %key, "registration from etcd not started: {}", e.message);
                        }
                        Box::pin(fut::ready(()))
                    }
                    Change::Stop(key) => match act.begin_unregister(key) {
                        Ok(work) => Box::pin(work.into_actor(act).map(|r, _, _| {
                            if let Err(e) = r {
                                tracing::error!("unregistration from etcd incomplete: {}", e.message);
                            }
                        })),
                        Err(_) => Box::pin(fut::ready(())),
                    },
                }
            }));
        }
        AtomicResponse::new(steps)
    }
}

impl Handler<ListServices> for Registry {
    type Result = Vec<ServiceInfo>;

    fn handle(&mut self, _: ListServices, _ctx: &mut Context<Self>) -> Vec<ServiceInfo> {
        self.state
            .services()
            .into_iter()
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
        MessageResult(self.state.refusals().clone())
    }
}

impl Handler<ShutdownAll> for Registry {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: ShutdownAll, _ctx: &mut Context<Self>) -> Self::Result {
        let actors: Vec<_> = (self.state.services().into_iter())
            .map(|e| e.subscription.clone())
            .collect();
        Box::pin(async move {
            for actor in actors {
                let _ = actor.send(Stop).await;
            }
        })
    }
}
