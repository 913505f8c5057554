//! A snapshot's chunks, written into an empty store and recovered, give back the exporting
//! context exactly (pairs, repeat counts, holders, listings, watermarks), in chunks that respect
//! their bound and carry their marks; exporting leaves the context's own checkpoints alone.

use crate::durability::codec;
use crate::durability::recovery::recover;
use crate::events::{Holder, IndexBatch, IndexOp};
use crate::index::{ContextIndex, ContextSnapshot, Watermark};
use crate::model::{BlockHash, ContextKey, PublisherConfig, PublisherType, SubscriptionKey, Tier};
use crate::storage::memory::MemoryStore;
use crate::storage::{Cf, KvOp, KvStore};
use crate::test_rng::Rng;

use super::cut::Cut;
use super::format::{self, FORMAT};

pub(super) fn source(i: u32) -> SubscriptionKey {
    SubscriptionKey::new(&format!("e{i}"), "", 0)
}

pub(super) fn registration(i: u32) -> PublisherConfig {
    PublisherConfig {
        instance_id: format!("e{i}"),
        endpoint: format!("tcp://127.0.0.1:{}", 6000 + i),
        replay_endpoint: String::new(),
        publisher_type: PublisherType::Vllm,
        model_name: "m".into(),
        lora_name: String::new(),
        tenant_id: "default".into(),
        block_size: 16,
        dp_rank: 0,
        cache_group: None,
        hybrid_parts: Vec::new(),
        hash_profile: crate::hashing::profile::vllm_cbor_default(),
    }
}

fn engine(i: u32) -> Holder {
    Holder::Engine {
        instance_id: format!("e{i}"),
        dp_rank: 0,
        group: 0,
    }
}

/// A context of two sources with more pairs than one slice, repeated announcements on both
/// sides of a slice boundary, removals, a store backend and a rank listing.
fn busy_context(seed: u64) -> ContextIndex {
    busy_context_of("m", seed)
}

/// [`busy_context`] for the model `model`.
pub(super) fn busy_context_of(model: &str, seed: u64) -> ContextIndex {
    let mut rng = Rng(seed);
    let mut index = ContextIndex::new(
        ContextKey::new("", model, "", 16),
        crate::hashing::profile::vllm_cbor_default(),
    );
    index.attach_rank(&source(0), "e0", 0);
    let store = |s: u32, holder: Holder, tier: Tier, hashes: Vec<u64>| IndexBatch {
        source: source(s),
        ops: vec![IndexOp::Store {
            holder,
            tier,
            hashes: hashes.into_iter().map(BlockHash).collect(),
        }],
    };
    let mut seq = 0;
    let mut apply = |index: &mut ContextIndex, batch: &IndexBatch| {
        seq += 1;
        index.apply_sequenced(
            batch,
            Watermark {
                seq,
                digest: seq * 7,
            },
        );
    };
    apply(
        &mut index,
        &store(0, engine(0), Tier::Device, (0..40_000).collect()),
    );
    apply(
        &mut index,
        &store(1, engine(1), Tier::CpuLocal, (30_000..50_000).collect()),
    );
    for _ in 0..200 {
        let hashes: Vec<u64> = (0..8).map(|_| rng.below(50_000) as u64).collect();
        let batch = match rng.below(4) {
            0 => IndexBatch {
                source: source(0),
                ops: vec![IndexOp::Remove {
                    holder: engine(0),
                    tier: Tier::Device,
                    hashes: hashes.into_iter().map(BlockHash).collect(),
                }],
            },
            1 => store(
                1,
                Holder::Shared {
                    backend_id: "b".into(),
                },
                Tier::CpuShare,
                hashes,
            ),
            // Announced again: a repeat count.
            _ => store(0, engine(0), Tier::Device, hashes),
        };
        apply(&mut index, &batch);
    }
    index
}

/// A chunk's records as the puts that store them.
pub(super) fn ops_of(chunk: &crate::gateway::pb::SnapshotChunk) -> Vec<KvOp> {
    chunk
        .records
        .iter()
        .map(|r| KvOp::Put {
            cf: format::cf_of(r.cf).expect("known cf"),
            key: r.key.clone(),
            value: r.value.clone(),
        })
        .collect()
}

pub(super) fn store_of(chunks: &[crate::gateway::pb::SnapshotChunk]) -> MemoryStore {
    let store = MemoryStore::new();
    for chunk in chunks {
        store.write(ops_of(chunk)).unwrap();
    }
    store
        .write(super::positions::record_ops(&records_of(chunks)))
        .unwrap();
    store
}

