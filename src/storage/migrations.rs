//! The migration runner over the steps described in `migrations/`.

use super::{Cf, KvOp, KvStore, StorageError};
use crate::hashing::derived::ChainTuning;

/// The schema version this binary writes.
pub const CURRENT_VERSION: u32 = 9;

/// The newest schema version that changed how a record (a key and value of the `KvStore`
/// API) is encoded or what it means. Schema 4 changed only how the RocksDB store packs records
/// into its own values (peers of schema 3 and 4 bootstrap from each other); schemas 5 and 6
/// changed what a derived block key means, so a replica's snapshot, which carries records, is in
/// schema 6's format and an older peer's is refused. Schema 9 gave holder records a KV-cache
/// group and its kind, which an older reader would merge into group 0.
pub const RECORDS_VERSION: u32 = 9;

const VERSION_KEY: &[u8] = b"schema_version";

/// The meta record of the chain tuning the store's derived keys were made with (two bytes,
/// `ChainTuning::encode`; see migration 8).
pub const TUNING_KEY: &[u8] = b"chain_tuning";

/// One schema step: what it changes (the file in `migrations/`) and the writes that do it.
pub struct Migration {
    pub version: u32,
    pub description: &'static str,
    pub apply: fn(&dyn KvStore) -> Result<Vec<KvOp>, StorageError>,
}

/// Every step, in order.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: include_str!("../../migrations/0001_initial_layout.md"),
        apply: |_| Ok(Vec::new()),
    },
    Migration {
        version: 2,
        // The new column family is created when the store opens; schema 1 values read as
        // they are (see the file).
        description: include_str!("../../migrations/0002_counts_and_derived_keys.md"),
        apply: |_| Ok(Vec::new()),
    },
    Migration {
        version: 3,
        // Schema 2 data reads as it is (see the file).
        description: include_str!(
            "../../migrations/0003_reclaimed_holders_and_source_positions.md"
        ),
        apply: |_| Ok(Vec::new()),
    },
    Migration {
        version: 4,
        // The store moves the records itself, in batches (see the file); only the version is
        // left for the step's own write.
        description: include_str!("../../migrations/0004_packed_pairs_and_aliases.md"),
        apply: |store| store.pack_records().map(|_| Vec::new()),
    },
    Migration {
        version: 5,
        // Deletes in batches and compacts itself (see the file).
        description: include_str!("../../migrations/0005_derived_keys_rebuilt_from_replay.md"),
        apply: |store| super::drop_derived::drop_derived_keys(store, 5),
    },
    Migration {
        version: 6,
        // Step 5's procedure again: the derived keys changed once more (see the file).
        description: include_str!("../../migrations/0006_longer_segments_rebuilt_from_replay.md"),
        apply: |store| super::drop_derived::drop_derived_keys(store, 6),
    },
    Migration {
        version: 7,
        // One record per registration, from its contexts' lowest position (see the file).
        description: include_str!("../../migrations/0007_source_records.md"),
        apply: super::source_records::add_source_records,
    },
    Migration {
        version: 8,
        // Records the tuning every older store's keys were made with; no key changes (see the
        // file).
        description: include_str!("../../migrations/0008_chain_tuning_recorded.md"),
        apply: |store| {
            Ok(match store.get(Cf::Meta, TUNING_KEY)? {
                Some(_) => Vec::new(),
                None => vec![tuning_op(ChainTuning::UNRECORDED)],
            })
        },
    },
    Migration {
        version: 9,
        // Holder records may name a KV-cache group and its kind; older ones read as group 0
        // of full attention (see the file).
        description: include_str!("../../migrations/0009_cache_groups.md"),
        apply: |_| Ok(Vec::new()),
    },
];

/// The write that records `tuning` as the store's.
pub fn tuning_op(tuning: ChainTuning) -> KvOp {
    KvOp::Put {
        cf: Cf::Meta,
        key: TUNING_KEY.to_vec(),
        value: tuning.encode().to_vec(),
    }
}

/// The chain tuning the store's derived keys were made with: recorded since schema 8; a store
/// of an older schema read as it is (the offline commands) was made with
/// [`ChainTuning::UNRECORDED`].
pub fn read_tuning(store: &dyn KvStore) -> Result<ChainTuning, StorageError> {
    match store.get(Cf::Meta, TUNING_KEY)? {
        None => Ok(ChainTuning::UNRECORDED),
        Some(bytes) => ChainTuning::decode(&bytes).ok_or_else(|| StorageError::Corrupt {
            cf: "meta",
            what: format!("chain_tuning {bytes:?} is not a tuning"),
        }),
    }
}

