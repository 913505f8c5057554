//! Engine (vLLM / SGLang) envelope and per-event rules on hand-built payloads.

use super::{V, arr, batch, decode_sglang, decode_vllm, i, ints, invalid_fields, map, s, with};
use crate::events::{EventTokens, IgnoreReason, KvEvent};
use crate::model::{BlockHash, GroupKind, Tier};
use crate::wire::EnvelopeError;

/// A complete vLLM 0.33 BlockStored, as its publisher writes it.
fn stored() -> V {
    map(&[
        ("type", s("BlockStored")),
        ("block_hashes", ints(&[1, 2])),
        ("parent_block_hash", V::Nil),
        ("token_ids", ints(&[1, 2, 3, 4])),
        ("block_size", i(2)),
        ("lora_id", V::Nil),
        ("medium", s("GPU")),
        ("lora_name", V::Nil),
        ("extra_keys", arr([V::Nil, V::Nil])),
        ("group_idx", i(0)),
        ("kv_cache_spec_kind", s("full_attention")),
    ])
}

fn removed() -> V {
    map(&[
        ("type", s("BlockRemoved")),
        ("block_hashes", ints(&[2])),
        ("medium", s("GPU")),
        ("group_idx", i(0)),
    ])
}

fn cleared() -> V {
    map(&[("type", s("AllBlocksCleared"))])
}

/// Decode `[good, bad, good]` and return the middle event's rejected field, checking that both
/// siblings still applied in order.
fn reject_middle(bad: V) -> String {
    let b = decode_vllm(&batch(vec![stored(), bad, removed()])).expect("envelope is fine");
    assert_eq!(b.events.len(), 2, "{:?}", b.invalid);
    assert!(
        matches!(b.events[0], KvEvent::Stored(_)) && matches!(b.events[1], KvEvent::Removed(_))
    );
    let fields = invalid_fields(&b);
    assert_eq!(fields.len(), 1, "{:?}", b.invalid);
    assert_eq!(fields[0].0, 1);
    fields[0].1.clone()
}

fn envelope_err(v: V) -> EnvelopeError {
    decode_vllm(&v.encode()).expect_err("must be rejected")
}

#[test]
fn envelope_shapes_are_accepted() {
    let two = V::A(vec![V::F(2.0), V::A(vec![cleared()])]).encode();
    assert_eq!(decode_vllm(&two).unwrap().dp_rank, None);
    let three_nil = V::A(vec![V::F(2.0), V::A(vec![]), V::Nil]).encode();
    assert_eq!(decode_vllm(&three_nil).unwrap().dp_rank, None);
    let int_ts = V::A(vec![i(7), V::A(vec![]), i(3)]).encode();
    let b = decode_vllm(&int_ts).unwrap();
    assert_eq!((b.ts, b.dp_rank), (7.0, Some(3)));
    let as_map = map(&[
        ("events", V::A(vec![cleared()])),
        ("data_parallel_rank", i(2)),
        ("extra", i(1)),
        ("ts", V::F(3.0)),
    ]);
    let b = decode_vllm(&as_map.encode()).unwrap();
    assert_eq!((b.ts, b.dp_rank, b.events.len()), (3.0, Some(2), 1));
    let sglang_map = map(&[
        ("ts", V::F(3.0)),
        ("events", V::A(vec![])),
        ("attn_dp_rank", i(1)),
    ]);
    assert_eq!(
        decode_sglang(&sglang_map.encode()).unwrap().dp_rank,
        Some(1)
    );
}

