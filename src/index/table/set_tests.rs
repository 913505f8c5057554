//! Holder sets: entries, outcomes, interning, refcounts, transitions and id reuse.

use std::collections::{BTreeMap, HashMap};

use super::sets::set_id;
use super::*;

fn add(t: &Table, key: u64, id: u32, bits: u8) -> Added {
    let mut out = KEPT;
    t.add_group(
        &mut t.writer(),
        t.shard_no(key),
        &[(key, id, bits)],
        |_, a, _| out = a,
    );
    out
}

fn entries(t: &Table, key: u64) -> Vec<(u32, u8)> {
    let mut v = Vec::new();
    t.read(key)
        .visit(key, |e| v.push((entry_id(e), entry_bits(e))));
    v.sort_unstable();
    v
}

fn value(t: &Table, key: u64) -> u32 {
    t.read(key).value(key)
}

/// Every live block value (tests).
fn values(t: &Table) -> Vec<u32> {
    t.shards
        .iter()
        .flat_map(|s| {
            let mut v = Vec::new();
            read_lock(s).blocks.for_each(|_, val| v.push(val));
            v
        })
        .collect()
}

/// Refcounts equal the blocks naming each set, and only named sets are alive.
fn check_refs(t: &Table) {
    let mut named: HashMap<u32, u32> = HashMap::new();
    for val in values(t) {
        if !is_inline(val) {
            *named.entry(val).or_default() += 1;
        }
    }
    for (&val, &n) in &named {
        assert_eq!(t.sets.refs(val), n, "refs of set {}", set_id(val));
    }
    assert_eq!(t.sets.live(), named.len(), "no unnamed set stays alive");
}

#[test]
fn inline_then_spill_then_back() {
    let t = Table::new();
    let new = Added {
        new_holder: true,
        new_block: true,
        repeat: false,
    };
    assert_eq!(add(&t, 7, 0, DEVICE), new);
    assert_eq!(add(&t, 7, 0, DISK), KEPT);
    assert!(is_inline(value(&t, 7)), "one holder stays inline");
    assert_eq!(add(&t, 7, 1, CPU_SHARE), JOINED);
    assert_eq!(add(&t, 7, 2, CPU_LOCAL), JOINED);
    assert_eq!(add(&t, 7, 3, DEVICE), JOINED);
    assert_eq!(
        entries(&t, 7),
        vec![
            (0, DEVICE | DISK),
            (1, CPU_SHARE),
            (2, CPU_LOCAL),
            (3, DEVICE)
        ]
    );
    check_refs(&t);
    assert_eq!(t.sets.live(), 1, "intermediate sets were freed");
    assert_eq!(t.remove(7, 0, DEVICE), Removed::default());
    assert_eq!(t.remove(7, 0, DISK), GONE_HOLDER);
    assert_eq!(t.remove(7, 2, ALL_TIERS), GONE_HOLDER);
    assert_eq!(entries(&t, 7), vec![(1, CPU_SHARE), (3, DEVICE)]);
    check_refs(&t);
    assert_eq!(t.remove(7, 9, ALL_TIERS), Removed::default());
    assert_eq!(t.remove(7, 1, CPU_SHARE), GONE_HOLDER);
    assert!(is_inline(value(&t, 7)), "back to inline at one holder");
    assert_eq!(t.sets.live(), 0);
    assert_eq!(t.remove(7, 3, DEVICE), GONE_BLOCK);
    assert_eq!(t.read(7).len(), 0);
    assert!(!t.read(7).visit(7, |_| {}));
}

#[test]
fn a_store_of_bits_already_held_is_a_repeat() {
    let t = Table::new();
    add(&t, 7, 0, DEVICE);
    assert_eq!(add(&t, 7, 0, DEVICE), REPEATED, "inline");
    assert_eq!(add(&t, 7, 0, DISK), KEPT, "a new tier is no repeat");
    add(&t, 7, 1, CPU_LOCAL);
    assert_eq!(add(&t, 7, 1, CPU_LOCAL), REPEATED, "in a set");
    assert_eq!(add(&t, 7, 0, DEVICE | DISK), REPEATED);
    // The same repeat again goes through the transition cache.
    assert_eq!(add(&t, 7, 1, CPU_LOCAL), REPEATED, "cached transition");
    assert_eq!(add(&t, 7, 1, DISK), KEPT);
    assert_eq!(
        entries(&t, 7),
        vec![(0, DEVICE | DISK), (1, CPU_LOCAL | DISK)]
    );
    check_refs(&t);
}

