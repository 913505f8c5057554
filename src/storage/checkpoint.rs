//! Periodic checkpoints: each context writes what changed since its last checkpoint together with
//! the watermarks of its sources, in one atomic write. Cost follows the change, not the index
//! size; queries never wait (the context actor only reads the touched pairs' current bits).
//!
//! A watermark is the source's position, not the last batch that happened to have ops for the
//! context: a round first has every subscription push its position to the contexts it fed (an
//! [`crate::index::actor::Advance`] behind the ops it sent them), then takes the changes. So a
//! context the source no longer stores into records the same position as the busy ones, and a
//! restart resumes the source from a batch its publisher still buffers.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::index::ContextChanges;
use crate::index::actor::{MarkDirty, TakeChanges};
use crate::model::ContextKey;
use crate::registry::{ContextDirectory, SubscriptionDirectory};

use super::codec::{self, context_id};
use super::health::StorageHealth;
use super::{Cf, KvOp, KvStore, StorageError, prefix_end};

/// The writes of one context's checkpoint (none for a context that did not change).
pub fn context_ops(changes: &ContextChanges) -> Vec<KvOp> {
    if changes.is_empty() {
        return Vec::new();
    }
    let ctx = context_id(&changes.key);
    let mut ops = Vec::with_capacity(changes.pairs.len() + changes.holders.len() + 8);
    if changes.fresh {
        // A context created in this process (not recovered): whatever the store still holds
        // under its id is an earlier incarnation's (unregistered and registered again between
        // two checkpoints), whose holder ids the new one reuses. It must not come back.
        ops.extend(clear_context_ops(&ctx));
    } else if changes.full {
        // A retry after a failed write: the records below replace whatever is there.
        ops.extend(
            [Cf::Holders, Cf::Watermarks]
                .into_iter()
                .map(|cf| range_of(cf, &ctx)),
        );
    }
    if changes.full {
        ops.push(KvOp::Put {
            cf: Cf::Contexts,
            key: ctx.to_vec(),
            value: codec::context_value(&changes.key, &changes.profile),
        });
    }
    // Deletes first: a reused id's new record follows its old one's delete.
    for &id in &changes.holders_gone {
        ops.push(KvOp::Delete {
            cf: Cf::Holders,
            key: codec::indexed_key(&ctx, id),
        });
    }
    for h in &changes.holders {
        ops.push(KvOp::Put {
            cf: Cf::Holders,
            key: codec::indexed_key(&ctx, h.id),
            value: codec::holder_value(h),
        });
    }
    // `repeats` is sorted like `pairs`: walk both together.
    let mut repeats = changes.repeats.iter().peekable();
    for &(holder, block, bits) in &changes.pairs {
        let key = codec::pair_key(&ctx, holder, block);
        let mut mine = Vec::new();
        while let Some(&&(h, b, bit, extra)) = repeats.peek() {
            if (h, b) > (holder, block) {
                break;
            }
            if (h, b) == (holder, block) {
                mine.push((bit, extra));
            }
            repeats.next();
        }
        ops.push(if bits == 0 {
            KvOp::Delete { cf: Cf::Pairs, key }
        } else {
            KvOp::Put {
                cf: Cf::Pairs,
                key,
                value: codec::pair_value(bits, mine),
            }
        });
    }
    for &(hash, key) in &changes.aliases {
        let k = codec::alias_key(&ctx, hash);
        ops.push(match key {
            Some(key) => KvOp::Put {
                cf: Cf::Aliases,
                key: k,
                value: key.to_be_bytes().to_vec(),
            },
            None => KvOp::Delete {
                cf: Cf::Aliases,
                key: k,
            },
        });
    }
    // Listings are few: rewritten whole when they changed.
    if let Some(attachments) = &changes.attachments {
        ops.push(range_of(Cf::Attachments, &ctx));
        for (n, (source, instance, rank)) in attachments.iter().enumerate() {
            let value = codec::attachment_value(source, instance, *rank);
            ops.push(KvOp::Put {
                cf: Cf::Attachments,
                key: codec::indexed_key(&ctx, n as u32),
                value,
            });
        }
    }
    for (source, mark) in &changes.watermarks {
        let mut key = ctx.to_vec();
        key.extend_from_slice(source.to_string().as_bytes());
        ops.push(match mark {
            Some(mark) => KvOp::Put {
                cf: Cf::Watermarks,
                key,
                value: codec::watermark_value(*mark),
            },
            None => KvOp::Delete {
                cf: Cf::Watermarks,
                key,
            },
        });
    }
    ops
}

/// Delete every key of context `ctx` in `cf`.
fn range_of(cf: Cf, ctx: &[u8; 8]) -> KvOp {
    KvOp::DeleteRange {
        cf,
        from: ctx.to_vec(),
        to: prefix_end(ctx),
    }
}

