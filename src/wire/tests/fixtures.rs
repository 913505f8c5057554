//! Every recorded payload in `tests/fixtures/events/` decodes to exactly what its manifest says.
//! The manifest's expectations were computed by the recording script from the values it handed
//! the engines' classes, independently of this decoder.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::{decode_sglang, decode_vllm, invalid_fields};
use crate::events::{DecodedBatch, EventTokens, KvEvent, StoreObject};
use crate::hashing::IndexProjection;
use crate::model::{BlockHash, GroupKind, PublisherType, Tier};
use crate::wire::decode;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/events")
}

pub(super) fn manifest() -> Vec<Value> {
    let text = std::fs::read_to_string(dir().join("manifest.json")).expect("manifest.json");
    let manifest: Value = serde_json::from_str(&text).expect("manifest is JSON");
    manifest["fixtures"]
        .as_array()
        .expect("fixtures list")
        .clone()
}

/// The one frame of a recorded fixture file (`docs/fixtures.md`).
pub(super) fn payload(name: &str) -> Vec<u8> {
    let path = dir().join(format!("{name}.jsonl"));
    let fixture = crate::fixture::format::Fixture::read_file(&path).expect("fixture file");
    assert_eq!(fixture.frames.len(), 1, "{name}: one recorded batch");
    // Written by the recorder script exactly as the Rust writer writes it.
    let text = std::fs::read_to_string(&path).expect("fixture file");
    assert_eq!(fixture.to_text(), text, "{name}: canonical fixture text");
    fixture.frames[0].payload.to_vec()
}

/// All fixtures with their publisher and the projection a registration of that engine uses.
pub(super) fn all_payloads() -> Vec<(String, PublisherType, IndexProjection, Vec<u8>)> {
    manifest()
        .iter()
        .map(|f| {
            let name = f["name"].as_str().expect("name").to_owned();
            let kind = PublisherType::parse(f["publisher"].as_str().expect("publisher"))
                .expect("known publisher");
            let projection = if kind == PublisherType::Sglang {
                IndexProjection::First64Be
            } else {
                IndexProjection::Low64Be
            };
            let bytes = payload(&name);
            (name, kind, projection, bytes)
        })
        .collect()
}

fn hashes(h: &[BlockHash]) -> Value {
    h.iter().map(|h| Value::String(h.to_string())).collect()
}

fn store_json(kind: &str, o: &StoreObject) -> Value {
    json!({
        "kind": kind, "backend_id": o.backend_id, "object_key": o.object_key, "tenant_id": o.tenant_id,
        "model_name": o.model_name, "lora_name": o.lora_name, "block_size": o.block_size,
        "tier": o.tier.as_str(), "hashes": hashes(&o.hashes),
    })
}

fn event_json(ev: &KvEvent) -> Value {
    match ev {
        KvEvent::Stored(st) => with_group(
            st.group.idx,
            Some(st.group.kind),
            json!({
                "kind": "stored",
                "hashes": hashes(&st.hashes),
                "parent": st.parent.map(|p| p.to_string()),
                "tokens": match &st.tokens {
                    None => Value::Null,
                    Some(EventTokens::Flat(ids)) => json!({ "flat": ids }),
                    Some(EventTokens::Bigram(pairs)) => {
                        json!({ "bigram": pairs.iter().map(|(a, b)| json!([a, b])).collect::<Vec<_>>() })
                    }
                },
                "block_size": st.block_size,
                "lora_name": st.lora_name,
                "cache_salt": st.cache_salt,
                "tier": st.tier.as_str(),
            }),
        ),
        KvEvent::Removed(rm) => with_group(
            rm.group,
            None,
            json!({ "kind": "removed", "hashes": hashes(&rm.hashes), "tier": rm.tier.as_str() }),
        ),
        KvEvent::AllCleared => json!({ "kind": "all_cleared" }),
        KvEvent::StoreStored(o) => store_json("store_stored", o),
        KvEvent::StoreRemoved(o) => store_json("store_removed", o),
        KvEvent::StoreCleared {
            backend_id,
            tenant_id,
        } => {
            json!({ "kind": "store_cleared", "backend_id": backend_id, "tenant_id": tenant_id })
        }
    }
}

/// An engine event's KV-cache group, written only when it is not group 0 of full attention
/// (so the single-group fixtures read as before): a removal's index, a store's index and kind.
fn with_group(idx: u32, kind: Option<GroupKind>, mut event: Value) -> Value {
    if idx == 0 && kind.unwrap_or_default() == GroupKind::Full {
        return event;
    }
    event["group"] = match kind {
        None => json!(idx),
        Some(kind) => match kind.window() {
            None => json!({ "idx": idx, "kind": kind.family() }),
            Some(w) => json!({ "idx": idx, "kind": kind.family(), "sliding_window": w }),
        },
    };
    event
}

