//! The one operation layer both transports call: validation, registry and index calls, result
//! building. gRPC and HTTP only translate their wire shapes to and from these types.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use actix::Addr;

use crate::error::OpError;
use crate::gateway::answer_status::{self, InstanceAnswerStatus};
use crate::gateway::auth::{Access, Auth};
use crate::gateway::engines_api::EngineControl;
use crate::gateway::readiness::{DegradedSource, Readiness};
use crate::gateway::registration::{FieldNames, MAX_BLOCK_SIZE, RegistrationInput};
use crate::index::{AnswerView, ContextView, IndexStats, QueryHits};
use crate::metrics::{QueryMetrics, Scrape, Transport};
use crate::model::{ContextKey, PublisherConfig, SubscriptionKey};
use crate::registry::shared::command::Reuploaded;
use crate::registry::shared::report::Held;
use crate::registry::{
    ContextDirectory, ListServices, Register, RegisterOutcome, Registry, ServiceInfo, Unregister,
};
use crate::storage::health::StorageHealth;

/// What `/services/status` says of registrations shared through etcd.
#[derive(Debug, Clone)]
pub struct RegistryStatus {
    pub etcd_up: bool,
    pub revision: i64,
    pub on_reset: &'static str,
    /// Registrations served that etcd lost, while some are.
    pub held: Option<Held>,
}

/// A prefix query, transport-neutral.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryInput {
    pub model_name: String,
    pub lora_name: String,
    pub block_size: i128,
    pub tenant_id: String,
    pub token_ids: Vec<i32>,
    pub cache_salt: String,
    /// `""` selects every instance of the context.
    pub instance_filter: String,
}

/// What names a query's context and instances, shared by both queries (`include_status`
/// reads the status of the same ranks).
#[derive(Debug, Clone, Copy)]
pub struct QueryContext<'a> {
    pub model_name: &'a str,
    pub lora_name: &'a str,
    pub block_size: i128,
    pub tenant_id: &'a str,
    pub instance_filter: &'a str,
}

impl QueryInput {
    pub fn context(&self) -> QueryContext<'_> {
        QueryContext {
            model_name: &self.model_name,
            lora_name: &self.lora_name,
            block_size: self.block_size,
            tenant_id: &self.tenant_id,
            instance_filter: &self.instance_filter,
        }
    }
}

impl QueryByHashInput {
    pub fn context(&self) -> QueryContext<'_> {
        QueryContext {
            model_name: &self.model_name,
            lora_name: &self.lora_name,
            block_size: self.block_size,
            tenant_id: &self.tenant_id,
            instance_filter: &self.instance_filter,
        }
    }
}

/// A query over already-projected block hashes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryByHashInput {
    pub model_name: String,
    pub lora_name: String,
    pub block_size: i128,
    pub tenant_id: String,
    pub block_hashes: Vec<u64>,
    pub instance_filter: String,
}

/// Shared state of the gateway.
/// What a registration did, and the instance id it was registered under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisterReply {
    pub outcome: RegisterOutcome,
    pub instance_id: String,
}

#[derive(Clone)]
pub struct Ops {
    registry: Addr<Registry>,
    contexts: ContextDirectory,
    /// Not ready while subscriptions are restored at start; `/health` and `Health` report it.
    readiness: Arc<Readiness>,
    queries: Arc<QueryMetrics>,
    /// Most token ids (or block hashes) in one query; HTTP already stops decoding past it.
    max_query_tokens: usize,
    storage: Arc<StorageHealth>,
    /// Registrations shared through etcd, for `/metrics`.
    shared: Option<Arc<crate::registry::shared::etcd::EtcdRegistry>>,
    /// Further `/metrics` sections (the replica's id and bootstrap progress).
    sections: Vec<Arc<dyn crate::metrics::Section>>,
    /// Further reasons to say degraded (a replica that started empty after its bootstrap failed).
    degraded: Vec<Arc<dyn DegradedSource>>,
    auth: Arc<Auth>,
    /// Engines registered by URL; set once the service has built them (they call back here).
    engines: Arc<std::sync::OnceLock<Arc<dyn EngineControl>>>,
}

impl Ops {
    pub fn new(
        registry: Addr<Registry>,
        contexts: ContextDirectory,
        readiness: Arc<Readiness>,
        auth: Auth,
    ) -> Self {
        Ops {
            registry,
            contexts,
            readiness,
            queries: Arc::default(),
            max_query_tokens: usize::MAX,
            storage: Arc::default(),
            shared: None,
            sections: Vec::new(),
            degraded: Vec::new(),
            auth: Arc::new(auth),
            engines: Arc::default(),
        }
    }

