//! Unit tests of the index, one per semantic point of `docs/python-api.md`, query(), and of the
//! apply/attach/drop/detach contract.

use std::collections::{BTreeMap, BTreeSet};

use crate::events::{Holder, IndexBatch, IndexOp};
use crate::hashing::{HashProfile, PrefixKeys};
use crate::model::{BlockHash, ContextKey, SubscriptionKey, Tier};

use super::*;

/// Block size of the test context.
const BS: u64 = 4;

pub(super) fn test_profile() -> HashProfile {
    HashProfile::resolve(Some("sglang"), Some("sha256_raw"), None, Some("first64_be"))
        .expect("valid test profile")
}

/// Prompt keys with an optional partial final block (as the SGLang strategies count them),
/// recording which blocks were asked for and, optionally, checking no index lock is held.
pub(super) struct TestKeys {
    pub hashes: Vec<BlockHash>,
    pub block_size: u64,
    pub tokens: u64,
    pub asked: Vec<usize>,
    pub probe: Option<IndexReader>,
}

impl TestKeys {
    /// The blocks asked for, each once, in the order first asked (the walk asks for a key again
    /// when it reaches a block it prefetched; a real chain caches it).
    pub fn first_asks(&self) -> Vec<usize> {
        let mut seen = std::collections::HashSet::new();
        self.asked
            .iter()
            .copied()
            .filter(|&i| seen.insert(i))
            .collect()
    }

    pub fn full(hashes: &[u64]) -> Self {
        Self::with_tokens(hashes, hashes.len() as u64 * BS)
    }

    pub fn with_tokens(hashes: &[u64], tokens: u64) -> Self {
        TestKeys {
            hashes: hashes.iter().map(|&h| BlockHash(h)).collect(),
            block_size: BS,
            tokens,
            asked: Vec::new(),
            probe: None,
        }
    }
}

impl PrefixKeys for TestKeys {
    fn num_blocks(&self) -> usize {
        self.hashes.len()
    }
    fn key(&mut self, i: usize) -> BlockHash {
        if let Some(probe) = &self.probe {
            assert!(
                probe.all_unlocked(),
                "key({i}) called while an index lock is held"
            );
        }
        self.asked.push(i);
        self.hashes[i]
    }
    fn covered(&self, n: usize) -> u64 {
        (n as u64 * self.block_size).min(self.tokens)
    }
}

fn src(instance: &str, rank: u32) -> SubscriptionKey {
    SubscriptionKey::new(instance, "", rank)
}

fn store_src() -> SubscriptionKey {
    src("store-sub", 0)
}

fn new_index() -> ContextIndex {
    ContextIndex::new(ContextKey::new("", "m", "", BS as u32), test_profile())
}

fn engine(instance: &str, rank: u32) -> Holder {
    Holder::Engine {
        instance_id: instance.to_owned(),
        dp_rank: rank,
        group: 0,
    }
}

fn shared(backend: &str) -> Holder {
    Holder::Shared {
        backend_id: backend.to_owned(),
    }
}

fn hashes(keys: &[u64]) -> Vec<BlockHash> {
    keys.iter().map(|&k| BlockHash(k)).collect()
}

/// Store `keys` on `tier` for engine (instance, rank), reported by that engine's own source.
fn put(ix: &mut ContextIndex, instance: &str, rank: u32, tier: Tier, keys: &[u64]) -> ApplyReport {
    let op = IndexOp::Store {
        holder: engine(instance, rank),
        tier,
        hashes: hashes(keys),
    };
    ix.apply(&IndexBatch {
        source: src(instance, rank),
        ops: vec![op],
    })
}

fn put_shared(ix: &mut ContextIndex, backend: &str, tier: Tier, keys: &[u64]) -> ApplyReport {
    let op = IndexOp::Store {
        holder: shared(backend),
        tier,
        hashes: hashes(keys),
    };
    ix.apply(&IndexBatch {
        source: store_src(),
        ops: vec![op],
    })
}

fn counts(d: u64, l: u64, s: u64, k: u64) -> TierCounts {
    TierCounts {
        device: d * BS,
        cpu_local: l * BS,
        cpu_share: s * BS,
        disk: k * BS,
    }
}

fn rank_of(ix: &ContextIndex, keys: &[u64], instance: &str, rank: u32) -> TierCounts {
    let hits = ix.query(&mut TestKeys::full(keys), None);
    hits.hits[instance].rank_matches[&rank]
}