#[test]
fn malformed_envelopes_are_rejected_whole() {
    assert_eq!(decode_vllm(&[]), Err(EnvelopeError::Empty));
    assert!(matches!(
        decode_vllm(&[0xc1]),
        Err(EnvelopeError::Malformed { .. })
    ));
    assert!(matches!(
        decode_vllm(b"\x93\xcb\x41"),
        Err(EnvelopeError::Malformed { .. })
    ));
    let mut trailing = batch(vec![cleared()]);
    trailing.push(0x00);
    assert_eq!(
        decode_vllm(&trailing),
        Err(EnvelopeError::TrailingBytes { count: 1 })
    );
    assert_eq!(envelope_err(i(1)), EnvelopeError::RootType { got: "int" });
    assert_eq!(
        envelope_err(V::A(vec![V::F(1.0)])),
        EnvelopeError::BatchLength { len: 1 }
    );
    assert_eq!(
        envelope_err(V::A(vec![V::F(1.0), V::A(vec![]), i(0), i(0)])),
        EnvelopeError::BatchLength { len: 4 }
    );
    assert_eq!(
        envelope_err(V::A(vec![s("1"), V::A(vec![])])),
        EnvelopeError::Timestamp { reason: "str" }
    );
    assert_eq!(
        envelope_err(V::A(vec![V::F(f64::NAN), V::A(vec![])])),
        EnvelopeError::Timestamp {
            reason: "not finite"
        }
    );
    assert_eq!(
        envelope_err(V::A(vec![V::F(f64::INFINITY), V::A(vec![])])),
        EnvelopeError::Timestamp {
            reason: "not finite"
        }
    );
    assert_eq!(
        envelope_err(V::A(vec![V::F(1.0), map(&[])])),
        EnvelopeError::EventsType { got: "map" }
    );
    assert_eq!(
        envelope_err(V::A(vec![V::F(1.0), V::A(vec![]), i(-1)])),
        EnvelopeError::DpRank {
            reason: "out of range"
        }
    );
    assert_eq!(
        envelope_err(V::A(vec![V::F(1.0), V::A(vec![]), i(1 << 32)])),
        EnvelopeError::DpRank {
            reason: "out of range"
        }
    );
    assert_eq!(
        envelope_err(V::A(vec![V::F(1.0), V::A(vec![]), s("0")])),
        EnvelopeError::DpRank { reason: "str" }
    );
    assert_eq!(
        envelope_err(map(&[("events", V::A(vec![]))])),
        EnvelopeError::MissingKey { key: "ts" }
    );
    assert_eq!(
        envelope_err(map(&[("ts", V::F(1.0))])),
        EnvelopeError::MissingKey { key: "events" }
    );
    assert_eq!(
        envelope_err(map(&[
            ("ts", V::F(1.0)),
            ("ts", V::F(2.0)),
            ("events", V::A(vec![]))
        ])),
        EnvelopeError::DuplicateKey { key: "ts" }
    );
    assert_eq!(
        envelope_err(V::M(vec![(i(1), V::F(1.0)), (s("events"), V::A(vec![]))])),
        EnvelopeError::NonStringKey
    );
    // A truncated event is a broken payload, not a bad event.
    let mut cut = batch(vec![stored()]);
    cut.truncate(cut.len() - 3);
    assert!(matches!(
        decode_vllm(&cut),
        Err(EnvelopeError::Malformed { .. })
    ));
}

#[test]
fn the_dp_rank_is_reported_not_judged() {
    let b = decode_vllm(&V::A(vec![V::F(1.0), V::A(vec![]), i(7)]).encode()).unwrap();
    assert_eq!(b.dp_rank, Some(7));
}

#[test]
fn missing_required_keys_reject_the_event() {
    for key in [
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "medium",
        "lora_name",
    ] {
        assert_eq!(reject_middle(with(&stored(), key, None)), key);
    }
    assert_eq!(reject_middle(with(&stored(), "type", None)), "type");
    assert_eq!(reject_middle(with(&removed(), "medium", None)), "medium");
    // lora_id is ignored, so its absence is fine.
    let b = decode_vllm(&batch(vec![with(&stored(), "lora_id", None)])).unwrap();
    assert_eq!((b.events.len(), b.invalid.len()), (1, 0));
}

#[test]
fn wrong_types_reject_the_event() {
    let cases = [
        ("block_hashes", s("x")),
        ("block_hashes", arr([s("x")])),
        ("block_hashes", arr([i(-1)])),
        ("block_hashes", arr([V::B(vec![1, 2, 3]), i(2)])),
        ("parent_block_hash", s("x")),
        ("token_ids", arr([V::F(1.0)])),
        ("token_ids", arr([ints(&[1, 2])])),
        ("block_size", s("2")),
        ("block_size", i(0)),
        ("block_size", i(1 << 32)),
        ("lora_id", s("3")),
        ("medium", i(1)),
        ("lora_name", i(1)),
        ("lora_name", V::B(vec![0xff])),
        ("extra_keys", i(1)),
        ("extra_keys", arr([V::Nil])),
        ("extra_keys", arr([i(1), V::Nil])),
        ("group_idx", s("0")),
        ("kv_cache_spec_kind", i(1)),
        ("kv_cache_spec_sliding_window", s("4")),
        ("session_id", i(1)),
        ("lookahead_token_ids", i(1)),
        ("type", i(1)),
    ];
    for (key, value) in cases {
        assert_eq!(
            reject_middle(with(&stored(), key, Some(value.clone()))),
            key,
            "{key} = {value:?}"
        );
    }
    assert_eq!(reject_middle(i(5)), "<event>");
    assert_eq!(reject_middle(V::Nil), "<event>");
}

