//! The registry's own state, without any actor: which services run, which endpoint each one
//! consumes, and which registrations the policy refused. The actor shell ([`super::actor`])
//! asks it what a request may do, does the I/O (disk, etcd, starting and stopping
//! subscriptions), and records the outcome here.
//!
//! Generic over the handle of a running subscription, so that unit tests need no actors.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use crate::error::OpError;
use crate::hashing::HashProfile;
use crate::model::FieldNames;
use crate::model::{PublisherConfig, SubscriptionKey};
use crate::subscription::status::StatusCell;

use super::policy::{Refusal, RegistrationPolicy};
use crate::index::ProfileConflict;

/// What a registration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterOutcome {
    Created,
    /// An identical registration already existed; nothing changed.
    Unchanged,
}

/// One registered service: its registration, its status, and its running subscription.
#[derive(Debug)]
pub struct ServiceEntry<A> {
    pub config: Arc<PublisherConfig>,
    pub status: StatusCell,
    pub subscription: A,
}

#[derive(Debug)]
pub struct RegistryState<A> {
    services: BTreeMap<SubscriptionKey, ServiceEntry<A>>,
    /// One endpoint feeds one subscription.
    endpoints: HashMap<String, SubscriptionKey>,
    policy: RegistrationPolicy,
    /// Registrations refused by the policy, by label (`conductor_registrations_refused_total`).
    refused: BTreeMap<&'static str, u64>,
}

impl<A> Default for RegistryState<A> {
    fn default() -> Self {
        RegistryState {
            services: BTreeMap::new(),
            endpoints: HashMap::new(),
            policy: RegistrationPolicy::default(),
            refused: BTreeMap::new(),
        }
    }
}

impl<A> RegistryState<A> {
    pub fn with_policy(mut self, policy: RegistrationPolicy) -> Self {
        self.policy = policy;
        self
    }

    fn refuse(&mut self, refusal: Refusal) -> OpError {
        *self.refused.entry(refusal.label).or_default() += 1;
        refusal.error
    }

    /// Every check a registration must pass here, without changing anything but the refusal
    /// counts: `Some` when an identical one already runs. `bound` is the profile of the
    /// registration's context when that context exists.
    pub fn check(
        &mut self,
        config: &PublisherConfig,
        names: FieldNames,
        bound: Option<&HashProfile>,
    ) -> Result<Option<RegisterOutcome>, OpError> {
        if let Err(refusal) = self.policy.check(config, names) {
            return Err(self.refuse(refusal));
        }
        let key = config.subscription_key();
        if let Some(existing) = self.services.get(&key) {
            return if *existing.config == *config {
                Ok(Some(RegisterOutcome::Unchanged))
            } else {
                Err(OpError::invalid_registration(format!(
                    "conflicting registration for service key: {key}"
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
        if let Some(existing) = bound {
            agree(config, existing)?;
        }
        Ok(None)
    }

    /// Record a service whose subscription now runs.
    pub fn insert(&mut self, config: Arc<PublisherConfig>, status: StatusCell, subscription: A) {
        let key = config.subscription_key();
        self.endpoints.insert(config.endpoint.clone(), key.clone());
        self.services.insert(
            key,
            ServiceEntry {
                config,
                status,
                subscription,
            },
        );
    }

    pub fn contains(&self, key: &SubscriptionKey) -> bool {
        self.services.contains_key(key)
    }

    /// Forget a service; its endpoint is free again.
    pub fn remove(&mut self, key: &SubscriptionKey) -> Option<ServiceEntry<A>> {
        let entry = self.services.remove(key)?;
        self.endpoints.remove(&entry.config.endpoint);
        Some(entry)
    }

    /// Every service, ordered by its rendered service key (`instance|tenant|rank`, the order
    /// the listing has always reported: rank 10 before rank 2).
    pub fn services(&self) -> Vec<&ServiceEntry<A>> {
        let mut entries: Vec<(String, &ServiceEntry<A>)> = self
            .services
            .iter()
            .map(|(key, entry)| (key.to_string(), entry))
            .collect();
        entries.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        entries.into_iter().map(|(_, entry)| entry).collect()
    }

    pub fn refusals(&self) -> &BTreeMap<&'static str, u64> {
        &self.refused
    }
}

/// A registration must agree with the profile its context is already bound to.
pub fn agree(config: &PublisherConfig, bound: &HashProfile) -> Result<(), OpError> {
    ProfileConflict::check(&config.context_key(), bound, &config.hash_profile)
        .map_err(|conflict| OpError::invalid_registration(conflict.to_string()))
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
