//! Whether this replica's store has synchronised with etcd under a prefix: the one fact that
//! tells a replica being switched to etcd (its own registrations go up, once, if etcd holds none
//! yet) from one that was down while the fleet removed everything (etcd's empty listing wins).

use crate::storage::{Cf, KvOp, KvStore, StorageError};

/// In the meta column family: the etcd prefix this store last synchronised with.
const SYNCED_PREFIX_KEY: &[u8] = b"etcd_synced_prefix";

/// Whether this store has synchronised with etcd under `prefix` before. A store that cannot be
/// read counts as synchronised: uploading on a guess could bring back removed registrations.
pub fn synced_with(store: &dyn KvStore, prefix: &str) -> bool {
    match store.get(Cf::Meta, SYNCED_PREFIX_KEY) {
        Ok(value) => value.as_deref() == Some(prefix.as_bytes()),
        Err(e) => {
            tracing::warn!("cannot read whether this replica synchronised with etcd: {e}");
            true
        }
    }
}

/// Record that this store now follows etcd under `prefix`.
pub fn mark_synced(store: &dyn KvStore, prefix: &str) -> Result<(), StorageError> {
    store.write_synced(vec![KvOp::Put {
        cf: Cf::Meta,
        key: SYNCED_PREFIX_KEY.to_vec(),
        value: prefix.as_bytes().to_vec(),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::memory::MemoryStore;

    #[test]
    fn a_store_is_synchronised_only_with_the_prefix_it_marked() {
        let store = MemoryStore::default();
        assert!(!synced_with(&store, "/a/"));
        mark_synced(&store, "/a/").unwrap();
        assert!(synced_with(&store, "/a/"));
        assert!(!synced_with(&store, "/b/"), "another fleet's prefix");
    }
}