const P: [u64; 6] = [11, 12, 13, 14, 15, 16];

#[test]
fn full_device_hit_fills_every_tier() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P);
    assert_eq!(rank_of(&ix, &P, "a", 0), counts(6, 6, 6, 6));
}

#[test]
fn tiers_are_walked_in_order_with_cumulative_boundaries() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..1]);
    put(&mut ix, "a", 0, Tier::CpuLocal, &P[1..2]);
    put_shared(&mut ix, "b1", Tier::CpuShare, &P[2..3]);
    put(&mut ix, "a", 0, Tier::Disk, &P[3..4]);
    assert_eq!(rank_of(&ix, &P, "a", 0), counts(1, 2, 3, 4));
}

#[test]
fn an_earlier_tier_satisfies_a_later_phase() {
    // [device, cpu_local, device]: all three are accessible with device + local CPU memory.
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &[P[0], P[2]]);
    put(&mut ix, "a", 0, Tier::CpuLocal, &[P[1]]);
    assert_eq!(rank_of(&ix, &P[..3], "a", 0), counts(1, 3, 3, 3));
    // [cpu_local, device]: the device phase ends at block 0; cpu_local accepts both.
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::CpuLocal, &[P[0]]);
    put(&mut ix, "a", 0, Tier::Device, &[P[1]]);
    assert_eq!(rank_of(&ix, &P[..2], "a", 0), counts(0, 2, 2, 2));
    // A device block after a shared one counts for cpu_share, never for device.
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &[P[1]]);
    put_shared(&mut ix, "b1", Tier::CpuShare, &[P[0]]);
    assert_eq!(rank_of(&ix, &P[..2], "a", 0), counts(0, 0, 2, 2));
}

#[test]
fn the_cursor_never_goes_back_to_an_earlier_tier() {
    // [cpu_local, device, device]: device counts only a prefix from block 0, so it stays 0.
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::CpuLocal, &[P[0]]);
    put(&mut ix, "a", 0, Tier::Device, &[P[1], P[2]]);
    assert_eq!(rank_of(&ix, &P[..3], "a", 0), counts(0, 3, 3, 3));
    // [device, disk, cpu_local]: cpu_local ends at the disk-only block and is not resumed by
    // the cpu_local block after it; the disk phase accepts that block.
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &[P[0]]);
    put(&mut ix, "a", 0, Tier::Disk, &[P[1]]);
    put(&mut ix, "a", 0, Tier::CpuLocal, &[P[2]]);
    assert_eq!(rank_of(&ix, &P[..3], "a", 0), counts(1, 1, 1, 3));
}

#[test]
fn a_gap_stops_every_tier() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &[P[0], P[2], P[3]]);
    put_shared(&mut ix, "b1", Tier::Disk, &[P[4]]);
    assert_eq!(rank_of(&ix, &P, "a", 0), counts(1, 1, 1, 1));
}

#[test]
fn nothing_counts_after_a_disk_miss() {
    let mut ix = new_index();
    put_shared(&mut ix, "b1", Tier::Disk, &[P[0], P[2], P[3]]);
    put(&mut ix, "a", 0, Tier::Device, &[P[2], P[3]]);
    assert_eq!(rank_of(&ix, &P, "a", 0), counts(0, 0, 0, 1));
}

#[test]
fn an_empty_phase_falls_through_at_the_same_block() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..2]);
    put(&mut ix, "a", 0, Tier::Disk, &P[2..4]);
    assert_eq!(rank_of(&ix, &P, "a", 0), counts(2, 2, 2, 4));
}

#[test]
fn a_block_in_several_tiers_is_consumed_once() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..2]);
    put(&mut ix, "a", 0, Tier::CpuLocal, &P[..3]);
    put_shared(&mut ix, "b1", Tier::CpuShare, &P[..4]);
    put_shared(&mut ix, "b1", Tier::Disk, &P[..5]);
    assert_eq!(rank_of(&ix, &P, "a", 0), counts(2, 3, 4, 5));
}

#[test]
fn shared_tiers_are_visible_to_every_rank_engine_disk_is_not() {
    let mut ix = new_index();
    ix.attach_rank(&src("a", 0), "a", 0);
    ix.attach_rank(&src("a", 1), "a", 1);
    ix.attach_rank(&src("b", 0), "b", 0);
    put_shared(&mut ix, "b1", Tier::CpuShare, &P[..2]);
    put(&mut ix, "a", 0, Tier::Disk, &P[2..4]);
    let hits = ix.query(&mut TestKeys::full(&P), None).hits;
    assert_eq!(hits["a"].rank_matches[&0], counts(0, 0, 2, 4));
    assert_eq!(hits["a"].rank_matches[&1], counts(0, 0, 2, 2));
    assert_eq!(hits["b"].rank_matches[&0], counts(0, 0, 2, 2));
}

