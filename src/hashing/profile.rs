//! Resolving and validating a registration's `hash_profile` (`docs/python-api.md`, `hash_profile`).
//!
//! The transport layers check that the profile is a map of strings; this module checks the values:
//! exactly the four keys, one of the supported combinations, and a well-formed `python_hash_seed`.
//! `root_digest` is derived here and never accepted as input.

use std::fmt;

use sha2::{Digest, Sha256};

use super::{IndexProjection, cbor, pickle};

/// The hash chain an engine builds over a prompt's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// vLLM v1 `hash_block_tokens`: full blocks only, root from the seed.
    VllmV1,
    /// SGLang radix pages over single tokens; a final partial page is hashed too.
    Sglang,
    /// SGLang EAGLE pages over adjacent token pairs (`n` tokens give `n - 1` units).
    SglangBigram,
}

impl Strategy {
    pub const ALL: [Strategy; 3] = [Strategy::VllmV1, Strategy::Sglang, Strategy::SglangBigram];

    pub const fn as_str(self) -> &'static str {
        match self {
            Strategy::VllmV1 => "vllm_v1",
            Strategy::Sglang => "sglang",
            Strategy::SglangBigram => "sglang_bigram",
        }
    }

    /// Parse the exact (case-sensitive) profile name.
    pub fn parse(name: &str) -> Option<Self> {
        Strategy::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// True for the strategies whose chain hashes a final partial block.
    pub const fn is_sglang(self) -> bool {
        matches!(self, Strategy::Sglang | Strategy::SglangBigram)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one block is serialized before SHA-256.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// vLLM `sha256`: SHA-256 of CPython `pickle.dumps(value, protocol=5)`.
    Sha256,
    /// vLLM `sha256_cbor`: SHA-256 of `cbor2.dumps(value, canonical=True)`.
    Sha256Cbor,
    /// SGLang: SHA-256 of the prior digest and the little-endian token words.
    Sha256Raw,
}

impl Algorithm {
    pub const ALL: [Algorithm; 3] = [
        Algorithm::Sha256,
        Algorithm::Sha256Cbor,
        Algorithm::Sha256Raw,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha256Cbor => "sha256_cbor",
            Algorithm::Sha256Raw => "sha256_raw",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Algorithm::ALL.into_iter().find(|a| a.as_str() == name)
    }
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl IndexProjection {
    pub const ALL: [IndexProjection; 2] = [IndexProjection::Low64Be, IndexProjection::First64Be];

    pub fn parse(name: &str) -> Option<Self> {
        IndexProjection::ALL
            .into_iter()
            .find(|p| p.as_str() == name)
    }
}

/// Profile keys accepted as input, in the order responses list them.
pub const KEY_STRATEGY: &str = "strategy";
pub const KEY_ALGORITHM: &str = "algorithm";
pub const KEY_PYTHON_HASH_SEED: &str = "python_hash_seed";
pub const KEY_INDEX_PROJECTION: &str = "index_projection";
/// Reported by read responses only; an unknown key on input.
pub const KEY_ROOT_DIGEST: &str = "root_digest";

/// The seed the SGLang strategies normalize to: their chains do not use it.
const SGLANG_SEED: &str = "0";

/// Domain separator of the root digest of the SGLang strategies (see [`HashProfile::root_digest`]).
const SGLANG_ROOT_DOMAIN: &[u8] = b"mooncake-conductor-root-v1\0";

/// A rejected `hash_profile`: which field, a machine-readable reason, and a message for humans.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("hash_profile.{field}: {message}")]
pub struct ProfileError {
    /// The profile key at fault (for an unknown key, the first of the four it is not).
    pub field: &'static str,
    /// `missing`, `invalid_value`, `unknown_field` or `duplicate_field`.
    pub reason: &'static str,
    pub message: String,
}

impl ProfileError {
    fn missing(field: &'static str) -> Self {
        ProfileError {
            field,
            reason: "missing",
            message: format!("`{field}` is required"),
        }
    }

    fn invalid(field: &'static str, message: String) -> Self {
        ProfileError {
            field,
            reason: "invalid_value",
            message,
        }
    }
}

/// A validated hash profile: every registration feeding a context carries an equal one.
///
/// Equality and hashing cover all five fields; the root digest is a function of the other
/// four, so two profiles are equal exactly when their inputs (after normalization) are.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HashProfile {
    strategy: Strategy,
    algorithm: Algorithm,
    /// Normalized: the publisher's seed text for `vllm_v1`, `"0"` for the SGLang strategies.
    python_hash_seed: String,
    index_projection: IndexProjection,
    /// Parent of block 0 for `vllm_v1`; a documented constant for the SGLang strategies.
    root_digest: [u8; 32],
}

impl HashProfile {
    /// Validate the four profile values (each `None` when the key is absent).
    pub fn resolve(
        strategy: Option<&str>,
        algorithm: Option<&str>,
        python_hash_seed: Option<&str>,
        index_projection: Option<&str>,
    ) -> Result<Self, ProfileError> {
        let strategy_text = strategy.ok_or_else(|| ProfileError::missing(KEY_STRATEGY))?;
        let strategy = Strategy::parse(strategy_text).ok_or_else(|| {
            ProfileError::invalid(
                KEY_STRATEGY,
                format!("unsupported strategy {strategy_text:?} (expected vllm_v1, sglang or sglang_bigram)"),
            )
        })?;

        let algorithm_text = algorithm.ok_or_else(|| ProfileError::missing(KEY_ALGORITHM))?;
        let algorithm = Algorithm::parse(algorithm_text)
            .filter(|a| algorithm_fits(strategy, *a))
            .ok_or_else(|| {
                let expected = match strategy {
                    Strategy::VllmV1 => "sha256 or sha256_cbor",
                    Strategy::Sglang | Strategy::SglangBigram => "sha256_raw",
                };
                ProfileError::invalid(
                    KEY_ALGORITHM,
                    format!("algorithm {algorithm_text:?} is not supported with strategy {strategy} (expected {expected})"),
                )
            })?;

        let projection_text =
            index_projection.ok_or_else(|| ProfileError::missing(KEY_INDEX_PROJECTION))?;
        let expected_projection = match strategy {
            Strategy::VllmV1 => IndexProjection::Low64Be,
            Strategy::Sglang | Strategy::SglangBigram => IndexProjection::First64Be,
        };
        if projection_text != expected_projection.as_str() {
            return Err(ProfileError::invalid(
                KEY_INDEX_PROJECTION,
                format!(
                    "index_projection {projection_text:?} is not supported with strategy {strategy} (expected {})",
                    expected_projection.as_str()
                ),
            ));
        }

        let python_hash_seed = match strategy {
            Strategy::VllmV1 => {
                let seed =
                    python_hash_seed.ok_or_else(|| ProfileError::missing(KEY_PYTHON_HASH_SEED))?;
                validate_vllm_seed(seed)?;
                seed.to_owned()
            }
            // SGLang does not seed its chain; any value is accepted and normalized so that
            // registrations of one context compare equal.
            Strategy::Sglang | Strategy::SglangBigram => SGLANG_SEED.to_owned(),
        };

        let root_digest = derive_root(strategy, algorithm, &python_hash_seed);
        Ok(HashProfile {
            strategy,
            algorithm,
            python_hash_seed,
            index_projection: expected_projection,
            root_digest,
        })
    }

    /// Validate a profile given as (key, value) pairs: unknown keys (including `root_digest`)
    /// and repeated keys are rejected before the values are checked.
    pub fn from_pairs<'a, I>(pairs: I) -> Result<Self, ProfileError>
    where
        I: IntoIterator<Item = (&'a str, &'a str)>,
    {
        let mut slots: [Option<&'a str>; 4] = [None; 4];
        for (key, value) in pairs {
            let index = match key {
                KEY_STRATEGY => 0,
                KEY_ALGORITHM => 1,
                KEY_PYTHON_HASH_SEED => 2,
                KEY_INDEX_PROJECTION => 3,
                _ => {
                    let message = if key == KEY_ROOT_DIGEST {
                        "`root_digest` is derived by the server and must not be passed".to_owned()
                    } else {
                        format!(
                            "unknown key {key:?} (expected strategy, algorithm, python_hash_seed, index_projection)"
                        )
                    };
                    return Err(ProfileError {
                        field: unknown_field_name(key),
                        reason: "unknown_field",
                        message,
                    });
                }
            };
            let slot = &mut slots[index];
            if slot.is_some() {
                return Err(ProfileError {
                    field: INPUT_KEYS[index],
                    reason: "duplicate_field",
                    message: format!("`{}` is given more than once", INPUT_KEYS[index]),
                });
            }
            *slot = Some(value);
        }
        let [strategy, algorithm, seed, projection] = slots;
        HashProfile::resolve(strategy, algorithm, seed, projection)
    }

    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The normalized seed text.
    pub fn python_hash_seed(&self) -> &str {
        &self.python_hash_seed
    }

    pub fn index_projection(&self) -> IndexProjection {
        self.index_projection
    }

    /// The server-derived root digest.
    ///
    /// * `vllm_v1`: vLLM's `NONE_HASH`, SHA-256 of the seed text encoded by the algorithm
    ///   (a CBOR text string, or a protocol-5 pickle of a `str`); the parent of block 0.
    /// * `sglang`, `sglang_bigram`: SGLang's chain has no root (its first page has no prior), so
    ///   the digest only identifies the profile: SHA-256 of
    ///   `"mooncake-conductor-root-v1\0" + strategy name`. It never enters a block hash.
    pub fn root_digest(&self) -> &[u8; 32] {
        &self.root_digest
    }

    /// The root digest as 64 lower-case hex characters, as read responses report it.
    pub fn root_digest_hex(&self) -> String {
        hex_lower(&self.root_digest)
    }

    /// The resolved profile as the five (key, value) pairs read responses report.
    pub fn to_pairs(&self) -> [(&'static str, String); 5] {
        [
            (KEY_STRATEGY, self.strategy.as_str().to_owned()),
            (KEY_ALGORITHM, self.algorithm.as_str().to_owned()),
            (KEY_PYTHON_HASH_SEED, self.python_hash_seed.clone()),
            (KEY_ROOT_DIGEST, self.root_digest_hex()),
            (
                KEY_INDEX_PROJECTION,
                self.index_projection.as_str().to_owned(),
            ),
        ]
    }
}

/// vLLM's default recipe, `vllm_v1` / `sha256_cbor` with seed "0": the profile unit tests and
/// benchmarks register most. A plain function rather than a test-only one so that bench targets,
/// which cannot see `cfg(test)` items, use the same definition.
pub fn vllm_cbor_default() -> HashProfile {
    HashProfile::resolve(
        Some("vllm_v1"),
        Some("sha256_cbor"),
        Some("0"),
        Some("low64_be"),
    )
    .expect("the vllm_v1 / sha256_cbor profile is valid")
}

/// The text vLLM hashes its root from when `PYTHONHASHSEED` is unset (sha256 and sha256_cbor),
/// which no registered `python_hash_seed` can name.
pub const VLLM_UNSET_SEED: &str = "vllm-none-hash";

impl HashProfile {
    /// Recipes an engine of this profile's strategy may really hash with when this one does not
    /// match its hashes: for `vllm_v1`, each of the two algorithms with the registered seed, the
    /// seed "0" and the unset-seed root. Unvalidated on purpose (the unset seed is not a registrable value);
    /// only the runtime check uses them.
    pub fn candidate_recipes(&self) -> Vec<HashProfile> {
        if self.strategy != Strategy::VllmV1 {
            return Vec::new();
        }
        let mut out = Vec::new();
        for algorithm in [Algorithm::Sha256, Algorithm::Sha256Cbor] {
            // "0" is the seed deployments most often pin; any other one cannot be guessed.
            for seed in [self.python_hash_seed.as_str(), "0", VLLM_UNSET_SEED] {
                let seen = out.iter().any(|p: &HashProfile| {
                    (p.algorithm, p.python_hash_seed.as_str()) == (algorithm, seed)
                });
                if seen || (algorithm, seed) == (self.algorithm, self.python_hash_seed.as_str()) {
                    continue;
                }
                out.push(HashProfile {
                    algorithm,
                    python_hash_seed: seed.to_owned(),
                    root_digest: derive_root(self.strategy, algorithm, seed),
                    ..self.clone()
                });
            }
        }
        out
    }

    /// How the status names this recipe: the profile, with the unset seed spelled out.
    pub fn recipe_name(&self) -> String {
        if self.python_hash_seed == VLLM_UNSET_SEED {
            format!(
                "{}/{}/PYTHONHASHSEED unset/{}",
                self.strategy,
                self.algorithm,
                self.index_projection.as_str()
            )
        } else {
            self.to_string()
        }
    }
}

impl fmt::Display for HashProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/seed={}/{}",
            self.strategy,
            self.algorithm,
            self.python_hash_seed,
            self.index_projection.as_str()
        )
    }
}

