//! An in-memory [`KvStore`] with fault injection around writes, for tests of checkpointing and
//! recovery without a disk.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::{Cf, KvOp, KvStore, Scanned, StorageError, Visitor};

/// Where an injected write failure strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The write fails and nothing is written.
    Before,
    /// The process dies mid-write: an atomic store writes nothing, and the caller never learns.
    During,
    /// The write lands, but the caller is told it failed (e.g. an fsync error after the write).
    After,
}

/// Every entry, keyed by column family and key.
type Entries = BTreeMap<(Cf, Vec<u8>), Vec<u8>>;

#[derive(Default)]
pub struct MemoryStore {
    data: Mutex<Entries>,
    /// Faults for the next writes, in order.
    faults: Mutex<Vec<Fault>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        MemoryStore::default()
    }

    /// Make the next write fail in the given way.
    pub fn inject(&self, fault: Fault) {
        self.faults
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(fault);
    }

    /// Number of entries in a column family.
    pub fn len(&self, cf: Cf) -> usize {
        self.lock().keys().filter(|(c, _)| *c == cf).count()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.data.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl KvStore for MemoryStore {
    fn write(&self, ops: Vec<KvOp>) -> Result<(), StorageError> {
        let fault = {
            let mut faults = self.faults.lock().unwrap_or_else(|p| p.into_inner());
            (!faults.is_empty()).then(|| faults.remove(0))
        };
        match fault {
            Some(Fault::Before) => {
                return Err(StorageError::Io("injected failure before the write".into()));
            }
            Some(Fault::During) => {
                return Err(StorageError::Io("injected crash during the write".into()));
            }
            Some(Fault::After) | None => {}
        }
        let mut data = self.lock();
        for op in ops {
            match op {
                KvOp::Put { cf, key, value } => {
                    data.insert((cf, key), value);
                }
                KvOp::Delete { cf, key } => {
                    data.remove(&(cf, key));
                }
                KvOp::DeleteRange { cf, from, to } => {
                    let doomed: Vec<_> = data
                        .range((cf, from)..(cf, to))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in doomed {
                        data.remove(&k);
                    }
                }
            }
        }
        match fault {
            Some(Fault::After) => Err(StorageError::Io("injected failure after the write".into())),
            _ => Ok(()),
        }
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.lock().get(&(cf, key.to_vec())).cloned())
    }

    fn scan_prefix(&self, cf: Cf, prefix: &[u8], visit: &mut Visitor<'_>) -> Scanned {
        let entries: Vec<(Vec<u8>, Vec<u8>)> = self
            .lock()
            .range((cf, prefix.to_vec())..)
            .take_while(|((c, k), _)| *c == cf && k.starts_with(prefix))
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect();
        for (k, v) in entries {
            visit(&k, &v)?;
        }
        Ok(())
    }

    fn compact(&self) -> Result<(), StorageError> {
        Ok(())
    }
}
