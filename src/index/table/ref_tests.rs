//! Block references handed to reverse lists: valid while the block lives, checked afterwards.

use super::*;

/// One store through [`Table::add_group`].
fn add(table: &Table, key: u64, id: u32, bits: u8) -> (Added, Option<BlockRef>) {
    let mut out = (KEPT, None);
    table.add_group(
        &mut table.writer(),
        table.shard_no(key),
        &[(key, id, bits)],
        |_, a, r| out = (a, r),
    );
    out
}

#[test]
fn references_survive_growth_and_go_stale_when_the_block_goes() {
    let table = Table::new();
    let keys: Vec<u64> = (0..20_000u64).map(|i| mix64(i + 1)).collect();
    let refs: Vec<BlockRef> = keys
        .iter()
        .map(|&k| add(&table, k, 1, DEVICE).1.expect("joined"))
        .collect();
    // A second holder on every other block spills those blocks into the arena.
    for &k in keys.iter().step_by(2) {
        let (added, r) = add(&table, k, 2, CPU_LOCAL);
        assert_eq!(added, JOINED);
        assert!(r.is_some());
    }
    for (&k, &r) in keys.iter().zip(&refs) {
        assert_eq!(table.held_key(r, 1), Some(k));
    }
    assert_eq!(
        add(&table, keys[0], 1, DISK),
        (KEPT, None),
        "no new pair, no ref"
    );
    assert_eq!(
        table.held_key(refs[1], 2),
        None,
        "holder 2 is not on odd blocks"
    );
    // Clearing through a reference removes exactly that pair.
    assert_eq!(table.clear_at(refs[0], 1), Some((keys[0], GONE_HOLDER)));
    assert_eq!(table.clear_at(refs[0], 1), None);
    assert_eq!(table.read(keys[0]).holder_bits(keys[0], 2), CPU_LOCAL);
    assert_eq!(table.clear_at(refs[1], 1), Some((keys[1], GONE_BLOCK)));
    assert_eq!(
        table.held_key(refs[1], 1),
        None,
        "stale after the block went"
    );
    assert_eq!(table.remove(keys[3], 1, ALL_TIERS), GONE_BLOCK);
    assert_eq!(table.held_key(refs[3], 1), None);
}

#[test]
fn a_reused_record_does_not_answer_for_its_old_holder() {
    let table = Table::new();
    let (_, old) = add(&table, 7, 1, DEVICE);
    let old = old.expect("joined");
    assert_eq!(table.remove(7, 1, DEVICE), GONE_BLOCK);
    // Find a key of the same shard, which takes the freed record.
    let same_shard = (8u64..)
        .find(|&k| table.shard_no(k) == table.shard_no(7))
        .expect("a key");
    let (_, new) = add(&table, same_shard, 2, DISK);
    assert_eq!(new, Some(old), "the freed record is reused");
    assert_eq!(table.held_key(old, 1), None);
    assert_eq!(table.held_key(old, 2), Some(same_shard));
    assert_eq!(table.clear_at(old, 1), None);
    assert_eq!(table.read(same_shard).holder_bits(same_shard, 2), DISK);
}

#[test]
fn a_group_applies_in_order_under_one_lock() {
    let table = Table::new();
    // Shards are picked by a seeded hash: search far enough to always find six keys of one.
    let keys: Vec<u64> = (1..1_000_000u64)
        .filter(|&k| table.shard_no(k) == 5)
        .take(6)
        .collect();
    let mut items: Vec<(u64, u32, u8)> = keys.iter().map(|&k| (k, 1, DEVICE)).collect();
    // The same pair twice and a second holder on the first block.
    items.push((keys[0], 1, DISK));
    items.push((keys[0], 2, CPU_LOCAL));
    let mut seen = Vec::new();
    table.add_group(&mut table.writer(), 5, &items, |it, added, r| {
        seen.push((it, added, r.is_some()))
    });
    let fresh = Added {
        new_holder: true,
        new_block: true,
        repeat: false,
    };
    assert!(seen[..6].iter().all(|s| s.1 == fresh && s.2));
    assert_eq!(seen[6], (items[6], KEPT, false));
    assert_eq!(seen[7], (items[7], JOINED, true));
    assert_eq!(table.read(keys[0]).holder_bits(keys[0], 1), DEVICE | DISK);
    assert_eq!(table.read(keys[0]).holder_bits(keys[0], 2), CPU_LOCAL);
}
