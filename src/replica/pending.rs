//! The data directory's "bootstrap pending" mark: written (synced) before an attempt writes
//! anything, removed only once the bootstrapped state is complete and checkpointed. A start
//! that finds it knows that whatever the directory holds is a partial bootstrap, never a state
//! of its own: it clears it and bootstraps again, instead of taking it for a replica's own
//! state and ignoring `bootstrap_from`.

use crate::storage::{Cf, KvOp, KvStore, StorageError};

/// In the meta column family (which a failed attempt's clearing leaves alone): the peer the
/// pending bootstrap pulls from.
const PENDING_KEY: &[u8] = b"bootstrap_pending";

/// The peer of a bootstrap that did not complete, if the directory holds one.
pub fn pending(store: &dyn KvStore) -> Result<Option<String>, StorageError> {
    Ok(store
        .get(Cf::Meta, PENDING_KEY)?
        .map(|peer| String::from_utf8_lossy(&peer).into_owned()))
}

/// Record that a bootstrap from `peer` is under way, on disk before it returns.
pub fn mark(store: &dyn KvStore, peer: &str) -> Result<(), StorageError> {
    store.write_synced(vec![KvOp::Put {
        cf: Cf::Meta,
        key: PENDING_KEY.to_vec(),
        value: peer.as_bytes().to_vec(),
    }])
}

/// The bootstrap is over: the directory's state is the replica's own.
pub fn clear(store: &dyn KvStore) -> Result<(), StorageError> {
    store.write_synced(vec![KvOp::Delete {
        cf: Cf::Meta,
        key: PENDING_KEY.to_vec(),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::pull;
    use crate::storage::memory::MemoryStore;

    #[test]
    fn the_mark_survives_the_clearing_of_a_failed_attempt_until_it_is_cleared() {
        let store = MemoryStore::default();
        assert_eq!(pending(&store).unwrap(), None);
        mark(&store, "http://peer:1").unwrap();
        store
            .write(vec![KvOp::Put {
                cf: Cf::Pairs,
                key: vec![1; 20],
                value: vec![1],
            }])
            .unwrap();
        pull::clear(&store).unwrap();
        assert_eq!(store.get(Cf::Pairs, &[1; 20]).unwrap(), None);
        assert_eq!(pending(&store).unwrap().as_deref(), Some("http://peer:1"));
        clear(&store).unwrap();
        assert_eq!(pending(&store).unwrap(), None);
    }
}
