//! The engines followed, and how each is brought in step with its description
//! (docs/engine-discovery.md, "Keeping in step").
//!
//! What is registered is always read from the registry (the ranks registered under the engine's
//! instance id and tenant), never from a copy kept here: after a restart, a failed step or a
//! registration made by hand, the next step compares the description with what really runs.
//! Steps that change registrations run one at a time (`changes`); reading descriptions does
//! not hold it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::error::OpError;
use crate::gateway::engines_api::{EngineLoad, EngineReply, EngineStatus, LoadReport};
use crate::gateway::ops::Ops;
use crate::hashing::HashProfile;
use crate::model::{PYTHON_NAMES, PublisherConfig};
use crate::registry::ServiceInfo;
use crate::registry::policy::RegistrationPolicy;

use super::EngineSettings;
use super::describe::Description;
use super::read::read_description;
use super::records::Records;
use super::schedule::Due;
use super::spec::{EngineSpec, Origin, RankPlan, wanted_ranks};

/// An engine failing on every refresh logs once a minute.
const WARN_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

type Key = (String, String);

pub(super) struct Engine {
    pub(super) spec: EngineSpec,
    model_name: String,
    ranks_found: usize,
    ranks_registered: usize,
    pub(super) last_read: Option<Instant>,
    /// Since when, and why, the description cannot be read (or asks for what cannot be
    /// registered).
    pub(super) failing: Option<(Instant, String)>,
    /// Unreadable past the grace: its ranks are unregistered until it reads again.
    dropped: bool,
    /// When its last warning was logged (one per [`WARN_EVERY`]).
    warned: Option<Instant>,
    /// Its last load read, and when.
    pub(super) load: Option<(Instant, EngineLoad)>,
    /// When its description and its load are read next (see `schedule`).
    pub(super) describe_due: Due,
    pub(super) load_due: Due,
}

impl Engine {
    fn new(spec: EngineSpec) -> Engine {
        Engine {
            model_name: spec.model_name.clone().unwrap_or_default(),
            spec,
            ranks_found: 0,
            ranks_registered: 0,
            last_read: None,
            failing: None,
            dropped: false,
            warned: None,
            load: None,
            describe_due: Due::default(),
            load_due: Due::default(),
        }
    }
}

pub struct Fleet {
    pub(super) ops: Ops,
    policy: RegistrationPolicy,
    pub(super) settings: EngineSettings,
    records: Records,
    engines: Mutex<BTreeMap<Key, Engine>>,
    changes: tokio::sync::Mutex<()>,
    errors: std::sync::atomic::AtomicU64,
}

impl Fleet {
    pub fn new(
        ops: Ops,
        policy: RegistrationPolicy,
        settings: EngineSettings,
        records: Records,
    ) -> Arc<Fleet> {
        let engines = records
            .load()
            .into_iter()
            .map(|spec| (spec.key(), Engine::new(spec)))
            .collect();
        Arc::new(Fleet {
            ops,
            policy,
            settings,
            records,
            engines: Mutex::new(engines),
            changes: tokio::sync::Mutex::new(()),
            errors: Default::default(),
        })
    }

    /// Register an engine: read its description, register each rank, and follow it. On any
    /// refusal, the ranks this call registered are unregistered again and the engine is not
    /// followed (an engine followed before keeps its ranks).
    pub async fn add(&self, spec: EngineSpec) -> Result<EngineReply, OpError> {
        if let Err(message) = self.allowed(&spec) {
            return Err(OpError::invalid("url", "not_allowed", message));
        }
        let key = spec.key();
        let description = self.read(&spec).await.map_err(|why| {
            OpError::invalid(
                "url",
                "unreadable",
                format!("the engine's description: {why}"),
            )
        })?;
        let wanted = wanted_ranks(&spec, &description, self.settings.fetch.allow_local)?;
        let (limits, ranks) = (self.settings.fetch, self.settings.max_ranks_per_engine);
        let load = super::load::read_load(&spec, limits, ranks).await;
        // Nothing slow below: the lock serialises registration changes only.
        let _changes = self.changes.lock().await;
        let previous = {
            let engines = self.lock_engines();
            let previous = engines.get(&key).map(|e| e.spec.clone());
            if previous.is_none() && engines.len() >= self.settings.max_engines {
                let message = format!(
                    "{} engines are followed; the limit is {} (max_engines)",
                    engines.len(),
                    self.settings.max_engines
                );
                return Err(OpError::invalid("url", "too_many", message));
            }
            previous
        };
        if spec.origin == Origin::Request {
            self.records.put(&spec).await?;
        }
        let before = self.registered(&spec).await?;
        let mut made = Vec::new();
        if let Err(e) = self.converge(&spec, &before, &wanted, &mut made).await {
            match &previous {
                // A new engine leaves nothing behind, and takes nothing away: only the ranks
                // this call registered go (a rank registered by hand before, which the
                // description names as it is, keeps its registration and its blocks).
                None => {
                    for rank in made {
                        let _ = (self.ops)
                            .unregister(&spec.instance_id, &spec.tenant_id, i128::from(rank))
                            .await;
                    }
                    let _ = self.records.delete(&key).await;
                }
                // A followed one keeps what it was asked as; the next refresh brings it in step.
                Some(old) if old.origin == Origin::Request => {
                    let _ = self.records.put(old).await;
                }
                Some(_) => {}
            }
            return Err(e);
        }
        let mut engine = Engine::new(spec.clone());
        note_read(&mut engine, &description, &wanted);
        engine.load = load.map(|load| (Instant::now(), load));
        self.lock_engines().insert(key, engine);
        Ok(reply(&spec, &wanted))
    }

