//! The walk over interned holder sets: the fast path when consecutive blocks share a set, set
//! changes mid-prompt, reused set values, the cached plan and answers written in place.

use super::*;

/// `n` ranks (instances `i0`, `i1`, … with ranks 0 and 1) all holding `system` on device, each
/// with its own continuation after it; returns the continuation of (`i0`, 0).
fn system_prompt(ix: &mut ContextIndex, system: &[u64], n: usize, len: u64) -> Vec<u64> {
    let mut first = Vec::new();
    for j in 0..n {
        let (inst, rank) = (format!("i{}", j / 2), (j % 2) as u32);
        let own: Vec<u64> = (0..len).map(|b| 1_000_000 * (j as u64 + 1) + b).collect();
        put(ix, &inst, rank, Tier::Device, system);
        put(ix, &inst, rank, Tier::Device, &own);
        if j == 0 {
            first = own;
        }
    }
    first
}

#[test]
fn a_shared_system_prompt_then_one_continuation() {
    let mut ix = new_index();
    let system: Vec<u64> = (1..=8).collect();
    let own = system_prompt(&mut ix, &system, 32, 24);
    let prompt: Vec<u64> = system.iter().chain(&own).copied().collect();
    put_shared(&mut ix, "b0", Tier::Disk, &prompt);
    let mut keys = TestKeys::full(&prompt);
    let hits = ix.query(&mut keys, None);
    assert_eq!(keys.first_asks(), (0..prompt.len()).collect::<Vec<_>>());
    assert_eq!(hits.hits.len(), 16);
    for (inst, row) in &hits.hits {
        for (&rank, &t) in &row.rank_matches {
            let want = if inst == "i0" && rank == 0 {
                counts(32, 32, 32, 32)
            } else {
                counts(8, 8, 8, 32)
            };
            assert_eq!(t, want, "{inst}/{rank}");
            assert_eq!(row.dp[&rank], t.device);
        }
    }
    assert_eq!(hits.hits["i0"].device, 32 * BS);
    assert_eq!(hits.hits["i5"].tiers(), counts(8, 8, 8, 32));
    // Without the disk backend, every other rank stops after the system prompt and the walk
    // stops asking for keys once (i0, 0) is alone and its conversation ends.
    let mut ix = new_index();
    let own = system_prompt(&mut ix, &system, 32, 24);
    let mut prompt: Vec<u64> = system.iter().chain(&own[..10]).copied().collect();
    prompt.extend(7_777_001..7_777_013);
    let mut keys = TestKeys::full(&prompt);
    let hits = ix.query(&mut keys, None);
    // 19 blocks looked up (the first block nobody holds is the 19th), 7 more hashed by the
    // lookahead, and the last 4 of the prompt's 30 never.
    assert_eq!(super::query::keys_hashed(19, prompt.len()), 26);
    assert_eq!(
        keys.first_asks(),
        (0..26).collect::<Vec<_>>(),
        "stops at the first block nobody holds"
    );
    assert_eq!(hits.hits["i0"].rank_matches[&0], counts(18, 18, 18, 18));
    assert_eq!(hits.hits["i0"].rank_matches[&1], counts(8, 8, 8, 8));
    assert_eq!(hits.hits["i9"].rank_matches[&1], counts(8, 8, 8, 8));
}

#[test]
fn a_tier_change_inside_an_unchanged_holder_set_is_seen() {
    let mut ix = new_index();
    let keys: Vec<u64> = (100..112).collect();
    for (inst, rank) in [("a", 0), ("b", 0), ("b", 1)] {
        put(&mut ix, inst, rank, Tier::Device, &keys);
    }
    // b/0 keeps block 5 on disk only; a/0 keeps block 9 on cpu_local only.
    let remove = |ix: &mut ContextIndex, inst: &str, rank: u32, key: u64| {
        let op = IndexOp::Remove {
            holder: engine(inst, rank),
            tier: Tier::Device,
            hashes: hashes(&[key]),
        };
        ix.apply(&IndexBatch {
            source: src(inst, rank),
            ops: vec![op],
        });
    };
    put(&mut ix, "b", 0, Tier::Disk, &keys[5..6]);
    remove(&mut ix, "b", 0, keys[5]);
    put(&mut ix, "a", 0, Tier::CpuLocal, &keys[9..10]);
    remove(&mut ix, "a", 0, keys[9]);
    // Blocks 0-4 and 6-8 carry the same set again after the change at 5.
    assert_eq!(rank_of(&ix, &keys, "b", 0), counts(5, 5, 5, 12));
    assert_eq!(rank_of(&ix, &keys, "a", 0), counts(9, 12, 12, 12));
    assert_eq!(rank_of(&ix, &keys, "b", 1), counts(12, 12, 12, 12));
}

