//! Order independence: an engine source and a Mooncake store source that announce the same
//! blocks give the same index whatever the interleaving of their events (see "Order of
//! sources" in `src/index/README.md`): same answers, counts, aliases and checkpoint
//! records, also across a checkpoint and restore between them.

use std::collections::BTreeMap;

use crate::events::{Holder, IndexBatch, IndexOp};
use crate::model::{SubscriptionKey, Tier};

use super::order_fixture::*;
use super::{ContextIndex, table};

/// The store's other hashes the dumps also query.
fn others() -> Vec<u64> {
    vec![registered_hash(5), registered_hash(6), 0x5555]
}

/// Both sources' batches for the unit cases: the engine stores the prompt on device, evicts
/// its tail and moves a block to local CPU; the store holds objects under the engine's hashes
/// (announced twice, in two tiers, one removed), one under the registered profile's hash and one
/// no engine announces.
fn sources() -> (Vec<IndexBatch>, Vec<IndexBatch>) {
    let e = |ops| batch(engine_source(), ops);
    let s = |ops| batch(store_source(), ops);
    let h = engine_hash;
    let engine = vec![
        e(vec![chained(0, 4, Tier::Device)]),
        e(vec![
            chained(4, 8, Tier::Device),
            removal(engine(), Tier::Device, &[h(6), h(7)]),
        ]),
        e(vec![
            removal(engine(), Tier::Device, &[h(5)]),
            chained(5, 6, Tier::CpuLocal),
        ]),
    ];
    let store = vec![
        s(vec![objects("b0", Tier::CpuShare, &[h(0), h(1), h(2)])]),
        s(vec![
            objects("b0", Tier::CpuShare, &[h(2), h(3), h(6)]),
            objects("b1", Tier::Disk, &[h(6), h(7), registered_hash(8)]),
        ]),
        s(vec![
            removal(backend("b0"), Tier::CpuShare, &[h(2)]),
            objects("b0", Tier::CpuShare, &[h(7), 0x5555]),
        ]),
        s(vec![removal(backend("b1"), Tier::Disk, &[h(7)])]),
    ];
    (engine, store)
}

/// Engine first: every store object names a block whose alias exists.
fn engine_first() -> ContextIndex {
    let (engine, store) = sources();
    let mut ix = index();
    interleave(&mut ix, &engine, &store, &[true; 3]);
    ix
}

#[test]
fn a_store_object_before_its_engine_block_is_the_same_block() {
    let h = engine_hash;
    let run = |engine_first: bool| {
        let mut ix = index();
        let engine = [batch(
            engine_source(),
            vec![
                chained(0, 4, Tier::Device),
                removal(engine(), Tier::Device, &[h(2), h(3)]),
            ],
        )];
        let store = [batch(
            store_source(),
            vec![objects("b0", Tier::CpuShare, &[h(0), h(1), h(2), h(3)])],
        )];
        interleave(&mut ix, &engine, &store, &[engine_first]);
        ix
    };
    let (mut a, mut b) = (run(true), run(false));
    for ix in [&a, &b] {
        assert_eq!(ix.prefix_count(), 4, "four blocks, whoever announced first");
        assert_eq!(ix.stats().holder_blocks, 6);
        let hits = ix.reader().query_tokens(&prompt()[..16], "", None);
        let rank = hits.hits["i"].rank_matches[&0];
        assert_eq!((rank.device, rank.cpu_share), (8, 16));
    }
    assert_eq!(dump(&mut a, &[]), dump(&mut b, &[]));
}

#[test]
fn every_interleaving_of_two_sources_gives_the_same_index() {
    let (engine, store) = sources();
    let mut want = engine_first();
    let want_dump = dump(&mut want, &others());
    let mut want_records = Records::default();
    want_records.checkpoint(&mut want);
    let orders = interleavings(engine.len(), store.len());
    assert_eq!(orders.len(), 35);
    for order in orders {
        let mut ix = index();
        interleave(&mut ix, &engine, &store, &order);
        assert_eq!(dump(&mut ix, &others()), want_dump, "order {order:?}");
        let mut records = Records::default();
        records.checkpoint(&mut ix);
        assert_eq!(
            records.canonical(),
            want_records.canonical(),
            "order {order:?}"
        );
    }
    // What the sources left: blocks 0-1 on device and in b0, 2-4 on device (3 in b0 too),
    // 5 in local CPU, 6 in b0 and b1, 7 in b0, and the two objects no engine block names.
    let held = &want_dump.held;
    let key = derived_key;
    let b0 = &held[&(store_source(), backend("b0"), Tier::CpuShare)];
    let want_b0: BTreeMap<u64, u32> = [0, 1, 2, 3, 6, 7]
        .map(key)
        .into_iter()
        .chain([0x5555])
        .map(|k| (k, 1))
        .collect();
    assert_eq!(b0, &want_b0, "block 2 announced twice, removed once");
    let b1 = &held[&(store_source(), backend("b1"), Tier::Disk)];
    assert_eq!(b1.keys().copied().collect::<Vec<_>>(), {
        let mut k = vec![key(6), registered_hash(8)];
        k.sort_unstable();
        k
    });
    assert_eq!(want_dump.counts.3, 2, "two pairs under published hashes");
}

