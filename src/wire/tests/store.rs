//! Mooncake store admission rules on hand-built maps (`docs/reference-behaviour.md`, "Mooncake
//! store events").

use super::{V, decode_store, i, ints, invalid_fields, map, s, with};
use crate::events::{IgnoreReason, KvEvent};
use crate::hashing::IndexProjection;
use crate::model::{BlockHash, PublisherType, Tier};
use crate::wire::{EnvelopeError, decode};

const DIGEST: &str = "0xabababababababababababababababababababababababf1e2d3c4b5a69788";
const LOW64: u64 = 0xf1e2_d3c4_b5a6_9788;

fn stored() -> V {
    map(&[
        ("event_id", i(1)),
        ("timestamp", i(1000)),
        ("event_type", s("stored")),
        ("model_name", s("m")),
        ("block_size", i(16)),
        ("lora_name", V::Nil),
        ("tenant_id", s("")),
        ("backend_id", s("b")),
        ("medium", s("cpu")),
        ("dp_rank", i(0)),
        ("group_id", V::Nil),
        ("object_key", s("k")),
        ("connector_block_hash", s(DIGEST)),
        ("seq_hashes", ints(&[i128::from(LOW64)])),
        ("base_block_idx", V::Nil),
        ("parent_hash", V::Nil),
        ("token_ids", V::Nil),
    ])
}

fn removed() -> V {
    let ev = with(&stored(), "event_type", Some(s("removed")));
    with(&with(&ev, "parent_hash", None), "token_ids", None)
}

fn cleared() -> V {
    map(&[
        ("event_type", s("cleared")),
        ("tenant_id", s("t")),
        ("backend_id", s("b")),
        ("medium", V::Nil),
    ])
}

fn payload(events: Vec<V>) -> Vec<u8> {
    V::A(vec![i(1000), V::A(events), V::Nil]).encode()
}

/// Decode `[good, bad]` and return the rejected field of the second event.
fn reject(bad: V) -> String {
    let b = decode_store(&payload(vec![stored(), bad])).expect("envelope is fine");
    assert_eq!(b.events.len(), 1, "{:?}", b.invalid);
    let fields = invalid_fields(&b);
    assert_eq!(fields.len(), 1, "{:?}", b.invalid);
    assert_eq!(fields[0].0, 1);
    fields[0].1.clone()
}

#[test]
fn a_stored_object_decodes_with_its_context_fields() {
    let b = decode_store(&payload(vec![stored(), removed(), cleared()])).unwrap();
    assert_eq!((b.ts, b.dp_rank), (1000.0, None));
    let KvEvent::StoreStored(o) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(o.hashes, vec![BlockHash(LOW64)]);
    assert_eq!(
        (
            o.tier,
            o.tenant_id.as_str(),
            o.block_size,
            o.model_name.as_deref()
        ),
        (Tier::CpuShare, "default", Some(16), Some("m"))
    );
    assert!(
        matches!(&b.events[1], KvEvent::StoreRemoved(r) if r.object_key == "k" && r.hashes == vec![BlockHash(LOW64)])
    );
    assert_eq!(
        b.events[2],
        KvEvent::StoreCleared {
            backend_id: "b".into(),
            tenant_id: "t".into()
        }
    );
}

#[test]
fn the_digest_is_projected_like_the_engine_hashes() {
    let ev = with(&stored(), "seq_hashes", None);
    let b = decode(
        PublisherType::Mooncake,
        &payload(vec![ev]),
        IndexProjection::First64Be,
    )
    .unwrap();
    let KvEvent::StoreStored(o) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(o.hashes, vec![BlockHash(0xabab_abab_abab_abab)]);
}

#[test]
fn relaxed_fields() {
    // No event_id, timestamp or dp_rank; legacy type agreeing; no digest (seq_hashes alone);
    // block_size 0 means unknown; group "group:0"; upper-case medium.
    let ev = with(&stored(), "event_id", None);
    let ev = with(&with(&ev, "timestamp", Some(i(5))), "dp_rank", Some(V::Nil));
    let ev = with(
        &with(&ev, "type", Some(s("BlockStored"))),
        "connector_block_hash",
        None,
    );
    let ev = with(
        &with(&ev, "block_size", Some(i(0))),
        "group_id",
        Some(s("group:0")),
    );
    let ev = with(
        &with(&ev, "medium", Some(s("DISK"))),
        "seq_hashes",
        Some(ints(&[-1])),
    );
    let b = decode_store(&payload(vec![
        ev,
        with(&removed(), "seq_hashes", Some(ints(&[]))),
    ]))
    .unwrap();
    assert_eq!(b.invalid, Vec::<String>::new());
    let KvEvent::StoreStored(o) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(
        (o.hashes.clone(), o.tier, o.block_size),
        (vec![BlockHash(u64::MAX)], Tier::Disk, None)
    );
    // The digest still names the removed object even with an empty seq_hashes list.
    assert!(matches!(&b.events[1], KvEvent::StoreRemoved(r) if r.hashes == vec![BlockHash(LOW64)]));
}

