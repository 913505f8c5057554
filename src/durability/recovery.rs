//! Recovery at start: rebuild every context and the registrations from the last checkpoint round.
//!
//! Each registration resumes from its source record, when the record belongs to the same
//! incarnation of the registration (see `sources`); contexts skip what they already have (a
//! context may be ahead of the record: it holds its own position). A source present in a
//! context but not registered, or registered without a source record of its incarnation (an
//! unregistration or re-registration the last round did not see, a drop during that round, a
//! registration no round covered yet), is dropped from every context: its blocks cannot be
//! vouched for, and it starts again from its publisher's stream start.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::index::{AliasLoader, ContextIndex, PairBatch, Restorer, Watermark};

use super::sources::Restored;
use crate::model::{ContextKey, PublisherConfig, SubscriptionKey};

use super::codec;
use crate::storage::{Cf, KvOp, KvStore, StorageError};

/// A registration as recovery loads it.
#[derive(Debug, Clone)]
pub struct RestoredRegistration {
    pub config: PublisherConfig,
    pub restored: Restored,
}

/// What recovery loaded.
pub struct Recovered {
    pub contexts: Vec<ContextIndex>,
    /// Registrations with their incarnation and the position to resume from.
    pub registrations: Vec<RestoredRegistration>,
    /// Every source record on disk, valid or not: what the first checkpoint round compares with
    /// (so it deletes a record recovery did not resume from, once its source has no position).
    pub sources: HashMap<SubscriptionKey, (u64, Watermark)>,
    /// Sources dropped from the contexts because no valid position vouches for them, with why.
    pub dropped: Vec<(SubscriptionKey, &'static str)>,
    /// (block, holder) pairs loaded.
    pub pairs: u64,
    /// The chain tuning the store's derived keys were made with: every context recovered, and
    /// every context started later on this store, makes its keys with it.
    pub tuning: crate::hashing::derived::ChainTuning,
    /// Where the time went (zero where the contexts were not read from a store).
    pub phases: Phases,
}

/// Time spent in each part of [`recover`], summed over the contexts.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Reading and decoding the pairs and aliases, and filling the alias map (one thread per
    /// core).
    pub scan: Duration,
    /// Building the contexts from what was read ([`Restorer::finish`]).
    pub build: Duration,
    /// Dropping unregistered sources and empty contexts.
    pub settle: Duration,
}

