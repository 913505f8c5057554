//! Unit tests of [`super::blocks::Blocks`]: Robin Hood order, growth, record reuse, churn.
use std::collections::HashMap;

use super::blocks::*;
use super::mix64;

/// `n` keys whose home is `home` in a table of `slots` slots.
fn aimed(b: &Blocks, home: usize, n: usize, skip: &[u64]) -> Vec<u64> {
    (1u64..)
        .filter(|k| b.home_of(*k) == home && !skip.contains(k))
        .take(n)
        .collect()
}

fn put(b: &mut Blocks, key: u64, val: u32) -> u32 {
    b.reserve_one();
    let probe = b.probe(key);
    assert!(matches!(probe, Probe::Vacant { .. }), "{key} already there");
    b.insert(key, val, probe).expect("room")
}

fn take(b: &mut Blocks, key: u64) -> u32 {
    let (pos, idx) = b.find(key).expect("present");
    b.remove(pos, idx);
    idx
}

#[test]
fn colliding_keys_wrap_around_saturate_and_shift_back() {
    // 64 slots hold 56 blocks before growing: 40 keys aimed at slot 60 wrap past the end and
    // sit up to 39 slots from home, far past the stored distance's saturation at 15.
    let mut b = Blocks::with_slots(9, 64);
    let hot = aimed(&b, 60, 40, &[]);
    let near_zero = aimed(&b, 1, 6, &hot);
    let mut all = Vec::new();
    for (i, &k) in hot.iter().chain(&near_zero).enumerate() {
        put(&mut b, k, i as u32 + 1);
        all.push(k);
        b.check();
    }
    assert_eq!(b.slot_count(), 64, "no growth: the keys stay aimed");
    for (i, &k) in all.iter().enumerate() {
        let (_, idx) = b.find(k).expect("found");
        assert_eq!(b.val(idx), i as u32 + 1);
    }
    let absent = aimed(&b, 60, 3, &all);
    assert!(absent.iter().all(|&k| b.find(k).is_none()));
    // Remove from the front of the cluster, its wrapped middle and its end.
    for k in [hot[0], hot[20], hot[39], near_zero[0], hot[5], near_zero[5]] {
        take(&mut b, k);
        b.check();
        assert!(b.find(k).is_none());
        all.retain(|&x| x != k);
        assert!(all.iter().all(|&x| b.find(x).is_some()));
    }
    while let Some(k) = all.pop() {
        take(&mut b, k);
        b.check();
    }
    assert_eq!(b.len(), 0);
    assert!(b.slot_values().iter().all(|&s| s == 0), "no tombstones");
}

#[test]
fn last_and_first_slot_neighbours_shift_across_the_end() {
    let mut b = Blocks::with_slots(3, 16);
    let last = aimed(&b, 15, 3, &[]);
    let first = aimed(&b, 0, 2, &last);
    for &k in last.iter().chain(&first) {
        put(&mut b, k, 1);
        b.check();
    }
    // last[1] sits in slot 0 and last[2] in slot 1: removing last[0] pulls both back.
    take(&mut b, last[0]);
    b.check();
    take(&mut b, first[0]);
    b.check();
    assert!(
        [last[1], last[2], first[1]]
            .iter()
            .all(|&k| b.find(k).is_some())
    );
}

#[test]
fn records_keep_their_index_through_growth_and_are_reused() {
    let mut b = Blocks::new(5);
    let keys: Vec<u64> = (0..5000u64).map(|i| i * 7919).collect();
    let idx: Vec<u32> = keys.iter().map(|&k| put(&mut b, k, 3)).collect();
    b.check();
    assert!(b.slot_count() > 5000);
    for (&k, &i) in keys.iter().zip(&idx) {
        assert_eq!(b.find(k).map(|f| f.1), Some(i));
        assert_eq!(b.key(i), Some(k));
    }
    let freed = take(&mut b, keys[10]);
    assert_eq!(b.key(freed), None, "a free record has no key");
    assert_eq!(b.val(freed), 0);
    assert_eq!(put(&mut b, 1, 4), freed, "freed records are reused first");
    assert_eq!(b.key(freed), Some(1));
    b.check();
}

#[test]
fn random_churn_matches_a_map() {
    let mut b = Blocks::new(11);
    let mut model: HashMap<u64, u32> = HashMap::new();
    let mut x = 1u64;
    for step in 0..60_000u32 {
        x = mix64(x);
        // Few distinct keys, so inserts, updates and removes all hit existing blocks often.
        let key = x % 4000;
        match (x >> 40) % 3 {
            0 | 1 => match b.find(key) {
                Some((_, idx)) => {
                    b.set_val(idx, step + 1);
                    model.insert(key, step + 1);
                }
                None => {
                    put(&mut b, key, step + 1);
                    model.insert(key, step + 1);
                }
            },
            _ => {
                if model.remove(&key).is_some() {
                    take(&mut b, key);
                } else {
                    assert!(b.find(key).is_none());
                }
            }
        }
        if step % 5000 == 0 {
            b.check();
        }
    }
    b.check();
    assert_eq!(b.len(), model.len());
    for (&k, &v) in &model {
        assert_eq!(b.find(k).map(|(_, i)| b.val(i)), Some(v));
    }
    let mut seen = 0;
    b.for_each(|k, v| {
        assert_eq!(model.get(&k), Some(&v));
        seen += 1;
    });
    assert_eq!(seen, model.len());
}

/// `n` keys sorted by slot hash under `seed`, the first `hot` of them with hashes in the top
/// 1/64 of the range (so their cluster runs past the last slot and wraps).
fn fill_keys(seed: u64, n: usize, hot: usize) -> Vec<(u64, u32)> {
    let top = |k: &u64| slot_hash(*k, seed) >> 58 == 63;
    let mut keys: Vec<u64> = (1u64..).filter(top).take(hot).collect();
    keys.extend((1u64..).map(mix64).filter(|k| !top(k)).take(n - hot));
    keys.sort_unstable_by_key(|&k| slot_hash(k, seed));
    keys.iter()
        .enumerate()
        .map(|(i, &k)| (k, i as u32 + 1))
        .collect()
}

#[test]
fn a_fill_is_a_valid_robin_hood_table_that_keeps_working() {
    for (n, hot) in [(0, 0), (1, 0), (7, 0), (1000, 0), (1000, 40), (5000, 300)] {
        let seed = 5;
        let recs = fill_keys(seed, n, hot);
        let mut b = Blocks::new(seed);
        assert_eq!(b.fill_sorted(&recs), n);
        b.check();
        assert_eq!(b.len(), n);
        for (i, &(k, v)) in recs.iter().enumerate() {
            assert_eq!(
                b.find(k).map(|(_, idx)| (idx, b.val(idx))),
                Some((i as u32, v))
            );
        }
        // Stores and removals after a fill behave as on any table.
        let more: Vec<u64> = (0..n as u64 + 20).map(|i| mix64(i ^ 0xfeed)).collect();
        for (i, &k) in more.iter().enumerate() {
            put(&mut b, k, i as u32 + 1);
        }
        for &(k, _) in recs.iter().step_by(2) {
            take(&mut b, k);
        }
        b.check();
        assert_eq!(b.len(), n - n.div_ceil(2) + more.len());
    }
}
