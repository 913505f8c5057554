//! The validation matrix of `hash_profile` (`docs/python-api.md`, `hash_profile`).

use crate::hashing::{Algorithm, HashProfile, IndexProjection, ProfileError, Strategy};

fn resolve(
    s: Option<&str>,
    a: Option<&str>,
    seed: Option<&str>,
    p: Option<&str>,
) -> Result<HashProfile, ProfileError> {
    HashProfile::resolve(s, a, seed, p)
}

fn vllm_seed(seed: &str) -> Result<HashProfile, ProfileError> {
    resolve(
        Some("vllm_v1"),
        Some("sha256_cbor"),
        Some(seed),
        Some("low64_be"),
    )
}

fn assert_rejects(result: Result<HashProfile, ProfileError>, field: &str, reason: &str) {
    let err = result.expect_err("must be rejected");
    assert_eq!((err.field, err.reason), (field, reason), "{err}");
    assert!(!err.message.is_empty());
    assert!(
        err.to_string().contains(field),
        "the message names the field: {err}"
    );
}

#[test]
fn supported_combinations_resolve() {
    for algorithm in ["sha256", "sha256_cbor"] {
        let p = resolve(
            Some("vllm_v1"),
            Some(algorithm),
            Some("0"),
            Some("low64_be"),
        )
        .unwrap();
        assert_eq!(p.strategy(), Strategy::VllmV1);
        assert_eq!(p.algorithm().as_str(), algorithm);
        assert_eq!(p.index_projection(), IndexProjection::Low64Be);
        assert_eq!(p.python_hash_seed(), "0");
    }
    for strategy in ["sglang", "sglang_bigram"] {
        for seed in [None, Some("0"), Some("17"), Some("random"), Some("")] {
            let p = resolve(Some(strategy), Some("sha256_raw"), seed, Some("first64_be")).unwrap();
            assert_eq!(p.strategy().as_str(), strategy);
            assert_eq!(p.algorithm(), Algorithm::Sha256Raw);
            assert_eq!(p.index_projection(), IndexProjection::First64Be);
            assert_eq!(p.python_hash_seed(), "0", "normalized");
        }
    }
}

#[test]
fn valid_vllm_seeds() {
    for seed in [
        "random",
        "0",
        "00",
        "007",
        "1",
        "4294967295",
        "0004294967295",
        "123456789",
    ] {
        assert_eq!(
            vllm_seed(seed).unwrap().python_hash_seed(),
            seed,
            "kept verbatim"
        );
    }
    assert_ne!(
        vllm_seed("0").unwrap(),
        vllm_seed("00").unwrap(),
        "leading zeros are significant"
    );
    assert_ne!(
        vllm_seed("0").unwrap().root_digest(),
        vllm_seed("00").unwrap().root_digest()
    );
}

#[test]
fn invalid_vllm_seeds_name_the_field() {
    for seed in [
        "",
        "-1",
        "+1",
        " 0",
        "0 ",
        "4294967296",
        "9999999999",
        "42949672950",
        "abc",
        "1e3",
        "0x10",
        "Random",
        "RANDOM",
        "random ",
        "١٢",
        "１",
        "٣",
        "1_000",
        "1.0",
        "\u{0}",
    ] {
        assert_rejects(vllm_seed(seed), "python_hash_seed", "invalid_value");
    }
}

#[test]
fn missing_keys() {
    assert_rejects(
        resolve(None, Some("sha256"), Some("0"), Some("low64_be")),
        "strategy",
        "missing",
    );
    assert_rejects(
        resolve(Some("vllm_v1"), None, Some("0"), Some("low64_be")),
        "algorithm",
        "missing",
    );
    assert_rejects(
        resolve(Some("vllm_v1"), Some("sha256"), None, Some("low64_be")),
        "python_hash_seed",
        "missing",
    );
    assert_rejects(
        resolve(Some("vllm_v1"), Some("sha256"), Some("0"), None),
        "index_projection",
        "missing",
    );
    assert_rejects(
        resolve(Some("sglang"), Some("sha256_raw"), None, None),
        "index_projection",
        "missing",
    );
    assert_rejects(resolve(None, None, None, None), "strategy", "missing");
}

#[test]
fn unsupported_values_and_combinations() {
    let bad = [
        // (strategy, algorithm, projection, field at fault)
        ("vllm", "sha256", "low64_be", "strategy"),
        ("VLLM_V1", "sha256", "low64_be", "strategy"),
        ("", "sha256", "low64_be", "strategy"),
        ("sglang_eagle", "sha256_raw", "first64_be", "strategy"),
        ("vllm_v1", "sha256_raw", "low64_be", "algorithm"),
        ("vllm_v1", "xxhash", "low64_be", "algorithm"),
        ("vllm_v1", "SHA256", "low64_be", "algorithm"),
        ("vllm_v1", "", "low64_be", "algorithm"),
        ("sglang", "sha256", "first64_be", "algorithm"),
        ("sglang", "sha256_cbor", "first64_be", "algorithm"),
        ("sglang_bigram", "sha256", "first64_be", "algorithm"),
        ("vllm_v1", "sha256", "first64_be", "index_projection"),
        ("vllm_v1", "sha256_cbor", "low64", "index_projection"),
        ("sglang", "sha256_raw", "low64_be", "index_projection"),
        (
            "sglang_bigram",
            "sha256_raw",
            "low64_be",
            "index_projection",
        ),
        ("sglang", "sha256_raw", "", "index_projection"),
    ];
    for (s, a, p, field) in bad {
        assert_rejects(
            resolve(Some(s), Some(a), Some("0"), Some(p)),
            field,
            "invalid_value",
        );
    }
}