pub fn recover(store: &dyn KvStore) -> Result<Recovered, StorageError> {
    let mut registrations: BTreeMap<String, (PublisherConfig, u64)> = BTreeMap::new();
    store.scan_prefix(Cf::Registrations, b"", &mut |key, value| {
        let config = codec::decode_registration(value)?;
        let incarnation = codec::decode_incarnation(value)?;
        registrations.insert(
            String::from_utf8_lossy(key).into_owned(),
            (config, incarnation),
        );
        Ok(())
    })?;
    let mut sources = super::sources::read_sources(store)?;
    if crate::storage::migrations::read_version(store)?.is_some_and(|v| v < 7) {
        // A store read as it is (the offline commands never migrate): its sources resume as
        // migration 7 would have them.
        for op in crate::storage::source_records::add_source_records(store)? {
            if let KvOp::Put { key, value, .. } = op
                && let Some(source) = std::str::from_utf8(&key)
                    .ok()
                    .and_then(SubscriptionKey::parse)
            {
                sources.insert(source, codec::decode_source(&value)?);
            }
        }
    }
    let tuning = crate::storage::migrations::read_tuning(store)?;
    let mut headers: Vec<([u8; 8], ContextKey, crate::hashing::HashProfile)> = Vec::new();
    store.scan_prefix(Cf::Contexts, b"", &mut |key, value| {
        let ctx: [u8; 8] = key.try_into().map_err(|_| StorageError::Corrupt {
            cf: "contexts",
            what: "key is not 8 bytes".into(),
        })?;
        let (key, profile) = codec::decode_context(value)?;
        headers.push((ctx, key, profile));
        Ok(())
    })?;

    let mut contexts = Vec::with_capacity(headers.len());
    let mut pairs = 0u64;
    let mut phases = Phases::default();
    for (ctx, key, profile) in headers {
        let mut restorer = Restorer::tuned(key.clone(), profile, tuning);
        let mut ids = Vec::new();
        store.scan_prefix(Cf::Holders, &ctx, &mut |k, v| {
            let id = holder_id(k);
            let record = codec::decode_holder(id, v)?;
            // Ids may have gaps (holders reclaimed), never a repeated holder.
            if let Err(reason) = restorer.holder(&record) {
                return Err(StorageError::Corrupt {
                    cf: "holders",
                    what: format!("context {key}: {reason}"),
                });
            }
            ids.push(id);
            Ok(())
        })?;
        store.scan_prefix(Cf::Attachments, &ctx, &mut |_, v| {
            let a = codec::decode_attachment(v)?;
            restorer.attach(&a.source, &a.instance_id, a.dp_rank);
            Ok(())
        })?;
        store.scan_prefix(Cf::Watermarks, &ctx, &mut |k, v| {
            let source = codec::decode_watermark_source(k)?;
            let mark = codec::decode_watermark(v)?;
            restorer.watermark(source, mark);
            Ok(())
        })?;
        // Reading the store is most of a restart (see the durability doc), so it runs on one
        // thread per core (up to SCAN_THREADS): the first reads the aliases and fills the alias
        // map, then joins the others, which read the pairs holder by holder, each into a batch
        // of its own. (A thread of its own for the aliases left one core idle once the pairs
        // were read while the aliases still were.)
        let scanning = Instant::now();
        let mut batches: Vec<PairBatch> = (0..scan_threads()).map(|_| restorer.batch()).collect();
        let work = ContextScan {
            store,
            ctx,
            ids: &ids,
            next: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            aliases: restorer.alias_loader(),
        };
        let work = &work;
        let scanned =
            std::thread::scope(|scope| {
                let Some((last, others)) = batches.split_last_mut() else {
                    return Vec::new();
                };
                let helpers: Vec<_> = others
                    .iter_mut()
                    .enumerate()
                    .map(|(i, batch)| scope.spawn(move || work.run(i == 0, batch)))
                    .collect();
                let mut scanned = vec![work.run(helpers.is_empty(), last)];
                for helper in helpers {
                    scanned.push(helper.join().unwrap_or_else(|_| {
                        Err(StorageError::Io("recovery scanner panicked".into()))
                    }));
                }
                scanned
            });
        let mut loaded = 0;
        for part in scanned {
            let (n, repeats) = part?;
            loaded += n;
            for (holder, block, bit, extra) in repeats {
                restorer.repeat(holder, block, bit, extra);
            }
        }
        for batch in batches {
            restorer.absorb(batch);
        }
        pairs += loaded;
        let building = Instant::now();
        phases.scan += building - scanning;
        contexts.push(restorer.finish());
        phases.build += building.elapsed();
    }
    let settling = Instant::now();
    let mut recovered = settle(registrations, contexts, sources, pairs);
    phases.settle = settling.elapsed();
    recovered.phases = phases;
    recovered.tuning = tuning;
    Ok(recovered)
}

/// What rebuilt contexts and decoded registrations load as. A registration resumes from its
/// source record when the record has the registration's incarnation and no context holds an
/// older position of the source than the record (a round writes the position the source had
/// before any context was asked, so every context it covers is at or past it). Every other
/// source present in a context is dropped from all of them (see the module doc), and contexts
/// left empty go unless a registered source still feeds them.
pub fn settle(
    registrations: BTreeMap<String, (PublisherConfig, u64)>,
    rebuilt: Vec<ContextIndex>,
    mut sources: HashMap<SubscriptionKey, (u64, Watermark)>,
    pairs: u64,
) -> Recovered {
    let mut dropped: Vec<(SubscriptionKey, &'static str)> = Vec::new();
    let on_disk = sources.clone();
    let incarnations: HashMap<SubscriptionKey, u64> = registrations
        .values()
        .map(|(c, incarnation)| (c.subscription_key(), *incarnation))
        .collect();
    sources.retain(|key, (incarnation, _)| {
        let valid = incarnations.get(key) == Some(incarnation);
        if !valid && incarnations.contains_key(key) {
            dropped.push((key.clone(), "other_incarnation"));
        }
        valid
    });
    for index in &rebuilt {
        for source in index.sources_present() {
            let Some((_, resume)) = sources.get(&source) else {
                continue;
            };
            if index.watermark(&source).is_some_and(|m| m.seq < resume.seq) {
                dropped.push((source.clone(), "behind_its_position"));
                sources.remove(&source);
            }
        }
    }
    let mut contexts = Vec::with_capacity(rebuilt.len());
    for mut index in rebuilt {
        for source in index.sources_present() {
            let registered = incarnations.contains_key(&source);
            // A registered source with no position here holds nothing here (a batch sets the
            // position): only its rank listing, which stays.
            if sources.contains_key(&source) || registered && index.watermark(&source).is_none() {
                continue;
            }
            let why = if registered {
                "no_position"
            } else {
                "unregistered"
            };
            if !dropped.iter().any(|(k, _)| *k == source) {
                dropped.push((source.clone(), why));
            }
            index.detach_source(&source);
        }
        // An empty context a source still feeds stays, as it does in the running service
        // (its source's next batch may store into it again).
        let fed = sources.keys().any(|s| index.watermark(s).is_some());
        if !index.is_empty_and_detached() || fed {
            contexts.push(index);
        }
    }
    let registrations = registrations
        .into_values()
        .map(|(config, incarnation)| {
            let key = config.subscription_key();
            let resume = sources.get(&key).map(|&(_, m)| m);
            let dropped = dropped.iter().any(|(k, _)| *k == key);
            RestoredRegistration {
                config,
                restored: Restored {
                    incarnation,
                    resume,
                    dropped,
                },
            }
        })
        .collect();
    Recovered {
        contexts,
        registrations,
        sources: on_disk,
        dropped,
        pairs,
        // Contexts rebuilt elsewhere keep their own; `recover` sets the store's.
        tuning: crate::hashing::derived::ChainTuning::DEFAULT,
        phases: Phases::default(),
    }
}

/// The holder id a holder record's key names (an id no record can have when the key is short).
pub fn holder_id(key: &[u8]) -> u32 {
    u32::from_be_bytes(
        key.get(8..12)
            .and_then(|b| b.try_into().ok())
            .unwrap_or([0xff; 4]),
    )
}

/// Threads reading one context: one per core, up to [`SCAN_THREADS`].
fn scan_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    cores.clamp(1, SCAN_THREADS)
}