#[test]
fn second_inline_entry_updates_in_place() {
    let t = Table::new();
    add(&t, 1, 5, DEVICE);
    add(&t, 1, 6, CPU_LOCAL);
    add(&t, 1, 6, DISK);
    assert_eq!(entries(&t, 1), vec![(5, DEVICE), (6, CPU_LOCAL | DISK)]);
    assert_eq!(t.remove(1, 6, CPU_LOCAL), Removed::default());
    assert_eq!(t.read(1).holder_bits(1, 6), DISK);
    assert_eq!(t.remove(1, 5, DEVICE), GONE_HOLDER);
    assert_eq!(entries(&t, 1), vec![(6, DISK)]);
    check_refs(&t);
}

#[test]
fn blocks_with_equal_entries_share_one_refcounted_set() {
    let t = Table::new();
    let keys: Vec<u64> = (1..=100).map(mix64).collect();
    for &k in &keys {
        add(&t, k, 1, DEVICE);
        add(&t, k, 2, CPU_LOCAL);
    }
    let v = value(&t, keys[0]);
    assert!(!is_inline(v));
    assert!(keys.iter().all(|&k| value(&t, k) == v), "one set value");
    assert_eq!(t.sets.refs(v), 100);
    assert_eq!(t.sets.live(), 1);
    // The same entries reached in another order are the same set.
    let other = mix64(1000);
    add(&t, other, 2, CPU_LOCAL);
    add(&t, other, 1, DEVICE);
    assert_eq!(value(&t, other), v);
    assert_eq!(t.sets.refs(v), 101);
    for &k in &keys[..50] {
        assert_eq!(t.remove(k, 2, CPU_LOCAL), GONE_HOLDER);
    }
    assert_eq!(t.sets.refs(v), 51);
    assert!(
        keys[..50]
            .iter()
            .all(|&k| value(&t, k) == make_entry(1, DEVICE))
    );
    check_refs(&t);
}

#[test]
fn bulk_stores_over_a_chain_move_every_block_to_one_set() {
    let t = Table::new();
    let chain: Vec<u64> = (0..2000u64).map(|i| mix64(i + 77)).collect();
    // Holders 0..8 join one after another, as engines announce a shared system prompt.
    for id in 0..8 {
        for s in 0..SHARDS {
            let group: Vec<(u64, u32, u8)> = chain
                .iter()
                .filter(|&&k| t.shard_no(k) == s)
                .map(|&k| (k, id, DEVICE))
                .collect();
            t.add_group(&mut t.writer(), s, &group, |_, a, r| {
                assert!(a.new_holder && r.is_some());
            });
        }
        let v = value(&t, chain[0]);
        assert!(chain.iter().all(|&k| value(&t, k) == v));
        check_refs(&t);
        assert!(t.sets.live() <= 1, "earlier sets are freed once unnamed");
    }
    assert_eq!(entries(&t, chain[9]).len(), 8);
    // A repeated store changes no set (the caller counts it), through the cache too.
    let before = value(&t, chain[0]);
    for &k in &chain {
        assert_eq!(add(&t, k, 3, DEVICE), REPEATED);
    }
    assert!(chain.iter().all(|&k| value(&t, k) == before));
    // Holder 3 adds a tier on the first half only: the set changes mid-chain.
    for &k in &chain[..1000] {
        assert_eq!(add(&t, k, 3, DISK), KEPT);
    }
    let (a, b) = (value(&t, chain[0]), value(&t, chain[1999]));
    assert_ne!(a, b);
    assert!(chain[..1000].iter().all(|&k| value(&t, k) == a));
    assert!(chain[1000..].iter().all(|&k| value(&t, k) == b));
    assert_eq!(t.read(chain[5]).holder_bits(chain[5], 3), DEVICE | DISK);
    check_refs(&t);
    // Leaving holder by holder, down to inline values and then no blocks.
    for id in 0..8 {
        for &k in &chain {
            let r = t.remove(k, id, ALL_TIERS);
            assert!(r.holder_gone);
            assert_eq!(r.block_gone, id == 7);
        }
        check_refs(&t);
    }
    assert_eq!(t.sets.live(), 0);
    assert!(values(&t).is_empty());
}

