//! Every case of the reference fixtures and of `generated_vectors.json`, byte for byte.

use serde_json::Value;

use super::{digest32, hex, load_fixture, profile_of, spec_text, spec_tokens, unhex};
use crate::hashing::vllm::VllmExtras;
use crate::hashing::{Algorithm, BlockHasher, HashProfile, PrefixKeys, Strategy, cbor, pickle};
use crate::model::BlockHash;

/// Walk `tokens` with the step API and return each block's (digest, key).
fn walk<T: crate::hashing::Token>(
    hasher: &BlockHasher,
    block_size: u32,
    tokens: &[T],
) -> Vec<([u8; 32], BlockHash)> {
    let bs = block_size as usize;
    let units = hasher.units(tokens.len());
    let mut out: Vec<([u8; 32], BlockHash)> = Vec::new();
    let mut buf = Vec::new();
    for i in 0..hasher.num_blocks(block_size, tokens.len()) {
        let start = i * bs;
        let end = (start + bs).min(units);
        let end = if hasher.units(2) == 1 { end + 1 } else { end };
        let parent = out.last().map(|(d, _)| *d);
        let step = hasher.step(parent.as_ref(), &tokens[start..end], &mut buf);
        out.push((step.digest, step.key));
    }
    out
}

/// Keys from the lazy chain, for both token types the chain is generic over.
fn chain_keys(hasher: &BlockHasher, block_size: u32, tokens: &[i64]) -> Vec<BlockHash> {
    let mut chain = hasher.chain(block_size, tokens);
    let keys: Vec<BlockHash> = (0..chain.num_blocks()).map(|i| chain.key(i)).collect();
    if let Ok(narrow) = tokens
        .iter()
        .map(|&t| i32::try_from(t))
        .collect::<Result<Vec<i32>, _>>()
    {
        let mut chain32 = hasher.chain(block_size, &narrow);
        let keys32: Vec<BlockHash> = (0..chain32.num_blocks()).map(|i| chain32.key(i)).collect();
        assert_eq!(keys32, keys, "i32 and i64 token chains agree");
    }
    keys
}

fn expected_strings(expected: &Value, field: &str) -> Vec<String> {
    expected
        .as_array()
        .expect("expected list")
        .iter()
        .map(|e| e[field].as_str().expect(field).to_owned())
        .collect()
}

fn golden_case_tokens(case: &Value) -> Vec<i64> {
    case.get("token_ids_repeat")
        .map_or_else(|| spec_tokens(&case["token_ids"]), spec_tokens)
}

fn golden_case_lora(case: &Value) -> String {
    case.get("lora_name_repeat")
        .map_or_else(|| spec_text(&case["lora_name"]), spec_text)
}

/// The trap: block 1 chained on block 0's 8-byte projection instead of its full digest.
fn trap_digest(algorithm: Algorithm, parent8: &[u8], tokens: &[i64]) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut buf = Vec::new();
    match algorithm {
        Algorithm::Sha256Cbor => {
            cbor::write_array_head(&mut buf, 3);
            cbor::write_bytes(&mut buf, parent8);
            cbor::write_array_head(&mut buf, tokens.len());
            tokens.iter().for_each(|&t| cbor::write_int(&mut buf, t));
            buf.push(cbor::NULL);
        }
        _ => {
            let mut p = pickle::Pickler::new(&mut buf);
            p.begin_tuple(3);
            p.bytes(parent8);
            p.begin_tuple(tokens.len());
            tokens.iter().for_each(|&t| p.int(t));
            p.end_tuple(tokens.len());
            p.none();
            p.end_tuple(3);
            p.finish();
        }
    }
    Sha256::digest(&buf).into()
}

