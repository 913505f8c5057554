//! The record hint a store keeps from its run's record prefetch ([`Table::locate_record`]):
//! taken only when the record is the block's, never applied to another block's record or to a
//! free one.

use super::*;

/// One store of `at` (hint included) through [`Table::add_each`].
fn add_located(table: &Table, at: Located, id: u32, bits: u8) -> Added {
    let mut out = KEPT;
    table.add_each(
        &mut table.writer(),
        table.shard_at(at),
        &[(at, id, bits)],
        |it| it,
        |_, a, _| out = a,
    );
    out
}

fn hinted(table: &Table, key: u64) -> Located {
    let mut at = table.locate(key);
    table.locate_record(&table.reading(), &mut at);
    at
}

fn keys_of_shard(table: &Table, shard: usize, n: usize) -> Vec<u64> {
    (1..)
        .map(mix64)
        .filter(|&k| table.shard_no(k) == shard)
        .take(n)
        .collect()
}

#[test]
fn a_store_hinted_at_its_own_record_joins_that_block() {
    let table = Table::new();
    let keys = keys_of_shard(&table, 3, 200);
    for &k in &keys {
        assert!(add_located(&table, hinted(&table, k), 1, DEVICE).new_block);
    }
    let mut hits = 0;
    for &k in &keys {
        let at = hinted(&table, k);
        hits += usize::from(at.record != NO_RECORD);
        assert_eq!(add_located(&table, at, 2, DISK), JOINED);
        assert_eq!(add_located(&table, at, 2, DISK), REPEATED);
        assert_eq!(table.read(k).holder_bits(k, 1), DEVICE);
        assert_eq!(table.read(k).holder_bits(k, 2), DISK);
    }
    assert!(hits > keys.len() / 2, "{hits} hints of {}", keys.len());
    read_lock(&table.shards[3]).blocks.check();
}

#[test]
fn a_hint_naming_another_live_block_falls_back_to_the_probe() {
    let table = Table::new();
    let [a, b] = keys_of_shard(&table, 5, 2)[..] else {
        unreachable!()
    };
    add_located(&table, table.locate(a), 1, DEVICE);
    add_located(&table, table.locate(b), 2, DEVICE);
    let wrong = Located {
        record: hinted(&table, b).record,
        ..table.locate(a)
    };
    assert_ne!(wrong.record, NO_RECORD);
    assert_eq!(add_located(&table, wrong, 3, CPU_LOCAL), JOINED);
    assert_eq!(
        table.read(a).holder_bits(a, 3),
        CPU_LOCAL,
        "the named block"
    );
    assert_eq!(table.read(b).holder_bits(b, 3), 0, "not the hinted one");
    assert_eq!(table.read(b).value(b), make_entry(2, DEVICE));
}

#[test]
fn a_hint_naming_a_free_record_that_holds_the_key_falls_back_to_the_probe() {
    let table = Table::new();
    // A free record's key field links the free list: the first record freed in a shard reads
    // as key 0. A store of key 0 hinted at it must not take it for the block.
    let shard = table.shard_no(0);
    let gone = keys_of_shard(&table, shard, 1)[0];
    add_located(&table, table.locate(gone), 1, DEVICE);
    let stale = hinted(&table, gone);
    assert_ne!(stale.record, NO_RECORD);
    assert_eq!(table.remove(gone, 1, DEVICE), GONE_BLOCK);
    let at = Located {
        record: stale.record,
        ..table.locate(0)
    };
    let fresh = Added {
        new_holder: true,
        new_block: true,
        repeat: false,
    };
    assert_eq!(add_located(&table, at, 2, DISK), fresh);
    assert_eq!(
        table.read(0).value(0),
        make_entry(2, DISK),
        "found by a probe"
    );
    assert_eq!(table.read(gone).value(gone), 0);
    let shard = read_lock(&table.shards[shard]);
    shard.blocks.check();
    assert_eq!(shard.len(), 1);
}
