//! The RocksDB implementation of [`KvStore`]: one column family per [`Cf`], atomic `WriteBatch`es,
//! LZ4 for the bulk (the pairs), WAL on (a killed process loses nothing the OS accepted). Pairs
//! and aliases are stored packed, many records to a RocksDB value ([`super::packed`]); what
//! [`KvStore`] reads and writes is still one record at a time.

use std::path::{Path, PathBuf};

use rocksdb::{
    ColumnFamilyDescriptor, DB, IngestExternalFileOptions, MergeOperands, Options, ReadOptions,
    WriteBatch, WriteOptions,
};

use super::packed::{self, ENTRY_KEY};
use super::rocks_bulk::IngestTarget;
use super::{BulkFeed, Cf, KvOp, KvStore, Scanned, StorageError, Visitor};

pub struct RocksStore {
    db: DB,
    path: PathBuf,
}

/// RocksDB's own verdict decides what is corruption (a bad checksum, a CURRENT or MANIFEST that
/// does not parse, a file the manifest names missing); everything else (the LOCK held by another
/// process, EACCES, EMFILE, ENOSPC, EIO) is the environment's and must not condemn the data.
fn io(e: rocksdb::Error) -> StorageError {
    error(String::new(), e)
}

fn error(context: String, e: rocksdb::Error) -> StorageError {
    let what = format!("{context}{e}");
    match e.kind() {
        rocksdb::ErrorKind::Corruption => StorageError::Corrupt {
            cf: "database",
            what,
        },
        // A file the manifest names is gone: the database is incomplete, not busy.
        rocksdb::ErrorKind::NotFound | rocksdb::ErrorKind::IOError
            if e.as_ref().contains("No such file or directory") =>
        {
            StorageError::Corrupt {
                cf: "database",
                what,
            }
        }
        _ => StorageError::Io(what),
    }
}

