//! The memory budget on one context: past its block cap it evicts oldest first, deepest block
//! first, down to the low-water mark; answers only shrink to a true prefix; an evicted block's
//! repeated announcements go with it (nothing of them stays in memory); and eviction is an
//! ordinary change for the checkpoint.

use std::sync::Arc;

use super::*;
use crate::index::Budget;

fn capped(blocks: u64) -> ContextIndex {
    let mut ix = new_index();
    ix.set_budget(Arc::new(Budget::new(0, blocks)));
    ix
}

/// Prompt `p`'s four blocks.
fn prompt(p: u64) -> [u64; 4] {
    [p * 100, p * 100 + 1, p * 100 + 2, p * 100 + 3]
}

fn device(ix: &ContextIndex, p: u64) -> u64 {
    rank_of(ix, &prompt(p), "a", 0).device / BS
}

#[test]
fn past_its_cap_a_context_evicts_its_oldest_prompt_from_the_deepest_block() {
    let mut ix = capped(10);
    for p in 1..=3 {
        put(&mut ix, "a", 0, Tier::Device, &prompt(p));
    }
    // 12 blocks past a cap of 10: down to 9, the oldest prompt's three deepest blocks.
    assert_eq!(ix.prefix_count(), 9);
    assert_eq!(ix.evicted(), 3);
    assert_eq!([device(&ix, 1), device(&ix, 2), device(&ix, 3)], [1, 4, 4]);
    put(&mut ix, "a", 0, Tier::Device, &prompt(4));
    // 13: down to 9 again, the rest of prompt 1 and then prompt 2 from its tail.
    assert_eq!(ix.prefix_count(), 9);
    assert_eq!(
        [
            device(&ix, 1),
            device(&ix, 2),
            device(&ix, 3),
            device(&ix, 4)
        ],
        [0, 1, 4, 4]
    );
    assert_eq!(ix.stats().evicted, 7);
    assert_eq!(ix.view().evicted, 7);
}

#[test]
fn an_evicted_block_loses_every_announcement_and_a_later_removal_is_a_no_op() {
    let mut ix = capped(4);
    // Announced twice (vLLM does not deduplicate), then evicted whole by a newer prompt: 8
    // blocks past a cap of 4, down to 3.
    put(&mut ix, "a", 0, Tier::Device, &prompt(1));
    put(&mut ix, "a", 0, Tier::Device, &prompt(1));
    put(&mut ix, "a", 0, Tier::Device, &prompt(2));
    assert_eq!([device(&ix, 1), device(&ix, 2)], [0, 3]);
    for key in prompt(1) {
        assert_eq!(ix.announcements(0, key, crate::index::table::DEVICE), 0);
    }
    // The repeated announcements went with the blocks: nothing of them is kept in memory.
    assert!(
        ix.holders[0].repeats.is_empty(),
        "{:?}",
        ix.holders[0].repeats
    );
    // The engine removes both copies: nothing left to remove here.
    let remove = |ix: &mut ContextIndex| {
        ix.apply(&IndexBatch {
            source: src("a", 0),
            ops: vec![IndexOp::Remove {
                holder: engine("a", 0),
                tier: Tier::Device,
                hashes: hashes(&prompt(1)),
            }],
        })
    };
    remove(&mut ix);
    remove(&mut ix);
    assert_eq!([device(&ix, 1), device(&ix, 2)], [0, 3]);
    // Stored once more (prompt 2 and the deepest block go to make room) and removed once: the
    // engine holds none of it, and neither does the index.
    put(&mut ix, "a", 0, Tier::Device, &prompt(1));
    assert_eq!([device(&ix, 1), device(&ix, 2)], [3, 0]);
    remove(&mut ix);
    assert_eq!(device(&ix, 1), 0, "no announcement outlived the eviction");
    assert_eq!(ix.prefix_count(), 0);
}

#[test]
fn eviction_is_an_ordinary_change_and_a_restore_keeps_the_cap() {
    let mut ix = capped(10);
    put(&mut ix, "a", 0, Tier::Device, &prompt(1));
    let _ = ix.take_changes();
    put(&mut ix, "a", 0, Tier::Device, &prompt(2));
    put(&mut ix, "a", 0, Tier::Device, &prompt(3));
    let changes = ix.take_changes();
    let gone: Vec<u64> = (changes.pairs.iter())
        .filter(|p| p.bits == 0)
        .map(|p| p.block)
        .collect();
    assert_eq!(gone.len(), 3, "{:?}", changes.pairs);
    assert!(gone.iter().all(|b| prompt(1)[1..].contains(b)), "{gone:?}");
    // The same history, restored from its first (full) change set.
    let mut same = capped(10);
    for p in 1..=3 {
        put(&mut same, "a", 0, Tier::Device, &prompt(p));
    }
    let mut back = super::restore::restored(&mut same, 1);
    assert_eq!(back.prefix_count(), 9);
    assert_eq!(device(&back, 1), 1);
    // Restored under a smaller cap, it obeys it at once.
    back.set_budget(Arc::new(Budget::new(0, 5)));
    assert!(back.prefix_count() <= 5, "{}", back.prefix_count());
    for p in 1..=3 {
        assert!(device(&back, p) <= 4);
    }
}

#[test]
fn a_budget_of_bytes_shrinks_the_growing_context() {
    let budget = Arc::new(Budget::new(1 << 20, 0));
    let mut ix = new_index();
    ix.set_budget(Arc::clone(&budget));
    // 4 blocks a prompt, 56 estimated bytes a block: about 18 700 blocks fit in 1 MiB.
    for p in 1..=6000 {
        put(&mut ix, "a", 0, Tier::Device, &prompt(p));
    }
    assert!(budget.bytes() <= 1 << 20, "{}", budget.bytes());
    assert!(ix.evicted() > 0);
    assert!(budget.degraded().is_some());
    assert_eq!(device(&ix, 6000), 4, "the newest prompt stays");
    drop(ix);
    assert_eq!(
        budget.bytes(),
        0,
        "a context gives its charge back when it goes"
    );
}