#[test]
fn a_set_value_freed_and_reused_names_its_new_holders() {
    let mut ix = new_index();
    let first: Vec<u64> = (1..=6).collect();
    put(&mut ix, "a", 0, Tier::Device, &first);
    put(&mut ix, "b", 0, Tier::Device, &first);
    assert_eq!(rank_of(&ix, &first, "b", 0), counts(6, 6, 6, 6));
    // Both leave: their set is freed; a new pair on other blocks takes its value.
    assert_eq!(ix.drop_source(&src("a", 0)), 6);
    assert_eq!(ix.drop_source(&src("b", 0)), 6);
    let second: Vec<u64> = (50..=55).collect();
    put(&mut ix, "c", 0, Tier::Device, &second);
    put(&mut ix, "d", 0, Tier::CpuLocal, &second);
    let hits = ix.query(&mut TestKeys::full(&second), None);
    assert_eq!(hits.hits["a"].tiers(), counts(0, 0, 0, 0));
    assert_eq!(hits.hits["b"].tiers(), counts(0, 0, 0, 0));
    assert_eq!(hits.hits["c"].tiers(), counts(6, 6, 6, 6));
    assert_eq!(hits.hits["d"].tiers(), counts(0, 6, 6, 6));
    // A prompt that runs from the old blocks into the new ones misses at once.
    let mixed: Vec<u64> = first.iter().chain(&second).copied().collect();
    let hits = ix.query(&mut TestKeys::full(&mixed), None);
    assert!(hits.hits.values().all(|r| r.disk == 0));
}

#[test]
fn readers_stay_exact_while_sets_are_freed_and_reused() {
    let mut ix = new_index();
    let reader = ix.reader();
    let prompt: Vec<u64> = (1..=48).collect();
    put(&mut ix, "a", 0, Tier::Device, &prompt);
    let elsewhere: Vec<u64> = (500..548).collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            let mut queries = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || queries < 10 {
                let hits = reader.query(&mut TestKeys::full(&prompt), None).hits;
                // a/0 never changes: whatever sets come and go, it holds all 48 blocks.
                assert_eq!(hits["a"].tiers(), counts(48, 48, 48, 48));
                queries += 1;
            }
        });
        for round in 0..200u64 {
            // b and c join and leave the prompt's blocks (sets with a) and other blocks (sets
            // without a), so set values are freed and reused under the reader.
            let cut = 8 + (round % 40) as usize;
            put(&mut ix, "b", 0, Tier::Device, &prompt[..cut]);
            put(&mut ix, "c", 0, Tier::CpuLocal, &elsewhere[..cut]);
            put(&mut ix, "b", 0, Tier::Device, &elsewhere);
            ix.drop_source(&src("b", 0));
            put(&mut ix, "c", 0, Tier::CpuLocal, &prompt[cut..]);
            ix.drop_source(&src("c", 0));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        t.join().expect("reader thread");
    });
    assert_eq!(ix.stats().holder_blocks, 48);
}

#[test]
fn the_plan_follows_every_metadata_change() {
    let mut ix = new_index();
    let keys: Vec<u64> = (1..=4).collect();
    put(&mut ix, "a", 0, Tier::Device, &keys);
    let reader = ix.reader();
    let listed = |r: &IndexReader| -> Vec<(String, Vec<u32>)> {
        let hits = r.query(&mut TestKeys::full(&keys), None);
        hits.hits
            .iter()
            .map(|(i, row)| (i.clone(), row.rank_matches.keys().copied().collect()))
            .collect()
    };
    assert_eq!(listed(&reader), vec![("a".to_owned(), vec![0])]);
    ix.attach_rank(&src("reg", 0), "a", 3);
    ix.attach_rank(&src("reg", 0), "z", 0);
    assert_eq!(
        listed(&reader),
        vec![("a".to_owned(), vec![0, 3]), ("z".to_owned(), vec![0])]
    );
    // A holder interned after a plan was built is seen by the next query.
    put_shared(&mut ix, "b0", Tier::CpuShare, &keys);
    assert_eq!(rank_of(&ix, &keys, "z", 0), counts(0, 0, 4, 4));
    ix.detach_source(&src("reg", 0));
    assert_eq!(listed(&reader), vec![("a".to_owned(), vec![0])]);
}