#[test]
fn instance_figures_are_the_max_over_ranks_and_ranks_never_concatenate() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..1]);
    put(&mut ix, "a", 1, Tier::Device, &P[1..3]);
    put(&mut ix, "a", 1, Tier::CpuLocal, &P[..1]);
    ix.attach_rank(&src("a", 2), "a", 2);
    let row = &ix.query(&mut TestKeys::full(&P), None).hits["a"];
    assert_eq!(row.rank_matches[&0], counts(1, 1, 1, 1));
    assert_eq!(row.rank_matches[&1], counts(0, 3, 3, 3));
    assert_eq!(row.rank_matches[&2], counts(0, 0, 0, 0));
    assert_eq!(row.dp, SortedMap::from_iter([(0, BS), (1, 0), (2, 0)]));
    assert_eq!(row.tiers(), counts(1, 3, 3, 3));
    assert_eq!(row.longest_matched, row.disk);
}

#[test]
fn a_partial_final_block_counts_its_tokens() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..3]);
    // 10 tokens: two full blocks and a partial third one.
    let row = &ix.query(&mut TestKeys::with_tokens(&P[..3], 10), None).hits["a"];
    assert_eq!(
        row.tiers(),
        TierCounts {
            device: 10,
            cpu_local: 10,
            cpu_share: 10,
            disk: 10
        }
    );
    let row = &ix
        .query(&mut TestKeys::with_tokens(&[P[0], P[1], 99], 10), None)
        .hits["a"];
    assert_eq!(row.device, 8);
}

#[test]
fn instance_filter_selects_one_and_unknown_filters_answer_empty() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..2]);
    put(&mut ix, "b", 0, Tier::Device, &P[..1]);
    let only_b = ix.query(&mut TestKeys::full(&P), Some("b")).hits;
    assert_eq!(only_b.keys().collect::<Vec<_>>(), vec!["b"]);
    assert_eq!(only_b["b"].device, BS);
    assert!(
        ix.query(&mut TestKeys::full(&P), Some("zzz"))
            .hits
            .is_empty()
    );
    assert_eq!(ix.query(&mut TestKeys::full(&P), Some("")).hits.len(), 2);
}

#[test]
fn empty_prompt_lists_registered_instances_with_zeros_and_creates_nothing() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P);
    let before = ix.stats();
    let mut keys = TestKeys::full(&[]);
    let hits = ix.query(&mut keys, None).hits;
    assert_eq!(hits["a"].rank_matches[&0], TierCounts::default());
    assert_eq!(hits["a"].dp[&0], 0);
    assert!(keys.asked.is_empty());
    assert_eq!(ix.stats(), before);
    assert!(
        new_index()
            .query(&mut TestKeys::full(&P), Some("a"))
            .hits
            .is_empty()
    );
}

#[test]
fn unregistered_instances_do_not_appear() {
    let mut ix = new_index();
    put_shared(&mut ix, "b1", Tier::CpuShare, &P);
    let mut keys = TestKeys::full(&P);
    assert!(ix.query(&mut keys, None).hits.is_empty());
    assert!(keys.asked.is_empty(), "no cursor, no hashing");
}

#[test]
fn invalid_tiers_are_counted_and_ignored() {
    let mut ix = new_index();
    let r = put(&mut ix, "a", 0, Tier::CpuShare, &P);
    assert_eq!((r.invalid_ops, r.stored), (1, 0));
    let r = put_shared(&mut ix, "b1", Tier::Device, &P);
    assert_eq!(r.invalid_ops, 1);
    put_shared(&mut ix, "b1", Tier::CpuLocal, &P);
    assert_eq!(ix.prefix_count(), 0);
    assert_eq!(ix.stats().invalid_ops, 3);
    assert!(ix.instances().is_empty(), "a refused store lists nothing");
}