impl RocksStore {
    /// Open (or create) the store in `path`.
    pub fn open(path: &Path) -> Result<RocksStore, StorageError> {
        std::fs::create_dir_all(path)
            .map_err(|e| StorageError::Io(format!("create {}: {e}", path.display())))?;
        let mut options = Options::default();
        options.create_if_missing(true);
        options.create_missing_column_families(true);
        options.set_compression_type(rocksdb::DBCompressionType::Lz4);
        // Months of operation: RocksDB's own files stay bounded too, not only our tables. The
        // manifest (a record per flush and compaction) rolls over past 4 MiB, the info log
        // keeps 4 files of at most 4 MiB, and the write-ahead log forces a flush past 64 MiB.
        options.set_max_manifest_file_size(4 << 20);
        options.set_max_log_file_size(4 << 20);
        options.set_keep_log_file_num(4);
        options.set_max_total_wal_size(64 << 20);
        let families = Cf::ALL
            .iter()
            .map(|&cf| ColumnFamilyDescriptor::new(cf.name(), family_options(cf)));
        let db = DB::open_cf_descriptors(&options, path, families)
            .map_err(|e| error(format!("open {}: ", path.display()), e))?;
        Ok(RocksStore {
            db,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn cf(&self, cf: Cf) -> Result<&rocksdb::ColumnFamily, StorageError> {
        self.db
            .cf_handle(cf.name())
            .ok_or_else(|| StorageError::Io(format!("column family {} missing", cf.name())))
    }

    /// Bytes on disk of the live SST files and logs.
    pub fn disk_bytes(&self) -> u64 {
        dir_size(&self.path)
    }
}

fn dir_size(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

impl IngestTarget for RocksStore {
    fn path(&self) -> &Path {
        &self.path
    }

    fn table_options(&self) -> Options {
        family_options(Cf::Meta)
    }

    fn ingest(
        &self,
        cf: Cf,
        options: &IngestExternalFileOptions,
        path: &Path,
    ) -> Result<(), StorageError> {
        self.db
            .ingest_external_file_cf_opts(self.cf(cf)?, options, vec![path])
            .map_err(io)
    }
}

/// A column family's options: LZ4 for all, the packed records' merge where they are kept.
/// (Block size, compression and checksums were measured for the recovery scan and make no
/// difference there: RocksDB's cost is per record, see `docs/durability.md`.)
fn family_options(cf: Cf) -> Options {
    let mut o = Options::default();
    o.set_compression_type(rocksdb::DBCompressionType::Lz4);
    if packed::logical_len(cf).is_some() {
        // The name is stored in the database's options file: a new meaning would need a new
        // name (and a migration).
        o.set_merge_operator(PACKED_MERGE, full_merge, partial_merge);
        // A bucket whose records were all removed folds into an empty value: drop it, as the
        // records themselves were. (Merge operands are never empty: an entry has 7 bytes.)
        o.set_compaction_filter(
            "mooncake.packed.empty",
            |_level: u32, _key: &[u8], value: &[u8]| {
                if value.is_empty() {
                    rocksdb::CompactionDecision::Remove
                } else {
                    rocksdb::CompactionDecision::Keep
                }
            },
        );
    }
    o
}

const PACKED_MERGE: &str = "mooncake.packed.v1";

/// Nothing older than `base` exists.
fn full_merge(_key: &[u8], base: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    Some(packed::merge(base, operands.iter(), true))
}

/// Operands folded together while older data may still be below them.
fn partial_merge(_key: &[u8], _base: Option<&[u8]>, operands: &MergeOperands) -> Option<Vec<u8>> {
    Some(packed::merge(None, operands.iter(), false))
}

/// A range delete in a packed column family removes whole buckets, so both of its ends must fall
/// between buckets: no longer than a bucket's key, or past every record key (what a delete of
/// "everything" uses: a run of 0xff longer than a record's key).
fn bucket_aligned(cf: Cf, end: &[u8]) -> bool {
    match packed::logical_len(cf) {
        None => true,
        Some(len) => {
            end.len() <= len - ENTRY_KEY
                || (end.len() > len && end[..len].iter().all(|&b| b == 0xff))
        }
    }
}

impl RocksStore {
    fn batch(&self, ops: Vec<KvOp>) -> Result<WriteBatch, StorageError> {
        let mut batch = WriteBatch::default();
        let mut entry = Vec::new();
        for op in ops {
            match op {
                KvOp::Put { cf, key, value } => match packed::bucket_of(cf, &key) {
                    Some(bucket) => {
                        entry.clear();
                        packed::put_entry(&mut entry, cf, &key[bucket.len()..], &value)?;
                        batch.merge_cf(self.cf(cf)?, bucket, &entry);
                    }
                    None => batch.put_cf(self.cf(cf)?, self.plain(cf, &key)?, value),
                },
                KvOp::Delete { cf, key } => match packed::bucket_of(cf, &key) {
                    Some(bucket) => {
                        entry.clear();
                        packed::removed_entry(&mut entry, &key[bucket.len()..]);
                        batch.merge_cf(self.cf(cf)?, bucket, &entry);
                    }
                    None => batch.delete_cf(self.cf(cf)?, self.plain(cf, &key)?),
                },
                KvOp::DeleteRange { cf, from, to } => {
                    if !bucket_aligned(cf, &from) || !bucket_aligned(cf, &to) {
                        return Err(StorageError::Io(format!(
                            "a range delete in {} must cover whole buckets ({} or fewer key bytes)",
                            cf.name(),
                            packed::logical_len(cf).unwrap_or(0) - ENTRY_KEY
                        )));
                    }
                    batch.delete_range_cf(self.cf(cf)?, from, to)
                }
            }
        }
        Ok(batch)
    }

    /// A key stored as it is: in a packed column family it must not look like a bucket.
    fn plain<'k>(&self, cf: Cf, key: &'k [u8]) -> Result<&'k [u8], StorageError> {
        if packed::is_bucket(cf, key) {
            return Err(StorageError::Io(format!(
                "a {}-byte key in {} would read as a bucket of packed records",
                key.len(),
                cf.name()
            )));
        }
        Ok(key)
    }

    /// Bring records a schema before packing stored one to a value (keys of the full length)
    /// into their buckets: each batch of them moves in one atomic write, so a process killed
    /// meanwhile leaves each record in exactly one of the two places, and the next run carries
    /// on with the rest. Returns how many records moved.
    fn move_plain_into_buckets(&self, batch_records: u64) -> Result<u64, StorageError> {
        let mut moved = 0;
        for cf in Cf::ALL {
            let Some(len) = packed::logical_len(cf) else {
                continue;
            };
            let handle = self.cf(cf)?;
            let mut from: Vec<u8> = Vec::new();
            loop {
                // (bucket, its records' entries), in key order.
                let mut buckets: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
                let mut first: Option<Vec<u8>> = None;
                let mut last = Vec::new();
                let mut n = 0;
                // A key of another length ends the batch before it: the batch's range delete
                // must not cover it (nothing but records of the full length is moved).
                let mut other = None;
                let mut it = self.db.raw_iterator_cf_opt(handle, bulk_read());
                it.seek(&from);
                while let (Some(key), Some(value)) = (it.key(), it.value()) {
                    if key.len() != len && first.is_some() {
                        other = Some(key.to_vec());
                        break;
                    }
                    if key.len() == len {
                        let (bucket, tail) = key.split_at(len - ENTRY_KEY);
                        if buckets.last().is_none_or(|(b, _)| b.as_slice() != bucket) {
                            buckets.push((bucket.to_vec(), Vec::new()));
                        }
                        if let Some((_, entries)) = buckets.last_mut() {
                            packed::put_entry(entries, cf, tail, value)?;
                        }
                        first.get_or_insert_with(|| key.to_vec());
                        last.clear();
                        last.extend_from_slice(key);
                        n += 1;
                        if n == batch_records {
                            break;
                        }
                    }
                    it.next();
                }
                it.status().map_err(io)?;
                drop(it);
                let Some(first) = first else {
                    break;
                };
                // One range delete for the batch's old records, ahead of its merges (which it
                // would otherwise remove too). The only buckets inside the range are the ones
                // this batch writes: a bucket's key is a prefix of its records' keys, so the
                // buckets of records moved before sort below this batch's first record.
                last.push(0);
                let mut batch = WriteBatch::default();
                batch.delete_range_cf(handle, &first, &last);
                for (bucket, entries) in &buckets {
                    batch.merge_cf(handle, bucket, entries);
                }
                self.db.write(batch).map_err(io)?;
                moved += n;
                from = other.unwrap_or(last);
            }
            if from.is_empty() {
                continue;
            }
            // The moved records are still in the table files, under range deletes that every
            // later scan would step over one by one (a 10 M-pair restart read as slowly as
            // before the move): compact them away now, once.
            self.db
                .compact_range_cf(handle, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(moved)
    }
}

// The scan writes a record's last 8 key bytes as the bucket's last 2 and an entry's tail.
const _: () = assert!(ENTRY_KEY + 2 == 8);

fn malformed(cf: Cf) -> StorageError {
    StorageError::Corrupt {
        cf: cf.name(),
        what: "a bucket of packed records is not whole entries".into(),
    }
}

/// Records [`RocksStore::move_plain_into_buckets`] moves per atomic write.
const PACK_BATCH: u64 = 100_000;

/// What the tests of the packed layout need below the record-at-a-time trait.
#[cfg(test)]
impl RocksStore {
    /// Write a record as it is, as a schema before packing did.
    pub(super) fn put_stored(&self, cf: Cf, key: &[u8], value: &[u8]) {
        self.db.put_cf(self.cf(cf).unwrap(), key, value).unwrap();
    }

    /// The keys RocksDB holds in `cf`.
    pub(super) fn stored_keys(&self, cf: Cf) -> Vec<Vec<u8>> {
        let mut it = self.db.raw_iterator_cf(self.cf(cf).unwrap());
        it.seek_to_first();
        let mut keys = Vec::new();
        while let Some(key) = it.key() {
            keys.push(key.to_vec());
            it.next();
        }
        keys
    }

    pub(super) fn move_plain_in_batches_of(&self, records: u64) -> u64 {
        self.move_plain_into_buckets(records).unwrap()
    }
}

/// Reads of whole column families (recovery, dumps): read ahead, and keep them out of the
/// block cache.
fn bulk_read() -> ReadOptions {
    let mut options = ReadOptions::default();
    options.fill_cache(false);
    options.set_readahead_size(4 << 20);
    options
}

impl KvStore for RocksStore {
    /// Checkpoints: in the WAL, not synced (a killed process loses nothing the OS accepted;
    /// a power loss may cost the last rounds, which replay from the publishers repairs).
    fn write(&self, ops: Vec<KvOp>) -> Result<(), StorageError> {
        self.db.write(self.batch(ops)?).map_err(io)?;
        super::failpoint::hit("store_write");
        Ok(())
    }

    fn write_synced(&self, ops: Vec<KvOp>) -> Result<(), StorageError> {
        let mut options = WriteOptions::default();
        options.set_sync(true);
        self.db.write_opt(self.batch(ops)?, &options).map_err(io)?;
        super::failpoint::hit("store_write");
        Ok(())
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let Some(bucket) = packed::bucket_of(cf, key) else {
            return self.db.get_cf(self.cf(cf)?, key).map_err(io);
        };
        if let Some(value) = self.db.get_pinned_cf(self.cf(cf)?, bucket).map_err(io)? {
            let tail = &key[bucket.len()..];
            for entry in packed::entries(&value) {
                match entry.map_err(|_| malformed(cf))? {
                    (t, Some(found)) if t == tail => return Ok(Some(found.to_vec())),
                    _ => {}
                }
            }
        }
        // Not in its bucket: a record of schema 3 not moved yet is stored as it is.
        self.db.get_cf(self.cf(cf)?, key).map_err(io)
    }

    fn scan_prefix(&self, cf: Cf, prefix: &[u8], visit: &mut Visitor<'_>) -> Scanned {
        // The raw iterator lends each key and value in place: the owning iterator allocates two
        // boxes per record, which was most of a 10 M-pair recovery's time in RocksDB.
        let mut it = self.db.raw_iterator_cf_opt(self.cf(cf)?, bulk_read());
        // In a packed column family the records of a prefix longer than a bucket's key are in
        // the buckets that start with its first bytes.
        let stored_prefix = match packed::logical_len(cf) {
            Some(len) => &prefix[..prefix.len().min(len - ENTRY_KEY)],
            None => prefix,
        };
        it.seek(stored_prefix);
        let mut record = [0u8; 32];
        while let (Some(key), Some(value)) = (it.key(), it.value()) {
            if !key.starts_with(stored_prefix) {
                break;
            }
            if !packed::is_bucket(cf, key) {
                if key.starts_with(prefix) {
                    visit(key, value)?;
                }
            } else {
                let full = key.len() + ENTRY_KEY;
                let record = &mut record[..full];
                record[..key.len()].copy_from_slice(key);
                // The last 8 bytes of a record's key (a pair's block, an alias's engine hash)
                // are written in one store: the visitor reads them as one number, and a load
                // spanning two smaller stores stalls until they retire (a third of the CPU of
                // decoding a pair, in a profile).
                let high = u64::from(u16::from_be_bytes([key[key.len() - 2], key[key.len() - 1]]));
                // A prefix no longer than the bucket's key holds all of its records: no compare
                // per record (which was an eighth of a 10 M-pair restart's CPU).
                let all = prefix.len() <= key.len();
                for entry in packed::entries(value) {
                    let (tail, value) = entry.map_err(|_| malformed(cf))?;
                    let word = high << (8 * ENTRY_KEY) | packed::tail_number(tail);
                    record[full - 8..].copy_from_slice(&word.to_be_bytes());
                    if let Some(value) = value
                        && (all || record.starts_with(prefix))
                    {
                        visit(record, value)?;
                    }
                }
            }
            it.next();
        }
        it.status().map_err(io)
    }

    fn bulk_load(&self, feed: &mut BulkFeed<'_>) -> Result<(), StorageError> {
        super::rocks_bulk::load(self, feed)
    }

    fn pack_records(&self) -> Result<u64, StorageError> {
        self.move_plain_into_buckets(PACK_BATCH)
    }

    fn compact(&self) -> Result<(), StorageError> {
        for cf in Cf::ALL {
            self.db
                .compact_range_cf(self.cf(cf)?, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }
}