/// Instance "a" with rank 0 on the first 3 of 6 blocks (device) and rank 1 on all (cpu_local),
/// instance "b" with rank 0 on all (device).
fn two_instances() -> (ContextIndex, Vec<u64>) {
    let mut ix = new_index();
    let keys: Vec<u64> = (1..=6).collect();
    put(&mut ix, "a", 0, Tier::Device, &keys[..3]);
    put(&mut ix, "a", 1, Tier::CpuLocal, &keys);
    put(&mut ix, "b", 0, Tier::Device, &keys);
    (ix, keys)
}

#[test]
fn answers_written_in_place_equal_fresh_answers() {
    let (mut ix, keys) = two_instances();
    let reader = ix.reader();
    let mut out = QueryHits::default();
    for filter in [
        None,
        Some("a"),
        Some("a"),
        None,
        None,
        Some("nope"),
        Some(""),
    ] {
        reader.query_into(&mut TestKeys::full(&keys), filter, &mut out);
        assert_eq!(
            out,
            reader.query(&mut TestKeys::full(&keys), filter),
            "{filter:?}"
        );
    }
    // Same shape, other counts: the reused maps get the new figures.
    reader.query_into(&mut TestKeys::full(&keys), None, &mut out);
    reader.query_into(&mut TestKeys::full(&keys[..2]), None, &mut out);
    assert_eq!(out.hits["b"].tiers(), counts(2, 2, 2, 2));
    assert_eq!(out.hits["a"].rank_matches[&0], counts(2, 2, 2, 2));
    // A new rank changes the shape.
    ix.attach_rank(&src("reg", 0), "a", 7);
    reader.query_into(&mut TestKeys::full(&keys), None, &mut out);
    assert_eq!(out, reader.query(&mut TestKeys::full(&keys), None));
    assert_eq!(out.hits["a"].rank_matches[&7], counts(0, 0, 0, 0));
}

/// A caller may add to a reused answer's maps between queries (its fields are public): the next
/// `query_into` then rebuilds it rather than write counts into the wrong ranks.
#[test]
fn an_answer_a_caller_reshaped_is_rebuilt() {
    let (ix, keys) = two_instances();
    let reader = ix.reader();
    let fresh = reader.query(&mut TestKeys::full(&keys), None);
    let reshapes: [fn(&mut QueryHits); 4] = [
        |out| {
            if let Some(row) = out.hits.get_mut("a") {
                row.dp.insert(9, 5);
            }
        },
        |out| {
            if let Some(row) = out.hits.get_mut("a") {
                row.rank_matches.insert(9, TierCounts::default());
            }
        },
        |out| {
            if let Some(row) = out.hits.get_mut("a") {
                row.dp.insert(9, 5);
                row.rank_matches.insert(9, TierCounts::default());
            }
        },
        |out| {
            out.hits.insert("c".into(), InstanceHits::default());
        },
    ];
    for (i, reshape) in reshapes.iter().enumerate() {
        let mut out = QueryHits::default();
        reader.query_into(&mut TestKeys::full(&keys), None, &mut out);
        reshape(&mut out);
        assert_ne!(out, fresh, "reshape {i} changed nothing");
        reader.query_into(&mut TestKeys::full(&keys), None, &mut out);
        assert_eq!(out, fresh, "reshape {i}");
    }
}