#[test]
fn repeated_stores_need_as_many_removes_and_removes_are_per_tier() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..3]);
    put(&mut ix, "a", 0, Tier::Device, &P[..3]);
    put(&mut ix, "a", 0, Tier::CpuLocal, &P[..3]);
    assert_eq!((ix.stats().blocks, ix.stats().holder_blocks), (3, 3));
    let remove = IndexOp::Remove {
        holder: engine("a", 0),
        tier: Tier::Device,
        hashes: hashes(&P[..1]),
    };
    ix.apply(&IndexBatch {
        source: src("a", 0),
        ops: vec![remove.clone()],
    });
    assert_eq!(
        rank_of(&ix, &P[..3], "a", 0),
        counts(3, 3, 3, 3),
        "one of two device announcements removed"
    );
    ix.apply(&IndexBatch {
        source: src("a", 0),
        ops: vec![remove],
    });
    assert_eq!(rank_of(&ix, &P[..3], "a", 0), counts(0, 3, 3, 3));
    let remove = IndexOp::Remove {
        holder: engine("a", 0),
        tier: Tier::CpuLocal,
        hashes: hashes(&P[..1]),
    };
    ix.apply(&IndexBatch {
        source: src("a", 0),
        ops: vec![remove],
    });
    assert_eq!(ix.prefix_count(), 2);
    assert_eq!(rank_of(&ix, &P[..3], "a", 0), counts(0, 0, 0, 0));
}

#[test]
fn clear_holder_touches_only_that_holder() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..3]);
    put(&mut ix, "a", 0, Tier::Disk, &P[3..]);
    put(&mut ix, "a", 1, Tier::Device, &P[..2]);
    put_shared(&mut ix, "b1", Tier::CpuShare, &P[..1]);
    let clear = IndexOp::ClearHolder {
        holder: engine("a", 0),
    };
    let r = ix.apply(&IndexBatch {
        source: src("a", 0),
        ops: vec![clear],
    });
    assert_eq!(r.cleared, 6);
    assert_eq!(rank_of(&ix, &P, "a", 0), counts(0, 0, 1, 1));
    assert_eq!(rank_of(&ix, &P, "a", 1), counts(2, 2, 2, 2));
    assert_eq!(ix.prefix_count(), 2);
}

#[test]
fn drop_source_removes_its_blocks_keeps_its_ranks_detach_unlists() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..3]);
    put_shared(&mut ix, "b1", Tier::CpuShare, &P[..4]);
    put_shared(&mut ix, "b1", Tier::Disk, &P);
    // One shared holder on six blocks: six (block, holder) pairs, whatever the tiers.
    assert_eq!(ix.drop_source(&store_src()), 6);
    assert_eq!(rank_of(&ix, &P, "a", 0), counts(3, 3, 3, 3));
    assert_eq!(ix.drop_source(&src("a", 0)), 3);
    assert_eq!(ix.prefix_count(), 0);
    assert_eq!(
        ix.instances(),
        BTreeMap::from([("a".to_owned(), BTreeSet::from([0]))])
    );
    assert!(!ix.is_empty_and_detached());
    assert_eq!(rank_of(&ix, &P, "a", 0), TierCounts::default());
    ix.detach_source(&src("a", 0));
    assert!(ix.instances().is_empty());
    assert!(ix.is_empty_and_detached());
    assert!(ix.query(&mut TestKeys::full(&P), None).hits.is_empty());
    // A detached source that stores again is listed again.
    put(&mut ix, "a", 0, Tier::Device, &P[..1]);
    assert_eq!(rank_of(&ix, &P, "a", 0), counts(1, 1, 1, 1));
}

#[test]
fn two_sources_feeding_one_rank_are_independent() {
    let mut ix = new_index();
    let base = src("a", 0);
    let other = src("a-adapter-feed", 0);
    let op = |keys: &[u64]| IndexOp::Store {
        holder: engine("a", 0),
        tier: Tier::Device,
        hashes: hashes(keys),
    };
    ix.apply(&IndexBatch {
        source: base.clone(),
        ops: vec![op(&P[..2])],
    });
    ix.apply(&IndexBatch {
        source: other.clone(),
        ops: vec![op(&P[..4])],
    });
    ix.detach_source(&other);
    assert_eq!(rank_of(&ix, &P, "a", 0), counts(2, 2, 2, 2));
    assert_eq!(ix.instances()["a"], BTreeSet::from([0]));
}