    /// Hand the engine operations to every clone of these ops (once).
    pub fn set_engines(&self, engines: Arc<dyn EngineControl>) {
        let _ = self.engines.set(engines);
    }

    /// The last load figures of the answer's instances that are engines registered by URL
    /// (`include_load`), in the answer's order.
    pub fn loads_of(
        &self,
        tenant_id: &str,
        answer: AnswerView<'_>,
    ) -> Vec<(String, crate::gateway::engines_api::LoadReport)> {
        let Some(engines) = self.engines.get() else {
            return Vec::new();
        };
        let tenant = crate::model::normalize_tenant(tenant_id);
        answer
            .rows()
            .filter_map(|row| Some((row.id.to_owned(), engines.load(&tenant, row.id)?)))
            .collect()
    }

    /// The engine operations, where the service runs them.
    pub fn engines(&self) -> Result<&Arc<dyn EngineControl>, OpError> {
        self.engines
            .get()
            .ok_or_else(|| OpError::unavailable("engine registration is not running"))
    }

    pub fn with_shared(
        mut self,
        shared: Option<Arc<crate::registry::shared::etcd::EtcdRegistry>>,
    ) -> Self {
        self.shared = shared;
        self
    }

    pub fn with_metrics_section(mut self, section: Arc<dyn crate::metrics::Section>) -> Self {
        self.sections.push(section);
        self
    }

    pub fn with_degraded_source(mut self, source: Arc<dyn DegradedSource>) -> Self {
        self.degraded.push(source);
        self
    }

    pub fn with_storage_health(mut self, storage: Arc<StorageHealth>) -> Self {
        self.storage = storage;
        self
    }

    /// Why the service is degraded while it keeps serving: checkpoints not landing,
    /// registrations served that etcd lost in a suspected reset, the memory budget evicting, or
    /// what a further source says (see [`Ops::with_degraded_source`]).
    pub fn degraded_reason(&self) -> Option<String> {
        let held = (self.shared.as_ref())
            .and_then(|e| e.reset_report().held())
            .map(|h| h.describe());
        let budget = self.contexts.budget().degraded();
        let further = self.degraded.iter().map(|d| d.degraded());
        let reasons: Vec<String> = [self.storage.degraded(), held, budget]
            .into_iter()
            .chain(further)
            .flatten()
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }

    /// The shared registry's section of `/services/status`: `None` without etcd.
    pub fn registry_status(&self) -> Option<RegistryStatus> {
        let e = self.shared.as_ref()?;
        Some(RegistryStatus {
            etcd_up: e.is_up(),
            revision: e.revision(),
            on_reset: e.on_reset().as_str(),
            held: e.reset_report().held(),
        })
    }

    /// `POST /registry/reupload`: write every registration held since a suspected etcd reset
    /// back into etcd.
    pub async fn reupload_held(&self) -> Result<Reuploaded, OpError> {
        self.etcd()?.reupload_held().await
    }

    /// `POST /registry/accept`: an operator confirms etcd's listing; every held registration
    /// is stopped. The service keys stopped.
    pub async fn accept_held(&self) -> Result<Vec<String>, OpError> {
        self.etcd()?.accept_held().await
    }

    fn etcd(&self) -> Result<&crate::registry::shared::etcd::EtcdRegistry, OpError> {
        self.shared.as_deref().ok_or_else(|| {
            OpError::not_found("registrations are not shared through etcd on this replica")
        })
    }

    pub fn with_max_query_tokens(mut self, max: usize) -> Self {
        self.max_query_tokens = max;
        self
    }

    /// Whether a request doing `access` may proceed with this `authorization` value (see
    /// [`Auth`]). Both transports call it before decoding anything else of the request.
    pub fn authorize(&self, access: Access, authorization: Option<&[u8]>) -> Result<(), OpError> {
        self.auth.check(access, authorization)
    }

    pub fn is_ready(&self) -> bool {
        self.readiness.is_ready()
    }

    /// What the service is still doing at start, while not ready.
    pub fn not_ready_reason(&self) -> Option<String> {
        self.readiness.reason()
    }

    /// Registration changes wait for the restored subscriptions (at most
    /// [`READY_WAIT`]), so that an unregister cannot miss a subscription still being restored,
    /// nor a register race with its own persisted copy.
    async fn ready_for_changes(&self) -> Result<(), OpError> {
        if self.readiness.wait_ready(READY_WAIT).await {
            return Ok(());
        }
        match self.readiness.reason() {
            None => Ok(()),
            Some(reason) => Err(OpError::unavailable(format!(
                "the service is starting ({reason}); retry shortly"
            ))),
        }
    }