fn check_golden_file(name: &str, algorithm: Algorithm) -> usize {
    let doc = load_fixture(name);
    let profile = profile_of(&doc["profile"]);
    assert_eq!(profile.algorithm(), algorithm);
    assert_eq!(
        profile.root_digest_hex(),
        doc["profile"]["root_digest"].as_str().unwrap()
    );

    for seed_case in doc["seed_root_vectors"].as_array().unwrap() {
        let seed = seed_case["python_hash_seed"].as_str().unwrap();
        let p = HashProfile::resolve(
            Some("vllm_v1"),
            Some(algorithm.as_str()),
            Some(seed),
            Some("low64_be"),
        )
        .unwrap();
        assert_eq!(
            p.root_digest_hex(),
            seed_case["root_digest"].as_str().unwrap(),
            "root of seed {seed:?}"
        );
        let encoded = match algorithm {
            Algorithm::Sha256Cbor => {
                let mut buf = Vec::new();
                cbor::write_text(&mut buf, seed);
                (buf, seed_case["canonical_cbor_hex"].as_str().unwrap())
            }
            _ => (
                pickle::dumps_str(seed),
                seed_case["pickle_hex"].as_str().unwrap(),
            ),
        };
        assert_eq!(hex(&encoded.0), encoded.1, "encoded seed {seed:?}");
    }

    let cases = doc["cases"].as_array().unwrap();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let bs = case["block_size"].as_u64().unwrap() as u32;
        let tokens = golden_case_tokens(case);
        let lora = golden_case_lora(case);
        let salt = spec_text(&case["cache_salt"]);
        let hasher = profile.hasher(&lora, &salt);
        let steps = walk(&hasher, bs, &tokens);
        let expected = &case["expected"];
        let digests: Vec<String> = steps.iter().map(|(d, _)| hex(d)).collect();
        assert_eq!(
            digests,
            expected_strings(expected, "digest"),
            "{name}: digests"
        );
        let keys_hex: Vec<String> = steps.iter().map(|(_, k)| k.to_string()).collect();
        assert_eq!(
            keys_hex,
            expected_strings(expected, "projected_hex"),
            "{name}: projections"
        );
        let keys_dec: Vec<String> = steps.iter().map(|(_, k)| k.0.to_string()).collect();
        assert_eq!(
            keys_dec,
            expected_strings(expected, "projected_decimal"),
            "{name}: decimals"
        );
        let keys: Vec<BlockHash> = steps.iter().map(|(_, k)| *k).collect();
        assert_eq!(chain_keys(&hasher, bs, &tokens), keys, "{name}: lazy chain");

        // The serialized bytes, where the fixture records them.
        let extras = VllmExtras::new(algorithm, &lora, &salt);
        let mut parent = *profile.root_digest();
        for (i, e) in expected.as_array().unwrap().iter().enumerate() {
            let mut buf = Vec::new();
            let block = &tokens[i * bs as usize..(i + 1) * bs as usize];
            extras.encode(&mut buf, &parent, block, i == 0);
            if let Some(want) = e.get("pickle_hex").and_then(Value::as_str) {
                assert_eq!(hex(&buf), want, "{name}: pickle bytes of block {i}");
            }
            if let Some(len) = e.get("pickle_len").and_then(Value::as_u64) {
                assert_eq!(buf.len() as u64, len, "{name}: pickle length of block {i}");
            }
            parent = digest32(e["digest"].as_str().unwrap());
        }

        if let Some(trap) = case
            .get("incorrect_low64_parent_digest")
            .and_then(Value::as_str)
        {
            let b0 = steps[0].0;
            let reproduced =
                trap_digest(algorithm, &b0[24..], &tokens[bs as usize..2 * bs as usize]);
            assert_eq!(
                hex(&reproduced),
                trap,
                "{name}: the trap is the 8-byte-parent digest"
            );
            assert_ne!(
                hex(&steps[1].0),
                trap,
                "{name}: the real chain avoids the trap"
            );
        }
    }
    cases.len()
}

#[test]
fn golden_sha256_cbor_vectors() {
    assert_eq!(
        check_golden_file("hash_golden_vectors.json", Algorithm::Sha256Cbor),
        11
    );
}

