//! The RocksDB implementation of [`KvStore`]: one column family per [`Cf`], atomic `WriteBatch`es,
//! LZ4 for the bulk (the pairs), WAL on (a killed process loses nothing the OS accepted).

use std::path::{Path, PathBuf};

use rocksdb::{
    ColumnFamilyDescriptor, DB, IngestExternalFileOptions, Options, ReadOptions, WriteBatch,
    WriteOptions,
};

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
            .map(|cf| ColumnFamilyDescriptor::new(cf.name(), family_options()));
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
        family_options()
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

/// Every column family's options.
fn family_options() -> Options {
    let mut o = Options::default();
    o.set_compression_type(rocksdb::DBCompressionType::Lz4);
    o
}

impl RocksStore {
    fn batch(&self, ops: Vec<KvOp>) -> Result<WriteBatch, StorageError> {
        let mut batch = WriteBatch::default();
        for op in ops {
            match op {
                KvOp::Put { cf, key, value } => batch.put_cf(self.cf(cf)?, key, value),
                KvOp::Delete { cf, key } => batch.delete_cf(self.cf(cf)?, key),
                KvOp::DeleteRange { cf, from, to } => batch.delete_range_cf(self.cf(cf)?, from, to),
            }
        }
        Ok(batch)
    }
}

impl KvStore for RocksStore {
    /// Checkpoints: in the WAL, not synced (a killed process loses nothing the OS accepted;
    /// a power loss may cost the last rounds, which replay from the publishers repairs).
    fn write(&self, ops: Vec<KvOp>) -> Result<(), StorageError> {
        self.db.write(self.batch(ops)?).map_err(io)
    }

    fn write_synced(&self, ops: Vec<KvOp>) -> Result<(), StorageError> {
        let mut options = WriteOptions::default();
        options.set_sync(true);
        self.db.write_opt(self.batch(ops)?, &options).map_err(io)
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.db.get_cf(self.cf(cf)?, key).map_err(io)
    }

    fn scan_prefix(&self, cf: Cf, prefix: &[u8], visit: &mut Visitor<'_>) -> Scanned {
        // Scans are bulk reads (recovery, dumps): read ahead, and keep them out of the block cache.
        let mut options = ReadOptions::default();
        options.fill_cache(false);
        options.set_readahead_size(4 << 20);
        // The raw iterator lends each key and value in place: the owning iterator allocates two
        // boxes per record, which was most of a 10 M-pair recovery's time in RocksDB.
        let mut it = self.db.raw_iterator_cf_opt(self.cf(cf)?, options);
        it.seek(prefix);
        while let (Some(key), Some(value)) = (it.key(), it.value()) {
            if !key.starts_with(prefix) {
                break;
            }
            visit(key, value)?;
            it.next();
        }
        it.status().map_err(io)
    }

    fn bulk_load(&self, feed: &mut BulkFeed<'_>) -> Result<(), StorageError> {
        super::rocks_bulk::load(self, feed)
    }

    fn compact(&self) -> Result<(), StorageError> {
        for cf in Cf::ALL {
            self.db
                .compact_range_cf(self.cf(cf)?, None::<&[u8]>, None::<&[u8]>);
        }
        Ok(())
    }
}
