//! Bulk loading: many records written once into a store that holds none of them yet (a
//! replica's bootstrap from a peer), where the per-write costs of [`KvStore::write`] (a
//! write-ahead log record, a memtable insert, later a flush and compactions) buy nothing.
//!
//! A loader takes puts in any order; in key order per column family it can do far better (the
//! RocksDB store writes table files and ingests them whole, see `rocks_bulk`). Whatever the
//! order, a later put of a key wins over an earlier one, as with plain writes. A load that
//! fails may leave part of its records written: the caller clears them (a bootstrap that
//! fails starts empty).

use super::{Cf, KvOp, KvStore, StorageError};

/// Where a bulk load's records go.
pub trait BulkSink {
    fn put(&mut self, cf: Cf, key: &[u8], value: &[u8]) -> Result<(), StorageError>;
}

/// What a bulk load runs: it puts its records into the sink it is given.
pub type BulkFeed<'a> = dyn FnMut(&mut dyn BulkSink) -> Result<(), StorageError> + 'a;

/// Plain writes gathered into batches of this many records.
const BATCH_RECORDS: usize = 4096;

/// The loader any store has: its own [`KvStore::write`]s, in batches.
pub struct BatchedSink<'a, S: KvStore + ?Sized> {
    store: &'a S,
    ops: Vec<KvOp>,
}

impl<'a, S: KvStore + ?Sized> BatchedSink<'a, S> {
    pub fn new(store: &'a S) -> Self {
        BatchedSink {
            store,
            ops: Vec::with_capacity(BATCH_RECORDS),
        }
    }

    /// Write what is still gathered.
    pub fn flush(&mut self) -> Result<(), StorageError> {
        if self.ops.is_empty() {
            return Ok(());
        }
        let ops = std::mem::replace(&mut self.ops, Vec::with_capacity(BATCH_RECORDS));
        self.store.write(ops)
    }
}

impl<S: KvStore + ?Sized> BulkSink for BatchedSink<'_, S> {
    fn put(&mut self, cf: Cf, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        self.ops.push(KvOp::Put {
            cf,
            key: key.to_vec(),
            value: value.to_vec(),
        });
        if self.ops.len() >= BATCH_RECORDS {
            self.flush()?;
        }
        Ok(())
    }
}

/// [`KvStore::bulk_load`] for stores with nothing better than their writes.
pub fn load_batched<S: KvStore + ?Sized>(
    store: &S,
    feed: &mut BulkFeed<'_>,
) -> Result<(), StorageError> {
    let mut sink = BatchedSink::new(store);
    feed(&mut sink)?;
    sink.flush()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::storage::memory::MemoryStore;

    /// Every record of `cf`, in key order.
    pub(crate) fn all(store: &dyn KvStore, cf: Cf) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        store
            .scan_prefix(cf, b"", &mut |k, v| {
                out.push((k.to_vec(), v.to_vec()));
                Ok(())
            })
            .unwrap();
        out
    }

    #[test]
    fn a_batched_load_writes_every_record_and_a_later_put_wins() {
        let store = MemoryStore::default();
        store
            .bulk_load(&mut |sink| {
                for i in 0..(BATCH_RECORDS as u32 * 2 + 7) {
                    sink.put(Cf::Pairs, &i.to_be_bytes(), b"a")?;
                }
                sink.put(Cf::Pairs, &3u32.to_be_bytes(), b"b")?;
                sink.put(Cf::Aliases, b"k", b"v")
            })
            .unwrap();
        let pairs = all(&store, Cf::Pairs);
        assert_eq!(pairs.len(), BATCH_RECORDS * 2 + 7);
        assert_eq!(pairs[3], (3u32.to_be_bytes().to_vec(), b"b".to_vec()));
        assert_eq!(all(&store, Cf::Aliases), [(b"k".to_vec(), b"v".to_vec())]);
    }

    #[test]
    fn a_feed_that_fails_fails_the_load() {
        let store = MemoryStore::default();
        let failed = store.bulk_load(&mut |sink| {
            sink.put(Cf::Pairs, b"a", b"1")?;
            Err(StorageError::Io("the peer went away".into()))
        });
        assert!(matches!(failed, Err(StorageError::Io(m)) if m.contains("peer")));
    }
}
