//! A test-only fault switch around the real store: with `CONDUCTOR_TEST_FAIL_WRITES_WHILE` set to
//! a path, every write fails as a full disk would (`No space left on device`) while a file exists
//! at that path, and works again once it is removed. Integration tests use it to show that a
//! failing checkpoint or registration write is visible, leaves no trace, and is caught up; it is
//! compiled only into test builds (the `failpoints` feature), never into the binary users run.

use std::path::PathBuf;
use std::sync::Arc;

use super::{Cf, KvOp, KvStore, Scanned, StorageError, Visitor};

pub const FAULT_SWITCH_ENV: &str = "CONDUCTOR_TEST_FAIL_WRITES_WHILE";

pub struct FaultSwitch {
    inner: Arc<dyn KvStore>,
    switch: PathBuf,
}

impl FaultSwitch {
    /// Wrap `store` if the environment names a switch file.
    pub fn from_env(store: Arc<dyn KvStore>) -> Arc<dyn KvStore> {
        match std::env::var_os(FAULT_SWITCH_ENV).filter(|p| !p.is_empty()) {
            Some(path) => {
                tracing::warn!(switch = ?path, "{FAULT_SWITCH_ENV} is set: writes fail while it exists");
                Arc::new(FaultSwitch::new(store, PathBuf::from(path)))
            }
            None => store,
        }
    }

    pub fn new(inner: Arc<dyn KvStore>, switch: PathBuf) -> Self {
        FaultSwitch { inner, switch }
    }

    fn check(&self) -> Result<(), StorageError> {
        if self.switch.exists() {
            return Err(StorageError::Io(
                "IO error: No space left on device (injected by the test switch)".into(),
            ));
        }
        Ok(())
    }
}

impl KvStore for FaultSwitch {
    fn write(&self, ops: Vec<KvOp>) -> Result<(), StorageError> {
        self.check()?;
        self.inner.write(ops)
    }

    fn write_synced(&self, ops: Vec<KvOp>) -> Result<(), StorageError> {
        self.check()?;
        self.inner.write_synced(ops)
    }

    fn get(&self, cf: Cf, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.inner.get(cf, key)
    }

    fn scan_prefix(&self, cf: Cf, prefix: &[u8], visit: &mut Visitor<'_>) -> Scanned {
        self.inner.scan_prefix(cf, prefix, visit)
    }

    fn compact(&self) -> Result<(), StorageError> {
        self.inner.compact()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::memory::MemoryStore;

    #[test]
    fn writes_fail_exactly_while_the_switch_file_exists() {
        let dir = tempfile::tempdir().unwrap();
        let switch = dir.path().join("full");
        let store = FaultSwitch::new(Arc::new(MemoryStore::new()), switch.clone());
        let put = |n: u8| {
            vec![KvOp::Put {
                cf: Cf::Meta,
                key: vec![n],
                value: vec![n],
            }]
        };
        store.write(put(1)).unwrap();
        std::fs::write(&switch, b"").unwrap();
        let e = store.write_synced(put(2)).unwrap_err();
        assert!(e.to_string().contains("No space left on device"), "{e}");
        assert_eq!(store.get(Cf::Meta, &[2]).unwrap(), None);
        std::fs::remove_file(&switch).unwrap();
        store.write(put(3)).unwrap();
        assert_eq!(store.get(Cf::Meta, &[1]).unwrap(), Some(vec![1]));
    }
}
