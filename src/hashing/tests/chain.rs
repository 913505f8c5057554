//! The per-request hasher, the lazy chain and the single-block step API.

use super::hex;
use crate::hashing::{BlockHasher, HashProfile, IndexProjection, PrefixKeys, Strategy, sglang};
use crate::model::BlockHash;

fn vllm(algorithm: &str) -> HashProfile {
    HashProfile::resolve(
        Some("vllm_v1"),
        Some(algorithm),
        Some("0"),
        Some("low64_be"),
    )
    .unwrap()
}

fn sglang_profile(strategy: &str) -> HashProfile {
    HashProfile::resolve(Some(strategy), Some("sha256_raw"), None, Some("first64_be")).unwrap()
}

fn all_profiles() -> Vec<HashProfile> {
    vec![
        vllm("sha256_cbor"),
        vllm("sha256"),
        sglang_profile("sglang"),
        sglang_profile("sglang_bigram"),
    ]
}

#[test]
fn chain_hashes_only_the_blocks_asked_for() {
    let tokens: Vec<i32> = (0..1000).collect();
    for profile in all_profiles() {
        let hasher = profile.hasher("", "");
        let mut chain = hasher.chain(16, &tokens);
        assert_eq!(chain.hashed(), 0, "{profile}: nothing hashed up front");
        let k2 = chain.key(2);
        assert_eq!(
            chain.hashed(),
            3,
            "{profile}: a walk to block 2 hashes blocks 0..=2"
        );
        assert_eq!(chain.key(2), k2);
        let k0 = chain.key(0);
        assert_eq!(
            chain.hashed(),
            3,
            "{profile}: earlier keys come from the cache"
        );
        // A fresh chain asked in order gives the same keys.
        let mut fresh = hasher.chain(16, &tokens);
        assert_eq!(fresh.key(0), k0);
        assert_eq!(fresh.key(1), chain.key(1));
        assert_eq!(fresh.key(2), k2);
    }
}

#[test]
fn block_counts_and_coverage_per_strategy() {
    let tokens: Vec<i32> = (1..=10).collect();
    let cases = [
        // (profile, blocks for 10 tokens at bs 4, covered by all blocks)
        (vllm("sha256_cbor"), 2, 8),
        (vllm("sha256"), 2, 8),
        (sglang_profile("sglang"), 3, 10),
        (sglang_profile("sglang_bigram"), 3, 9),
    ];
    for (profile, blocks, covered) in cases {
        let hasher = profile.hasher("", "");
        let chain = hasher.chain(4, &tokens);
        assert_eq!(chain.num_blocks(), blocks, "{profile}");
        assert_eq!(chain.covered(blocks), covered, "{profile}");
        assert_eq!(
            chain.covered(usize::MAX),
            covered,
            "{profile}: coverage is capped"
        );
        assert_eq!(chain.covered(1), 4, "{profile}");
        assert_eq!(chain.covered(0), 0, "{profile}");
        // Empty and degenerate prompts, and a zero block size, have no blocks and never panic.
        assert_eq!(hasher.chain(4, &[] as &[i32]).num_blocks(), 0);
        assert_eq!(hasher.chain(0, &tokens).num_blocks(), 0);
        let mut none = hasher.chain(0, &tokens);
        assert_eq!(none.try_key(0), None);
        assert_eq!(none.key(5), BlockHash(0));
    }
    let bigram = sglang_profile("sglang_bigram").hasher("", "");
    assert_eq!(
        bigram.chain(4, &[7i32]).num_blocks(),
        0,
        "one token is zero bigram units"
    );
    assert_eq!(bigram.chain(4, &[7i32, 8]).num_blocks(), 1);
}

#[test]
fn step_api_matches_the_chain_and_takes_full_parents() {
    let tokens: Vec<i64> = (100..164).collect();
    for profile in all_profiles() {
        let hasher = profile.hasher("adapter-A", "tenant-salt");
        let mut chain = hasher.chain(16, &tokens);
        let mut parent: Option<[u8; 32]> = None;
        let mut buf = Vec::new();
        for i in 0..chain.num_blocks() {
            let end = if profile.strategy() == Strategy::SglangBigram {
                (i + 1) * 16 + 1
            } else {
                (i + 1) * 16
            };
            let block = &tokens[i * 16..end.min(tokens.len())];
            let step = hasher.step(parent.as_ref(), block, &mut buf);
            assert_eq!(step.key, chain.key(i), "{profile}: block {i}");
            // The convenience form prepares the request each call and agrees.
            assert_eq!(
                profile.hash_block(parent.as_ref(), block, "adapter-A", "tenant-salt"),
                step
            );
            parent = Some(step.digest);
        }
    }
}

