//! The directory of live contexts, shared by the registry, the subscriptions (which create
//! adapter and store contexts on first use) and the query path (which reads it without any actor
//! round trip).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use actix::ArbiterHandle;

use super::actor::ContextHandle;
use super::write::context::ContextIndex;
use crate::hashing::HashProfile;
use crate::hashing::derived::ChainTuning;
use crate::model::ContextKey;

/// A context exists with another hash profile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("context {key} is bound to hash profile {existing}; this registration uses {requested}")]
pub struct ProfileConflict {
    pub key: ContextKey,
    pub existing: String,
    pub requested: String,
}

impl ProfileConflict {
    /// A conflict when context `key`, bound to `existing`, is asked for `requested`.
    pub fn check(
        key: &ContextKey,
        existing: &HashProfile,
        requested: &HashProfile,
    ) -> Result<(), Box<ProfileConflict>> {
        if existing == requested {
            return Ok(());
        }
        Err(Box::new(ProfileConflict {
            key: key.clone(),
            existing: existing.to_string(),
            requested: requested.to_string(),
        }))
    }
}

/// Arbiters (one OS thread each) the context actors are spread over, round robin.
#[derive(Clone)]
pub struct ArbiterPool {
    arbiters: Arc<Vec<ArbiterHandle>>,
    next: Arc<AtomicUsize>,
}

impl ArbiterPool {
    /// `threads` new arbiters; with 0, every actor runs on the caller's arbiter.
    pub fn new(threads: usize) -> Self {
        let arbiters = (0..threads)
            .map(|_| actix::Arbiter::new().handle())
            .collect();
        ArbiterPool {
            arbiters: Arc::new(arbiters),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub fn pick(&self) -> ArbiterHandle {
        if self.arbiters.is_empty() {
            return actix::Arbiter::current();
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.arbiters.len();
        self.arbiters[i].clone()
    }

    pub fn stop(&self) {
        for arbiter in self.arbiters.iter() {
            arbiter.stop();
        }
    }
}

/// Context key → running context.
#[derive(Clone)]
pub struct ContextDirectory {
    contexts: Arc<RwLock<HashMap<ContextKey, ContextHandle>>>,
    arbiters: ArbiterPool,
    /// The memory budget every context it starts shares.
    budget: Arc<super::Budget>,
    /// The chain tuning of the store, which every context it starts uses
    /// ([`ChainTuning::to_bits`]): set from the store at start and after a bootstrap, before
    /// any context is started.
    tuning: Arc<AtomicU16>,
}

impl ContextDirectory {
    pub fn new(arbiters: ArbiterPool) -> Self {
        ContextDirectory {
            contexts: Arc::default(),
            arbiters,
            budget: super::Budget::unbounded(),
            tuning: Arc::new(AtomicU16::new(ChainTuning::DEFAULT.to_bits())),
        }
    }

    /// Contexts started from now on make their derived keys with `tuning` (the store's).
    pub fn set_tuning(&self, tuning: ChainTuning) {
        self.tuning.store(tuning.to_bits(), Ordering::Release);
    }

    /// The tuning contexts are started with.
    pub fn tuning(&self) -> ChainTuning {
        ChainTuning::from_bits(self.tuning.load(Ordering::Acquire)).unwrap_or(ChainTuning::DEFAULT)
    }

    /// Contexts started from now on share `budget` (see [`super::Budget`]).
    pub fn with_budget(mut self, budget: Arc<super::Budget>) -> Self {
        self.budget = budget;
        self
    }

    pub fn budget(&self) -> &Arc<super::Budget> {
        &self.budget
    }

    pub fn get(&self, key: &ContextKey) -> Option<ContextHandle> {
        self.read().get(key).cloned()
    }

    /// The context for `key`, started with `profile` if it does not exist yet.
    pub fn get_or_create(
        &self,
        key: &ContextKey,
        profile: &HashProfile,
    ) -> Result<ContextHandle, Box<ProfileConflict>> {
        if let Some(handle) = self.get(key) {
            return check_profile(handle, profile);
        }
        let mut contexts = self
            .contexts
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(handle) = contexts.get(key) {
            return check_profile(handle.clone(), profile);
        }
        let mut index = ContextIndex::tuned(key.clone(), profile.clone(), self.tuning());
        index.set_budget(Arc::clone(&self.budget));
        let handle = ContextHandle::start_in_arbiter(&self.arbiters.pick(), index);
        contexts.insert(key.clone(), handle.clone());
        Ok(handle)
    }

    /// Put a recovered context back.
    pub fn insert(&self, handle: ContextHandle) {
        let mut contexts = self
            .contexts
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        contexts.insert(handle.key().clone(), handle);
    }

    /// Start a recovered context under this directory's budget (which it obeys at once: see
    /// [`ContextIndex::set_budget`]).
    pub fn start(&self, mut index: ContextIndex) -> ContextHandle {
        index.set_budget(Arc::clone(&self.budget));
        ContextHandle::start_in_arbiter(&self.arbiters.pick(), index)
    }

    pub fn remove(&self, key: &ContextKey) -> Option<ContextHandle> {
        self.contexts
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .remove(key)
    }

    /// Every context, sorted by key.
    pub fn all(&self) -> Vec<ContextHandle> {
        let mut all: Vec<ContextHandle> = self.read().values().cloned().collect();
        all.sort_by(|a, b| a.key().cmp(b.key()));
        all
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn arbiters(&self) -> &ArbiterPool {
        &self.arbiters
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<ContextKey, ContextHandle>> {
        // A panic while holding the lock cannot leave the map half-updated (single inserts and
        // removes), so a poisoned lock is still safe to read.
        self.contexts
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn check_profile(
    handle: ContextHandle,
    profile: &HashProfile,
) -> Result<ContextHandle, Box<ProfileConflict>> {
    ProfileConflict::check(handle.key(), handle.reader().profile(), profile)?;
    Ok(handle)
}