#[test]
fn joins_under_one_writer_move_references_exactly_when_a_set_changes_again() {
    let t = Table::new();
    let s = 9;
    let keys: Vec<u64> = (1..)
        .map(mix64)
        .filter(|&k| t.shard_no(k) == s)
        .take(50)
        .collect();
    let group = |id: u32, bits: u8, keys: &[u64]| -> Vec<(u64, u32, u8)> {
        keys.iter().map(|&k| (k, id, bits)).collect()
    };
    let mut w = t.writer();
    t.add_group(&mut w, s, &group(1, DEVICE, &keys), |_, _, _| {});
    t.add_group(&mut w, s, &group(2, DEVICE, &keys), |_, _, _| {});
    // Holder 3 moves every block to one new set; then, under the same writer, holder 4 moves
    // the first block on again, releasing that set once: it must keep the other 49 blocks'
    // references.
    let mut items = group(3, DEVICE, &keys);
    items.push((keys[0], 4, DISK));
    items.push((keys[1], 3, DEVICE));
    let mut outcomes = Vec::new();
    t.add_group(&mut w, s, &items, |_, a, _| outcomes.push(a));
    assert!(outcomes[..50].iter().all(|&a| a == JOINED));
    assert_eq!(outcomes[50..], [JOINED, REPEATED]);
    // Holder 5 joins the last 40 blocks (their moves pending), then holder 1 leaves the last
    // one under the same writer: the pending moves settle before that set is released.
    t.add_group(&mut w, s, &group(5, DEVICE, &keys[10..]), |_, _, _| {});
    assert!(t.remove_at(&mut w, keys[49], 1, DEVICE).0.holder_gone);
    drop(w);
    check_refs(&t);
    let three = value(&t, keys[1]);
    assert!(keys[1..10].iter().all(|&k| value(&t, k) == three));
    let five = value(&t, keys[10]);
    assert!(keys[10..49].iter().all(|&k| value(&t, k) == five));
    assert_eq!(entries(&t, keys[0]).len(), 4);
    assert_eq!(
        entries(&t, keys[49]),
        [(2, DEVICE), (3, DEVICE), (5, DEVICE)]
    );
    assert_eq!(
        t.sets.live(),
        4,
        "{{1,2,3}}, {{1,2,3,4}}, {{1,2,3,5}}, {{2,3,5}}"
    );
}

#[test]
fn freed_set_ids_are_reused_and_counted() {
    let t = Table::new();
    for id in 0..4 {
        add(&t, 10, id, DEVICE);
    }
    let ids = t.sets.ids();
    for id in 0..4 {
        t.remove(10, id, DEVICE);
    }
    assert_eq!(t.sets.live(), 0);
    let reading = t.reading();
    let mut out = Vec::new();
    let (_, reused) = t.lookup(&reading, &mut t.locate(10), |_, _| false, &mut out);
    // Other entries on another block take the freed ids again.
    for id in 10..14 {
        add(&t, 11, id, DISK);
    }
    assert_eq!(t.sets.ids(), ids, "no new ids while freed ones exist");
    assert!(
        t.lookup(&reading, &mut t.locate(11), |_, _| false, &mut out)
            .1
            > reused,
        "reuse is visible to readers"
    );
    assert_eq!(
        entries(&t, 11),
        (10..14).map(|id| (id, DISK)).collect::<Vec<_>>()
    );
    for id in 20..60 {
        add(&t, 11, id, DISK);
    }
    assert_eq!(entries(&t, 11).len(), 44);
    for id in (10..14).chain(20..59) {
        assert!(!t.remove(11, id, ALL_TIERS).block_gone);
    }
    assert_eq!(entries(&t, 11), vec![(59, DISK)]);
    check_refs(&t);
}

#[test]
fn clear_at_and_held_key_see_set_entries() {
    let t = Table::new();
    let mut refs = Vec::new();
    for k in 1..=3u64 {
        for id in 0..3 {
            t.add_group(
                &mut t.writer(),
                t.shard_no(k),
                &[(k, id, DEVICE)],
                |_, _, r| {
                    if id == 1 {
                        refs.push(r.expect("joined"));
                    }
                },
            );
        }
    }
    assert_eq!(t.held_key(refs[0], 1), Some(1));
    assert_eq!(t.clear_at(refs[0], 1), Some((1, GONE_HOLDER)));
    assert_eq!(t.held_key(refs[0], 1), None);
    assert_eq!(t.clear_at(refs[0], 1), None);
    assert_eq!(entries(&t, 1), vec![(0, DEVICE), (2, DEVICE)]);
    assert_eq!(value(&t, 1), value(&t, 1), "stable");
    assert_ne!(
        value(&t, 1),
        value(&t, 2),
        "different entries, different sets"
    );
    check_refs(&t);
}