#[test]
fn strict_fields() {
    assert_eq!(reject(with(&stored(), "tenant_id", None)), "tenant_id");
    assert_eq!(
        reject(with(&stored(), "tenant_id", Some(V::Nil))),
        "tenant_id"
    );
    assert_eq!(
        reject(with(&stored(), "backend_id", Some(s("")))),
        "backend_id"
    );
    assert_eq!(reject(with(&stored(), "object_key", None)), "object_key");
    assert_eq!(reject(with(&stored(), "event_type", None)), "event_type");
    assert_eq!(
        reject(with(&stored(), "event_type", Some(s("moved")))),
        "event_type"
    );
    assert_eq!(reject(with(&stored(), "type", Some(s("removed")))), "type");
    assert_eq!(
        reject(with(&stored(), "seq_hashes", Some(ints(&[5])))),
        "seq_hashes"
    );
    assert_eq!(
        reject(with(
            &stored(),
            "seq_hashes",
            Some(ints(&[i128::from(LOW64), 5]))
        )),
        "seq_hashes"
    );
    assert_eq!(
        reject(with(&stored(), "block_hashes", Some(ints(&[5])))),
        "block_hashes"
    );
    assert_eq!(
        reject(with(&stored(), "connector_block_hash", Some(s("0x123")))),
        "connector_block_hash"
    );
    assert_eq!(
        reject(with(
            &stored(),
            "connector_block_hash",
            Some(s(&"zz".repeat(16)))
        )),
        "connector_block_hash"
    );
    assert_eq!(
        reject(with(&stored(), "group_id", Some(s("one")))),
        "group_id"
    );
    assert_eq!(
        reject(with(&stored(), "parent_block_hash", Some(i(3)))),
        "parent_block_hash"
    );
    assert_eq!(
        reject(with(
            &with(&stored(), "connector_block_hash", None),
            "seq_hashes",
            Some(ints(&[]))
        )),
        "seq_hashes"
    );
    assert_eq!(
        reject(with(&removed(), "parent_hash", Some(V::Nil))),
        "parent_hash"
    );
    assert_eq!(
        reject(with(&cleared(), "object_key", Some(s("k")))),
        "object_key"
    );
    assert_eq!(
        reject(with(&cleared(), "seq_hashes", Some(ints(&[])))),
        "seq_hashes"
    );
    assert_eq!(
        reject(with(&stored(), "block_size", Some(i(-1)))),
        "block_size"
    );
    assert_eq!(
        reject(with(&stored(), "seq_hashes", Some(s("1")))),
        "seq_hashes"
    );
    assert_eq!(reject(i(3)), "<event>");
    let V::M(mut entries) = stored() else {
        unreachable!()
    };
    entries.push((s("medium"), s("cpu")));
    assert_eq!(reject(V::M(entries)), "medium");
}

#[test]
fn ignores_are_counted() {
    let b = decode_store(&payload(vec![
        with(&stored(), "medium", Some(s("gpu"))),
        with(&stored(), "medium", None),
        with(&stored(), "group_id", Some(s("2"))),
        with(&removed(), "group_id", Some(i(1))),
    ]))
    .unwrap();
    assert!(b.events.is_empty());
    assert_eq!(
        b.ignored,
        vec![
            IgnoreReason::UnknownMedium,
            IgnoreReason::UnknownMedium,
            IgnoreReason::OtherCacheGroup,
            IgnoreReason::OtherCacheGroup
        ]
    );
}

#[test]
fn store_envelopes() {
    assert_eq!(
        decode_store(&V::A(vec![i(1), V::A(vec![]), i(2)]).encode())
            .unwrap()
            .dp_rank,
        Some(2)
    );
    assert_eq!(
        decode_store(&V::A(vec![i(1), V::A(vec![])]).encode())
            .unwrap()
            .dp_rank,
        None
    );
    // The store never sends the map form.
    let as_map = map(&[("ts", i(1)), ("events", V::A(vec![]))]).encode();
    assert_eq!(
        decode_store(&as_map),
        Err(EnvelopeError::RootType { got: "map" })
    );
    assert_eq!(
        decode_store(&V::A(vec![V::Nil, V::A(vec![])]).encode()),
        Err(EnvelopeError::Timestamp { reason: "nil" })
    );
    assert_eq!(
        decode_store(&V::A(vec![i(1), V::A(vec![]), V::Bool(true)]).encode()),
        Err(EnvelopeError::DpRank { reason: "bool" })
    );
}