    /// Validate and register `input`: every transport's registrations are validated here, and
    /// only here. A bad one is refused at once, even while the service is starting.
    pub async fn register(
        &self,
        input: RegistrationInput,
        names: FieldNames,
    ) -> Result<RegisterReply, OpError> {
        let config = input.validate(names)?;
        self.ready_for_changes().await?;
        self.send_register(config, names).await
    }

    /// [`Ops::register`] without waiting for readiness: the service's own static entries, which
    /// it registers while it starts.
    pub async fn register_at_start(
        &self,
        input: RegistrationInput,
        names: FieldNames,
    ) -> Result<RegisterReply, OpError> {
        let config = input.validate(names)?;
        self.send_register(config, names).await
    }

    async fn send_register(
        &self,
        config: PublisherConfig,
        names: FieldNames,
    ) -> Result<RegisterReply, OpError> {
        // The id the registration got (a store publisher's may be its endpoint).
        let instance_id = config.instance_id.clone();
        let outcome = self
            .registry
            .send(Register {
                config,
                names,
                restored: None,
                origin: crate::registry::Origin::Request,
            })
            .await
            .map_err(unavailable)??;
        Ok(RegisterReply {
            outcome,
            instance_id,
        })
    }

    pub async fn unregister(
        &self,
        instance_id: &str,
        tenant_id: &str,
        dp_rank: i128,
    ) -> Result<(), OpError> {
        if instance_id.is_empty() {
            return Err(OpError::invalid(
                "instance_id",
                "missing",
                "instance_id is required",
            ));
        }
        let dp_rank = u32::try_from(dp_rank)
            .ok()
            .filter(|r| *r <= i32::MAX as u32)
            .ok_or_else(|| {
                OpError::invalid(
                    "dp_rank",
                    "out_of_range",
                    "dp_rank must be a non-negative int",
                )
            })?;
        let key = SubscriptionKey::new(instance_id, tenant_id, dp_rank);
        self.ready_for_changes().await?;
        self.registry
            .send(Unregister(key))
            .await
            .map_err(unavailable)?
    }

    /// Hash the prompt with the context's profile (lazily, no lock held) and walk the index.
    pub fn query(&self, q: &QueryInput, transport: Transport) -> Result<QueryHits, OpError> {
        self.query_with(q, transport, |answer| answer.to_hits())
    }