/// Random stores and removes against a map model: entries, outcomes, refcounts, and one value
/// per distinct entry set.
#[test]
fn random_ops_match_a_model_and_equal_entries_share_a_value() {
    let t = Table::new();
    let mut model: HashMap<u64, BTreeMap<u32, u8>> = HashMap::new();
    let mut x = 12345u64;
    for step in 0..40_000u32 {
        x = mix64(x);
        let key = x % 64;
        let id = ((x >> 8) % 6) as u32;
        let bits = 1u8 << ((x >> 16) % 4);
        if (x >> 24) % 5 < 3 {
            let before = model.get(&key).and_then(|m| m.get(&id)).is_some();
            let had_block = model.contains_key(&key);
            *model.entry(key).or_default().entry(id).or_default() |= bits;
            let a = add(&t, key, id, bits);
            assert_eq!(a.new_holder, !before, "step {step}");
            assert_eq!(a.new_block, !had_block, "step {step}");
        } else {
            let r = t.remove(key, id, bits);
            let mut want = Removed::default();
            if let Some(m) = model.get_mut(&key) {
                if let Some(b) = m.get_mut(&id) {
                    *b &= !bits;
                    if *b == 0 {
                        m.remove(&id);
                        want.holder_gone = true;
                    }
                }
                if m.is_empty() {
                    model.remove(&key);
                    want.block_gone = true;
                }
            }
            assert_eq!(r, want, "step {step}");
        }
        if step % 2000 == 0 {
            check_refs(&t);
            let mut by_entries: HashMap<Vec<(u32, u8)>, u32> = HashMap::new();
            for (&k, m) in &model {
                let want: Vec<(u32, u8)> = m.iter().map(|(&i, &b)| (i, b)).collect();
                assert_eq!(entries(&t, k), want, "step {step} key {k}");
                let v = value(&t, k);
                assert_eq!(*by_entries.entry(want).or_insert(v), v, "one value per set");
            }
        }
    }
    check_refs(&t);
}

#[test]
fn lock_free_reads_stay_exact_while_shards_grow_shift_and_reuse_records() {
    // Stable blocks: one holder each (inline values), and 4 holders on every 8th (a set). The
    // writer then grows every shard many times over, shifts clusters by removing, and reuses
    // records and set ids, while readers check that every stable block reads exactly and
    // that blocks never stored read as absent.
    let t = std::sync::Arc::new(Table::new());
    let stable: Vec<u64> = (0..2_000u64).map(|i| mix64(i | 1 << 40)).collect();
    for (i, &k) in stable.iter().enumerate() {
        add(&t, k, 1, DEVICE);
        if i % 8 == 0 {
            (2..5).for_each(|id| {
                add(&t, k, id, DISK);
            });
        }
    }
    let want: Vec<Vec<(u32, u8)>> = stable.iter().map(|&k| entries(&t, k)).collect();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (t, stop) = (t.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut x = 7u64;
            for round in 0..200u64 {
                let keys: Vec<u64> = (0..5_000u64).map(|i| mix64(i + (round << 20))).collect();
                for &k in &keys {
                    x = mix64(x);
                    add(&t, k, (x % 6) as u32 + 10, DEVICE);
                }
                for &k in &keys {
                    t.remove(k, (mix64(k) % 6) as u32 + 10, DEVICE);
                    (10..16).for_each(|id| {
                        t.remove(k, id, DEVICE);
                    });
                }
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (t, stop, stable, want) = (t.clone(), stop.clone(), stable.clone(), want.clone());
            std::thread::spawn(move || {
                let mut reads = 0u64;
                let mut out = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) || reads < 10_000 {
                    let reading = t.reading();
                    for (i, &k) in stable.iter().enumerate().skip(r).step_by(7) {
                        t.lookup(&reading, &mut t.locate(k), |_, _| true, &mut out);
                        let got: Vec<(u32, u8)> =
                            out.iter().map(|&e| (entry_id(e), entry_bits(e))).collect();
                        assert_eq!(got, want[i], "stable block {i}");
                        // Keys of this form are never stored.
                        let absent = mix64(k) | 1 << 63;
                        assert_eq!(
                            t.lookup(&reading, &mut t.locate(absent), |_, _| false, &mut out)
                                .0,
                            0
                        );
                        reads += 2;
                    }
                }
                reads
            })
        })
        .collect();
    writer.join().expect("writer");
    for r in readers {
        assert!(r.join().expect("reader") >= 10_000);
    }
    for (i, &k) in stable.iter().enumerate() {
        assert_eq!(entries(&t, k), want[i]);
    }
}