#[test]
fn snapshot_restores_every_answer() {
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..2]);
    put(&mut ix, "a", 1, Tier::CpuLocal, &P[..3]);
    put(&mut ix, "b", 0, Tier::Disk, &P);
    put_shared(&mut ix, "b1", Tier::CpuShare, &P[..4]);
    ix.attach_rank(&src("c", 3), "c", 3);
    let copy = ContextSnapshot::of(&ix).restore();
    for filter in [None, Some("a"), Some("c")] {
        assert_eq!(
            copy.query(&mut TestKeys::full(&P), filter),
            ix.query(&mut TestKeys::full(&P), filter)
        );
    }
    assert_eq!(copy.view(), ix.view());
    assert_eq!(copy.stats().holder_blocks, ix.stats().holder_blocks);
}

#[test]
fn view_reports_key_profile_count_and_ranks() {
    let mut ix = new_index();
    put(&mut ix, "a", 1, Tier::Device, &P[..2]);
    put_shared(&mut ix, "b1", Tier::CpuShare, &P[1..4]);
    ix.attach_rank(&src("a", 0), "a", 0);
    let view = ix.view();
    assert_eq!(view.key, ContextKey::new("default", "m", "", 4));
    assert_eq!(view.profile, test_profile());
    assert_eq!(view.prefix_count, 4);
    assert_eq!(
        view.instances,
        BTreeMap::from([("a".to_owned(), BTreeSet::from([0, 1]))])
    );
}

#[test]
fn hash_list_counts_whole_blocks() {
    let mut keys = HashList {
        hashes: hashes(&P[..3]),
        block_size: 16,
    };
    assert_eq!(
        (keys.num_blocks(), keys.covered(2), keys.covered(9)),
        (3, 32, 48)
    );
    assert_eq!(keys.key(1), BlockHash(P[1]));
    let mut ix = new_index();
    put(&mut ix, "a", 0, Tier::Device, &P[..2]);
    assert_eq!(ix.query(&mut keys, None).hits["a"].device, 32);
}

#[test]
fn queries_run_while_the_writer_stores() {
    let mut ix = new_index();
    let reader = ix.reader();
    let keys: Vec<u64> = (1..=64).collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            let mut last = 0;
            let mut queries = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || queries == 0 {
                let hits = reader.query(&mut TestKeys::full(&keys), None).hits;
                let got = hits.get("a").map_or(0, |r| r.device);
                // Blocks are stored in prefix order and never removed: answers only grow.
                assert!(got >= last, "device went from {last} to {got}");
                last = got;
                queries += 1;
            }
            last
        });
        for k in &keys {
            put(&mut ix, "a", 0, Tier::Device, &[*k]);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(t.join().expect("reader thread") <= 64 * BS);
    });
    assert_eq!(rank_of(&ix, &keys, "a", 0).device, 64 * BS);
}

#[test]
fn the_actor_forwards_and_the_handle_queries_without_the_mailbox() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<ContextHandle>();
    assert_send_sync::<IndexReader>();
    actix_rt::System::new().block_on(async {
        let handle = ContextHandle::start(new_index());
        let op = IndexOp::Store {
            holder: engine("a", 0),
            tier: Tier::Device,
            hashes: hashes(&P[..3]),
        };
        let report = handle
            .send(ApplyBatch(IndexBatch {
                source: src("a", 0),
                ops: vec![op],
            }))
            .await;
        assert_eq!(report.expect("actor alive").stored, 3);
        handle
            .send(AttachRank {
                source: src("b", 0),
                instance_id: "b".into(),
                dp_rank: 0,
            })
            .await
            .expect("actor alive");
        let hits = handle.query(&mut TestKeys::full(&P), None).hits;
        assert_eq!(hits["a"].device, 3 * BS);
        assert_eq!(hits["b"].device, 0);
        assert_eq!(
            handle
                .send(GetStats)
                .await
                .expect("actor alive")
                .holder_blocks,
            3
        );
        assert_eq!(
            handle
                .send(DropSource(src("a", 0)))
                .await
                .expect("actor alive"),
            3
        );
        let snap = handle.send(Snapshot).await.expect("actor alive");
        assert_eq!(snap.attachments.len(), 2);
        let out = handle
            .send(DetachSource(src("a", 0)))
            .await
            .expect("actor alive");
        assert_eq!(
            out,
            DetachOutcome {
                removed: 0,
                empty_and_detached: false
            }
        );
        let out = handle
            .send(DetachSource(src("b", 0)))
            .await
            .expect("actor alive");
        assert!(out.empty_and_detached);
        assert_eq!(handle.view().prefix_count, 0);
    });
}

mod budget;
mod hybrid;
mod reclaim;
mod refs;
mod restore;
mod walk;