/// Scanning threads per context, at most.
const SCAN_THREADS: usize = 4;

/// A persisted repeat count: holder id, block, tier bit, announcements beyond the first.
type Repeat = (u32, u64, u8, u32);

/// What the threads reading one context share: the restored holders, handed out one at a time
/// (only restored holders are read: pairs of any other id were ignored, and the key range of
/// each, context id + holder id, is read with one seek), and where the aliases go.
struct ContextScan<'a> {
    store: &'a dyn KvStore,
    ctx: [u8; 8],
    ids: &'a [u32],
    next: AtomicUsize,
    /// A scanner met an error: the others stop at their next holder.
    failed: AtomicBool,
    aliases: AliasLoader,
}

impl ContextScan<'_> {
    /// One thread's share: the aliases first when `aliases`, then pairs until none are left.
    fn run(
        &self,
        aliases: bool,
        batch: &mut PairBatch,
    ) -> Result<(u64, Vec<Repeat>), StorageError> {
        if aliases {
            match scan_aliases(self.store, &self.ctx) {
                Ok(all) => self.aliases.load(all),
                Err(e) => {
                    self.failed.store(true, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        self.scan(batch)
    }

    /// File the pairs of holders taken from the work into `batch`: how many it accepted and
    /// the repeat counts of those that have any.
    fn scan(&self, batch: &mut PairBatch) -> Result<(u64, Vec<Repeat>), StorageError> {
        let mut loaded = 0u64;
        let mut repeats = Vec::new();
        let mut prefix = [0u8; 12];
        prefix[..8].copy_from_slice(&self.ctx);
        while !self.failed.load(Ordering::Relaxed) {
            let Some(&id) = self.ids.get(self.next.fetch_add(1, Ordering::Relaxed)) else {
                break;
            };
            prefix[8..].copy_from_slice(&id.to_be_bytes());
            let scanned = self.store.scan_prefix(Cf::Pairs, &prefix, &mut |k, v| {
                let (holder, block) = codec::decode_pair_key(k)?;
                let (bits, extra) = codec::decode_pair_value(v)?;
                loaded += u64::from(batch.pair(holder, block, bits));
                repeats.extend(extra.map(|(bit, n)| (holder, block, bit, n)));
                Ok(())
            });
            if let Err(e) = scanned {
                self.failed.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
        Ok((loaded, repeats))
    }
}

fn scan_aliases(store: &dyn KvStore, ctx: &[u8; 8]) -> Result<Vec<(u64, u64)>, StorageError> {
    let mut all = Vec::new();
    store.scan_prefix(Cf::Aliases, ctx, &mut |k, v| {
        all.push(codec::decode_alias(k, v)?);
        Ok(())
    })?;
    Ok(all)
}
