//! The packed layout of the RocksDB store (`packed`) against the memory store, which keeps every
//! record as it is: the same writes must read back the same through scans and gets, with the
//! merge operands still in the memtable, folded by a flush and by a compaction, and after a
//! reopen; and schema 3's records stored one by one move into their buckets.

use super::memory::MemoryStore;
use super::migrations;
use super::rocks::RocksStore;
use crate::storage::bulk::tests::all;
use crate::storage::{Cf, KvOp, KvStore, prefix_end};
use crate::test_rng::Rng;

/// A pair key in a small space: two contexts, three holders, blocks sharing their top bytes so
/// that many fall in one bucket.
fn pair_key(rng: &mut Rng) -> Vec<u8> {
    let mut k = vec![rng.below(2) as u8; 8];
    k.extend_from_slice(&(rng.below(3) as u32).to_be_bytes());
    let block = ((rng.below(3) as u64) << 48) | rng.below(40) as u64;
    k.extend_from_slice(&block.to_be_bytes());
    k
}

fn alias_key(rng: &mut Rng) -> Vec<u8> {
    let mut k = vec![rng.below(2) as u8; 8];
    k.extend_from_slice(&(((rng.below(2) as u64) << 48) | rng.below(60) as u64).to_be_bytes());
    k
}

fn random_ops(rng: &mut Rng, n: usize) -> Vec<KvOp> {
    (0..n)
        .map(|_| {
            let (cf, key) = if rng.below(2) == 0 {
                (Cf::Pairs, pair_key(rng))
            } else {
                (Cf::Aliases, alias_key(rng))
            };
            match rng.below(10) {
                0..=5 => {
                    let value = vec![rng.below(256) as u8; rng.below(12)];
                    KvOp::Put { cf, key, value }
                }
                6..=8 => KvOp::Delete { cf, key },
                // Whole holders and whole contexts, as checkpoints and forgets delete them.
                _ => {
                    let holder = cf == Cf::Pairs && rng.below(2) == 0;
                    let from = key[..if holder { 12 } else { 8 }].to_vec();
                    let to = prefix_end(&from);
                    KvOp::DeleteRange { cf, from, to }
                }
            }
        })
        .collect()
}

fn same(rocks: &RocksStore, memory: &MemoryStore, rng: &mut Rng, when: &str) {
    compare(rocks, memory, rng, when, false)
}

/// With `any_order`, the records are compared as sets: records not moved into their buckets
/// yet read where they are stored, among the buckets (only the migration's own batches ever
/// see that).
fn compare(rocks: &RocksStore, memory: &MemoryStore, rng: &mut Rng, when: &str, any_order: bool) {
    let read = |store: &dyn KvStore, cf: Cf| {
        let mut records = all(store, cf);
        if any_order {
            records.sort();
        }
        records
    };
    for cf in [Cf::Pairs, Cf::Aliases] {
        let (r, m) = (read(rocks, cf), read(memory, cf));
        assert!(
            r == m,
            "{} {when}: {} records, {} expected",
            cf.name(),
            r.len(),
            m.len()
        );
        for _ in 0..20 {
            let key = if cf == Cf::Pairs {
                pair_key(rng)
            } else {
                alias_key(rng)
            };
            assert_eq!(
                rocks.get(cf, &key).unwrap(),
                memory.get(cf, &key).unwrap(),
                "{} get {when}",
                cf.name()
            );
            // Prefixes shorter than a bucket's key, as long, and longer.
            for len in [8, 12, 14, 17, key.len()] {
                let prefix = &key[..len.min(key.len())];
                let scan = |store: &dyn KvStore| {
                    let mut out = Vec::new();
                    store
                        .scan_prefix(cf, prefix, &mut |k, v| {
                            out.push((k.to_vec(), v.to_vec()));
                            Ok(())
                        })
                        .unwrap();
                    if any_order {
                        out.sort();
                    }
                    out
                };
                assert_eq!(
                    scan(rocks),
                    scan(memory),
                    "{} prefix {len} {when}",
                    cf.name()
                );
            }
        }
    }
}

#[test]
fn packed_records_read_back_like_plain_ones_through_flushes_compactions_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryStore::new();
    let mut rng = Rng(7);
    for round in 0..6 {
        let rocks = RocksStore::open(dir.path()).unwrap();
        for _ in 0..30 {
            let ops = random_ops(&mut rng, 40);
            memory.write(ops.clone()).unwrap();
            rocks.write(ops).unwrap();
        }
        same(
            &rocks,
            &memory,
            &mut rng,
            &format!("round {round}, merges unfolded"),
        );
        if round % 2 == 1 {
            rocks.compact().unwrap();
            same(
                &rocks,
                &memory,
                &mut rng,
                &format!("round {round}, compacted"),
            );
        }
        // Dropped: the memtable's operands are flushed (folded partly) or replayed next round.
    }
    assert!(!all(&memory, Cf::Pairs).is_empty() && !all(&memory, Cf::Aliases).is_empty());
    // Deleting everything, as a replica's clear does.
    let rocks = RocksStore::open(dir.path()).unwrap();
    let clear: Vec<KvOp> = [Cf::Pairs, Cf::Aliases]
        .into_iter()
        .map(|cf| KvOp::DeleteRange {
            cf,
            from: Vec::new(),
            to: vec![0xff; 64],
        })
        .collect();
    rocks.write(clear).unwrap();
    assert!(all(&rocks, Cf::Pairs).is_empty() && all(&rocks, Cf::Aliases).is_empty());
}