/// The tuning a new store records: the default, or in test builds `CONDUCTOR_TEST_CHAIN_TUNING`
/// (`shard_bits,segment_bits`), so that the tests can write a store under another tuning than
/// the one the binary that reads it defaults to.
fn new_store_tuning() -> ChainTuning {
    #[cfg(feature = "failpoints")]
    if let Ok(text) = std::env::var("CONDUCTOR_TEST_CHAIN_TUNING")
        && let Some((shard, segment)) = text.split_once(',')
        && let (Ok(shard), Ok(segment)) = (shard.trim().parse(), segment.trim().parse())
        && let Some(tuning) = ChainTuning::new(shard, segment)
    {
        return tuning;
    }
    ChainTuning::DEFAULT
}

pub fn read_version(store: &dyn KvStore) -> Result<Option<u32>, StorageError> {
    match store.get(Cf::Meta, VERSION_KEY)? {
        None => Ok(None),
        Some(bytes) => {
            let bytes: [u8; 4] =
                bytes
                    .as_slice()
                    .try_into()
                    .map_err(|_| StorageError::Corrupt {
                        cf: "meta",
                        what: "schema_version is not 4 bytes".into(),
                    })?;
            Ok(Some(u32::from_be_bytes(bytes)))
        }
    }
}

pub fn version_op(version: u32) -> KvOp {
    KvOp::Put {
        cf: Cf::Meta,
        key: VERSION_KEY.to_vec(),
        value: version.to_be_bytes().to_vec(),
    }
}

/// Bring the store to [`CURRENT_VERSION`]; returns the version it had (0 for a new store).
pub fn migrate(store: &dyn KvStore, path: &str) -> Result<u32, StorageError> {
    migrate_to(store, path, CURRENT_VERSION)
}

/// Apply the steps up to `target` (tests of one step stop after it); see [`migrate`].
pub fn migrate_to(store: &dyn KvStore, path: &str, target: u32) -> Result<u32, StorageError> {
    let found = read_version(store)?.unwrap_or(0);
    if found > CURRENT_VERSION {
        return Err(StorageError::TooNew {
            path: path.to_owned(),
            found,
            supported: CURRENT_VERSION,
        });
    }
    if found == 0 && holds_nothing(store)? {
        // A new data directory: created at the target schema, with nothing to convert, and
        // the tuning its keys will be made with.
        let mut ops = vec![version_op(target)];
        if target >= 8 {
            ops.push(tuning_op(new_store_tuning()));
        }
        store.write(ops)?;
        return Ok(0);
    }
    for step in MIGRATIONS
        .iter()
        .filter(|m| m.version > found && m.version <= target)
    {
        let mut ops = (step.apply)(store)?;
        ops.push(version_op(step.version));
        store.write(ops)?;
        let title = step
            .description
            .lines()
            .next()
            .unwrap_or_default()
            .trim_start_matches("# ");
        tracing::info!(version = step.version, "applied schema migration {title}");
    }
    Ok(found)
}

/// Whether the store holds no record at all (a new data directory), read up to its first record.
fn holds_nothing(store: &dyn KvStore) -> Result<bool, StorageError> {
    for cf in Cf::ALL {
        let mut found = false;
        let scanned = store.scan_prefix(cf, b"", &mut |_, _| {
            found = true;
            // Ends the scan at the first record; `found` says why it ended.
            Err(StorageError::Corrupt {
                cf: cf.name(),
                what: String::new(),
            })
        });
        if found {
            return Ok(false);
        }
        scanned?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::memory::MemoryStore;

    #[test]
    fn steps_are_numbered_in_order_and_described() {
        for (i, step) in MIGRATIONS.iter().enumerate() {
            assert_eq!(step.version, i as u32 + 1);
            assert!(
                step.description
                    .starts_with(&format!("# {:04}", step.version))
            );
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(CURRENT_VERSION));
        let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().as_bytes()[0].is_ascii_digit())
                    .count()
            })
            .unwrap_or(0);
        assert_eq!(files, MIGRATIONS.len(), "one file in migrations/ per step");
    }

    #[test]
    fn a_new_store_gets_the_current_version_and_a_newer_one_is_refused() {
        let store = MemoryStore::new();
        assert_eq!(migrate(&store, "mem").unwrap(), 0);
        assert_eq!(read_version(&store).unwrap(), Some(CURRENT_VERSION));
        assert_eq!(
            migrate(&store, "mem").unwrap(),
            CURRENT_VERSION,
            "idempotent"
        );
        store.write(vec![version_op(CURRENT_VERSION + 1)]).unwrap();
        let err = migrate(&store, "/data/x").unwrap_err().to_string();
        assert!(
            err.contains("/data/x") && err.contains("newer than this binary"),
            "{err}"
        );
    }
}
