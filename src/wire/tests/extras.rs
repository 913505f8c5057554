//! vLLM's untagged `extra_keys`: the cache salt and the other extras the index keys blocks by.

use super::{V, arr, batch, decode_vllm, i, ints, map, s};
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
