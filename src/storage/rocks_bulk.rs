//! RocksDB's bulk load: each column family's records written into a table file of its own
//! (RocksDB's `SstFileWriter`) and the files ingested whole at the end, so the records never
//! pass through the write-ahead log, the memtables, a flush or a compaction.
//!
//! Measured on a replica bootstrapping 10 M pairs from a peer (see `docs/replicas.md`): with
//! plain batched writes the store's writer thread and RocksDB's flush and compaction threads
//! took about 38 % of the two cores the whole pull shared, which is what made the pull's time
//! depend on the machine's load.
//!
//! A table file needs its keys in strictly increasing order, which a well-formed snapshot
//! gives (each column family in key order). A put that is not above its column family's last
//! key ends the files: they are ingested at once (later files take newer sequence numbers, so
//! a later put still wins) and the rest of the load goes through plain batched writes, whose
//! cost a stream in the wrong order then pays, with no bound on files to worry about.
//!
//! In the packed column families ([`super::packed`]) consecutive records of one bucket are
//! gathered and written as one merge operand: a merge rather than a put, so that records the
//! store already holds in that bucket stay, as they would with plain writes.

use std::path::{Path, PathBuf};

use rocksdb::{IngestExternalFileOptions, Options, SstFileWriter};

use super::bulk::{BatchedSink, BulkFeed, BulkSink};
use super::packed;
use super::{Cf, KvStore, StorageError};

/// What a bulk load needs of the RocksDB store (implemented by `rocks::RocksStore`).
pub(super) trait IngestTarget: KvStore {
    /// The database's directory (the table files are staged inside it).
    fn path(&self) -> &Path;
    /// The options a table file for one of the column families is written with.
    fn table_options(&self) -> Options;
    /// Ingest the finished table file at `path` into `cf`.
    fn ingest(
        &self,
        cf: Cf,
        options: &IngestExternalFileOptions,
        path: &Path,
    ) -> Result<(), StorageError>;
}

/// The directory, inside the database's, where the table files are written before ingestion.
/// Removed before and after each load, so a process killed mid-way leaves nothing for the
/// next one (RocksDB itself ignores a directory it did not make).
pub(super) const STAGING_DIR: &str = "bulk-load";

/// One column family's table file being written.
struct CfFile<'o> {
    writer: SstFileWriter<'o>,
    path: PathBuf,
    last_key: Vec<u8>,
    records: u64,
    /// The bucket being gathered (packed column families) and its entries so far (empty: none),
    /// written when a record of another bucket comes.
    bucket: Vec<u8>,
    entries: Vec<u8>,
    /// The key of what was last written or gathered: the file's keys must increase too.
    last_stored: Vec<u8>,
}

impl CfFile<'_> {
    fn write_bucket(&mut self) -> Result<(), StorageError> {
        if self.entries.is_empty() {
            return Ok(());
        }
        self.writer
            .merge(&self.bucket, &self.entries)
            .map_err(|e| io(&format!("write {}", self.path.display()), e))?;
        self.entries.clear();
        Ok(())
    }
}

/// The sink of a bulk load into RocksDB (see the module doc).
struct SstSink<'s, 'o, S: IngestTarget> {
    store: &'s S,
    options: &'o Options,
    dir: PathBuf,
    files: [Option<CfFile<'o>>; Cf::ALL.len()],
    /// Set once a put came out of order: everything from then on is a plain write.
    batched: Option<BatchedSink<'s, S>>,
}

fn io(what: &str, e: impl std::fmt::Display) -> StorageError {
    StorageError::Io(format!("bulk load: {what}: {e}"))
}

fn slot(cf: Cf) -> usize {
    Cf::ALL.iter().position(|&c| c == cf).unwrap_or(0)
}

impl<'s, 'o, S: IngestTarget> SstSink<'s, 'o, S> {
    fn file(&mut self, cf: Cf) -> Result<&mut CfFile<'o>, StorageError> {
        let options = self.options;
        let entry = &mut self.files[slot(cf)];
        if entry.is_none() {
            let path = self.dir.join(format!("{}.sst", cf.name()));
            let writer = SstFileWriter::create(options);
            writer
                .open(&path)
                .map_err(|e| io(&format!("create {}", path.display()), e))?;
            *entry = Some(CfFile {
                writer,
                path,
                last_key: Vec::new(),
                records: 0,
                bucket: Vec::new(),
                entries: Vec::new(),
                last_stored: Vec::new(),
            });
        }
        Ok(entry.as_mut().expect("just made"))
    }

