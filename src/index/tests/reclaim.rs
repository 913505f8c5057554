//! Reclaimed holders: ids of holders that own nothing and that no source lists are given to later
//! holders only once no plan that routed them can still be in a walk.

use super::*;
use crate::index::plan::NOT_SELECTED;

fn id_of(ix: &ContextIndex, instance: &str) -> u32 {
    let key = crate::index::write::holder::HolderKey {
        source: src(instance, 0),
        holder: engine(instance, 0),
    };
    ix.holder_ids[&key]
}

fn register_and_store(ix: &mut ContextIndex, instance: &str) {
    ix.attach_rank(&src(instance, 0), instance, 0);
    put(ix, instance, 0, Tier::Device, &P);
}

#[test]
fn a_walk_with_an_older_plan_never_counts_a_new_holder_for_an_old_cursor() {
    let mut ix = new_index();
    register_and_store(&mut ix, "a");
    // A walk in flight holds the plan it started with.
    let walking = ix.shared.meta.plan();
    let a = id_of(&ix, "a");
    assert_ne!(walking.route[a as usize], NOT_SELECTED);
    ix.detach_source(&src("a", 0));
    assert_eq!(ix.stats().holders, 0, "a owns nothing and is not listed");
    register_and_store(&mut ix, "b");
    let b = id_of(&ix, "b");
    assert_ne!(
        b, a,
        "a's id is not reused while a plan routing it is alive"
    );
    assert!(
        walking
            .route
            .get(b as usize)
            .is_none_or(|&r| r == NOT_SELECTED)
    );
    drop(walking);
    ix.detach_source(&src("b", 0));
    register_and_store(&mut ix, "c");
    assert!(
        id_of(&ix, "c") <= b,
        "a freed id is reused once no old plan is alive"
    );
    assert_eq!(
        ix.holders.len(),
        2,
        "the table keeps the size of the live holders"
    );
    let hits = ix.query(&mut TestKeys::full(&P), None);
    assert_eq!(hits.hits.keys().collect::<Vec<_>>(), ["c"]);
    assert_eq!(hits.hits["c"].rank_matches[&0], counts(6, 6, 6, 6));
}

#[test]
fn instances_coming_and_going_leave_the_holders_and_checkpoints_flat() {
    let mut ix = new_index();
    register_and_store(&mut ix, "keep");
    let first = ix.take_changes();
    assert!(first.full && !first.is_empty());
    for i in 0..200 {
        let name = format!("i{i}");
        register_and_store(&mut ix, &name);
        ix.take_changes();
        ix.detach_source(&src(&name, 0));
        let changes = ix.take_changes();
        assert!(
            changes.holders.is_empty() && changes.holders_gone.len() == 1,
            "round {i}: only the gone holder's record changes"
        );
        assert!(
            ix.holders.len() <= 3,
            "round {i}: {} slots",
            ix.holders.len()
        );
        assert!(
            ix.take_changes().is_empty(),
            "round {i}: idle writes nothing"
        );
    }
    assert_eq!(ix.stats().holders, 1);
    assert_eq!(ix.shared.meta.read().sources.len(), 1, "gone sources leave");
    assert_eq!(rank_of(&ix, &P, "keep", 0), counts(6, 6, 6, 6));
}

#[test]
fn a_store_backend_that_owns_nothing_is_reclaimed_at_the_next_checkpoint() {
    let mut ix = new_index();
    register_and_store(&mut ix, "e");
    put_shared(&mut ix, "b0", Tier::Disk, &P);
    ix.take_changes();
    assert_eq!(ix.stats().holders, 2);
    ix.apply(&IndexBatch {
        source: store_src(),
        ops: vec![IndexOp::ClearHolder {
            holder: shared("b0"),
        }],
    });
    let changes = ix.take_changes();
    assert_eq!(changes.holders_gone.len(), 1);
    assert_eq!(ix.stats().holders, 1);
    // An engine whose blocks are all evicted keeps its holder while its rank is registered.
    ix.apply(&IndexBatch {
        source: src("e", 0),
        ops: vec![IndexOp::ClearHolder {
            holder: engine("e", 0),
        }],
    });
    ix.take_changes();
    assert_eq!(ix.stats().holders, 1);
    put_shared(&mut ix, "b1", Tier::Disk, &P);
    assert_eq!(rank_of(&ix, &P, "e", 0), counts(0, 0, 0, 6));
}