#[test]
fn a_rank_fed_by_two_sources_keeps_a_tier_while_either_holds_it() {
    let mut ix = new_index();
    let keys: Vec<u64> = (200..212).collect();
    let store = |ix: &mut ContextIndex, source: &SubscriptionKey, tier: Tier, blocks: &[u64]| {
        let op = IndexOp::Store {
            holder: engine("a", 0),
            tier,
            hashes: hashes(blocks),
        };
        ix.apply(&IndexBatch {
            source: source.clone(),
            ops: vec![op],
        });
    };
    let (first, second) = (src("a", 0), src("a-adapter-feed", 0));
    // Device comes from one source, then both, then the other, then the first again.
    let from_first: Vec<u64> = keys[..8]
        .iter()
        .filter(|&&k| k != keys[5])
        .copied()
        .collect();
    store(&mut ix, &first, Tier::Device, &from_first);
    store(&mut ix, &second, Tier::Device, &keys[3..6]);
    store(&mut ix, &second, Tier::Disk, &keys);
    assert_eq!(rank_of(&ix, &keys, "a", 0), counts(8, 8, 8, 12));
    ix.drop_source(&second);
    assert_eq!(rank_of(&ix, &keys, "a", 0), counts(5, 5, 5, 5));
}

#[test]
fn a_backend_tier_that_ends_mid_prompt_ends_that_phase_for_every_rank() {
    let mut ix = new_index();
    let keys: Vec<u64> = (300..312).collect();
    ix.attach_rank(&src("reg", 0), "z", 0);
    put(&mut ix, "a", 0, Tier::Device, &keys[..3]);
    put_shared(&mut ix, "b0", Tier::CpuShare, &keys[..6]);
    put_shared(&mut ix, "b1", Tier::CpuShare, &keys[4..9]);
    put_shared(&mut ix, "b0", Tier::Disk, &keys);
    // cpu_share is held by b0, then by both, then by b1, and by nobody from block 9.
    assert_eq!(rank_of(&ix, &keys, "z", 0), counts(0, 0, 9, 12));
    assert_eq!(rank_of(&ix, &keys, "a", 0), counts(3, 3, 9, 12));
}

#[test]
fn the_walk_hashes_only_what_it_needs_and_never_under_a_lock() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..2]);
    put(&mut ix, "b", 0, Tier::Device, &P[..3]);
    let mut keys = TestKeys::full(&P);
    keys.probe = Some(ix.reader());
    let hits = ix.query(&mut keys, None).hits;
    assert_eq!(hits["b"].disk, 3 * BS);
    // Block 3 is where the last cursor stopped: 4 blocks looked up, the other 2 hashed ahead.
    assert_eq!(super::query::keys_hashed(4, P.len()), 6);
    assert_eq!(keys.first_asks(), (0..6).collect::<Vec<_>>());
    // A long prompt: the lookahead is bounded, the tail is never hashed.
    let long: Vec<u64> = P.iter().copied().chain(100..200).collect();
    let mut keys = TestKeys::full(&long);
    keys.probe = Some(ix.reader());
    ix.query(&mut keys, Some("a"));
    assert_eq!(super::query::keys_hashed(3, long.len()), 10);
    assert_eq!(keys.first_asks(), (0..10).collect::<Vec<_>>());
    let mut keys = TestKeys::full(&long);
    ix.query(&mut keys, None);
    assert_eq!(keys.first_asks(), (0..11).collect::<Vec<_>>());
}

/// The borrowed answer the transports encode: the selected rows in id order, each with its
/// listed ranks in order and their counts, the row's counts being the maxima over its ranks.
#[test]
fn a_walks_answer_view_holds_the_selected_rows_ranks_and_counts() {
    let (ix, keys) = two_instances();
    let reader = ix.reader();
    type Rows = Vec<(String, Vec<(u32, TierCounts)>, TierCounts)>;
    let view = |filter: Option<&str>| -> (Rows, usize) {
        crate::index::query::walk_view(&reader.shared, &mut TestKeys::full(&keys), filter, |a| {
            let rows = (a.rows())
                .map(|r| (r.id.to_owned(), r.ranks().collect(), r.tiers()))
                .collect();
            (rows, a.rank_total())
        })
    };
    let a = (
        "a".to_owned(),
        vec![(0, counts(3, 3, 3, 3)), (1, counts(0, 6, 6, 6))],
        counts(3, 6, 6, 6),
    );
    let b = (
        "b".to_owned(),
        vec![(0, counts(6, 6, 6, 6))],
        counts(6, 6, 6, 6),
    );
    assert_eq!(view(None), (vec![a.clone(), b.clone()], 3));
    assert_eq!(view(Some("")), (vec![a.clone(), b.clone()], 3));
    assert_eq!(view(Some("a")), (vec![a], 2));
    assert_eq!(view(Some("b")), (vec![b], 1));
    assert_eq!(view(Some("nope")), (vec![], 0));
}
