//! Hybrid models: the KV-cache groups of one rank as holders of their own, and the answer as
//! the engine's fixed point over all of them (`read::hybrid`). The randomized differential
//! compares the index with a transcription of vLLM's own loops
//! (`HybridKVCacheCoordinator.find_longest_cache_hit` and the managers' `find_longest_cache_hit`
//! of full attention, sliding window and Mamba), written the engine's way (scans over a
//! "cached?" predicate), independently of the index's own rules over sorted positions.

use crate::model::GroupKind;
use crate::test_rng::Rng;

use super::*;

fn group(instance: &str, rank: u32, idx: u32) -> Holder {
    Holder::Engine {
        instance_id: instance.to_owned(),
        dp_rank: rank,
        group: idx,
    }
}

fn apply(ix: &mut ContextIndex, instance: &str, rank: u32, ops: Vec<IndexOp>) {
    ix.apply(&IndexBatch {
        source: src(instance, rank),
        ops,
    });
}

fn kind_op(instance: &str, idx: u32, kind: GroupKind) -> IndexOp {
    IndexOp::GroupKind {
        holder: group(instance, 0, idx),
        kind,
    }
}

fn store(instance: &str, idx: u32, tier: Tier, keys: &[u64]) -> IndexOp {
    IndexOp::Store {
        holder: group(instance, 0, idx),
        tier,
        hashes: hashes(keys),
    }
}

fn remove(instance: &str, idx: u32, tier: Tier, keys: &[u64]) -> IndexOp {
    IndexOp::Remove {
        holder: group(instance, 0, idx),
        tier,
        hashes: hashes(keys),
    }
}

/// Blocks of a prompt: 1..=n.
fn prompt(n: u64) -> Vec<u64> {
    (1..=n).collect()
}

fn device(ix: &ContextIndex, keys: &[u64], instance: &str) -> u64 {
    rank_of(ix, keys, instance, 0).device / BS
}

#[test]
fn a_window_first_model_is_answered_by_both_groups() {
    // Gemma-like: group 0 a window of 2 blocks' worth (needs cdiv(8 - 1, 4) = 2 blocks), group
    // 1 full attention.
    let mut ix = new_index();
    let p = prompt(8);
    let window = GroupKind::SlidingWindow { window: 8 };
    apply(
        &mut ix,
        "a",
        0,
        vec![
            kind_op("a", 0, window),
            kind_op("a", 1, GroupKind::Full),
            // The window group keeps only the last blocks of what it stored.
            store("a", 0, Tier::Device, &p[5..8]),
            store("a", 1, Tier::Device, &p),
        ],
    );
    assert_eq!(
        device(&ix, &p, "a"),
        8,
        "blocks 6 and 7 are the window at 8"
    );
    apply(&mut ix, "a", 0, vec![remove("a", 0, Tier::Device, &[8])]);
    assert_eq!(
        device(&ix, &p, "a"),
        7,
        "blocks 5 and 6 are the window at 7"
    );
    apply(&mut ix, "a", 0, vec![remove("a", 0, Tier::Device, &[6])]);
    assert_eq!(
        device(&ix, &p, "a"),
        0,
        "no two consecutive window blocks, none from 0"
    );
    let statuses = ix.reader().rank_statuses(None);
    assert_eq!(statuses.len(), 1);
    assert_eq!(statuses[0].certainty, Certainty::Exact);
    let kinds: Vec<(u32, GroupKind)> = statuses[0].groups.iter().map(|g| (g.idx, g.kind)).collect();
    assert_eq!(
        kinds,
        [(1, GroupKind::Full), (0, window)],
        "full attention first"
    );
}

#[test]
fn full_first_with_mamba_needs_a_state_at_the_boundary() {
    let mut ix = new_index();
    let p = prompt(6);
    apply(
        &mut ix,
        "a",
        0,
        vec![
            kind_op("a", 1, GroupKind::Mamba),
            store("a", 0, Tier::Device, &p),
            // States where two chunks ended: after blocks 2 and 5 (positions 1 and 4).
            store("a", 1, Tier::Device, &[2, 5]),
        ],
    );
    assert_eq!(device(&ix, &p, "a"), 5);
    let diverging = [1, 2, 3, 99, 98, 97];
    assert_eq!(
        device(&ix, &diverging, "a"),
        2,
        "the state after block 2 only"
    );
    apply(&mut ix, "a", 0, vec![remove("a", 1, Tier::Device, &[2])]);
    assert_eq!(
        device(&ix, &diverging, "a"),
        0,
        "no state below the divergence"
    );
}

#[test]
fn a_single_group_model_stays_on_the_walk() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P);
    assert!(ix.shared.meta.plan().hybrid.is_empty());
    assert!(ix.reader().rank_statuses(None)[0].groups.is_empty());
}

#[test]
fn a_kind_the_events_cannot_decide_is_an_upper_bound() {
    let mut ix = new_index();
    let p = prompt(4);
    apply(
        &mut ix,
        "a",
        0,
        vec![
            kind_op("a", 1, GroupKind::ChunkedLocal),
            store("a", 0, Tier::Device, &p),
        ],
    );
    assert_eq!(
        device(&ix, &p, "a"),
        4,
        "the chunked group does not lower the answer"
    );
    let status = &ix.reader().rank_statuses(None)[0];
    assert_eq!(status.certainty.as_str(), "upper_bound");
}