#[test]
fn golden_sha256_pickle_vectors() {
    assert_eq!(
        check_golden_file("hash_golden_vectors_sha256.json", Algorithm::Sha256),
        19
    );
}

#[test]
fn generated_vectors() {
    let doc = load_fixture("generated_vectors.json");
    let cases = doc["cases"].as_array().unwrap();
    assert!(cases.len() >= 100, "generator output looks truncated");
    let mut strategies = std::collections::HashSet::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let profile = profile_of(&case["profile"]);
        strategies.insert((profile.strategy(), profile.algorithm()));
        assert_eq!(
            profile.root_digest_hex(),
            case["root_digest"].as_str().unwrap(),
            "{name}: root"
        );
        let bs = case["block_size"].as_u64().unwrap() as u32;
        let tokens = spec_tokens(&case["tokens"]);
        let lora = spec_text(&case["lora_name"]);
        let salt = spec_text(&case["cache_salt"]);
        let hasher = profile.hasher(&lora, &salt);
        let steps = walk(&hasher, bs, &tokens);
        let expected = case["expected"].as_array().unwrap();
        assert_eq!(steps.len(), expected.len(), "{name}: block count");
        for (i, ((digest, key), e)) in steps.iter().zip(expected).enumerate() {
            assert_eq!(
                hex(digest),
                e["digest"].as_str().unwrap(),
                "{name}: digest {i}"
            );
            assert_eq!(
                key.to_string(),
                e["key_hex"].as_str().unwrap(),
                "{name}: key {i}"
            );
            assert_eq!(
                key.0.to_string(),
                e["key_decimal"].as_str().unwrap(),
                "{name}: key {i}"
            );
            if let Some(event) = e.get("event_hash").and_then(Value::as_i64) {
                assert_eq!(key.0 as i64, event, "{name}: signed event hash {i}");
            }
        }
        let keys: Vec<BlockHash> = steps.iter().map(|(_, k)| *k).collect();
        assert_eq!(chain_keys(&hasher, bs, &tokens), keys, "{name}: lazy chain");

        if profile.strategy() == Strategy::VllmV1 {
            let extras = VllmExtras::new(profile.algorithm(), &lora, &salt);
            let mut parent = *profile.root_digest();
            for (i, e) in expected.iter().enumerate() {
                let mut buf = Vec::new();
                extras.encode(
                    &mut buf,
                    &parent,
                    &tokens[i * bs as usize..(i + 1) * bs as usize],
                    i == 0,
                );
                assert_eq!(
                    buf.len() as u64,
                    e["encoded_len"].as_u64().unwrap(),
                    "{name}: encoded length {i}"
                );
                if let Some(want) = e.get("encoded_hex").and_then(Value::as_str) {
                    assert_eq!(buf, unhex(want), "{name}: encoded bytes {i}");
                }
                parent = digest32(e["digest"].as_str().unwrap());
            }
        }
    }
    assert_eq!(
        strategies.len(),
        4,
        "every supported strategy/algorithm pair is covered"
    );
}

#[test]
fn generated_sglang_namespace_pins() {
    // Includes SGLang's own pinned values for extra_key "lora-a" (its kv_events unit test).
    let doc = load_fixture("generated_vectors.json");
    let pins = doc["sglang_namespace_pins"].as_array().unwrap();
    assert!(
        pins.iter()
            .any(|p| p["hash"] == 123 && p["namespaced"] == 9220659119954863560u64)
    );
    for pin in pins {
        let seed = crate::hashing::sglang::event_namespace_seed(
            pin["extra_key"].as_str(),
            pin["cache_salt"].as_str(),
        );
        assert_eq!(hex(&seed), pin["seed"].as_str().unwrap());
        let mut digest = [0u8; 32];
        digest[..8].copy_from_slice(&pin["hash"].as_i64().unwrap().to_be_bytes());
        let key = crate::hashing::sglang::namespaced_key(&seed, &digest);
        assert_eq!(key.0 as i64, pin["namespaced"].as_i64().unwrap());
    }
}