/// Delete everything of a context that no longer exists.
pub fn forget_context_ops(key: &ContextKey) -> Vec<KvOp> {
    let ctx = context_id(key);
    let mut ops = vec![KvOp::Delete {
        cf: Cf::Contexts,
        key: ctx.to_vec(),
    }];
    ops.extend(clear_context_ops(&ctx));
    ops
}

/// Delete everything stored under context id `ctx` but its header.
fn clear_context_ops(ctx: &[u8; 8]) -> impl Iterator<Item = KvOp> + '_ {
    [
        Cf::Holders,
        Cf::Attachments,
        Cf::Watermarks,
        Cf::Pairs,
        Cf::Aliases,
    ]
    .into_iter()
    .map(|cf| range_of(cf, ctx))
}

/// What one checkpoint round did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointReport {
    pub contexts: usize,
    pub pairs: usize,
    pub failed: usize,
    pub forgotten: usize,
    /// Contexts with nothing to write.
    pub idle: usize,
}

/// Writes checkpoints of every live context.
pub struct Checkpointer {
    store: Arc<dyn KvStore>,
    contexts: ContextDirectory,
    subscriptions: SubscriptionDirectory,
    /// Contexts that have data on disk (so a removed one is deleted there too).
    persisted: HashSet<ContextKey>,
    health: Arc<StorageHealth>,
}

impl Checkpointer {
    /// `persisted`: the contexts recovery found on disk.
    pub fn new(
        store: Arc<dyn KvStore>,
        contexts: ContextDirectory,
        subscriptions: SubscriptionDirectory,
        persisted: HashSet<ContextKey>,
    ) -> Self {
        Checkpointer {
            store,
            contexts,
            subscriptions,
            persisted,
            health: Arc::default(),
        }
    }

    /// Report each round's outcome to `health`.
    pub fn with_health(mut self, health: Arc<StorageHealth>) -> Self {
        self.health = health;
        self
    }

    pub async fn checkpoint(&mut self) -> CheckpointReport {
        let mut report = CheckpointReport::default();
        // Before any context is asked for its changes (see the module doc).
        self.subscriptions.push_marks().await;
        let mut first_error = None;
        let live = self.contexts.all();
        let live_keys: HashSet<ContextKey> = live.iter().map(|h| h.key().clone()).collect();
        for handle in live {
            let Ok(changes) = handle.send(TakeChanges).await else {
                continue;
            };
            let pairs = changes.pairs.len();
            let ops = context_ops(&changes);
            if ops.is_empty() {
                // Idle: nothing to write (its key is already in `persisted`).
                report.idle += 1;
                continue;
            }
            match self.store.write(ops) {
                Ok(()) => {
                    report.contexts += 1;
                    report.pairs += pairs;
                    self.persisted.insert(changes.key);
                }
                Err(e) => {
                    report.failed += 1;
                    tracing::warn!(context = %changes.key, "checkpoint write failed, retried next round: {e}");
                    first_error.get_or_insert_with(|| e.to_string());
                    handle.notify(MarkDirty {
                        pairs: changes.pairs.iter().map(|&(h, b, _)| (h, b)).collect(),
                        aliases: changes.aliases.iter().map(|&(h, _)| h).collect(),
                        fresh: changes.fresh,
                    });
                }
            }
        }
        let gone: Vec<ContextKey> = self.persisted.difference(&live_keys).cloned().collect();
        for key in gone {
            match self.store.write(forget_context_ops(&key)) {
                Ok(()) => {
                    report.forgotten += 1;
                    self.persisted.remove(&key);
                }
                Err(e) => {
                    report.failed += 1;
                    tracing::warn!(context = %key, "could not delete a removed context: {e}");
                    first_error.get_or_insert_with(|| e.to_string());
                }
            }
        }
        self.health.record_round(report.failed, first_error);
        report
    }

    /// Checkpoint every `interval` until `shutdown`; the caller takes the last one.
    pub async fn run(mut self, interval: Duration, shutdown: CancellationToken) -> Self {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = ticker.tick() => {
                    let started = Instant::now();
                    let r = self.checkpoint().await;
                    if r.pairs > 0 || r.failed > 0 || r.forgotten > 0 {
                        tracing::debug!(?r, elapsed = ?started.elapsed(), "checkpoint");
                    }
                }
            }
        }
        self
    }
}

/// Persist one registration (synchronously, before the caller is told it succeeded).
pub fn put_registration(
    store: &dyn KvStore,
    config: &crate::model::PublisherConfig,
) -> Result<(), StorageError> {
    let key = config.subscription_key().to_string().into_bytes();
    store.write_synced(vec![KvOp::Put {
        cf: Cf::Registrations,
        key,
        value: codec::registration_value(config),
    }])
}

pub fn delete_registration(
    store: &dyn KvStore,
    key: &crate::model::SubscriptionKey,
) -> Result<(), StorageError> {
    store.write_synced(vec![KvOp::Delete {
        cf: Cf::Registrations,
        key: key.to_string().into_bytes(),
    }])
}