#[test]
fn a_bucket_whose_records_are_all_removed_is_dropped_at_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let rocks = RocksStore::open(dir.path()).unwrap();
    let mut rng = Rng(3);
    let (kept, gone) = (pair_key(&mut rng), {
        let mut k = pair_key(&mut rng);
        k[12] ^= 0x80; // another bucket
        k
    });
    for key in [&kept, &gone] {
        rocks
            .write(vec![KvOp::Put {
                cf: Cf::Pairs,
                key: key.clone(),
                value: b"v".to_vec(),
            }])
            .unwrap();
    }
    rocks.compact().unwrap();
    rocks
        .write(vec![KvOp::Delete {
            cf: Cf::Pairs,
            key: gone.clone(),
        }])
        .unwrap();
    rocks.compact().unwrap();
    // Compacted twice: once folds the removal into an empty value, the next drops it (which
    // of the two compactions does both depends on RocksDB's levels).
    rocks.compact().unwrap();
    assert_eq!(rocks.stored_keys(Cf::Pairs), [kept[..14].to_vec()]);
    assert_eq!(all(&rocks, Cf::Pairs), [(kept, b"v".to_vec())]);
}

#[test]
fn a_range_delete_that_would_cut_a_bucket_is_refused_naming_the_column_family() {
    let dir = tempfile::tempdir().unwrap();
    let rocks = RocksStore::open(dir.path()).unwrap();
    let err = rocks
        .write(vec![KvOp::DeleteRange {
            cf: Cf::Pairs,
            from: vec![0; 16],
            to: vec![1; 16],
        }])
        .unwrap_err();
    assert!(err.to_string().contains("pairs"), "{err}");
    // A key that would read as a bucket cannot be written as a plain record either.
    let err = rocks
        .write(vec![KvOp::Put {
            cf: Cf::Aliases,
            key: vec![0; 10],
            value: b"v".to_vec(),
        }])
        .unwrap_err();
    assert!(err.to_string().contains("aliases"), "{err}");
}

/// Write `n` schema 3 records of keys not written yet, as they are, to both stores.
fn plain_records(rocks: &RocksStore, memory: &MemoryStore, rng: &mut Rng, n: usize) {
    let mut written = 0;
    while written < n {
        let (cf, key) = if rng.below(2) == 0 {
            (Cf::Pairs, pair_key(rng))
        } else {
            (Cf::Aliases, alias_key(rng))
        };
        if memory.get(cf, &key).unwrap().is_some() {
            continue;
        }
        let value = vec![rng.below(256) as u8; 1 + rng.below(8)];
        rocks.put_stored(cf, &key, &value);
        memory.write(vec![KvOp::Put { cf, key, value }]).unwrap();
        written += 1;
    }
}

#[test]
fn schema_3_records_move_into_their_buckets_and_read_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let memory = MemoryStore::new();
    let mut rng = Rng(11);
    {
        let rocks = RocksStore::open(dir.path()).unwrap();
        rocks.write(vec![migrations::version_op(3)]).unwrap();
        plain_records(&rocks, &memory, &mut rng, 150);
        // A record of another length stays where it is.
        rocks.put_stored(Cf::Pairs, &[0, 0, 0, 9], b"odd");
        memory
            .write(vec![KvOp::Put {
                cf: Cf::Pairs,
                key: vec![0, 0, 0, 9],
                value: b"odd".to_vec(),
            }])
            .unwrap();
        // Read as they are before the move.
        same(&rocks, &memory, &mut rng, "before the move");
        assert_eq!(rocks.move_plain_in_batches_of(7), 150);
        // What a run killed between two batches leaves: buckets, and records still as they
        // are (here even between the buckets).
        plain_records(&rocks, &memory, &mut rng, 150);
        compare(&rocks, &memory, &mut rng, "half moved", true);
    }
    let rocks = RocksStore::open(dir.path()).unwrap();
    assert_eq!(migrations::migrate_to(&rocks, "test", 4).unwrap(), 3);
    assert_eq!(migrations::read_version(&rocks).unwrap(), Some(4));
    same(&rocks, &memory, &mut rng, "migrated");
    for cf in [Cf::Pairs, Cf::Aliases] {
        let stored = rocks.stored_keys(cf);
        let bucket = if cf == Cf::Pairs { 14 } else { 10 };
        assert!(
            stored.iter().all(|k| k.len() == bucket || k.len() == 4),
            "{}: every record of the full length is in a bucket",
            cf.name()
        );
        assert!(stored.len() < all(&rocks, cf).len(), "{}", cf.name());
    }
    assert_eq!(rocks.move_plain_in_batches_of(7), 0, "nothing left to move");
    rocks.compact().unwrap();
    same(&rocks, &memory, &mut rng, "migrated and compacted");
}

#[test]
fn a_bucket_that_is_not_whole_entries_reads_as_corrupt_data_of_its_column_family() {
    let dir = tempfile::tempdir().unwrap();
    let rocks = RocksStore::open(dir.path()).unwrap();
    let mut bucket = vec![0u8; 14];
    bucket[13] = 1;
    // A whole entry, then a tail that is not one.
    rocks.put_stored(Cf::Pairs, &bucket, &[0, 0, 0, 0, 0, 1, 1, 7, 0, 0]);
    let err = rocks
        .scan_prefix(Cf::Pairs, &bucket[..8], &mut |_, _| Ok(()))
        .unwrap_err();
    assert!(
        err.is_corruption() && err.to_string().contains("pairs"),
        "{err}"
    );
    let mut key = bucket.clone();
    key.extend_from_slice(&[0, 0, 0, 0, 0, 9]);
    assert!(rocks.get(Cf::Pairs, &key).unwrap_err().is_corruption());
}