#[test]
fn duplicate_recognized_keys_reject_the_event() {
    let V::M(mut entries) = stored() else {
        unreachable!()
    };
    entries.push((s("block_size"), i(2)));
    assert_eq!(reject_middle(V::M(entries)), "block_size");
    // An unknown key may repeat: it is skipped, never recorded.
    let dup_unknown = with(&with(&stored(), "zzz", Some(i(1))), "yyy", Some(i(2)));
    let V::M(mut entries) = dup_unknown else {
        unreachable!()
    };
    entries.push((s("zzz"), i(3)));
    let b = decode_vllm(&batch(vec![V::M(entries)])).unwrap();
    assert_eq!((b.events.len(), b.invalid.len()), (1, 0));
}

#[test]
fn non_string_keys_reject_the_event() {
    let V::M(mut entries) = stored() else {
        unreachable!()
    };
    entries.push((i(1), i(1)));
    assert_eq!(reject_middle(V::M(entries)), "<key>");
}

#[test]
fn stored_only_keys_on_removed_and_any_key_on_cleared_are_rejected() {
    for key in [
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "lora_name",
        "extra_keys",
        "kv_cache_spec_kind",
    ] {
        assert_eq!(reject_middle(with(&removed(), key, Some(V::Nil))), key);
    }
    assert_eq!(
        reject_middle(with(&cleared(), "block_hashes", Some(ints(&[1])))),
        "block_hashes"
    );
    assert_eq!(
        reject_middle(with(&cleared(), "medium", Some(s("GPU")))),
        "medium"
    );
    // Removed's own optional keys are fine; unknown keys on cleared are ignored.
    let b = decode_vllm(&batch(vec![
        with(&removed(), "locality", Some(s("LOCAL"))),
        with(&cleared(), "future_field", Some(i(1))),
    ]))
    .unwrap();
    assert_eq!(
        b.events,
        vec![
            KvEvent::Removed(crate::events::EngineRemoved {
                hashes: vec![BlockHash(2)],
                tier: Tier::Device,
                group: 0,
            }),
            KvEvent::AllCleared
        ]
    );
}

#[test]
fn unknown_tags_and_unknown_keys() {
    assert_eq!(
        reject_middle(with(&stored(), "type", Some(s("BlockMoved")))),
        "type"
    );
    let b = decode_vllm(&batch(vec![with(
        &with(&stored(), "brand_new", Some(map(&[("x", i(1))]))),
        "cache_salt",
        Some(i(9)),
    )]))
    .unwrap();
    // `cache_salt` is SGLang's: unknown (and so ignored) for vLLM.
    assert_eq!((b.events.len(), b.invalid.len()), (1, 0));
}