    /// Finish every file that has records and ingest it into its column family.
    fn ingest(&mut self) -> Result<(), StorageError> {
        let mut ingest = IngestExternalFileOptions::default();
        // The files are ours and staged inside the database's directory: link them in rather
        // than copying hundreds of megabytes.
        ingest.set_move_files(true);
        for (i, entry) in self.files.iter_mut().enumerate() {
            let Some(mut file) = entry.take() else {
                continue;
            };
            if file.records == 0 {
                continue;
            }
            file.write_bucket()?;
            file.writer
                .finish()
                .map_err(|e| io(&format!("finish {}", file.path.display()), e))?;
            drop(file.writer);
            let cf = Cf::ALL[i];
            self.store
                .ingest(cf, &ingest, &file.path)
                .map_err(|e| io(&format!("ingest into {}", cf.name()), e))?;
        }
        Ok(())
    }
}

impl<S: IngestTarget> BulkSink for SstSink<'_, '_, S> {
    fn put(&mut self, cf: Cf, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        if let Some(batched) = &mut self.batched {
            return batched.put(cf, key, value);
        }
        let file = self.file(cf)?;
        let bucket = packed::bucket_of(cf, key);
        let stored = bucket.unwrap_or(key);
        let same_bucket = bucket.is_some() && !file.entries.is_empty() && stored == file.bucket;
        let in_order = file.records == 0
            || (key > file.last_key.as_slice()
                && (same_bucket || stored > file.last_stored.as_slice()));
        if !in_order {
            tracing::warn!(
                cf = cf.name(),
                "bulk load: records out of key order; writing the rest record by record"
            );
            self.ingest()?;
            let mut batched = BatchedSink::new(self.store);
            batched.put(cf, key, value)?;
            self.batched = Some(batched);
            return Ok(());
        }
        if !same_bucket {
            file.write_bucket()?;
        }
        match bucket {
            Some(bucket) => {
                if !same_bucket {
                    file.bucket.clear();
                    file.bucket.extend_from_slice(bucket);
                }
                packed::put_entry(&mut file.entries, cf, &key[bucket.len()..], value)?;
            }
            None => file
                .writer
                .put(key, value)
                .map_err(|e| io(&format!("write {}", file.path.display()), e))?,
        }
        file.last_stored.clear();
        file.last_stored.extend_from_slice(stored);
        file.last_key.clear();
        file.last_key.extend_from_slice(key);
        file.records += 1;
        Ok(())
    }
}

fn remove_staging(dir: &Path) -> Result<(), StorageError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(io(&format!("remove {}", dir.display()), e))
        }
        _ => Ok(()),
    }
}

/// [`super::KvStore::bulk_load`] for RocksDB (see the module doc).
pub(super) fn load<S: IngestTarget>(
    store: &S,
    feed: &mut BulkFeed<'_>,
) -> Result<(), StorageError> {
    let dir = store.path().join(STAGING_DIR);
    remove_staging(&dir)?;
    std::fs::create_dir_all(&dir).map_err(|e| io(&format!("create {}", dir.display()), e))?;
    let options = store.table_options();
    let result = {
        let mut sink = SstSink {
            store,
            options: &options,
            dir: dir.clone(),
            files: Default::default(),
            batched: None,
        };
        feed(&mut sink).and_then(|()| match &mut sink.batched {
            Some(batched) => batched.flush(),
            None => sink.ingest(),
        })
    };
    let removed = remove_staging(&dir);
    result.and(removed)
}
