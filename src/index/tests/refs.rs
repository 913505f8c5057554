//! Reverse lists: each holder's block references stay exact through removals, re-adds and
//! records reused by later blocks (I18).

use super::*;

#[test]
fn churn_keeps_the_reverse_index_exact() {
    let mut ix = new_index();
    let many: Vec<u64> = (1000..3000).collect();
    for round in 0..5 {
        put(&mut ix, "a", 0, Tier::Device, &many);
        let op = IndexOp::Remove {
            holder: engine("a", 0),
            tier: Tier::Device,
            hashes: hashes(&many[round..]),
        };
        ix.apply(&IndexBatch {
            source: src("a", 0),
            ops: vec![op],
        });
    }
    assert_eq!(ix.stats().holder_blocks, 4);
    assert_eq!(ix.drop_source(&src("a", 0)), 4);
    assert_eq!((ix.stats().blocks, ix.stats().holder_blocks), (0, 0));
}

/// Removals name the references they make stale (`HolderState::gone`) and reverse lists shed
/// them by subtraction, with records freed and reused by later blocks of the same holders: every
/// holder's list still reaches exactly its live pairs, and stays within its bounds (I18).
#[test]
fn reverse_lists_shed_what_removals_name_and_stay_exact_under_churn() {
    let mut ix = new_index();
    let mut rng = crate::test_rng::Rng(0x5eed_0008);
    // Per instance, each key's announcements (engines do not deduplicate).
    let mut model: BTreeMap<String, BTreeMap<u64, u32>> = BTreeMap::new();
    for _ in 0..3000 {
        let inst = format!("i{}", rng.below(3));
        let mut keys: Vec<u64> = (0..1 + rng.below(40))
            .map(|_| 1 + rng.below(600) as u64)
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let held = model.entry(inst.clone()).or_default();
        if rng.below(2) == 0 {
            put(&mut ix, &inst, 0, Tier::Device, &keys);
            keys.iter().for_each(|k| *held.entry(*k).or_default() += 1);
        } else {
            let op = IndexOp::Remove {
                holder: engine(&inst, 0),
                tier: Tier::Device,
                hashes: hashes(&keys),
            };
            let source = src(&inst, 0);
            ix.apply(&IndexBatch {
                source,
                ops: vec![op],
            });
            for k in &keys {
                if let Some(n) = held.get_mut(k) {
                    *n -= 1;
                    if *n == 0 {
                        held.remove(k);
                    }
                }
            }
        }
    }
    let table = &ix.shared.table;
    let mut checked = 0;
    for (id, state) in ix.holders.iter().enumerate() {
        let Holder::Engine { instance_id, .. } = &state.key.holder else {
            continue;
        };
        let reached: BTreeSet<u64> = (state.blocks.iter())
            .filter_map(|r| table.held_key(r, id as u32))
            .collect();
        let expected: BTreeSet<u64> = model[instance_id].keys().copied().collect();
        assert_eq!(reached, expected, "{instance_id}");
        assert_eq!(state.live, expected.len() as u64, "{instance_id}");
        assert!(
            state.blocks.len() as u64 <= 2 * state.live + 64,
            "{instance_id}"
        );
        assert!(
            state.gone.len() as u64 <= state.live / 2 + 64,
            "{instance_id}"
        );
        checked += 1;
    }
    assert_eq!(checked, 3);
}
