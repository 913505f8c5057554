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
    table.lookup(&reading, at, |_, _| false, &mut Vec::new()).0
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
