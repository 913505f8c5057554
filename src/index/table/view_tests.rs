//! The fences of the lock-free reads (see `view`): a `Reading` of another table is refused, a
//! panic inside a write section leaves the table answering no block (and its writer still
//! working), and the shard a store grows keeps its write section free of the rehash (checked by
//! the debug assertion in `Shard::add_at` on every growth these tests make).

use super::*;

fn add(table: &Table, key: u64, id: u32) {
    let mut w = table.writer();
    table.add_group(
        &mut w,
        table.shard_no(key),
        &[(key, id, DEVICE)],
        |_, _, _| {},
    );
}

/// Block `key`'s value through the lock-free lookup (0: absent).
fn value_of(table: &Table, key: u64) -> u32 {
    let reading = table.reading();
    let mut at = table.locate(key);
    table
        .lookup(&reading, &mut at, |_, _| false, &mut Vec::new())
        .0
}

#[test]
#[should_panic(expected = "another table's Reading")]
fn a_reading_of_another_table_is_refused() {
    let (a, b) = (Table::new(), Table::new());
    add(&a, mix64(7), 1);
    let reading = b.reading();
    let mut at = a.locate(mix64(7));
    a.lookup(&reading, &mut at, |_, _| false, &mut Vec::new());
}

#[test]
fn a_panic_inside_a_write_section_leaves_the_table_answering_no_block() {
    let table = Table::new();
    let (held, other) = (mix64(7), mix64(9));
    add(&table, held, 1);
    assert_ne!(value_of(&table, held), 0);
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut w = table.writer();
        let shard = table.shard_no(other);
        table.add_group(&mut w, shard, &[(other, 2, DEVICE)], |_, _, _| {
            panic!("a bug inside the section")
        });
    }));
    assert!(unwound.is_err());
    assert_eq!(value_of(&table, held), 0, "a broken table answers no block");
    assert_eq!(value_of(&table, other), 0);
    // Its writer goes on (no lock or section is left open), and reads stay empty.
    let third = mix64(11);
    add(&table, third, 3);
    assert_eq!(value_of(&table, third), 0);
}

#[test]
fn growth_keeps_every_block_readable() {
    let table = Table::new();
    let keys: Vec<u64> = (1..=50_000u64).map(mix64).collect();
    for chunk in keys.chunks(97) {
        let mut w = table.writer();
        for &k in chunk {
            table.add_group(&mut w, table.shard_no(k), &[(k, 1, DEVICE)], |_, _, _| {});
        }
    }
    assert!(keys.iter().all(|&k| value_of(&table, k) != 0));
}

#[test]
fn readers_never_take_the_sets_writer_mutex() {
    let table = Table::new();
    let key = mix64(21);
    add(&table, key, 1);
    add(&table, key, 2);
    let (value, _) = {
        let reading = table.reading();
        let mut at = table.locate(key);
        table.lookup(&reading, &mut at, |_, _| false, &mut Vec::new())
    };
    assert!(!is_inline(value), "two holders: a set value");
    // The writer's mutex held for the whole read: a reader that took it would never finish.
    let writer = table.sets.writer();
    let entries = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let reading = table.reading();
            let mut at = table.locate(key);
            let mut out = Vec::new();
            table.lookup(&reading, &mut at, |_, _| true, &mut out);
            out
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !reader.is_finished() {
            assert!(
                std::time::Instant::now() < deadline,
                "a reader waits for the writer's mutex"
            );
            std::thread::yield_now();
        }
        reader.join().expect("reader")
    });
    drop(writer);
    assert_eq!(entries.len(), 2);
}

/// The lock order's check (`lock_order`) fires: a shard lock taken under the set lists' lock.
#[test]
#[should_panic(expected = "keeps that lock innermost")]
fn a_shard_lock_under_the_lists_lock_breaks_the_lock_order() {
    let table = Table::new();
    let _lists = table.sets.lists();
    let _ = table.read(mix64(3)).value(mix64(3));
}

/// A key's shard (I8): an odd key names it in its top bits, an even key takes it from its slot
/// hash; either way the table finds the key where it put it.
#[test]
fn an_odd_key_names_its_shard_and_an_even_key_takes_its_slot_hashs() {
    let table = Table::new();
    for i in 1..2_000u64 {
        let key = mix64(i);
        let hash = blocks::slot_hash(key, table.slot_seed);
        let shard = table.shard_no(key);
        if key & 1 == 1 {
            assert_eq!(shard, (key >> (64 - SHARD_BITS)) as usize);
        } else {
            assert_eq!(shard, shard_of_hash(hash));
        }
        add(&table, key, 1);
        assert_ne!(value_of(&table, key), 0);
    }
}