#[test]
fn clearing_an_engine_clears_every_group() {
    let mut ix = new_index();
    let p = prompt(4);
    apply(
        &mut ix,
        "a",
        0,
        vec![
            kind_op("a", 1, GroupKind::Mamba),
            store("a", 0, Tier::Device, &p),
            store("a", 1, Tier::Device, &p[3..]),
        ],
    );
    apply(
        &mut ix,
        "a",
        0,
        vec![IndexOp::ClearHolder {
            holder: group("a", 0, 0),
        }],
    );
    assert_eq!(ix.stats().holder_blocks, 0);
}

/// vLLM's rules written the engine's way: `cached(group, i)` says whether block `i` (0-based)
/// of the prompt is cached in the group; `n` blocks; the hit in blocks.
fn engine_hit(kinds: &[GroupKind], cached: &dyn Fn(usize, usize) -> bool, n: usize) -> usize {
    // Full attention first, as `verify_and_split_kv_cache_groups` sorts them (stable).
    let mut order: Vec<usize> = (0..kinds.len()).collect();
    order.sort_by_key(|&g| kinds[g] != GroupKind::Full);
    let mut hit_length = n;
    loop {
        let mut curr = hit_length;
        for &g in &order {
            curr = match kinds[g] {
                GroupKind::Full => (0..curr).take_while(|&i| cached(g, i)).count(),
                GroupKind::SlidingWindow { window } => {
                    let contiguous = (window as usize - 1).div_ceil(BS as usize);
                    let mut num_contiguous = 0;
                    let mut found = None;
                    for i in (0..curr).rev() {
                        if cached(g, i) {
                            num_contiguous += 1;
                            if num_contiguous >= contiguous {
                                found = Some(i + num_contiguous);
                                break;
                            }
                        } else {
                            num_contiguous = 0;
                        }
                    }
                    found.unwrap_or(num_contiguous)
                }
                GroupKind::Mamba => (0..curr).rev().find(|&i| cached(g, i)).map_or(0, |i| i + 1),
                GroupKind::ChunkedLocal | GroupKind::Unknown => curr,
            };
        }
        if curr >= hit_length {
            return hit_length;
        }
        hit_length = curr;
    }
}

#[test]
fn random_layouts_match_the_engines_rule() {
    let mut rng = Rng(0x4859_4252);
    let mut checked = 0;
    for case in 0..300 {
        let groups = 1 + rng.below(4);
        let kinds: Vec<GroupKind> = (0..groups)
            .map(|_| match rng.below(3) {
                0 => GroupKind::Full,
                1 => GroupKind::SlidingWindow {
                    window: 1 + rng.below(4 * BS as usize) as u32,
                },
                _ => GroupKind::Mamba,
            })
            .collect();
        let mut ix = new_index();
        let mut ops: Vec<IndexOp> = (0..groups)
            .map(|g| kind_op("a", g as u32, kinds[g]))
            .collect();
        // Each group holds a random subset of a few prompts' blocks (keys: prompt * 100 + i),
        // counted: a block stored twice needs two removals (vLLM does not deduplicate).
        let mut held: Vec<BTreeMap<u64, u32>> = vec![BTreeMap::new(); groups];
        for _ in 0..3 {
            let base = 100 * (1 + rng.below(3) as u64);
            let len = 1 + rng.below(12) as u64;
            for (g, set) in held.iter_mut().enumerate() {
                let keys: Vec<u64> = (0..len)
                    .filter(|_| rng.below(4) != 0)
                    .map(|i| base + i)
                    .collect();
                for &k in &keys {
                    *set.entry(k).or_default() += 1;
                }
                ops.push(store("a", g as u32, Tier::Device, &keys));
            }
        }
        apply(&mut ix, "a", 0, ops);
        // Evictions, one group's block at a time, as vLLM sends them.
        for _ in 0..rng.below(6) {
            let g = rng.below(groups);
            let Some(&key) = held[g].keys().nth(rng.below(held[g].len())) else {
                continue;
            };
            let count = held[g].get_mut(&key).expect("listed");
            *count -= 1;
            if *count == 0 {
                held[g].remove(&key);
            }
            apply(
                &mut ix,
                "a",
                0,
                vec![remove("a", g as u32, Tier::Device, &[key])],
            );
        }
        for _ in 0..10 {
            let base = 100 * (1 + rng.below(3) as u64);
            let n = 1 + rng.below(14);
            let keys: Vec<u64> = (0..n as u64).map(|i| base + i).collect();
            let cached = |g: usize, i: usize| held[g].contains_key(&keys[i]);
            let want = engine_hit(&kinds, &cached, n) as u64;
            let got = ix
                .query(&mut TestKeys::full(&keys), None)
                .hits
                .get("a")
                .map_or(0, |row| row.rank_matches[&0].device / BS);
            assert_eq!(
                got, want,
                "case {case}: kinds {kinds:?}, held {held:?}, query {keys:?}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 3000);
}

#[test]
fn an_instance_filter_answers_its_hybrid_rank_alone() {
    let mut ix = new_index();
    let p = prompt(4);
    for (instance, window_keeps) in [("a", &p[3..]), ("b", &p[..1])] {
        apply(
            &mut ix,
            instance,
            0,
            vec![
                kind_op(instance, 1, GroupKind::Mamba),
                store(instance, 0, Tier::Device, &p),
                store(instance, 1, Tier::Device, window_keeps),
            ],
        );
    }
    let rank = |filter: Option<&str>, instance: &str| {
        ix.query(&mut TestKeys::full(&p), filter)
            .hits
            .get(instance)
            .map(|row| row.rank_matches[&0].device / BS)
    };
    assert_eq!((rank(None, "a"), rank(None, "b")), (Some(4), Some(1)));
    assert_eq!(
        (rank(Some("b"), "b"), rank(Some("b"), "a")),
        (Some(1), None)
    );
    assert_eq!(rank(Some("a"), "a"), Some(4));
}