    /// The engines followed. Each change under this lock is one map operation or one engine's
    /// fields, never a half-done whole: a panic elsewhere that poisoned it leaves a usable map.
    pub(super) fn lock_engines(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, Engine>> {
        self.engines.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stop following an engine and unregister its ranks.
    pub async fn remove(&self, tenant_id: &str, instance_id: &str) -> Result<usize, OpError> {
        let key = (
            crate::model::normalize_tenant(tenant_id),
            instance_id.to_owned(),
        );
        let _changes = self.changes.lock().await;
        let spec = match self.lock_engines().get(&key) {
            Some(engine) => engine.spec.clone(),
            None => {
                let message = format!("no engine {instance_id:?} of tenant {:?}", key.0);
                return Err(OpError::not_found(message));
            }
        };
        // The record goes first: another replica that reads the engine meanwhile finds it
        // gone and does not register its ranks again.
        self.records.delete(&key).await?;
        let registered = self.registered(&spec).await?;
        (self.converge(&spec, &registered, &BTreeMap::new(), &mut Vec::new())).await?;
        self.lock_engines().remove(&key);
        Ok(registered.len())
    }

    /// Follow exactly `specs` among the engines of `origin` (the configuration's list, or the
    /// addresses a name resolves to): new ones are brought in step by the next refresh, gone
    /// ones removed now.
    pub async fn set_origin(&self, origin: Origin, specs: Vec<EngineSpec>) {
        let wanted: BTreeMap<Key, EngineSpec> = specs.into_iter().map(|s| (s.key(), s)).collect();
        let gone: Vec<Key> = {
            let mut engines = self.lock_engines();
            for (key, spec) in &wanted {
                let replace = engines.get(key).is_none_or(|e| e.spec != *spec);
                if replace
                    && (engines.len() < self.settings.max_engines || engines.contains_key(key))
                {
                    engines.insert(key.clone(), Engine::new(spec.clone()));
                }
            }
            engines
                .iter()
                .filter(|(k, e)| e.spec.origin == origin && !wanted.contains_key(*k))
                .map(|(k, _)| k.clone())
                .collect()
        };
        for spec in wanted.values() {
            if let Err(e) = self.records.put(spec).await {
                tracing::warn!("engine {}: not recorded: {e}", spec.instance_id);
            }
        }
        for (tenant, instance) in gone {
            if let Err(e) = self.remove(&tenant, &instance).await {
                tracing::warn!("engine {instance}: not removed: {e}");
            }
        }
    }

    /// With etcd: follow the engines other replicas registered, and stop following those
    /// another replica removed (their ranks left through the shared registrations already).
    pub(super) async fn follow_shared(&self) {
        if !self.records.is_shared() {
            return;
        }
        // Listed under the lock that adds hold, so that an engine being added is listed.
        let _changes = self.changes.lock().await;
        let Some(shared) = self.records.shared_specs().await else {
            return;
        };
        let listed: BTreeMap<Key, EngineSpec> = shared.into_iter().map(|s| (s.key(), s)).collect();
        let mut engines = self.lock_engines();
        engines.retain(|key, e| e.spec.origin != Origin::Request || listed.contains_key(key));
        for (key, spec) in listed {
            let replace = engines.get(&key).is_none_or(|e| e.spec != spec);
            if replace && engines.len() < self.settings.max_engines {
                engines.insert(key, Engine::new(spec));
            }
        }
    }

    /// Bring one engine in step with what was just read of it.
    pub(super) async fn step(
        &self,
        spec: &EngineSpec,
        read: Result<Description, String>,
        services: Option<&[ServiceInfo]>,
    ) {
        let _changes = self.changes.lock().await;
        let key = spec.key();
        if self
            .engines
            .lock()
            .unwrap()
            .get(&key)
            .is_none_or(|e| e.spec != *spec)
        {
            return; // Removed or replaced while it was read.
        }
        // With etcd, another replica may have removed the engine since the last listing: its
        // ranks must not be registered again (nor anything changed while etcd cannot say).
        if spec.origin == Origin::Request
            && self.records.is_shared()
            && self.records.still_shared(spec).await != Some(true)
        {
            return;
        }
        let outcome = match read {
            Ok(description) => {
                match wanted_ranks(spec, &description, self.settings.fetch.allow_local) {
                    Ok(wanted) => match services.map(|s| registered_in(s, spec)) {
                        Some(before) => self
                            .converge(spec, &before, &wanted, &mut Vec::new())
                            .await
                            .map(|()| (description, wanted))
                            .map_err(|e| e.message),
                        None => Err("the registry did not list its services".to_owned()),
                    },
                    Err(e) => Err(e.message),
                }
            }
            Err(why) => Err(why),
        };
        let now = Instant::now();
        let expired = {
            let mut engines = self.lock_engines();
            let Some(engine) = engines.get_mut(&key) else {
                return;
            };
            match outcome {
                Ok((description, wanted)) => {
                    note_read(engine, &description, &wanted);
                    false
                }
                Err(why) => {
                    self.errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let quiet = engine
                        .warned
                        .is_some_and(|at| now.duration_since(at) < WARN_EVERY);
                    if !quiet {
                        engine.warned = Some(now);
                        tracing::warn!("engine {}: {why}", spec.instance_id);
                    }
                    let since = engine.failing.as_ref().map_or(now, |(since, _)| *since);
                    engine.failing = Some((since, why));
                    !engine.dropped && now.duration_since(since) >= self.settings.unreadable_grace
                }
            }
        };
        if expired {
            // Past the grace its blocks would answer for an engine that is gone.
            let registered = self.registered(spec).await.unwrap_or_default();
            let cleared =
                (self.converge(spec, &registered, &BTreeMap::new(), &mut Vec::new())).await;
            if let Some(engine) = self.lock_engines().get_mut(&key) {
                engine.dropped = cleared.is_ok();
                engine.ranks_registered = if cleared.is_ok() { 0 } else { registered.len() };
            }
        }
    }

    /// Unregister what `before` has and `wanted` does not (or has otherwise), then register
    /// what `wanted` adds, noting each rank it registered in `made`; stops at the first
    /// refusal.
    async fn converge(
        &self,
        spec: &EngineSpec,
        before: &BTreeMap<u32, RankPlan>,
        wanted: &BTreeMap<u32, RankPlan>,
        made: &mut Vec<u32>,
    ) -> Result<(), OpError> {
        for (rank, plan) in before {
            if !wanted.get(rank).is_some_and(|w| w.registers_as(plan)) {
                let done = self
                    .ops
                    .unregister(&spec.instance_id, &spec.tenant_id, *rank as i128)
                    .await;
                match done {
                    Ok(()) => {}
                    Err(e) if e.code == crate::error::Code::ServiceNotFound => {}
                    Err(e) => return Err(e),
                }
            }
        }
        for (rank, plan) in wanted {
            if !before.get(rank).is_some_and(|b| b.registers_as(plan)) {
                self.ops
                    .register(plan.input(spec, *rank), PYTHON_NAMES)
                    .await?;
                made.push(*rank);
            }
        }
        Ok(())
    }

    /// The ranks registered now under `spec`'s instance id and tenant, as plans to compare a
    /// description's with (a rank registered with another recipe compares unequal).
    async fn registered(&self, spec: &EngineSpec) -> Result<BTreeMap<u32, RankPlan>, OpError> {
        Ok(registered_in(&self.ops.list_services().await?, spec))
    }

    /// The Conductor connects where the URL says: the same hosts as endpoints may name. One
    /// policy at every entrance: an engine from a request, the configuration, a DNS name, the
    /// store or another replica is checked before each read, so one outside the policy is
    /// reported and never read (and its ranks go after the unreadable grace).
    pub(super) fn allowed(&self, spec: &EngineSpec) -> Result<(), String> {
        if self
            .policy
            .host_allowed(&format!("tcp://{}:1", spec.url.host))
        {
            return Ok(());
        }
        Err(format!(
            "url {:?}: the host is not in allowed_endpoint_hosts",
            spec.url.to_url()
        ))
    }

    pub(super) async fn read(&self, spec: &EngineSpec) -> Result<Description, String> {
        self.allowed(spec)?;
        read_description(
            spec,
            self.settings.fetch,
            self.settings.max_ranks_per_engine,
        )
        .await
    }

    /// Every engine followed, by (tenant, instance id).
    pub fn list(&self) -> Vec<EngineStatus> {
        let now = Instant::now();
        let engines = self.lock_engines();
        engines.values().map(|e| status(e, now)).collect()
    }

    /// The last load read of an engine, with its age.
    pub fn load(&self, tenant_id: &str, instance_id: &str) -> Option<LoadReport> {
        let key = (tenant_id.to_owned(), instance_id.to_owned());
        let engines = self.lock_engines();
        let (at, load) = engines.get(&key)?.load.as_ref()?;
        Some(LoadReport {
            age_ms: at.elapsed().as_millis() as u64,
            load: load.clone(),
        })
    }

    /// Descriptions that could not be read or registered, since start.
    pub fn discovery_errors(&self) -> u64 {
        self.errors.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The ranks of `services` registered under `spec`'s instance id and tenant.
fn registered_in(services: &[ServiceInfo], spec: &EngineSpec) -> BTreeMap<u32, RankPlan> {
    let pairs = spec
        .hash_profile
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()));
    let profile = HashProfile::from_pairs(pairs).ok();
    services
        .iter()
        .map(|s| &*s.config)
        .filter(|c| c.instance_id == spec.instance_id && c.tenant_id == spec.tenant_id)
        .map(|c| (c.dp_rank, as_plan(c, profile.as_ref(), &spec.hybrid_parts)))
        .collect()
}

/// A registered rank as the plan that would have registered it (compared with
/// [`RankPlan::registers_as`]: the topic is not part of a registration).
fn as_plan(
    config: &PublisherConfig,
    profile: Option<&HashProfile>,
    hybrid_parts: &[crate::model::HybridPart],
) -> RankPlan {
    // Declared hybrid parts are part of the recipe: a change registers the rank again.
    let same_recipe =
        profile.is_some_and(|p| *p == config.hash_profile) && config.hybrid_parts == hybrid_parts;
    RankPlan {
        endpoint: config.endpoint.clone(),
        replay_endpoint: config.replay_endpoint.clone(),
        topic: String::new(),
        block_size: config.block_size,
        // A rank registered with another recipe must be registered again.
        model_name: if same_recipe {
            config.model_name.clone()
        } else {
            format!("{}\u{0}(other recipe)", config.model_name)
        },
    }
}

fn note_read(engine: &mut Engine, description: &Description, wanted: &BTreeMap<u32, RankPlan>) {
    engine.ranks_found = description.sources.len();
    engine.ranks_registered = wanted.len();
    engine.last_read = Some(Instant::now());
    engine.failing = None;
    engine.dropped = false;
    if let Some(plan) = wanted.values().next() {
        engine.model_name = plan.model_name.clone();
    }
}

fn reply(spec: &EngineSpec, wanted: &BTreeMap<u32, RankPlan>) -> EngineReply {
    EngineReply {
        instance_id: spec.instance_id.clone(),
        tenant_id: spec.tenant_id.clone(),
        url: spec.url.to_url(),
        engine_type: spec.kind.as_str(),
        model_name: wanted
            .values()
            .next()
            .map(|p| p.model_name.clone())
            .unwrap_or_default(),
        ranks: wanted.iter().map(|(r, p)| p.report(*r)).collect(),
    }
}

fn status(engine: &Engine, now: Instant) -> EngineStatus {
    let ms = |since: Instant| now.duration_since(since).as_millis() as u64;
    EngineStatus {
        instance_id: engine.spec.instance_id.clone(),
        tenant_id: engine.spec.tenant_id.clone(),
        url: engine.spec.url.to_url(),
        engine_type: engine.spec.kind.as_str(),
        model_name: engine.model_name.clone(),
        origin: engine.spec.origin.as_str(),
        state: match (&engine.failing, engine.dropped) {
            (None, _) => "ok",
            (Some(_), false) => "unreadable",
            (Some(_), true) => "dropped",
        },
        ranks_found: engine.ranks_found,
        ranks_registered: engine.ranks_registered,
        description_age_ms: engine.last_read.map(ms),
        last_error: engine.failing.as_ref().map(|(_, why)| why.clone()),
        failing_for_ms: engine.failing.as_ref().map(|(since, _)| ms(*since)),
    }
}