#[test]
fn vllm_key_is_low64_of_the_digest_and_parent_is_the_full_digest() {
    let profile = vllm("sha256_cbor");
    let hasher = profile.hasher("", "");
    let tokens: Vec<i32> = (1..=8).collect();
    let b0 = hasher.step(None, &tokens[..4], &mut Vec::new());
    assert_eq!(Some(b0.key), IndexProjection::Low64Be.project(&b0.digest));
    let b1 = hasher.step(Some(&b0.digest), &tokens[4..], &mut Vec::new());
    assert_eq!(
        hex(&b1.digest),
        "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6"
    );
}

#[test]
fn salt_enters_block_zero_only_and_lora_every_block() {
    let tokens: Vec<i32> = (1..=12).collect();
    for profile in all_profiles() {
        let keys = |lora: &str, salt: &str| -> Vec<BlockHash> {
            let hasher = profile.hasher(lora, salt);
            let mut chain = hasher.chain(4, &tokens);
            (0..chain.num_blocks()).map(|i| chain.key(i)).collect()
        };
        let base = keys("", "");
        let salted = keys("", "s");
        let lora = keys("a", "");
        assert!(
            base.iter().zip(&salted).all(|(a, b)| a != b),
            "{profile}: salt changes every key via the chain"
        );
        assert!(
            base.iter().zip(&lora).all(|(a, b)| a != b),
            "{profile}: LoRA changes every key"
        );
        assert_ne!(
            keys("a", ""),
            keys("b", ""),
            "{profile}: adapters stay apart"
        );
        assert_eq!(keys("", ""), base, "{profile}: deterministic");
    }
}

#[test]
fn sglang_salt_prior_and_lora_seed_are_sglangs_functions() {
    // SGLang's own pins (kv_events unit test): seed from extra_key "lora-a", no salt.
    let seed = sglang::event_namespace_seed(Some("lora-a"), None);
    let key_of = |h: i64| {
        let mut digest = [0u8; 32];
        digest[..8].copy_from_slice(&h.to_be_bytes());
        sglang::namespaced_key(&seed, &digest).0 as i64
    };
    assert_eq!(key_of(123), 9220659119954863560);
    assert_eq!(key_of(-5), -1810974732006142875);
    // The LoRA seed is the same function with the LoRA name standing in for extra_key.
    assert_eq!(sglang::lora_event_seed("lora-a"), Some(seed));
    assert_eq!(sglang::lora_event_seed(""), None);
    assert_eq!(sglang::salt_prior(""), None);
    assert_ne!(sglang::salt_prior("a"), sglang::salt_prior("b"));
}

#[test]
fn sglang_negative_tokens_hash_as_wide_pages() {
    let hasher: BlockHasher = sglang_profile("sglang").hasher("", "");
    let mut buf = Vec::new();
    // -1 widens to u64::MAX: the page is 0xff || u64_le words.
    let neg = hasher.step(None, &[-1i32, 2], &mut buf);
    let wide = hasher.step(None, &[-1i64, 2], &mut buf);
    assert_eq!(neg, wide, "i32 and i64 negatives agree");
    use sha2::{Digest, Sha256};
    let mut msg = vec![0xffu8];
    msg.extend_from_slice(&u64::MAX.to_le_bytes());
    msg.extend_from_slice(&2u64.to_le_bytes());
    let want: [u8; 32] = Sha256::digest(&msg).into();
    assert_eq!(neg.digest, want);
    // Never the same as the narrow page of the u32 bit pattern.
    assert_ne!(
        hasher.step(None, &[u32::MAX, 2], &mut buf).digest,
        neg.digest
    );
}

#[test]
fn sglang_key_is_first64_and_matches_signed_event_value() {
    let hasher = sglang_profile("sglang").hasher("", "");
    let step = hasher.step(None, &[1i32, 2, 3, 4], &mut Vec::new());
    assert_eq!(
        Some(step.key),
        IndexProjection::First64Be.project(&step.digest)
    );
    let signed = i64::from_be_bytes(step.digest[..8].try_into().unwrap());
    assert_eq!(step.key.0 as i64, signed);
}
