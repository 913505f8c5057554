//! The key-value layer: a small trait ([`KvStore`]) that knows nothing about RocksDB or about
//! what is stored, its RocksDB implementation ([`rocks`]), an in-memory one with fault injection
//! for tests ([`memory`]), bulk loading into an empty store ([`bulk`]), the schema migrations over
//! `migrations/` ([`migrations`], migration 5's step in [`drop_derived`]), the
//! checkpoint health figures ([`health`]) and, in test builds only, a fault switch
//! (`fault_switch`, with the `failpoints` feature).
//! RocksDB keeps the many small records of `pairs` and `aliases` packed, many to a value
//! ([`packed`]), behind the same record-at-a-time trait.
//! What goes into which column family, and how, is [`crate::durability`]'s.

pub mod bulk;
pub mod drop_derived;
#[cfg(test)]
mod drop_derived_tests;
#[allow(unsafe_code)] // kill(2) of the process itself, in test builds only.
pub mod failpoint;
#[cfg(feature = "failpoints")]
pub mod fault_switch;
pub mod health;
pub mod memory;
pub mod migrations;
#[cfg(feature = "rocksdb")]
pub mod packed;
#[cfg(feature = "rocksdb")]
pub mod rocks;
#[cfg(feature = "rocksdb")]
mod rocks_bulk;
#[cfg(all(test, feature = "rocksdb"))]
mod rocks_bulk_tests;
#[cfg(all(test, feature = "rocksdb"))]
mod rocks_packed_tests;
pub mod source_records;

pub use bulk::{BulkFeed, BulkSink};

/// Column families.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cf {
    Meta,
    Registrations,
    Contexts,
    Holders,
    Attachments,
    Watermarks,
    Pairs,
    Aliases,
    Sources,
}

impl Cf {
    pub const ALL: [Cf; 9] = [
        Cf::Meta,
        Cf::Registrations,
        Cf::Contexts,
        Cf::Holders,
        Cf::Attachments,
        Cf::Watermarks,
        Cf::Pairs,
        Cf::Aliases,
        Cf::Sources,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Cf::Meta => "meta",
            Cf::Registrations => "registrations",
            Cf::Contexts => "contexts",
            Cf::Holders => "holders",
            Cf::Attachments => "attachments",
            Cf::Watermarks => "watermarks",
            Cf::Pairs => "pairs",
            Cf::Aliases => "aliases",
            Cf::Sources => "sources",
        }
    }
}

/// One change in an atomic write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvOp {
    Put {
        cf: Cf,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Delete {
        cf: Cf,
        key: Vec<u8>,
    },
    /// Delete every key in `[from, to)`.
    DeleteRange {
        cf: Cf,
        from: Vec<u8>,
        to: Vec<u8>,
    },
}

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage I/O: {0}")]
    Io(String),
    #[error("corrupt data in {cf}: {what}")]
    Corrupt { cf: &'static str, what: String },
    #[error(
        "the database at {path} has schema version {found}, newer than this binary supports ({supported}); \
         use a newer mooncake_conductor or move the data directory aside"
    )]
    TooNew {
        path: String,
        found: u32,
        supported: u32,
    },
}

impl StorageError {
    /// The stored data itself is bad (as opposed to the disk, the permissions, the process
    /// limits or another process holding the database): only then may it be moved aside.
    pub fn is_corruption(&self) -> bool {
        matches!(self, StorageError::Corrupt { .. })
    }
}

/// What a scan returns: done, or the first error of the store or of the visitor.
pub type Scanned = Result<(), StorageError>;

/// Called for each entry of a scan, in key order; an error stops the scan.
pub type Visitor<'a> = dyn FnMut(&[u8], &[u8]) -> Result<(), StorageError> + 'a;

/// The key-value operations the Conductor needs; implementations must make `write` atomic.
pub trait KvStore: Send + Sync {
    fn write(&self, ops: Vec<KvOp>) -> Result<(), StorageError>;
    /// Like [`KvStore::write`], on stable storage before it returns (registrations, which are
    /// acknowledged to the caller). Stores without a disk have nothing more to do.
    fn write_synced(&self, ops: Vec<KvOp>) -> Result<(), StorageError> {
        self.write(ops)
    }
    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError>;
    /// Visit every entry whose key starts with `prefix`, in key order.
    fn scan_prefix(&self, cf: Cf, prefix: &[u8], visit: &mut Visitor<'_>) -> Scanned;
    /// Reclaim space (a no-op where meaningless).
    fn compact(&self) -> Result<(), StorageError>;
    /// Write many records that the store does not hold yet, put by `feed` (see [`bulk`]): a
    /// replica's bootstrap. Stores without a cheaper way write them in batches.
    fn bulk_load(&self, feed: &mut BulkFeed<'_>) -> Result<(), StorageError> {
        bulk::load_batched(self, feed)
    }
    /// Move records an older schema stored one by one into the layout this store keeps them in
    /// (schema 4, see `migrations/`); returns how many moved. Stores that keep every record as
    /// it is have nothing to do.
    fn pack_records(&self) -> Result<u64, StorageError> {
        Ok(0)
    }
}

/// The exclusive upper bound of keys starting with `prefix` (for range deletes).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return end;
        }
    }
    vec![u8::MAX; prefix.len() + 1]
}
