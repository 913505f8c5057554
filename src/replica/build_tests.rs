//! Contexts built from a snapshot's records as they arrive are those recovery makes from a
//! store holding the same records; records out of the store's order stop the build.

use crate::durability::codec;
use crate::durability::recovery::{Recovered, recover};
use crate::gateway::pb::SnapshotChunk;
use crate::index::{ContextIndex, ContextSnapshot};
use crate::storage::{Cf, KvOp};

use super::build::StreamBuild;
use super::cut::Cut;
use super::cut_tests::{busy_context_of, ops_of, records_of, registration, source, store_of};

/// The chunks of a cut of `contexts`, with the registrations of sources `registered` only.
fn chunks_of(contexts: Vec<ContextIndex>, registered: &[u32]) -> Vec<SnapshotChunk> {
    let mut exported: Vec<_> = contexts.iter().map(|c| c.export_changes()).collect();
    exported.sort_by_key(|c| codec::context_id(&c.key));
    let registrations = registered
        .iter()
        .map(|&i| {
            let c = registration(i);
            let key = c.subscription_key().to_string().into_bytes();
            (key, codec::registration_value(&c))
        })
        .collect();
    // Each source resumes from the lowest of its positions in the contexts, as the peer's
    // subscriptions would have pushed them.
    let mut positions = super::positions::Positions::new();
    for context in &contexts {
        for s in 0..2 {
            if let Some(mark) = context.watermark(&source(s)) {
                let lowest = positions.entry(source(s)).or_insert(mark);
                if mark.seq < lowest.seq {
                    *lowest = mark;
                }
            }
        }
    }
    let cut = Cut {
        contexts: exported,
        registrations,
        positions,
        tuning: crate::hashing::derived::ChainTuning::DEFAULT,
    };
    cut.into_chunks("peer".into(), 64 * 1024).collect()
}

/// Feed every chunk as the pull does.
pub(super) fn build(chunks: &[SnapshotChunk]) -> Result<Recovered, String> {
    let mut build = StreamBuild::default();
    for chunk in chunks {
        build.feed(&ops_of(chunk))?;
    }
    build.finish(records_of(chunks))
}

fn assert_same(built: &Recovered, recovered: &Recovered) {
    assert_eq!(built.pairs, recovered.pairs);
    assert_eq!(built.contexts.len(), recovered.contexts.len());
    for (b, r) in built.contexts.iter().zip(&recovered.contexts) {
        assert_eq!(ContextSnapshot::of(b), ContextSnapshot::of(r));
        for s in 0..2 {
            assert_eq!(b.watermark(&source(s)), r.watermark(&source(s)));
        }
    }
    let marks = |r: &Recovered| -> Vec<_> {
        r.registrations
            .iter()
            .map(|r| (r.config.subscription_key(), r.restored.resume))
            .collect()
    };
    assert_eq!(marks(built), marks(recovered));
}

#[test]
fn a_snapshot_built_as_it_arrives_is_what_recovery_makes_of_its_records() {
    for registered in [&[0, 1][..], &[1]] {
        let contexts = vec![busy_context_of("m", 1), busy_context_of("n", 2)];
        let chunks = chunks_of(contexts, registered);
        assert!(chunks.len() > 4, "{} chunks", chunks.len());
        let built = build(&chunks).expect("built");
        let recovered = recover(&store_of(&chunks)).unwrap();
        assert_eq!(built.contexts.len(), 2);
        assert!(built.pairs > 80_000, "{}", built.pairs);
        // With source 0 unregistered, its blocks are dropped from both contexts alike.
        assert_same(&built, &recovered);
    }
}

#[test]
fn records_out_of_the_stores_order_stop_the_build() {
    let chunks = chunks_of(vec![busy_context_of("m", 3)], &[0, 1]);
    let ops: Vec<KvOp> = chunks
        .iter()
        .flat_map(ops_of)
        .filter(|op| {
            !matches!(
                op,
                KvOp::Put {
                    cf: Cf::Registrations,
                    ..
                }
            )
        })
        .collect();
    let first_pair = ops
        .iter()
        .position(|op| matches!(op, KvOp::Put { cf: Cf::Pairs, .. }))
        .expect("pairs");
    let feed = |ops: Vec<KvOp>| StreamBuild::default().feed(&ops);
    // A pair sent twice.
    let mut repeated = ops[..=first_pair].to_vec();
    repeated.push(ops[first_pair].clone());
    assert!(feed(repeated).unwrap_err().contains("order"));
    // A holder after the pairs.
    let mut late = ops[..=first_pair].to_vec();
    late.push(ops[1].clone());
    assert!(matches!(
        ops[1],
        KvOp::Put {
            cf: Cf::Holders,
            ..
        }
    ));
    assert!(feed(late).unwrap_err().contains("order"));
    // Records before their context's header.
    assert!(
        feed(ops[1..].to_vec())
            .unwrap_err()
            .contains("before any context")
    );
    // A record of another context.
    let mut other = ops[..first_pair].to_vec();
    if let KvOp::Put { key, .. } = &mut other[first_pair - 1] {
        key[0] ^= 1;
    }
    assert!(feed(other).unwrap_err().contains("another context"));
    // A record recovery cannot read.
    let mut bad = ops[..=first_pair].to_vec();
    if let KvOp::Put { value, .. } = &mut bad[first_pair] {
        value.clear();
    }
    assert!(feed(bad).unwrap_err().contains("empty value"));
    // A holder id far past what was sent: refused as it is read, before a slot is made for
    // every id below it.
    let mut far = ops[..2].to_vec();
    if let KvOp::Put { key, .. } = &mut far[1] {
        key[8..12].copy_from_slice(&(1u32 << 27).to_be_bytes());
    }
    assert!(feed(far).unwrap_err().contains("unused holder ids"));
    // The whole stream in order builds.
    assert!(feed(ops).is_ok());
}
