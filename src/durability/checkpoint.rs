//! Periodic checkpoints: each context writes what changed since its last checkpoint together with
//! the watermarks of its sources, in one atomic write. Cost follows the change, not the index
//! size; queries never wait (the context actor only reads the touched pairs' current bits).
//!
//! A watermark is the source's position, not the last batch that happened to have ops for the
//! context: a round first has every subscription push its position to the contexts it fed (an
//! [`crate::index::actor::Advance`] behind the ops it sent them), then takes the changes. So a
//! context the source no longer stores into records the same position as the busy ones, and a
//! restart resumes the source from a batch its publisher still buffers.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::index::ContextDirectory;
use crate::index::actor::{MarkDirty, TakeChanges};
use crate::index::{ContextChanges, PairBits, Watermark};
use crate::model::{ContextKey, SubscriptionKey};
use crate::subscription::directory::SubscriptionDirectory;

use super::codec::{self, context_id};
use super::sources::{SourcePosition, SourceRecords, SourceUpdate};
use crate::storage::health::StorageHealth;
use crate::storage::{Cf, KvOp, KvStore, StorageError, prefix_end};

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
    for &PairBits {
        holder,
        block,
        bits,
    } in &changes.pairs
    {
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
        for (n, a) in attachments.iter().enumerate() {
            let value = codec::attachment_value(&a.source, &a.instance_id, a.dp_rank);
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
    /// Source records written or deleted.
    pub sources: usize,
}

/// The synchronous part of checkpointing, without any actor: what one round writes, and what
/// goes back to the contexts when its write fails. [`Checkpointer`] feeds it each live
/// context's changes and the sources' positions, and sends back what it returns.
///
/// A round is one atomic write: every context's changes, the source records
/// ([`super::sources`]) and the deletes of contexts that are gone. So whatever instruction a
/// crash interrupts, the store holds the last round that landed, whole
/// (`docs/durability.md`, "One consistent cut").
#[derive(Debug, Default)]
pub struct CheckpointState {
    /// Contexts that have data on disk (so a removed one is deleted there too).
    persisted: HashSet<ContextKey>,
    sources: SourceRecords,
}

/// One round being assembled: its writes, and what each context must take back if they fail.
#[derive(Debug, Default)]
pub struct Round {
    pub report: CheckpointReport,
    pub first_error: Option<String>,
    ops: Vec<KvOp>,
    /// The changes of every context written: on failure each goes back as a retry.
    written: Vec<ContextChanges>,
    forgotten: Vec<ContextKey>,
    sources: SourceUpdate,
}

impl CheckpointState {
    /// `persisted`: the contexts recovery found on disk; `sources`: the source records it read.
    pub fn new(
        persisted: HashSet<ContextKey>,
        sources: HashMap<SubscriptionKey, (u64, Watermark)>,
    ) -> Self {
        CheckpointState {
            persisted,
            sources: SourceRecords::new(sources),
        }
    }

    /// Add one context's changes to the round.
    pub fn add_context(&self, changes: ContextChanges, round: &mut Round) {
        let ops = context_ops(&changes);
        if ops.is_empty() {
            // Idle: nothing to write (its key is already in `persisted`).
            round.report.idle += 1;
            return;
        }
        round.report.contexts += 1;
        round.report.pairs += changes.pairs.len();
        round.ops.extend(ops);
        round.written.push(changes);
    }

    /// Add the deletes of every persisted context that is no longer `live`.
    pub fn add_gone(&self, live: &HashSet<ContextKey>, round: &mut Round) {
        for key in self.persisted.difference(live) {
            round.ops.extend(forget_context_ops(key));
            round.forgotten.push(key.clone());
        }
    }

    /// Add the source records (see [`SourceRecords::round_ops`]).
    pub fn add_sources(
        &self,
        began: &[(SubscriptionKey, SourcePosition)],
        ended: &HashMap<SubscriptionKey, (u64, u64)>,
        complete: bool,
        round: &mut Round,
    ) {
        round.sources = self.sources.round_ops(began, ended, complete);
        round.report.sources = round.sources.put.len() + round.sources.delete.len();
        round.ops.extend(round.sources.ops());
    }

    /// Write the round in one atomic write. On failure nothing of it landed: the returned
    /// retries must go back to their contexts, so that the next round writes them again, and
    /// the sources keep their last records.
    pub fn commit(
        &mut self,
        store: &dyn KvStore,
        mut round: Round,
    ) -> (Round, Vec<(ContextKey, MarkDirty)>) {
        if round.ops.is_empty() {
            return (round, Vec::new());
        }
        let ops = std::mem::take(&mut round.ops);
        match write_round(store, ops) {
            Ok(()) => {
                for changes in round.written.drain(..) {
                    self.persisted.insert(changes.key);
                }
                round.report.forgotten = round.forgotten.len();
                for key in round.forgotten.drain(..) {
                    self.persisted.remove(&key);
                }
                self.sources.written(std::mem::take(&mut round.sources));
                (round, Vec::new())
            }
            Err(e) => {
                let failed = round.written.len() + round.forgotten.len();
                round.report.failed += failed.max(1);
                round.report.contexts = 0;
                round.report.pairs = 0;
                round.report.sources = 0;
                tracing::warn!(
                    contexts = round.written.len(),
                    "checkpoint write failed, retried next round: {e}"
                );
                round.first_error.get_or_insert_with(|| e.to_string());
                let retries = std::mem::take(&mut round.written)
                    .into_iter()
                    .map(|changes| {
                        let retry = MarkDirty {
                            pairs: changes.pairs.iter().map(|p| (p.holder, p.block)).collect(),
                            aliases: changes.aliases.iter().map(|&(h, _)| h).collect(),
                            fresh: changes.fresh,
                        };
                        (changes.key, retry)
                    })
                    .collect();
                (round, retries)
            }
        }
    }
}

/// The round's write; with the `failpoints` feature, a test may stop the process right after
/// it ([`crate::storage::failpoint`]).
fn write_round(store: &dyn KvStore, ops: Vec<KvOp>) -> Result<(), StorageError> {
    crate::storage::failpoint::hit("checkpoint_before_write");
    store.write(ops)?;
    crate::storage::failpoint::hit("checkpoint_after_write");
    Ok(())
}

/// Writes checkpoints of every live context: asks the actors, and lets [`CheckpointState`] decide.
pub struct Checkpointer {
    store: Arc<dyn KvStore>,
    contexts: ContextDirectory,
    subscriptions: SubscriptionDirectory,
    state: CheckpointState,
    health: Arc<StorageHealth>,
}

impl Checkpointer {
    /// `persisted`: the contexts recovery found on disk; `sources`: the source records it read.
    pub fn new(
        store: Arc<dyn KvStore>,
        contexts: ContextDirectory,
        subscriptions: SubscriptionDirectory,
        persisted: HashSet<ContextKey>,
        sources: HashMap<SubscriptionKey, (u64, Watermark)>,
    ) -> Self {
        Checkpointer {
            store,
            contexts,
            subscriptions,
            state: CheckpointState::new(persisted, sources),
            health: Arc::default(),
        }
    }

    /// Report each round's outcome to `health`.
    pub fn with_health(mut self, health: Arc<StorageHealth>) -> Self {
        self.health = health;
        self
    }

    pub async fn checkpoint(&mut self) -> CheckpointReport {
        // Before any context is asked for its changes (see the module doc): every context a
        // source created up to its position is listed below, and holds that position.
        let began = self.subscriptions.push_marks().await;
        let mut round = Round::default();
        let live = self.contexts.all();
        let live_keys: HashSet<ContextKey> = live.iter().map(|h| h.key().clone()).collect();
        let mut complete = true;
        let mut handles = HashMap::new();
        for handle in live {
            let Ok(changes) = handle.send(TakeChanges).await else {
                complete = false;
                continue;
            };
            self.state.add_context(changes, &mut round);
            handles.insert(handle.key().clone(), handle);
        }
        let ended = self.subscriptions.identities().await;
        self.state.add_sources(&began, &ended, complete, &mut round);
        self.state.add_gone(&live_keys, &mut round);
        let (round, retries) = self.state.commit(self.store.as_ref(), round);
        for (key, retry) in retries {
            if let Some(handle) = handles.get(&key) {
                handle.notify(retry);
            }
        }
        self.health
            .record_round(round.report.failed, round.first_error);
        round.report
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

pub use super::sources::{delete_registration, put_registration};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Holder, IndexBatch, IndexOp};
    use crate::index::{ContextIndex, Watermark};
    use crate::model::{BlockHash, SubscriptionKey, Tier};
    use crate::storage::memory::{Fault, MemoryStore};

    fn index(lora: &str) -> ContextIndex {
        let key = ContextKey::new("", "m", lora, 16);
        ContextIndex::new(key, crate::hashing::profile::vllm_cbor_default())
    }

    fn store_blocks(index: &mut ContextIndex, blocks: std::ops::Range<u64>, seq: u64) {
        let batch = IndexBatch {
            source: SubscriptionKey::new("e", "", 0),
            ops: vec![IndexOp::Store {
                holder: Holder::Engine {
                    instance_id: "e".into(),
                    dp_rank: 0,
                    group: 0,
                },
                tier: Tier::Device,
                hashes: blocks.map(BlockHash).collect(),
            }],
        };
        index.apply_sequenced(&batch, Watermark { seq, digest: seq });
    }

    /// What the checkpointer does: one round over the contexts, and on failure the retries
    /// handed back.
    fn round_of(
        state: &mut CheckpointState,
        store: &dyn KvStore,
        indexes: &mut [&mut ContextIndex],
    ) -> Round {
        let mut round = Round::default();
        for index in indexes.iter_mut() {
            state.add_context(index.take_changes(), &mut round);
        }
        let live = indexes.iter().map(|i| i.reader().key().clone()).collect();
        state.add_gone(&live, &mut round);
        let (round, retries) = state.commit(store, round);
        for (key, retry) in retries {
            let index = indexes
                .iter_mut()
                .find(|i| *i.reader().key() == key)
                .expect("a retry for a context of the round");
            index.mark_dirty(retry.pairs, retry.aliases, retry.fresh);
        }
        round
    }

    #[test]
    fn a_round_writes_changed_contexts_and_counts_idle_ones() {
        let store = MemoryStore::new();
        let mut state = CheckpointState::default();
        let (mut busy, mut idle) = (index(""), index("ad"));
        store_blocks(&mut busy, 0..5, 1);
        let round = round_of(&mut state, &store, &mut [&mut busy, &mut idle]);
        // The new idle context still writes its header once.
        assert_eq!(round.report.contexts, 2);
        assert_eq!(round.report.pairs, 5);
        assert_eq!(store.len(Cf::Pairs), 5);
        assert_eq!(round.first_error, None);

        store_blocks(&mut busy, 5..7, 2);
        let round = round_of(&mut state, &store, &mut [&mut busy, &mut idle]);
        assert_eq!(
            round.report,
            CheckpointReport {
                contexts: 1,
                pairs: 2,
                idle: 1,
                ..Default::default()
            }
        );
        assert_eq!(store.len(Cf::Pairs), 7);
    }

    #[test]
    fn a_failed_write_is_counted_named_and_retried_by_the_next_round() {
        let store = MemoryStore::new();
        let mut state = CheckpointState::default();
        let mut ctx = index("");
        store_blocks(&mut ctx, 0..5, 1);
        store.inject(Fault::Before);
        let round = round_of(&mut state, &store, &mut [&mut ctx]);
        assert_eq!(round.report.failed, 1);
        assert!(round.first_error.is_some());
        assert_eq!(
            store.len(Cf::Pairs),
            0,
            "nothing of the failed write landed"
        );
        assert!(ctx.has_changes(), "the retry went back to the context");

        let round = round_of(&mut state, &store, &mut [&mut ctx]);
        assert_eq!((round.report.contexts, round.report.pairs), (1, 5));
        assert_eq!(round.report.failed, 0);
        assert_eq!(store.len(Cf::Pairs), 5);
    }

    #[test]
    fn a_context_no_longer_live_is_forgotten_on_disk_once_the_delete_lands() {
        let store = MemoryStore::new();
        let mut ctx = index("");
        store_blocks(&mut ctx, 0..3, 1);
        let mut state = CheckpointState::default();
        round_of(&mut state, &store, &mut [&mut ctx]);
        assert_eq!(store.len(Cf::Contexts), 1);

        // Recovered from disk but no longer live: its delete fails once, then lands.
        let mut recovered =
            CheckpointState::new(HashSet::from([ctx.reader().key().clone()]), HashMap::new());
        store.inject(Fault::Before);
        let round = round_of(&mut recovered, &store, &mut []);
        assert_eq!((round.report.failed, round.report.forgotten), (1, 0));
        assert_eq!(store.len(Cf::Contexts), 1);
        let round = round_of(&mut recovered, &store, &mut []);
        assert_eq!(round.report.forgotten, 1);
        assert!(store.is_empty(), "every record of the context is gone");
        let round = round_of(&mut recovered, &store, &mut []);
        assert_eq!(round.report, CheckpointReport::default(), "forgotten once");
    }
}
