//! The RocksDB bulk load against a real store in a temporary directory.

use super::rocks::RocksStore;
use super::rocks_bulk::STAGING_DIR;
use crate::storage::bulk::tests::all;
use crate::storage::{Cf, KvOp, KvStore, StorageError};

fn key(i: u32) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

#[test]
fn sorted_records_are_ingested_and_survive_a_reopen_without_a_wal() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = RocksStore::open(dir.path()).unwrap();
        // An older record of the same key, in the memtable: the ingested one is newer.
        store
            .write(vec![KvOp::Put {
                cf: Cf::Pairs,
                key: key(5),
                value: b"old".to_vec(),
            }])
            .unwrap();
        store
            .bulk_load(&mut |sink| {
                for i in 0..10_000 {
                    sink.put(Cf::Pairs, &key(i), b"p")?;
                }
                sink.put(Cf::Aliases, b"a", b"1")?;
                sink.put(Cf::Aliases, b"b", b"2")
            })
            .unwrap();
        let pairs = all(&store, Cf::Pairs);
        assert_eq!(pairs.len(), 10_000);
        assert_eq!(pairs[5].1, b"p");
        assert!(
            !dir.path().join(STAGING_DIR).exists(),
            "staging directory removed"
        );
    }
    let store = RocksStore::open(dir.path()).unwrap();
    assert_eq!(all(&store, Cf::Pairs).len(), 10_000);
    assert_eq!(
        all(&store, Cf::Aliases),
        [
            (b"a".to_vec(), b"1".to_vec()),
            (b"b".to_vec(), b"2".to_vec())
        ]
    );
    assert!(all(&store, Cf::Holders).is_empty());
}

#[test]
fn records_out_of_order_are_all_kept_and_the_later_put_wins() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    store
        .bulk_load(&mut |sink| {
            for i in 0..100 {
                sink.put(Cf::Pairs, &key(i), b"first")?;
            }
            sink.put(Cf::Pairs, &key(50), b"again")?;
            sink.put(Cf::Pairs, &key(7), b"again")?;
            sink.put(Cf::Pairs, &key(200), b"new")?;
            sink.put(Cf::Watermarks, b"w", b"1")
        })
        .unwrap();
    let pairs = all(&store, Cf::Pairs);
    assert_eq!(pairs.len(), 101);
    let value = |i: u32| &pairs.iter().find(|(k, _)| *k == key(i)).unwrap().1;
    assert_eq!(value(50), b"again");
    assert_eq!(value(7), b"again");
    assert_eq!(value(8), b"first");
    assert_eq!(value(200), b"new");
    assert_eq!(all(&store, Cf::Watermarks).len(), 1);
}

#[test]
fn a_failed_feed_leaves_no_staged_files_and_ingests_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = RocksStore::open(dir.path()).unwrap();
    let failed = store.bulk_load(&mut |sink| {
        sink.put(Cf::Pairs, &key(1), b"x")?;
        Err(StorageError::Io("the peer went away".into()))
    });
    assert!(failed.is_err());
    assert!(all(&store, Cf::Pairs).is_empty());
    assert!(!dir.path().join(STAGING_DIR).exists());
}

#[test]
fn a_stale_staging_directory_from_a_killed_load_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    drop(RocksStore::open(dir.path()).unwrap());
    let staging = dir.path().join(STAGING_DIR);
    std::fs::create_dir_all(&staging).unwrap();
    std::fs::write(staging.join("pairs.sst"), b"half a file").unwrap();
    // The database opens with it there (RocksDB ignores a directory it did not make).
    let store = RocksStore::open(dir.path()).unwrap();
    store
        .bulk_load(&mut |sink| sink.put(Cf::Pairs, &key(1), b"x"))
        .unwrap();
    assert_eq!(all(&store, Cf::Pairs).len(), 1);
}
