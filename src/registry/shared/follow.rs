//! The task that follows the prefix: list (with the fleet's epoch), then watch from the next
//! revision; reconnect with back-off and check that etcd still holds the history followed
//! before resuming; list again after a compaction. Changes go to the registry in etcd's order;
//! a listing suspected of coming from an etcd that lost the registrations holds them instead
//! ([`super::sync`]), and the held ones are written back or wait for an operator's command.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use actix::Recipient;
use etcd_client::{EventType, WatchOptions};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::OnReset;
use super::command::{Command, Reuploaded};
use super::etcd::EtcdRegistry;
use super::marker;
use super::sync::{ApplyShared, Change, Event, Kv, Step, SyncState, registrations_prefix};
use crate::error::Code;
use crate::model::PublisherConfig;
use crate::storage::KvStore;

const MAX_BACKOFF: Duration = Duration::from_secs(2);

enum Broken {
    Etcd(String),
    RegistryGone,
}

/// What the follower works with besides its state.
struct Links<'a> {
    registry: &'a Recipient<ApplyShared>,
    store: &'a Arc<dyn KvStore>,
    /// Set once a listing is applied (a bootstrapping replica waits for it).
    listed: &'a tokio::sync::watch::Sender<bool>,
}

impl EtcdRegistry {
    /// Follow the prefix until `stop`: every change is applied by the registry, in etcd's order.
    /// The history followed is recorded in `store` whenever it moves and nothing is held (see
    /// [`super::marker`]).
    pub async fn run(
        self: Arc<Self>,
        mut state: SyncState,
        registry: impl Into<Recipient<ApplyShared>>,
        stop: CancellationToken,
        store: Arc<dyn KvStore>,
        listed: tokio::sync::watch::Sender<bool>,
    ) {
        let registry = registry.into();
        let Some(mut inbox) = self.inbox.lock().ok().and_then(|mut i| i.take()) else {
            tracing::error!("the etcd follower runs once per service");
            return;
        };
        let links = Links {
            registry: &registry,
            store: &store,
            listed: &listed,
        };
        let mut backoff = Duration::from_millis(100);
        loop {
            let outcome = tokio::select! {
                _ = stop.cancelled() => return,
                r = self.follow(&mut state, &links, &mut inbox) => r,
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
                    // Commands are still taken meanwhile: an operator's confirmation needs no
                    // etcd, a write-back answers that etcd is unavailable.
                    let wake = tokio::time::Instant::now() + backoff;
                    loop {
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = tokio::time::sleep_until(wake) => break,
                            Some(command) = inbox.recv() => {
                                if let Err(Broken::RegistryGone) =
                                    self.command(command, &mut state, &links).await
                                {
                                    return;
                                }
                            }
                        }
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
        links: &Links<'_>,
        inbox: &mut mpsc::UnboundedReceiver<Command>,
    ) -> Result<(), Broken> {
        let client = self.client().await.map_err(Broken::Etcd)?;
        if let Step::Watch { .. } = state.next_step() {
            // Reconnected: etcd may have been replaced meanwhile.
            let now = self.read_epoch().await.map_err(Broken::Etcd)?;
            if !state.resumes(&now) {
                tracing::warn!(
                    revision = now.revision,
                    applied = state.revision(),
                    "etcd no longer continues the history this replica followed; listing the \
                     registrations again"
                );
            }
        }
        if state.next_step() == Step::List {
            self.list_and_apply(state, links).await?;
        }
        let Step::Watch { from } = state.next_step() else {
            return Ok(());
        };
        // After the listing that held them, and again after any reconnect while some are still
        // held (a write-back that etcd's absence cut short; one refused is tried once more).
        if self.config.on_reset == OnReset::Reupload && !state.held().is_empty() {
            self.reupload(state).await?;
        }
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(from)
            .with_progress_notify();
        let mut watch = client.watch_client();
        let prefix = registrations_prefix(&self.config.prefix);
        let stream = watch.watch(prefix, Some(options));
        // Bounded by the connect timeout: while etcd is away this is the call that waits.
        let connect = Duration::from_millis(self.config.connect_timeout_ms);
        let mut stream = match tokio::time::timeout(connect, stream).await {
            Ok(r) => r.map_err(|e| Broken::Etcd(e.to_string()))?,
            Err(_) => return Err(Broken::Etcd("watch not created in time".into())),
        };
        loop {
            let message = tokio::select! {
                m = stream.message() => m,
                Some(command) = inbox.recv() => {
                    self.command(command, state, links).await?;
                    continue;
                }
            };
            let resp = match message {
                Ok(Some(resp)) => resp,
                Ok(None) => return Err(Broken::Etcd("the watch stream ended".into())),
                Err(e) => return Err(Broken::Etcd(e.to_string())),
            };
            let header = resp.header();
            let header_revision = header.map_or(0, |h| h.revision());
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
                let cluster_id = header.map_or(0, |h| h.cluster_id());
                if !state.watch_created(header_revision, cluster_id) {
                    tracing::warn!(
                        header_revision,
                        applied = state.revision(),
                        "etcd is behind the revision already applied, or another cluster \
                         (restored or replaced); listing the registrations again"
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
            self.apply(links, changes, state).await?;
        }
    }

    /// List the prefix and apply it: the seed of a replica switched to etcd goes up first; a
    /// suspected reset is counted and logged, what it lacks is held; an etcd without an epoch
    /// gets one.
    async fn list_and_apply(&self, state: &mut SyncState, links: &Links<'_>) -> Result<(), Broken> {
        let (kvs, listed) = self.list().await.map_err(Broken::Etcd)?;
        let seed = state.take_seed(kvs.is_empty());
        if !seed.is_empty() {
            self.upload(state, seed).await?;
            // Listed again (by the caller's next round), now with them.
            return Ok(());
        }
        let (revision, epoch_missing) = (listed.revision, listed.epoch.is_none());
        let changes = state.apply_list(kvs, listed);
        tracing::info!(
            registrations = state.registrations(),
            revision,
            changes = changes.len(),
            "etcd registrations listed"
        );
        if let Some(suspicion) = state.take_detected() {
            self.report.count(suspicion.reason);
            let held: Vec<String> = (state.held().iter())
                .map(|c| c.subscription_key().to_string())
                .collect();
            tracing::warn!(
                reason = %suspicion.reason,
                held = ?held,
                "suspected etcd reset: {}; nothing is removed, the registrations etcd lacks \
                 stay served ({})",
                suspicion.detail,
                match self.config.on_reset {
                    OnReset::Reupload => "written back",
                    OnReset::Hold => "until an operator decides",
                }
            );
        }
        self.apply(links, changes, state).await?;
        let _ = links.listed.send(true);
        if epoch_missing {
            let epoch = self.ensure_epoch().await.map_err(Broken::Etcd)?;
            state.adopt_epoch(epoch);
            self.settled(state, links).await;
        }
        Ok(())
    }

    async fn command(
        &self,
        command: Command,
        state: &mut SyncState,
        links: &Links<'_>,
    ) -> Result<(), Broken> {
        match command {
            Command::Forget(key) => {
                state.forget_held(&key);
                self.settled(state, links).await;
            }
            Command::Accept(reply) => {
                let changes = state.accept_held();
                let stopped = (changes.iter())
                    .filter_map(|c| match c {
                        Change::Stop(key) => Some(key.to_string()),
                        Change::Start(_) => None,
                    })
                    .collect();
                if !changes.is_empty() {
                    tracing::warn!(stopped = ?stopped, "an operator confirmed etcd's listing: stopping the held registrations");
                }
                self.apply(links, changes, state).await?;
                let _ = reply.send(stopped);
            }
            Command::Reupload(reply) => match self.reupload(state).await {
                Ok(done) => {
                    let _ = reply.send(Ok(done));
                }
                Err(Broken::Etcd(e)) => {
                    let _ = reply.send(Err(self.unavailable(&e)));
                    return Err(Broken::Etcd(e));
                }
                Err(Broken::RegistryGone) => return Err(Broken::RegistryGone),
            },
        }
        Ok(())
    }

    /// Create every held registration in etcd, each only if absent (as a register would): two
    /// replicas writing back the same one do not fight, the second finds it `Unchanged`. The
    /// watch then delivers each one, which ends its hold.
    async fn reupload(&self, state: &mut SyncState) -> Result<Reuploaded, Broken> {
        let mut done = Reuploaded::default();
        for config in state.held() {
            let service = config.subscription_key().to_string();
            match self.create(&config).await {
                Ok(_) => done.reuploaded.push(service),
                Err(e) if e.code == Code::ConductorUnavailable => {
                    return Err(Broken::Etcd(e.message));
                }
                Err(e) => {
                    tracing::warn!(%service, "held registration not written back: {}", e.message);
                    done.refused.push((service, e.message));
                }
            }
        }
        if !done.reuploaded.is_empty() {
            tracing::info!(services = ?done.reuploaded, "held registrations written back into etcd");
        }
        self.report.refused(done.refused.clone());
        Ok(done)
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

    /// Hand `changes` to the registry, then publish what is held and record the history.
    async fn apply(
        &self,
        links: &Links<'_>,
        changes: Vec<Change>,
        state: &mut SyncState,
    ) -> Result<(), Broken> {
        if !changes.is_empty() {
            links
                .registry
                .send(ApplyShared(changes))
                .await
                .map_err(|_| Broken::RegistryGone)?;
        }
        self.revision.store(state.revision(), Ordering::Relaxed);
        self.settled(state, links).await;
        Ok(())
    }

    /// Publish what is held, and record the history followed once it moved and nothing is held
    /// (a synced write, off the runtime's threads).
    async fn settled(&self, state: &mut SyncState, links: &Links<'_>) {
        let held = (state.held().iter())
            .map(|c| c.subscription_key().to_string())
            .collect();
        self.report
            .update(state.suspicion(), held, self.config.on_reset);
        let Some(history) = state.take_persist() else {
            return;
        };
        let (store, prefix) = (links.store.clone(), self.config.prefix.clone());
        let write =
            tokio::task::spawn_blocking(move || marker::record(store.as_ref(), &prefix, &history));
        match write.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!("cannot record the etcd history this replica follows: {e}")
            }
            Err(e) => tracing::warn!("cannot record the etcd history this replica follows: {e}"),
        }
    }
}