#[test]
fn pairs_reject_unknown_and_duplicate_keys() {
    let good = [
        ("strategy", "vllm_v1"),
        ("algorithm", "sha256"),
        ("python_hash_seed", "5"),
        ("index_projection", "low64_be"),
    ];
    let p = HashProfile::from_pairs(good).unwrap();
    assert_eq!(
        p,
        HashProfile::resolve(Some("vllm_v1"), Some("sha256"), Some("5"), Some("low64_be")).unwrap()
    );

    let mut with_root = good.to_vec();
    with_root.push((
        "root_digest",
        "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
    ));
    assert_rejects(
        HashProfile::from_pairs(with_root),
        "root_digest",
        "unknown_field",
    );

    for extra in ["seed", "Strategy", "strategy ", "", "block_size"] {
        let mut pairs = good.to_vec();
        pairs.push((extra, "x"));
        let err = HashProfile::from_pairs(pairs).expect_err("unknown key");
        assert_eq!(err.reason, "unknown_field");
        assert!(
            err.message.contains(&format!("{extra:?}")),
            "the message names the key: {err}"
        );
    }

    let mut dup = good.to_vec();
    dup.push(("algorithm", "sha256_cbor"));
    assert_rejects(HashProfile::from_pairs(dup), "algorithm", "duplicate_field");

    assert_rejects(
        HashProfile::from_pairs([("strategy", "sglang"), ("algorithm", "sha256_raw")]),
        "index_projection",
        "missing",
    );
    let sglang = HashProfile::from_pairs([
        ("strategy", "sglang"),
        ("algorithm", "sha256_raw"),
        ("index_projection", "first64_be"),
    ]);
    assert_eq!(sglang.unwrap().python_hash_seed(), "0");
}

#[test]
fn roots_and_rendering() {
    let cbor = vllm_seed("0").unwrap();
    assert_eq!(
        cbor.root_digest_hex(),
        "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
    );
    assert_eq!(
        vllm_seed("random").unwrap().root_digest_hex(),
        "78d6ac7e28de859e492449dcea03e3807377d69998c5af819fed33a6df490cad"
    );
    assert_eq!(
        vllm_seed("4294967295").unwrap().root_digest_hex(),
        "177f280a5695322a18f16c96a26dc99d9c03f905940103dfe24a9c646fe446a8"
    );
    let pickle = resolve(Some("vllm_v1"), Some("sha256"), Some("0"), Some("low64_be")).unwrap();
    assert_eq!(
        pickle.root_digest_hex(),
        "1973e23848344dc43a988a9b478663803cfffe1243480253f9a3cf004b14aa7c"
    );

    // SGLang roots: SHA-256 of the documented domain-separated text.
    use sha2::{Digest, Sha256};
    for strategy in ["sglang", "sglang_bigram"] {
        let p = resolve(Some(strategy), Some("sha256_raw"), None, Some("first64_be")).unwrap();
        let want: [u8; 32] =
            Sha256::digest(format!("mooncake-conductor-root-v1\0{strategy}")).into();
        assert_eq!(p.root_digest(), &want);
        assert_eq!(p.root_digest_hex(), super::hex(&want));
    }

    let pairs = cbor.to_pairs();
    let keys: Vec<&str> = pairs.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        [
            "strategy",
            "algorithm",
            "python_hash_seed",
            "root_digest",
            "index_projection"
        ]
    );
    assert_eq!(pairs[3].1, cbor.root_digest_hex());
    assert_eq!(cbor.to_string(), "vllm_v1/sha256_cbor/seed=0/low64_be");
    assert_eq!(
        Strategy::parse("sglang_bigram"),
        Some(Strategy::SglangBigram)
    );
    assert_eq!(Algorithm::parse("sha256_raw"), Some(Algorithm::Sha256Raw));
    assert_eq!(
        IndexProjection::parse("first64_be"),
        Some(IndexProjection::First64Be)
    );
}

#[test]
fn profiles_compare_and_hash_by_value() {
    use std::collections::HashSet;
    let set: HashSet<HashProfile> = [
        vllm_seed("0").unwrap(),
        vllm_seed("0").unwrap(),
        vllm_seed("1").unwrap(),
    ]
    .into_iter()
    .collect();
    assert_eq!(set.len(), 2);
    let a = resolve(Some("sglang"), Some("sha256_raw"), None, Some("first64_be")).unwrap();
    let b = resolve(
        Some("sglang"),
        Some("sha256_raw"),
        Some("99"),
        Some("first64_be"),
    )
    .unwrap();
    assert_eq!(a, b, "the SGLang seed is normalized away");
    let c = resolve(
        Some("sglang_bigram"),
        Some("sha256_raw"),
        None,
        Some("first64_be"),
    )
    .unwrap();
    assert_ne!(a, c);
    assert_ne!(a.root_digest(), c.root_digest());
}