#[test]
fn an_engine_block_stored_unlinked_and_linked_is_one_pair_in_either_order() {
    // The same engine's blocks 2-3 once without a known parent (as after joining mid-stream)
    // and once chained; a second engine source (another rank's subscription) links them.
    let other = SubscriptionKey::new("j", "", 0);
    let other_engine = Holder::Engine {
        instance_id: "j".into(),
        dp_rank: 0,
        group: 0,
    };
    let mid_stream = || unlinked(2, 4, Tier::Device);
    let linked = |holder: Holder| match chained(0, 4, Tier::Device) {
        IndexOp::StoreChained {
            tier,
            hashes,
            contents,
            ..
        } => IndexOp::StoreChained {
            holder,
            tier,
            hashes,
            contents,
        },
        _ => unreachable!("chained() makes a chained store"),
    };
    let a = [batch(engine_source(), vec![mid_stream()])];
    let b = [batch(other.clone(), vec![linked(other_engine.clone())])];
    let mut dumps = Vec::new();
    for order in interleavings(1, 1) {
        let mut ix = index();
        interleave(&mut ix, &a, &b, &order);
        assert_eq!(ix.prefix_count(), 4, "order {order:?}");
        assert_eq!(ix.stats().raw_pairs, 0, "order {order:?}");
        dumps.push(dump(&mut ix, &[]));
    }
    assert_eq!(dumps[0], dumps[1]);
    // One holder, its unlinked and its linked announcements of one block: two announcements of
    // one pair, so two removals take it away.
    let mut ix = index();
    ix.apply(&batch(engine_source(), vec![mid_stream()]));
    ix.apply(&batch(engine_source(), vec![linked(engine())]));
    assert_eq!((ix.prefix_count(), ix.stats().holder_blocks), (4, 4));
    assert_eq!(ix.announcements(0, derived_key(2), table::DEVICE), 2);
    for left in [4, 3] {
        ix.apply(&batch(
            engine_source(),
            vec![removal(engine(), Tier::Device, &[engine_hash(2)])],
        ));
        assert_eq!(ix.stats().holder_blocks, left);
    }
}

#[test]
fn a_restart_between_the_sources_gives_the_uninterrupted_index() {
    let (engine, store) = sources();
    let mut want = engine_first();
    let want_dump = dump(&mut want, &others());
    let mut want_records = Records::default();
    want_records.checkpoint(&mut want);
    for order in [[false, false, true, false], [false, true, false, false]] {
        // The first four batches, a checkpoint, a restart from its records, then the rest in
        // the other order.
        let mut before = index();
        let taken: Vec<bool> = order.to_vec();
        let (e, s) = (
            taken.iter().filter(|&&x| x).count(),
            taken.iter().filter(|&&x| !x).count(),
        );
        interleave(&mut before, &engine[..e], &store[..s], &taken);
        let mut records = Records::default();
        records.checkpoint(&mut before);
        let mut after = records.restore();
        assert_eq!(dump(&mut after, &others()), dump(&mut before, &others()));
        interleave(&mut after, &engine[e..], &store[s..], &[true; 3]);
        assert_eq!(dump(&mut after, &others()), want_dump, "order {order:?}");
        records.checkpoint(&mut after);
        assert_eq!(records.canonical(), want_records.canonical());
        assert_eq!(dump(&mut records.restore(), &others()), want_dump);
    }
}

#[test]
fn re_keying_writes_only_the_pairs_it_moved() {
    let mut ix = index();
    // A large context of objects no engine names, and four that an engine names later.
    let unrelated: Vec<u64> = (0..2000).map(|i| 0x7000_0000 + i).collect();
    ix.apply(&batch(
        store_source(),
        vec![
            objects("b0", Tier::CpuShare, &unrelated),
            objects(
                "b0",
                Tier::CpuShare,
                &engine_hashes(0..4).iter().map(|h| h.0).collect::<Vec<_>>(),
            ),
        ],
    ));
    let mut records = Records::default();
    records.checkpoint(&mut ix);
    ix.apply(&batch(engine_source(), vec![chained(0, 4, Tier::Device)]));
    let changes = records.checkpoint(&mut ix);
    // The engine's four pairs, and per moved pair its old key going and its new one coming.
    assert_eq!(changes.pairs.len(), 4 + 2 * 4);
    assert_eq!(changes.aliases.len(), 4);
    assert_eq!(ix.stats().raw_pairs, 2000);
    assert_eq!(dump(&mut records.restore(), &[]), dump(&mut ix, &[]));
}