fn batch_json(b: &DecodedBatch) -> Value {
    json!({
        "ts": b.ts,
        "dp_rank": b.dp_rank,
        "events": b.events.iter().map(event_json).collect::<Vec<_>>(),
        "ignored": b.ignored.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
        "invalid": invalid_fields(b).into_iter().map(|(index, field)| json!({ "index": index, "field": field })).collect::<Vec<_>>(),
    })
}

#[test]
fn every_fixture_decodes_to_its_manifest() {
    let manifest = manifest();
    assert!(manifest.len() >= 17, "fixtures went missing");
    for (fixture, (name, kind, projection, bytes)) in manifest.iter().zip(all_payloads()) {
        let batch = decode(kind, &bytes, projection).unwrap_or_else(|e| panic!("{name}: {e}"));
        if let Some(counts) = fixture["expect"].get("counts") {
            let stored: Vec<_> = batch
                .events
                .iter()
                .filter_map(|e| {
                    if let KvEvent::Stored(s) = e {
                        Some(s)
                    } else {
                        None
                    }
                })
                .collect();
            let removed: usize = batch
                .events
                .iter()
                .map(|e| {
                    if let KvEvent::Removed(r) = e {
                        r.hashes.len()
                    } else {
                        0
                    }
                })
                .sum();
            assert_eq!(
                stored.len() as u64,
                counts["stored_events"].as_u64().unwrap(),
                "{name}"
            );
            assert_eq!(
                stored.iter().map(|s| s.hashes.len()).sum::<usize>() as u64,
                counts["stored_blocks"].as_u64().unwrap(),
                "{name}"
            );
            assert_eq!(
                removed as u64,
                counts["removed_blocks"].as_u64().unwrap(),
                "{name}"
            );
            assert!(
                batch.invalid.is_empty() && batch.ignored.is_empty(),
                "{name}"
            );
        } else {
            assert_eq!(batch_json(&batch), fixture["expect"], "{name}");
        }
    }
}

#[test]
fn vllm_uint64_hashes_above_i64_stay_unsigned() {
    let batch = decode_vllm(&payload("vllm_basic")).unwrap();
    let KvEvent::Stored(st) = &batch.events[0] else {
        panic!("{:?}", batch.events[0])
    };
    assert_eq!(
        st.hashes,
        vec![BlockHash(0xF1E2_D3C4_B5A6_9788), BlockHash(5)]
    );
    assert_eq!(st.tokens, Some(EventTokens::Flat(vec![1, 2, 300, 70000])));
    assert_eq!(st.tier, Tier::Device);
    assert_eq!(batch.dp_rank, Some(0));
    assert_eq!(batch.ts, 1_700_000_000.0);
}

#[test]
fn vllm_bin_hashes_use_the_last_eight_bytes() {
    let batch = decode_vllm(&payload("vllm_bin_hashes")).unwrap();
    let KvEvent::Stored(st) = &batch.events[0] else {
        panic!()
    };
    // bytes(range(32)): the last 8 bytes are 0x18..=0x1f.
    assert_eq!(st.hashes[0], BlockHash(0x1819_1a1b_1c1d_1e1f));
    assert_eq!(
        st.parent,
        Some(BlockHash(u64::from_be_bytes([
            224, 225, 226, 227, 228, 229, 230, 231
        ])))
    );
}

#[test]
fn sglang_negative_hashes_keep_their_bits() {
    let batch = decode_sglang(&payload("sglang_salt_lora")).unwrap();
    let KvEvent::Stored(st) = &batch.events[0] else {
        panic!()
    };
    assert_eq!(
        st.hashes,
        vec![
            BlockHash(0x8000_0000_0000_0000),
            BlockHash(0x7fff_ffff_ffff_ffff)
        ]
    );
    assert_eq!(st.parent, Some(BlockHash((-42i64) as u64)));
    assert_eq!(st.cache_salt.as_deref(), Some("tenant-salt"));
    assert_eq!(st.lora_name.as_deref(), Some("ad"));
    assert_eq!(batch.dp_rank, Some(3));
}

#[test]
fn sglang_bigram_pairs_become_bigram_tokens() {
    let batch = decode_sglang(&payload("sglang_bigram")).unwrap();
    let KvEvent::Stored(st) = &batch.events[0] else {
        panic!()
    };
    assert_eq!(
        st.tokens,
        Some(EventTokens::Bigram(vec![
            (10, 11),
            (11, 12),
            (12, 13),
            (13, 14)
        ]))
    );
    assert_eq!(st.hashes[0], BlockHash((-7i64) as u64));
}

#[test]
fn negative_hashes_are_sglang_only() {
    // vLLM hashes are unsigned: the same bytes are a bad hash there.
    let batch = decode_vllm(&payload("sglang_bigram")).unwrap();
    assert!(batch.events.is_empty());
    assert_eq!(invalid_fields(&batch), vec![(0, "block_hashes".to_owned())]);
}
