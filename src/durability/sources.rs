//! Registrations and the positions sources resume from (`docs/durability.md`, "One consistent
//! cut").
//!
//! Each registration is stored with an *incarnation*, a number drawn when it is created here
//! (a restart keeps it). A checkpoint round writes, in the same atomic write as every context's
//! changes, one *source record* per source: its incarnation and the position the source had
//! when the round began. Recovery resumes a source only from a record whose incarnation is the
//! registration's; a source without one starts over and its blocks in every context are dropped.
//! So an unregister followed by a register of the same key (a new incarnation) can never bring
//! the old registration's blocks or position back, whatever a round in flight writes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::index::Watermark;
use crate::model::{PublisherConfig, SubscriptionKey};
use crate::storage::{Cf, KvOp, KvStore, StorageError};
pub use crate::subscription::marks::SourcePosition;

use super::codec;

/// A new incarnation: distinct from every earlier one with overwhelming probability (time and a
/// process counter, mixed), and never 0 (the incarnation of records older than incarnations).
pub fn new_incarnation() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let pid = u64::from(std::process::id());
    crate::mix::mix64(nanos ^ crate::mix::mix64(n ^ (pid << 32))).max(1)
}

/// A registration recovered from the store: its incarnation, and the position its source
/// resumes from (`None`: from the publisher's stream start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    pub incarnation: u64,
    pub resume: Option<Watermark>,
    /// Recovery dropped this source's blocks from every context (no valid position vouched for
    /// them); its subscription counts the drop.
    pub dropped: bool,
}

fn registration_key(key: &SubscriptionKey) -> Vec<u8> {
    key.to_string().into_bytes()
}

/// Persist a new registration (synchronously, before the caller is told it succeeded) with a
/// new incarnation, which it returns. Any source record of the key is an earlier
/// incarnation's and goes in the same write.
pub fn put_registration(
    store: &dyn KvStore,
    config: &PublisherConfig,
) -> Result<u64, StorageError> {
    let incarnation = new_incarnation();
    let key = registration_key(&config.subscription_key());
    store.write_synced(vec![
        KvOp::Put {
            cf: Cf::Registrations,
            key: key.clone(),
            value: codec::local_registration_value(config, incarnation),
        },
        KvOp::Delete {
            cf: Cf::Sources,
            key,
        },
    ])?;
    Ok(incarnation)
}

/// Persist a recovered registration again, keeping its incarnation and its source record.
pub fn restore_registration(
    store: &dyn KvStore,
    config: &PublisherConfig,
    incarnation: u64,
) -> Result<(), StorageError> {
    store.write_synced(vec![KvOp::Put {
        cf: Cf::Registrations,
        key: registration_key(&config.subscription_key()),
        value: codec::local_registration_value(config, incarnation),
    }])
}

/// Forget a registration and its source record in one synced write: once it answers, no crash
/// brings the registration's position back.
pub fn delete_registration(store: &dyn KvStore, key: &SubscriptionKey) -> Result<(), StorageError> {
    let key = registration_key(key);
    store.write_synced(vec![
        KvOp::Delete {
            cf: Cf::Registrations,
            key: key.clone(),
        },
        KvOp::Delete {
            cf: Cf::Sources,
            key,
        },
    ])
}

/// The source records this process wrote (or recovery read), so a round writes only what moved.
#[derive(Debug, Default)]
pub struct SourceRecords {
    written: HashMap<SubscriptionKey, (u64, Watermark)>,
}

impl SourceRecords {
    pub fn new(written: HashMap<SubscriptionKey, (u64, Watermark)>) -> Self {
        SourceRecords { written }
    }

    /// The writes of one round's source records. `began`: every running source's position when
    /// the round began, before any context was asked for its changes. `ended`: the sources'
    /// identity (incarnation, generation) once every context answered. `complete`: every listed
    /// context gave its changes; otherwise no record moves (a context left out may hold older
    /// state on disk than the new positions would vouch for). Call [`SourceRecords::written`]
    /// with the result once the write landed.
    pub fn round_ops(
        &self,
        began: &[(SubscriptionKey, SourcePosition)],
        ended: &HashMap<SubscriptionKey, (u64, u64)>,
        complete: bool,
    ) -> SourceUpdate {
        let mut update = SourceUpdate::default();
        if !complete {
            return update;
        }
        for (key, pos) in began {
            let steady = ended.get(key) == Some(&(pos.incarnation, pos.generation));
            match pos.mark.filter(|_| steady) {
                Some(mark) if self.written.get(key) != Some(&(pos.incarnation, mark)) => {
                    update.put.push((key.clone(), pos.incarnation, mark));
                }
                Some(_) => {}
                None if self.written.contains_key(key) || !steady => {
                    update.delete.push(key.clone());
                }
                None => {}
            }
        }
        // A source that is not running keeps its record: unregistering deleted it with the
        // registration (a record a round in flight writes back has the old incarnation, which
        // no registration has), and a source stopped for shutdown resumes from it.
        update
    }