#[test]
fn every_cache_group_is_admitted_with_its_kind_and_only_media_are_filtered() {
    let b = decode_vllm(&batch(vec![
        with(&stored(), "group_idx", Some(i(2))),
        with(&stored(), "kv_cache_spec_kind", Some(s("sliding_window"))),
        with(&stored(), "kv_cache_spec_sliding_window", Some(i(128))),
        with(
            &with(
                &stored(),
                "kv_cache_spec_kind",
                Some(s("sliding_window_mla")),
            ),
            "kv_cache_spec_sliding_window",
            Some(i(128)),
        ),
        with(&stored(), "kv_cache_spec_kind", Some(s("MLA_ATTENTION"))),
        with(
            &stored(),
            "kv_cache_spec_kind",
            Some(s("sink_full_attention")),
        ),
        with(&stored(), "kv_cache_spec_kind", Some(s("mamba"))),
        with(&stored(), "kv_cache_spec_kind", Some(s("some_new_kind"))),
        with(&stored(), "group_idx", Some(i(64))),
        with(&stored(), "medium", Some(s("tape"))),
        with(&removed(), "group_idx", Some(i(1))),
        with(&removed(), "group_idx", Some(i(-1))),
        with(&removed(), "medium", Some(s("tape"))),
        // Invalid wins over ignored.
        with(
            &with(&stored(), "group_idx", Some(i(64))),
            "block_size",
            Some(s("x")),
        ),
    ]))
    .unwrap();
    assert_eq!(
        b.ignored,
        vec![
            IgnoreReason::OtherCacheGroup,
            IgnoreReason::UnknownMedium,
            IgnoreReason::OtherCacheGroup,
            IgnoreReason::UnknownMedium,
        ]
    );
    let groups: Vec<(u32, GroupKind)> = b
        .events
        .iter()
        .map(|e| match e {
            KvEvent::Stored(s) => (s.group.idx, s.group.kind),
            KvEvent::Removed(r) => (r.group, GroupKind::Full),
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    assert_eq!(
        groups,
        vec![
            (2, GroupKind::Full),
            (0, GroupKind::Unknown),
            // The base event says full attention: a window beside it contradicts it.
            (0, GroupKind::Unknown),
            (0, GroupKind::SlidingWindow { window: 128 }),
            (0, GroupKind::Full),
            (0, GroupKind::Full),
            (0, GroupKind::Mamba),
            (0, GroupKind::Unknown),
            (1, GroupKind::Full),
        ],
        "a window without its size and a kind this service does not know are unknown kinds"
    );
    assert_eq!(invalid_fields(&b), vec![(13, "block_size".to_owned())]);
}

#[test]
fn lora_id_is_ignored_and_empty_names_mean_none() {
    let ev = with(
        &with(&stored(), "lora_id", Some(i(12))),
        "lora_name",
        Some(s("")),
    );
    let b = decode_vllm(&batch(vec![
        ev,
        with(&stored(), "lora_name", Some(s("ad"))),
    ]))
    .unwrap();
    let names: Vec<_> = b
        .events
        .iter()
        .map(|e| {
            if let KvEvent::Stored(s) = e {
                s.lora_name.clone()
            } else {
                None
            }
        })
        .collect();
    assert_eq!(names, vec![None, Some("ad".to_owned())]);
}

#[test]
fn positional_events_need_their_leading_fields() {
    let short = V::A(vec![s("BlockStored"), ints(&[1]), V::Nil, ints(&[1, 2])]);
    assert_eq!(reject_middle(short), "block_size");
    assert_eq!(reject_middle(V::A(vec![])), "type");
    assert_eq!(reject_middle(V::A(vec![i(1)])), "type");
    // Fields appended by a later release are skipped.
    let long = V::A(vec![
        s("BlockRemoved"),
        ints(&[9]),
        s("GPU"),
        i(0),
        V::Nil,
        V::Nil,
        s("new"),
    ]);
    let b = decode_vllm(&batch(vec![long])).unwrap();
    assert_eq!(b.events.len(), 1);
}

#[test]
fn sglang_rules() {
    let ev = map(&[
        ("type", s("BlockStored")),
        ("block_hashes", ints(&[-1, i128::from(i64::MIN)])),
        ("parent_block_hash", i(-2)),
        ("token_ids", V::A(vec![ints(&[1, 2]), ints(&[2, 3])])),
        ("block_size", i(2)),
        ("lora_id", V::Nil),
        ("cache_salt", s("")),
    ]);
    let b = decode_sglang(&batch(vec![ev.clone()])).unwrap();
    let KvEvent::Stored(st) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(st.hashes, vec![BlockHash(u64::MAX), BlockHash(1 << 63)]);
    assert_eq!(st.parent, Some(BlockHash(u64::MAX - 1)));
    assert_eq!(st.tokens, Some(EventTokens::Bigram(vec![(1, 2), (2, 3)])));
    assert_eq!((st.tier, st.cache_salt.clone()), (Tier::Device, None));
    // Mixed or ragged pairs, and vLLM-only keys, are SGLang errors.
    let ragged = with(
        &ev,
        "token_ids",
        Some(V::A(vec![ints(&[1, 2]), ints(&[3])])),
    );
    let mixed = with(&ev, "token_ids", Some(V::A(vec![ints(&[1, 2]), i(3)])));
    let vllm_key = with(&ev, "extra_keys", Some(V::Nil));
    let b = decode_sglang(&batch(vec![ragged, mixed, vllm_key])).unwrap();
    assert_eq!(
        invalid_fields(&b),
        vec![(0, "token_ids".to_owned()), (1, "token_ids".to_owned())]
    );
    assert_eq!(
        b.events.len(),
        1,
        "extra_keys is not an SGLang key: ignored"
    );
    // An int beyond the int64 / uint64 ranges cannot be encoded; the largest uint64 is a valid bit pattern.
    let b = decode_sglang(&batch(vec![with(
        &ev,
        "block_hashes",
        Some(ints(&[i128::from(u64::MAX)])),
    )]))
    .unwrap();
    assert_eq!(b.events.len(), 1);
}
