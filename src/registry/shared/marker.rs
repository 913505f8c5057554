//! What this replica's store knows of the etcd it follows. Whether it has synchronised with etcd
//! under a prefix: the one fact that tells a replica being switched to etcd (its own
//! registrations go up, once, if etcd holds none yet) from one that was down while the fleet
//! removed everything (etcd's empty listing wins). And the history it followed (epoch, cluster
//! id, revision; see [`super::reset`]), so that a restarted replica tells an etcd that lost the
//! fleet's registrations from one whose fleet removed them.

use serde_json::{Value, json};

use super::reset::History;
use crate::storage::{Cf, KvOp, KvStore, StorageError};

/// In the meta column family: the etcd prefix this store last synchronised with.
const SYNCED_PREFIX_KEY: &[u8] = b"etcd_synced_prefix";
/// In the meta column family: the history followed, as JSON with the prefix it belongs to.
const HISTORY_KEY: &[u8] = b"etcd_history";

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

/// The history this store followed under `prefix`; `None` for none (a store from a build that
/// kept none, or one that followed another prefix), or one that cannot be read (logged).
pub fn history(store: &dyn KvStore, prefix: &str) -> Option<History> {
    let value = match store.get(Cf::Meta, HISTORY_KEY) {
        Ok(value) => value?,
        Err(e) => {
            tracing::warn!("cannot read the etcd history this replica followed: {e}");
            return None;
        }
    };
    let Ok(v) = serde_json::from_slice::<Value>(&value) else {
        tracing::warn!("the etcd history in this store is not JSON; ignored");
        return None;
    };
    if v["prefix"].as_str() != Some(prefix) {
        return None;
    }
    let parsed = (|| {
        Some(History {
            epoch: Some(v["epoch"].as_str()?.to_owned()),
            cluster_id: v["cluster_id"].as_u64()?,
            revision: v["revision"].as_i64()?,
        })
    })();
    if parsed.is_none() {
        tracing::warn!("the etcd history in this store lacks a field; ignored");
    }
    parsed
}

/// Record that this store follows etcd under `prefix`, at `history` (which has an epoch).
pub fn record(store: &dyn KvStore, prefix: &str, history: &History) -> Result<(), StorageError> {
    let value = json!({
        "prefix": prefix,
        "epoch": history.epoch,
        "cluster_id": history.cluster_id,
        "revision": history.revision,
    });
    store.write_synced(vec![
        KvOp::Put {
            cf: Cf::Meta,
            key: SYNCED_PREFIX_KEY.to_vec(),
            value: prefix.as_bytes().to_vec(),
        },
        KvOp::Put {
            cf: Cf::Meta,
            key: HISTORY_KEY.to_vec(),
            value: value.to_string().into_bytes(),
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::memory::MemoryStore;

    fn at(revision: i64) -> History {
        History {
            epoch: Some("e1".into()),
            cluster_id: 7,
            revision,
        }
    }

    #[test]
    fn a_store_is_synchronised_only_with_the_prefix_it_recorded() {
        let store = MemoryStore::default();
        assert!(!synced_with(&store, "/a/"));
        assert_eq!(history(&store, "/a/"), None);
        record(&store, "/a/", &at(5)).unwrap();
        assert!(synced_with(&store, "/a/"));
        assert!(!synced_with(&store, "/b/"), "another fleet's prefix");
        assert_eq!(history(&store, "/a/"), Some(at(5)));
        assert_eq!(history(&store, "/b/"), None, "another fleet's history");
        record(&store, "/a/", &at(9)).unwrap();
        assert_eq!(history(&store, "/a/"), Some(at(9)));
    }

    #[test]
    fn an_unreadable_history_is_none() {
        let store = MemoryStore::default();
        let op = KvOp::Put {
            cf: Cf::Meta,
            key: HISTORY_KEY.to_vec(),
            value: b"{\"prefix\": \"/a/\", \"epoch\": 3}".to_vec(),
        };
        store.write(vec![op]).unwrap();
        assert_eq!(history(&store, "/a/"), None);
    }
}
