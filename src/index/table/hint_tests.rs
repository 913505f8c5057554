//! The record hint a walk keeps from its record prefetch ([`Table::locate_record`]): a
//! shortcut that never answers for another block.

use super::*;

fn add(table: &Table, key: u64, id: u32, bits: u8) {
    table.add_group(
        &mut table.writer(),
        table.shard_no(key),
        &[(key, id, bits)],
        |_, _, _| {},
    );
}

fn value(table: &Table, at: Located) -> u32 {
    let reading = table.reading();
    table
        .lookup(&reading, &mut { at }, |_, _| false, &mut Vec::new())
        .0
}

/// `at` with its record hint taken, as the walk takes it a few blocks ahead.
fn hinted(table: &Table, key: u64) -> Located {
    let mut at = table.locate(key);
    table.locate_record(&table.reading(), &mut at);
    at
}

#[test]
fn a_hint_names_the_record_and_the_lookup_agrees_with_a_probe() {
    let table = Table::new();
    let keys: Vec<u64> = (1..=5_000u64).map(mix64).collect();
    for (i, &k) in keys.iter().enumerate() {
        add(&table, k, (i % 7) as u32, DEVICE);
    }
    let mut hits = 0;
    for &k in &keys {
        let at = hinted(&table, k);
        hits += usize::from(at.record != NO_RECORD);
        assert_eq!(value(&table, at), value(&table, table.locate(k)), "{k:#x}");
        assert_ne!(value(&table, at), 0);
    }
    assert!(hits > keys.len() * 9 / 10, "{hits} hints of {}", keys.len());
    // Absent keys answer 0, hint or not.
    for k in (10_001..10_200u64).map(mix64) {
        assert_eq!(value(&table, hinted(&table, k)), 0);
    }
}

#[test]
fn a_stale_or_wrong_hint_falls_back_to_the_probe() {
    let table = Table::new();
    let gone = mix64(1);
    add(&table, gone, 1, DEVICE);
    let stale = hinted(&table, gone);
    assert_ne!(stale.record, NO_RECORD);
    assert_eq!(table.remove(gone, 1, DEVICE), GONE_BLOCK);
    // Another block of the same shard takes the freed record.
    let shard = table.shard_no(gone);
    let reuser = (2..)
        .map(mix64)
        .find(|&k| table.shard_no(k) == shard)
        .expect("a key of the same shard");
    add(&table, reuser, 2, CPU_LOCAL);
    assert_eq!(
        hinted(&table, reuser).record,
        stale.record,
        "the record was reused"
    );
    assert_eq!(value(&table, stale), 0, "the old key is absent");
    // A live block looked up with another live block's record as its hint.
    add(&table, gone, 3, DISK);
    let wrong = Located {
        record: stale.record,
        ..table.locate(gone)
    };
    assert_eq!(value(&table, wrong), make_entry(3, DISK));
    assert_eq!(
        value(&table, table.locate(reuser)),
        make_entry(2, CPU_LOCAL)
    );
}

/// Derived keys of one shard (odd, top bits `shard`), as a chain's segment has them.
fn segment_keys(shard: u64, n: u64) -> Vec<u64> {
    (1..=n)
        .map(|i| (mix64(i) >> 6) | (shard << 58) | 1)
        .collect()
}

#[test]
fn a_chain_stored_in_one_run_is_followed_record_by_record() {
    let table = Table::new();
    let keys = segment_keys(9, 40);
    assert!(keys.iter().all(|&k| table.shard_no(k) == 9));
    let items: Vec<_> = keys.iter().map(|&k| (k, 1, DEVICE)).collect();
    table.add_group(&mut table.writer(), 9, &items, |_, _, _| {});
    let reading = table.reading();
    // The first block's record as a lookup finds it: a prefetch's hint alone may name the
    // record of another key with the same slot tag.
    let mut before = table.locate(keys[0]);
    table.lookup(&reading, &mut before, |_, _| false, &mut Vec::new());
    assert_ne!(before.record, NO_RECORD);
    for &k in &keys[1..] {
        let mut at = table.locate(k);
        assert!(
            table.locate_record_after(&reading, &mut at, &before),
            "{k:#x} follows its predecessor's record"
        );
        assert_eq!(at.record, before.record + 1);
        assert_eq!(value(&table, at), make_entry(1, DEVICE));
        before = at;
    }
}

#[test]
fn a_guess_that_names_another_block_or_another_shard_falls_back_to_the_slots() {
    let table = Table::new();
    let keys = segment_keys(3, 3);
    for &k in &keys {
        add(&table, k, 1, DEVICE);
    }
    // Stored in the order 0, 1, 2: block 2 does not follow block 0's record.
    let reading = table.reading();
    let first = hinted(&table, keys[0]);
    let mut at = table.locate(keys[2]);
    assert!(!table.locate_record_after(&reading, &mut at, &first));
    assert_eq!(
        at.record,
        hinted(&table, keys[2]).record,
        "found by its slot"
    );
    assert_eq!(value(&table, at), make_entry(1, DEVICE));
    // A predecessor in another shard is never followed, even where its record + 1 is ours.
    let other = segment_keys(4, 1)[0];
    add(&table, other, 2, DISK);
    let elsewhere = Located {
        record: first.record,
        ..hinted(&table, other)
    };
    let mut at = table.locate(keys[1]);
    assert!(!table.locate_record_after(&reading, &mut at, &elsewhere));
    assert_eq!(value(&table, at), make_entry(1, DEVICE));
    // The block after the last record: nothing there, and nothing found.
    let last = hinted(&table, keys[2]);
    let mut absent = table.locate(segment_keys(3, 9)[8]);
    assert!(!table.locate_record_after(&reading, &mut absent, &last));
    assert_eq!(value(&table, absent), 0);
}