    /// `update` landed.
    pub fn written(&mut self, update: SourceUpdate) {
        for key in update.delete {
            self.written.remove(&key);
        }
        for (key, incarnation, mark) in update.put {
            self.written.insert(key, (incarnation, mark));
        }
    }
}

/// What one round changes among the source records.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SourceUpdate {
    pub put: Vec<(SubscriptionKey, u64, Watermark)>,
    pub delete: Vec<SubscriptionKey>,
}

impl SourceUpdate {
    pub fn ops(&self) -> impl Iterator<Item = KvOp> + '_ {
        let deletes = self.delete.iter().map(|key| KvOp::Delete {
            cf: Cf::Sources,
            key: registration_key(key),
        });
        let puts = self.put.iter().map(|(key, incarnation, mark)| KvOp::Put {
            cf: Cf::Sources,
            key: registration_key(key),
            value: codec::source_value(*incarnation, *mark),
        });
        deletes.chain(puts)
    }
}

/// Every source record in `store`: service key → (incarnation, position).
pub fn read_sources(
    store: &dyn KvStore,
) -> Result<HashMap<SubscriptionKey, (u64, Watermark)>, StorageError> {
    let mut out = HashMap::new();
    store.scan_prefix(Cf::Sources, b"", &mut |k, v| {
        let key = std::str::from_utf8(k)
            .ok()
            .and_then(SubscriptionKey::parse)
            .ok_or_else(|| StorageError::Corrupt {
                cf: "sources",
                what: format!("bad service key {:?}", String::from_utf8_lossy(k)),
            })?;
        out.insert(key, codec::decode_source(v)?);
        Ok(())
    })?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> SubscriptionKey {
        SubscriptionKey::new(&format!("e{i}"), "", 0)
    }

    fn mark(seq: u64) -> Watermark {
        Watermark { seq, digest: seq }
    }

    fn at(incarnation: u64, generation: u64, seq: Option<u64>) -> SourcePosition {
        SourcePosition {
            incarnation,
            generation,
            mark: seq.map(mark),
        }
    }

    #[test]
    fn a_round_writes_moved_positions_only() {
        let mut records = SourceRecords::default();
        let began = [(key(0), at(7, 0, Some(3))), (key(1), at(8, 0, None))];
        let ended = HashMap::from([(key(0), (7, 0)), (key(1), (8, 0))]);
        let update = records.round_ops(&began, &ended, true);
        assert_eq!(update.put, [(key(0), 7, mark(3))]);
        assert!(update.delete.is_empty());
        records.written(update);
        assert_eq!(
            records.round_ops(&began, &ended, true),
            SourceUpdate::default()
        );
    }

    #[test]
    fn a_drop_or_a_new_incarnation_during_the_round_makes_the_position_unknown() {
        let mut records = SourceRecords::default();
        let began = [(key(0), at(7, 0, Some(3)))];
        records.written(records.round_ops(&began, &HashMap::from([(key(0), (7, 0))]), true));
        for ended in [(7, 1), (9, 0)] {
            let began = [(key(0), at(7, 0, Some(5)))];
            let update = records.round_ops(&began, &HashMap::from([(key(0), ended)]), true);
            assert_eq!(update.put, []);
            assert_eq!(update.delete, [key(0)], "{ended:?}");
        }
        let update = records.round_ops(&[(key(0), at(7, 0, Some(5)))], &HashMap::new(), true);
        assert_eq!(update.delete, [key(0)], "unregistered during the round");
    }

    #[test]
    fn an_incomplete_round_moves_no_record_and_a_stopped_source_keeps_its_own() {
        let mut records = SourceRecords::default();
        let began = [(key(0), at(7, 0, Some(3)))];
        let ended = HashMap::from([(key(0), (7, 0))]);
        assert_eq!(
            records.round_ops(&began, &ended, false),
            SourceUpdate::default()
        );
        records.written(records.round_ops(&began, &ended, true));
        let update = records.round_ops(&[], &HashMap::new(), true);
        assert_eq!(update, SourceUpdate::default());
    }

    #[test]
    fn records_round_trip_through_a_store() {
        let store = crate::storage::memory::MemoryStore::new();
        let update = SourceUpdate {
            put: vec![(key(0), 7, mark(3)), (key(1), 9, mark(u64::MAX))],
            delete: vec![],
        };
        store.write(update.ops().collect()).unwrap();
        let read = read_sources(&store).unwrap();
        assert_eq!(read[&key(0)], (7, mark(3)));
        assert_eq!(read[&key(1)], (9, mark(u64::MAX)));
        store
            .write(vec![KvOp::Put {
                cf: Cf::Sources,
                key: b"e2||0".to_vec(),
                value: vec![1, 2, 3],
            }])
            .unwrap();
        let err = read_sources(&store).unwrap_err();
        assert!(err.to_string().contains("sources"), "{err}");
    }
}
