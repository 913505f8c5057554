//! A context rebuilt by [`Restorer`] from its own change set is the context it was: blocks,
//! entries, sets, counts, repeat counts, aliases and reverse lists, whether the pairs came one
//! by one or in batches filled on other threads, and whatever the number of build threads. The
//! copies then take the same churn as the original and stay equal.

use super::*;
use crate::index::stored::snapshot::ContextSnapshot;
use crate::test_rng::Rng;

const HOLDERS: [&str; 5] = ["a", "b", "c", "d", "e"];

/// Random stores (repeats among them) and removals on a small key space, so that most blocks
/// have several holders and many share a holder set.
fn churn(ix: &mut ContextIndex, rng: &mut Rng, steps: usize) {
    for _ in 0..steps {
        let keys: Vec<u64> = (0..1 + rng.below(40))
            .map(|_| 1 + rng.below(600) as u64)
            .collect();
        let tier = [Tier::Device, Tier::CpuLocal, Tier::Disk][rng.below(3)];
        match rng.below(10) {
            0 => {
                put_shared(ix, "store", Tier::CpuShare, &keys);
            }
            1..=2 => {
                let who = HOLDERS[rng.below(5)];
                ix.apply(&IndexBatch {
                    source: src(who, 0),
                    ops: vec![IndexOp::Remove {
                        holder: engine(who, 0),
                        tier,
                        hashes: hashes(&keys),
                    }],
                });
            }
            _ => {
                put(ix, HOLDERS[rng.below(5)], 0, tier, &keys);
            }
        }
    }
}

/// Everything a restore must reproduce, ids and set numbering aside.
fn state(ix: &ContextIndex) -> impl PartialEq + std::fmt::Debug {
    let snapshot = ContextSnapshot::of(ix);
    let holders: Vec<_> = ix
        .holders
        .iter()
        .enumerate()
        .map(|(id, h)| {
            let mut held: Vec<u64> = h
                .blocks
                .iter()
                .filter_map(|r| ix.shared.table.held_key(r, id as u32))
                .collect();
            held.sort_unstable();
            held.dedup();
            let mut repeats: Vec<_> = h.repeats.iter().map(|(&k, &n)| (k, n)).collect();
            repeats.sort_unstable();
            (h.vacant, h.live, h.raw_live, held, repeats)
        })
        .collect();
    let s = ix.stats();
    (
        format!("{:?}", (snapshot.attachments, snapshot.batches)),
        snapshot.aliases,
        (s.blocks, s.holder_blocks, s.holders, s.raw_pairs),
        holders,
    )
}

/// Rebuild `ix` from its full change set: half the pairs one by one, half through a batch
/// filled on another thread; one pair filed twice with its bits split; two pairs refused.
pub(super) fn restored(ix: &mut ContextIndex, threads: usize) -> ContextIndex {
    let mut changes = ix.take_changes();
    ix.mark_dirty(
        changes.pairs.iter().map(|p| (p.holder, p.block)),
        changes.aliases.iter().map(|&(h, _)| h),
        false,
    );
    let mut r = Restorer::new(changes.key.clone(), changes.profile.clone());
    for h in &changes.holders {
        r.holder(h).expect("holder record");
    }
    for a in changes.attachments.iter().flatten() {
        r.attach(&a.source, &a.instance_id, a.dp_rank);
    }
    r.aliases(
        changes
            .aliases
            .iter()
            .filter_map(|&(h, k)| Some((h, k?)))
            .collect(),
    );
    changes.pairs.retain(|p| p.bits != 0);
    let (mine, theirs) = changes.pairs.split_at(changes.pairs.len() / 2);
    let mut batch = r.batch();
    std::thread::scope(|s| {
        s.spawn(|| {
            for p in theirs {
                assert!(batch.pair(p.holder, p.block, p.bits));
            }
        });
        for p in mine {
            let bits = p.bits;
            if bits.count_ones() > 1 {
                let low = bits & bits.wrapping_neg();
                assert!(r.pair(p.holder, p.block, low));
                assert!(r.pair(p.holder, p.block, bits & !low));
            } else {
                assert!(r.pair(p.holder, p.block, bits));
            }
        }
    });
    assert_eq!(batch.len(), theirs.len());
    r.absorb(batch);
    assert!(!r.pair(99, 1, table::DEVICE), "no record names holder 99");
    assert!(!r.pair(0, 1, 0x10), "no tier bit");
    for &(h, b, bit, n) in &changes.repeats {
        assert!(r.repeat(h, b, bit, n));
    }
    r.finish_on(threads)
}

#[test]
fn a_restored_context_is_the_context_whatever_the_build_threads() {
    for seed in [1, 2, 3] {
        let mut rng = Rng(seed);
        let mut original = new_index();
        for who in HOLDERS {
            original.attach_rank(&src(who, 0), who, 0);
        }
        churn(&mut original, &mut rng, 300);
        let mut copies = [restored(&mut original, 1), restored(&mut original, 4)];
        assert!(
            original.stats().blocks > 300,
            "seed {seed}: a sizeable context"
        );
        for copy in &copies {
            assert_eq!(state(copy), state(&original), "seed {seed}");
            assert!(!copy.has_changes());
        }
        // The same churn afterwards keeps them equal: set references and reverse lists are
        // what stores and removals expect.
        let after = rng.next();
        churn(&mut original, &mut Rng(after), 200);
        for copy in &mut copies {
            churn(copy, &mut Rng(after), 200);
            assert_eq!(state(copy), state(&original), "seed {seed}, after churn");
        }
    }
}

#[test]
fn holder_ids_far_past_what_was_read_are_refused_without_filling_the_gap() {
    use crate::index::write::context::restore::{VACANT_FLOOR, VACANT_PER_HOLDER};
    let record = |id: u32, who: &str| crate::index::stored::image::HolderRecord {
        id,
        source: src(who, 0),
        holder: Holder::Shared {
            backend_id: who.into(),
        },
        raw_pairs: Some(0),
        kind: crate::model::GroupKind::Full,
    };
    let new = || Restorer::new(new_index().key().clone(), test_profile());
    // Gaps as reclaims leave them are accepted, up to the floor plus a share per record.
    let mut r = new();
    r.holder(&record(3, "a")).expect("a small gap");
    let edge = (VACANT_FLOOR + 2 * VACANT_PER_HOLDER + 1) as u32;
    r.holder(&record(edge, "b")).expect("at the bound");
    let ix = r.finish();
    assert_eq!(ix.stats().holders, 2);

    // One record of id 2^27 is refused as it is read, before a slot is made for the ids below.
    let mut r = new();
    let e = r.holder(&record(1 << 27, "a")).unwrap_err();
    assert!(
        e.contains("134217728") && e.contains("unused holder ids"),
        "{e}"
    );
    assert!(r.finish().holders.len() < 2, "no slot was made for the gap");
    let mut r = new();
    r.holder(&record(0, "a")).unwrap();
    let e = r.holder(&record(0, "b")).unwrap_err();
    assert!(e.contains("out of order"), "{e}");
}
