//! Opening the data directory at start-up: the store, its migrations, and recovery, with the
//! configured policy for a directory that cannot be read.

use std::path::Path;
use std::sync::Arc;

use super::recovery::{Recovered, recover};
use crate::storage::{KvStore, StorageError, migrations};

/// What start-up does with a data directory whose contents are corrupt (`on_corrupt_data`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnCorruptData {
    /// Refuse to start.
    Stop,
    /// Move the directory aside and start empty.
    MoveAside,
}

/// The store and what it held.
pub struct Loaded {
    pub store: Arc<dyn KvStore>,
    pub recovered: Recovered,
}

/// Open, migrate and recover. A database newer than this binary always stops start-up; so does
/// any other failure, unless `on_corrupt_data` is `move_aside` and the data is corrupt. A
/// directory is never moved for a held LOCK, a permission, a process limit or a full disk:
/// those say nothing about the data, and moving it would start the service empty beside it.
pub fn load(data_dir: &Path, on_corrupt: OnCorruptData) -> Result<Loaded, StorageError> {
    let move_aside = on_corrupt == OnCorruptData::MoveAside;
    match open_and_recover(data_dir) {
        Ok(loaded) => Ok(loaded),
        Err(e @ StorageError::TooNew { .. }) => Err(e),
        Err(e) if move_aside && !e.is_corruption() => {
            tracing::error!(
                "data directory {} cannot be opened ({e}); this is not corruption, so it is not \
                 moved aside",
                data_dir.display()
            );
            Err(e)
        }
        Err(e) if move_aside => {
            let stamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let aside = data_dir.with_extension(format!("unreadable-{stamp}"));
            tracing::error!(
                "data directory {} is unreadable ({e}); moving it to {} and starting empty",
                data_dir.display(),
                aside.display()
            );
            std::fs::rename(data_dir, &aside).map_err(|io| {
                StorageError::Io(format!("move {} aside: {io}", data_dir.display()))
            })?;
            open_and_recover(data_dir)
        }
        Err(e) => Err(e),
    }
}

fn open_and_recover(dir: &Path) -> Result<Loaded, StorageError> {
    let store = open(dir)?;
    // Test builds only: the integration tests' full-disk switch (`storage::fault_switch`).
    #[cfg(feature = "failpoints")]
    let store = crate::storage::fault_switch::FaultSwitch::from_env(store);
    let found = migrations::migrate(store.as_ref(), &dir.display().to_string())?;
    let recovered = recover(store.as_ref())?;
    tracing::info!(
        data_dir = %dir.display(),
        schema_from = found,
        contexts = recovered.contexts.len(),
        registrations = recovered.registrations.len(),
        pairs = recovered.pairs,
        chain_tuning = %format_args!(
            "{},{}",
            recovered.tuning.shard_bits(),
            recovered.tuning.segment_bits()
        ),
        scan_ms = recovered.phases.scan.as_millis() as u64,
        build_ms = recovered.phases.build.as_millis() as u64,
        "recovered state"
    );
    Ok(Loaded { store, recovered })
}

#[cfg(feature = "rocksdb")]
fn open(dir: &Path) -> Result<Arc<dyn KvStore>, StorageError> {
    Ok(Arc::new(crate::storage::rocks::RocksStore::open(dir)?))
}

/// Built without RocksDB (release benchmarks of the pure parts): state lives in memory only.
#[cfg(not(feature = "rocksdb"))]
fn open(dir: &Path) -> Result<Arc<dyn KvStore>, StorageError> {
    tracing::warn!(data_dir = %dir.display(), "built without RocksDB: nothing is persisted");
    Ok(Arc::new(crate::storage::memory::MemoryStore::new()))
}