    /// [`Self::query`] with the answer handed to `answer` while the walk lends it: the
    /// transports encode it there, and nothing is built per instance (see [`AnswerView`]).
    pub fn query_with<R>(
        &self,
        q: &QueryInput,
        transport: Transport,
        answer: impl FnOnce(AnswerView<'_>) -> R,
    ) -> Result<R, OpError> {
        self.observed(transport, || self.query_inner(q, answer))
    }

    /// Run one query and count it, with its time, in the query metrics.
    fn observed<R>(
        &self,
        transport: Transport,
        query: impl FnOnce() -> Result<R, OpError>,
    ) -> Result<R, OpError> {
        let started = Instant::now();
        let result = query();
        self.queries
            .observe(transport, started.elapsed(), result.is_ok());
        result
    }

    fn query_inner<R>(
        &self,
        q: &QueryInput,
        answer: impl FnOnce(AnswerView<'_>) -> R,
    ) -> Result<R, OpError> {
        if q.token_ids.len() > self.max_query_tokens {
            let (n, max) = (q.token_ids.len(), self.max_query_tokens);
            return Err(crate::gateway::request::too_many("token_ids", n, max));
        }
        let key = context_key(&q.model_name, &q.lora_name, q.block_size, &q.tenant_id)?;
        // An unknown context is a successful query with no hits, and creates nothing.
        let Some(handle) = key.and_then(|key| self.contexts.get(&key)) else {
            return Ok(answer(AnswerView::empty()));
        };
        let filter = Some(q.instance_filter.as_str());
        let reader = handle.reader();
        Ok(reader.query_tokens_with(&q.token_ids, &q.cache_salt, filter, answer))
    }

    pub fn query_by_hash(
        &self,
        q: &QueryByHashInput,
        transport: Transport,
    ) -> Result<QueryHits, OpError> {
        self.query_by_hash_with(q, transport, |answer| answer.to_hits())
    }

    /// [`Self::query_by_hash`] with the answer handed to `answer` (see [`Self::query_with`]).
    pub fn query_by_hash_with<R>(
        &self,
        q: &QueryByHashInput,
        transport: Transport,
        answer: impl FnOnce(AnswerView<'_>) -> R,
    ) -> Result<R, OpError> {
        self.observed(transport, || {
            let (n, max) = (q.block_hashes.len(), self.max_query_tokens);
            if n > max {
                return Err(crate::gateway::request::too_many("block_hashes", n, max));
            }
            let key = context_key(&q.model_name, &q.lora_name, q.block_size, &q.tenant_id)?;
            let Some(handle) = key.and_then(|key| self.contexts.get(&key)) else {
                return Ok(answer(AnswerView::empty()));
            };
            let filter = Some(q.instance_filter.as_str());
            Ok((handle.reader()).query_hashes_with(&q.block_hashes, filter, answer))
        })
    }

    /// Every context, sorted by key.
    /// The memory budget the contexts share.
    pub fn budget(&self) -> &std::sync::Arc<crate::index::Budget> {
        self.contexts.budget()
    }

    /// How sure a query's answer is for each instance it names (`include_status`): the
    /// context's plan as it is now, and the state and lag of each rank's subscription. An
    /// unknown context has no instances.
    pub async fn answer_status(
        &self,
        q: QueryContext<'_>,
    ) -> Result<BTreeMap<String, InstanceAnswerStatus>, OpError> {
        let key = context_key(q.model_name, q.lora_name, q.block_size, q.tenant_id)?;
        let Some((key, handle)) = key.and_then(|k| Some((k.clone(), self.contexts.get(&k)?)))
        else {
            return Ok(BTreeMap::new());
        };
        let ranks = handle.reader().rank_statuses(Some(q.instance_filter));
        let services = self.list_services().await?;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Ok(answer_status::statuses(&key, ranks, &services, now_ms))
    }

    /// Per context with hybrid ranks, their KV-cache groups as the events showed them, with
    /// block counts (`/services/status`). A context whose writer does not answer is left out.
    pub async fn group_layouts(&self) -> Vec<(ContextKey, Vec<crate::index::GroupCount>)> {
        let mut out = Vec::new();
        for handle in self.contexts.all() {
            if let Ok(groups) = handle.send(crate::index::GetGroups).await
                && !groups.is_empty()
            {
                out.push((handle.key().clone(), groups));
            }
        }
        out
    }

    pub fn global_view(&self) -> Vec<ContextView> {
        self.contexts.all().iter().map(|h| h.view()).collect()
    }

    pub async fn list_services(&self) -> Result<Vec<ServiceInfo>, OpError> {
        self.registry.send(ListServices).await.map_err(unavailable)
    }

    /// The Prometheus text of `/metrics`.
    pub async fn metrics_text(&self) -> Result<String, OpError> {
        let services = self.list_services().await?;
        let refused = self
            .registry
            .send(crate::registry::Refusals)
            .await
            .map_err(unavailable)?;
        let contexts: Vec<IndexStats> = self
            .contexts
            .all()
            .iter()
            .map(|h| h.reader().stats())
            .collect();
        let mut text = crate::metrics::render(&Scrape {
            ready: self.is_ready(),
            services: &services,
            contexts: &contexts,
            queries: &self.queries,
            storage_degraded: self.storage.degraded().is_some(),
            checkpoint_failures: self.storage.failures_total(),
            registrations_refused: &refused,
            etcd: self.shared.as_ref().map(|e| crate::metrics::EtcdGauges {
                up: e.is_up(),
                revision: e.revision(),
                held: e.reset_report().held().map_or(0, |h| h.services.len()),
                resets: (e.reset_report().detected().into_iter())
                    .map(|(reason, n)| (reason.label(), n))
                    .collect(),
            }),
        });
        crate::metrics::render_budget(&mut text, self.contexts.budget());
        for section in &self.sections {
            section.render(&mut text);
        }
        if let Some(engines) = self.engines.get() {
            engines.render_metrics(&mut text);
        }
        Ok(text)
    }
}

/// The context a query names; `None` for a block size no registration can have (above
/// [`MAX_BLOCK_SIZE`]), which like any unknown context answers no hits.
fn context_key(
    model_name: &str,
    lora_name: &str,
    block_size: i128,
    tenant_id: &str,
) -> Result<Option<ContextKey>, OpError> {
    if model_name.is_empty() {
        return Err(OpError::invalid(
            "model_name",
            "invalid_value",
            "model_name must not be empty",
        ));
    }
    if block_size < 1 {
        return Err(OpError::invalid(
            "block_size",
            "out_of_range",
            "block_size must be a positive integer",
        ));
    }
    if block_size > MAX_BLOCK_SIZE {
        return Ok(None);
    }
    Ok(Some(ContextKey::new(
        tenant_id,
        model_name,
        lora_name,
        block_size as u32,
    )))
}

/// How long a registration change made while the service starts waits for it to be ready
/// before it is refused as unavailable.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn unavailable(e: actix::MailboxError) -> OpError {
    OpError::unavailable(format!("registry unavailable: {e}"))
}