const INPUT_KEYS: [&str; 4] = [
    KEY_STRATEGY,
    KEY_ALGORITHM,
    KEY_PYTHON_HASH_SEED,
    KEY_INDEX_PROJECTION,
];

/// `ProfileError::field` is `&'static str`, so an unknown key is reported under a fixed name;
/// the message carries the key itself.
fn unknown_field_name(key: &str) -> &'static str {
    if key == KEY_ROOT_DIGEST {
        KEY_ROOT_DIGEST
    } else {
        "hash_profile"
    }
}

const fn algorithm_fits(strategy: Strategy, algorithm: Algorithm) -> bool {
    match strategy {
        Strategy::VllmV1 => matches!(algorithm, Algorithm::Sha256 | Algorithm::Sha256Cbor),
        Strategy::Sglang | Strategy::SglangBigram => matches!(algorithm, Algorithm::Sha256Raw),
    }
}

/// `"random"` (literal text, not a random seed), or 1..=10 ASCII digits with value at most
/// `u32::MAX`. Leading zeros are kept ("0" and "00" are different seeds); no sign, no spaces.
fn validate_vllm_seed(seed: &str) -> Result<(), ProfileError> {
    if seed == "random" {
        return Ok(());
    }
    let invalid = |why: &str| {
        ProfileError::invalid(
            KEY_PYTHON_HASH_SEED,
            format!(
                "python_hash_seed {seed:?} {why} (expected \"random\" or decimal 0..4294967295)"
            ),
        )
    };
    if seed.is_empty() {
        return Err(invalid("is empty"));
    }
    if !seed.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid("is not ASCII decimal digits"));
    }
    // Leading zeros make the text longer without making the value larger.
    let digits = seed.trim_start_matches('0');
    let fits = digits.len() < 10 || (digits.len() == 10 && digits <= "4294967295");
    if !fits {
        return Err(invalid("is out of range"));
    }
    Ok(())
}

fn derive_root(strategy: Strategy, algorithm: Algorithm, seed: &str) -> [u8; 32] {
    match (strategy, algorithm) {
        (Strategy::VllmV1, Algorithm::Sha256Cbor) => {
            let mut buf = Vec::with_capacity(seed.len() + 9);
            cbor::write_text(&mut buf, seed);
            Sha256::digest(&buf).into()
        }
        (Strategy::VllmV1, _) => Sha256::digest(pickle::dumps_str(seed)).into(),
        (Strategy::Sglang | Strategy::SglangBigram, _) => {
            let mut h = Sha256::new();
            h.update(SGLANG_ROOT_DOMAIN);
            h.update(strategy.as_str().as_bytes());
            h.finalize().into()
        }
    }
}

/// Lower-case hex of a byte string.
pub fn hex_lower(bytes: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(HEX[usize::from(b >> 4)]));
        out.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    out
}
