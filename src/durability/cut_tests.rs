//! Recovery resumes each source from its record of the last round, and drops a source that no
//! valid record vouches for (`docs/durability.md`, "One consistent cut").

use crate::events::{Holder, IndexBatch, IndexOp};
use crate::index::{ContextIndex, Watermark};
use crate::model::{BlockHash, ContextKey, PublisherConfig, SubscriptionKey, Tier};
use crate::storage::memory::MemoryStore;
use crate::storage::{Cf, KvOp, KvStore};

use super::checkpoint::context_ops;
use super::codec;
use super::recovery::recover;
use super::sources::{delete_registration, put_registration};

fn source() -> SubscriptionKey {
    SubscriptionKey::new("e", "", 0)
}

fn context(lora: &str) -> ContextIndex {
    ContextIndex::new(
        ContextKey::new("", "m", lora, 16),
        crate::hashing::profile::vllm_cbor_default(),
    )
}

fn mark(seq: u64) -> Watermark {
    Watermark { seq, digest: seq }
}

fn stored(index: &mut ContextIndex, block: u64, seq: u64) {
    let batch = IndexBatch {
        source: source(),
        ops: vec![IndexOp::Store {
            holder: Holder::Engine {
                instance_id: "e".into(),
                dp_rank: 0,
                group: 0,
            },
            tier: Tier::Device,
            hashes: vec![BlockHash(block)],
        }],
    };
    index.apply_sequenced(&batch, mark(seq));
}

fn record(store: &dyn KvStore, incarnation: u64, seq: u64) {
    store
        .write(vec![KvOp::Put {
            cf: Cf::Sources,
            key: source().to_string().into_bytes(),
            value: codec::source_value(incarnation, mark(seq)),
        }])
        .unwrap();
}

fn write(store: &dyn KvStore, index: &mut ContextIndex) {
    store.write(context_ops(&index.take_changes())).unwrap();
}

/// One round: a base context at seq 61 (ahead of the position the round began at) and an
/// adapter context the source created at seq 55, with the source record at 60.
fn one_round(store: &MemoryStore) -> u64 {
    let incarnation =
        put_registration(store, &PublisherConfig::test_vllm("e", "tcp://h:1")).unwrap();
    let (mut base, mut adapter) = (context(""), context("ad"));
    stored(&mut base, 1, 50);
    stored(&mut adapter, 2, 55);
    adapter.advance(&source(), mark(60));
    stored(&mut base, 3, 61);
    write(store, &mut base);
    write(store, &mut adapter);
    record(store, incarnation, 60);
    incarnation
}

#[test]
fn a_source_resumes_from_its_record_and_contexts_ahead_of_it_keep_their_own() {
    let store = MemoryStore::new();
    let incarnation = one_round(&store);
    let r = recover(&store).unwrap();
    assert_eq!(r.registrations.len(), 1);
    let restored = r.registrations[0].restored;
    assert_eq!(restored.incarnation, incarnation);
    assert_eq!(
        restored.resume,
        Some(mark(60)),
        "the record, not the contexts' 61"
    );
    assert!(!restored.dropped);
    assert_eq!(r.contexts.len(), 2);
    assert!(r.dropped.is_empty());
}

#[test]
fn a_registration_without_a_record_drops_its_source_from_every_context() {
    let store = MemoryStore::new();
    one_round(&store);
    store
        .write(vec![KvOp::Delete {
            cf: Cf::Sources,
            key: source().to_string().into_bytes(),
        }])
        .unwrap();
    let r = recover(&store).unwrap();
    assert!(r.contexts.is_empty(), "nothing vouches for the blocks");
    let restored = r.registrations[0].restored;
    assert_eq!((restored.resume, restored.dropped), (None, true));
    assert_eq!(r.dropped, [(source(), "no_position")]);
}

/// Unregister then register the same key again, and a crash before the next round (or a
/// round in flight writing the old record back): the old incarnation's blocks and position
/// never come back.
#[test]
fn a_reregistration_never_resurrects_the_old_incarnation() {
    let store = MemoryStore::new();
    let old = one_round(&store);
    delete_registration(&store, &source()).unwrap();
    assert_eq!(
        store.len(Cf::Sources),
        0,
        "the record goes with the registration"
    );
    let new = put_registration(&store, &PublisherConfig::test_vllm("e", "tcp://h:1")).unwrap();
    assert_ne!(new, old);
    for stale_record in [false, true] {
        if stale_record {
            record(&store, old, 60);
        }
        let r = recover(&store).unwrap();
        assert!(r.contexts.is_empty(), "stale record: {stale_record}");
        let restored = r.registrations[0].restored;
        assert_eq!(restored.incarnation, new);
        assert_eq!((restored.resume, restored.dropped), (None, true));
        assert_eq!(
            r.sources.len(),
            usize::from(stale_record),
            "the first round deletes it"
        );
    }
}

#[test]
fn a_context_behind_the_record_drops_the_source() {
    let store = MemoryStore::new();
    let incarnation = one_round(&store);
    record(&store, incarnation, 70);
    let r = recover(&store).unwrap();
    assert!(r.contexts.is_empty());
    assert_eq!(r.registrations[0].restored.resume, None);
    assert!(r.dropped.iter().all(|(k, _)| *k == source()));
    assert!(
        r.dropped
            .iter()
            .any(|(_, why)| *why == "behind_its_position")
    );
}
