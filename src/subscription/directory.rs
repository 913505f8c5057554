//! The running subscriptions, for the checkpointer: before it takes the contexts' changes, every
//! subscription brings the contexts it fed up to its position (see
//! [`crate::subscription::actor::PushMarks`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use actix::Addr;

use super::actor::{Identity, PushMarks, SubscriptionActor};
use super::marks::SourcePosition;
use crate::model::SubscriptionKey;

/// Service key → its subscription actor; the registry keeps it in step with its services.
#[derive(Clone, Default)]
pub struct SubscriptionDirectory {
    actors: Arc<RwLock<BTreeMap<SubscriptionKey, Addr<SubscriptionActor>>>>,
}

impl SubscriptionDirectory {
    pub fn insert(&self, key: SubscriptionKey, actor: Addr<SubscriptionActor>) {
        self.write().insert(key, actor);
    }

    pub fn remove(&self, key: &SubscriptionKey) {
        self.write().remove(key);
    }

    /// Ask every subscription to push its marks; returns once each has, with each one's
    /// position (a stopped one is skipped: it pushed its marks when it stopped).
    pub async fn push_marks(&self) -> Vec<(SubscriptionKey, SourcePosition)> {
        let actors = self.snapshot();
        // Concurrently: each reply only says that subscription's marks are queued.
        let replies =
            futures::future::join_all(actors.iter().map(|(_, a)| a.send(PushMarks))).await;
        actors
            .into_iter()
            .zip(replies)
            .filter_map(|((key, _), reply)| Some((key, reply.ok()?)))
            .collect()
    }

    /// Every running subscription's (incarnation, generation).
    pub async fn identities(&self) -> HashMap<SubscriptionKey, (u64, u64)> {
        let actors = self.snapshot();
        let replies = futures::future::join_all(actors.iter().map(|(_, a)| a.send(Identity))).await;
        actors
            .into_iter()
            .zip(replies)
            .filter_map(|((key, _), reply)| Some((key, reply.ok()?)))
            .collect()
    }

    fn snapshot(&self) -> Vec<(SubscriptionKey, Addr<SubscriptionActor>)> {
        let actors = self.actors.read().unwrap_or_else(|p| p.into_inner());
        actors.iter().map(|(k, a)| (k.clone(), a.clone())).collect()
    }

    fn write(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, BTreeMap<SubscriptionKey, Addr<SubscriptionActor>>> {
        // Single inserts and removes cannot leave the map half-updated: a poisoned lock is safe.
        self.actors.write().unwrap_or_else(|p| p.into_inner())
    }
}