/// The source records a pull writes for `chunks`: the begin mark's positions under the
/// incarnations of the registrations the snapshot carries.
pub(super) fn records_of(
    chunks: &[crate::gateway::pb::SnapshotChunk],
) -> std::collections::HashMap<SubscriptionKey, (u64, Watermark)> {
    let begin = chunks[0].begin.clone().expect("begin mark");
    let positions = super::positions::from_wire(&begin.sources).expect("positions");
    let registered: Vec<_> = chunks
        .iter()
        .flat_map(ops_of)
        .filter_map(|op| match op {
            KvOp::Put {
                cf: Cf::Registrations,
                value,
                ..
            } => Some(super::positions::registered(&value).expect("registration")),
            _ => None,
        })
        .collect();
    super::positions::source_records(&registered, &positions)
}

#[test]
fn the_chunks_recover_into_the_same_context_and_respect_their_bound() {
    for seed in [1, 2] {
        let mut index = busy_context(seed);
        // Half of it was checkpointed already: the export must not change what is still due.
        let _ = index.take_changes();
        index.apply_sequenced(
            &IndexBatch {
                source: source(1),
                ops: vec![IndexOp::ClearHolder { holder: engine(1) }],
            },
            Watermark {
                seq: 10_000,
                digest: 3,
            },
        );
        let due = index.has_changes();
        // The sources' positions, as their subscriptions pushed them to the context.
        let positions: super::positions::Positions = (0..2)
            .filter_map(|s| Some((source(s), index.watermark(&source(s))?)))
            .collect();
        assert_eq!(positions.len(), 2);
        let cut = Cut {
            contexts: vec![index.export_changes()],
            registrations: (0..2)
                .map(|i| {
                    let c = registration(i);
                    (
                        c.subscription_key().to_string().into_bytes(),
                        codec::registration_value(&c),
                    )
                })
                .collect(),
            positions: positions.clone(),
            tuning: crate::hashing::derived::ChainTuning::DEFAULT,
        };
        assert_eq!(index.has_changes(), due);
        let pairs = cut.contexts[0].pairs.len() as u64;
        assert!(pairs > 40_000, "{pairs}");
        assert!(!cut.contexts[0].repeats.is_empty());
        let bound = 64 * 1024;
        let chunks: Vec<_> = cut.into_chunks("peer".into(), bound).collect();
        let begin = chunks[0].begin.clone().expect("begin mark");
        assert_eq!(
            (begin.format, begin.pairs, begin.contexts),
            (FORMAT, pairs, 1)
        );
        // The sources' positions travel in the begin mark.
        assert_eq!(super::positions::from_wire(&begin.sources), Ok(positions));
        let mut records = 0;
        for (i, chunk) in chunks.iter().enumerate() {
            assert_eq!(chunk.seq, i as u64);
            assert_eq!(chunk.begin.is_some(), i == 0);
            assert_eq!(chunk.end.is_some(), i == chunks.len() - 1);
            let bytes: usize = chunk.records.iter().map(format::record_bytes).sum();
            let last = chunk.records.last().map_or(0, format::record_bytes);
            assert!(bytes - last < bound, "chunk {i}: {bytes} bytes");
            records += chunk.records.len() as u64;
        }
        assert_eq!(records, begin.records);
        let end = chunks.last().and_then(|c| c.end).expect("end mark");
        assert_eq!((end.records, end.pairs), (records, pairs));

        let recovered = recover(&store_of(&chunks)).unwrap();
        assert_eq!(recovered.pairs, pairs);
        assert_eq!(recovered.registrations.len(), 2);
        let back = recovered.contexts.into_iter().next().expect("context");
        assert_eq!(
            ContextSnapshot::of(&back),
            ContextSnapshot::of(&index),
            "seed {seed}"
        );
        for s in 0..2 {
            assert_eq!(back.watermark(&source(s)), index.watermark(&source(s)));
        }
        // Every registration resumes from its position in the snapshot.
        for r in &recovered.registrations {
            assert_eq!(
                r.restored.resume,
                index.watermark(&r.config.subscription_key())
            );
        }
    }
}

#[test]
fn an_empty_cut_is_one_chunk_with_both_marks() {
    let cut = Cut {
        contexts: Vec::new(),
        registrations: Vec::new(),
        positions: Default::default(),
        tuning: crate::hashing::derived::ChainTuning::DEFAULT,
    };
    let chunks: Vec<_> = cut.into_chunks("peer".into(), 1024).collect();
    assert_eq!(chunks.len(), 1);
    assert!(chunks[0].begin.is_some() && chunks[0].end.is_some());
    assert!(chunks[0].records.is_empty());
}
