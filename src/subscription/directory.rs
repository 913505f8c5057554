//! The running subscriptions, for the checkpointer: before it takes the contexts' changes, every
//! subscription brings the contexts it fed up to its position (see
//! [`crate::subscription::actor::PushMarks`]).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use actix::Addr;

use super::actor::{PushMarks, SubscriptionActor};
use crate::index::Watermark;
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

    /// Ask every subscription to push its marks; returns once each has (a stopped one is
    /// skipped: it pushed its marks when it stopped), with the position each pushed (sources
    /// that consumed nothing yet have none).
    pub async fn push_marks(&self) -> BTreeMap<SubscriptionKey, Watermark> {
        let actors: Vec<(SubscriptionKey, Addr<SubscriptionActor>)> = self
            .actors
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, a)| (k.clone(), a.clone()))
            .collect();
        // Concurrently: each reply only says that subscription's marks are queued.
        let replies =
            futures::future::join_all(actors.iter().map(|(_, a)| a.send(PushMarks))).await;
        actors
            .into_iter()
            .zip(replies)
            .filter_map(|((key, _), reply)| Some((key, reply.ok()??)))
            .collect()
    }

    fn write(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, BTreeMap<SubscriptionKey, Addr<SubscriptionActor>>> {
        // Single inserts and removes cannot leave the map half-updated: a poisoned lock is safe.
        self.actors.write().unwrap_or_else(|p| p.into_inner())
    }
}
