//! vLLM's untagged `extra_keys`: the cache salt and the other extras the index keys blocks by.

use super::{V, arr, batch, decode_sglang, decode_vllm, i, ints, invalid_fields, map, s, with};
use crate::events::KvEvent;

fn stored(parent: V, lora: V, extra_keys: V) -> V {
    map(&[
        ("type", s("BlockStored")),
        ("block_hashes", ints(&[1, 2])),
        ("parent_block_hash", parent),
        ("token_ids", ints(&[1, 2, 3, 4])),
        ("block_size", i(2)),
        ("lora_id", V::Nil),
        ("medium", s("GPU")),
        ("lora_name", lora),
        ("extra_keys", extra_keys),
    ])
}

/// Whether the one stored event of `payload` carries its extras (its `extras_carried`).
fn carried(b: Result<crate::events::DecodedBatch, crate::wire::EnvelopeError>) -> bool {
    let b = b.unwrap();
    assert!(b.invalid.is_empty(), "{:?}", b.invalid);
    match &b.events[..] {
        [KvEvent::Stored(e)] => e.extras_carried,
        other => panic!("{other:?}"),
    }
}

/// (cache_salt, extras) of the one stored event.
fn split(event: V) -> (Option<String>, Vec<u64>) {
    let b = decode_vllm(&batch(vec![event])).unwrap();
    assert!(b.invalid.is_empty(), "{:?}", b.invalid);
    match &b.events[..] {
        [KvEvent::Stored(e)] => (e.cache_salt.clone(), e.extras.clone()),
        other => panic!("{other:?}"),
    }
}

#[test]
fn plain_and_lora_requests_have_no_extras() {
    assert_eq!(
        split(stored(V::Nil, V::Nil, arr([V::Nil, V::Nil]))),
        (None, vec![])
    );
    let lora = arr([arr([s("ad")]), arr([s("ad")])]);
    assert_eq!(split(stored(V::Nil, s("ad"), lora)), (None, vec![]));
}

#[test]
fn the_salt_of_a_sequence_start_is_read_and_kept_out_of_the_extras() {
    let salted = arr([arr([s("s1")]), V::Nil]);
    assert_eq!(
        split(stored(V::Nil, V::Nil, salted)),
        (Some("s1".into()), vec![])
    );
    // LoRA first, then the salt, on block 0 only.
    let both = arr([arr([s("ad"), s("s1")]), arr([s("ad")])]);
    assert_eq!(
        split(stored(V::Nil, s("ad"), both)),
        (Some("s1".into()), vec![])
    );
    // A salt equal to the adapter name is still the salt (the adapter comes first).
    let same = arr([arr([s("ad"), s("ad")]), arr([s("ad")])]);
    assert_eq!(
        split(stored(V::Nil, s("ad"), same)),
        (Some("ad".into()), vec![])
    );
}

#[test]
fn other_extras_give_each_block_its_own_digest() {
    // A multimodal item on block 1 and a prompt-embedding digest on block 0.
    let mm = arr([arr([V::B(vec![7; 32])]), arr([arr([s("img"), i(0)])])]);
    let (salt, extras) = split(stored(V::Nil, V::Nil, mm));
    assert_eq!(salt, None);
    assert_eq!(extras.len(), 2);
    assert!(extras.iter().all(|&d| d != 0) && extras[0] != extras[1]);
    // Past the start of a sequence a string is not a salt: it is an extra of that block.
    let later = arr([arr([s("x")]), V::Nil]);
    let (salt, extras) = split(stored(i(9), V::Nil, later));
    assert_eq!(salt, None);
    assert!(extras[0] != 0 && extras[1] == 0);
}

#[test]
fn absent_or_nil_extra_keys_leave_the_extras_unsaid_and_an_array_says_them() {
    let plain = stored(V::Nil, V::Nil, arr([V::Nil, V::Nil]));
    let vllm = |event: &V| carried(decode_vllm(&batch(vec![event.clone()])));
    assert!(vllm(&plain), "[nil, nil]: a plain request, said");
    assert!(!vllm(&with(&plain, "extra_keys", None)), "absent");
    assert!(!vllm(&with(&plain, "extra_keys", Some(V::Nil))), "nil");
    // Absent or nil, the salt and the other extras are unknown, not empty.
    assert_eq!(split(with(&plain, "extra_keys", None)), (None, vec![]));
    // An empty array still needs one entry per block: it is not "unsaid" but wrong.
    let empty = with(&plain, "extra_keys", Some(arr([])));
    let b = decode_vllm(&batch(vec![empty.clone()])).unwrap();
    assert_eq!(invalid_fields(&b), vec![(0, "extra_keys".to_owned())]);
    // With no blocks, the empty array is one entry per block: said.
    let no_blocks = with(
        &with(&empty, "block_hashes", Some(arr([]))),
        "token_ids",
        Some(arr([])),
    );
    assert!(vllm(&no_blocks));
    // Older positional events end before `extra_keys`: unsaid.
    let positional = V::A(vec![
        s("BlockStored"),
        ints(&[1, 2]),
        V::Nil,
        ints(&[1, 2, 3, 4]),
        i(2),
        V::Nil,
    ]);
    assert!(!vllm(&positional));
    // SGLang's schema writes `cache_salt` whenever it is set: an SGLang event says its extras.
    let sglang = map(&[
        ("type", s("BlockStored")),
        ("block_hashes", ints(&[1])),
        ("parent_block_hash", V::Nil),
        ("token_ids", ints(&[1, 2])),
        ("block_size", i(2)),
        ("lora_id", V::Nil),
    ]);
    assert!(carried(decode_sglang(&batch(vec![sglang]))));
}
