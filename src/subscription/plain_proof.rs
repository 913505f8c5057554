//! Whether the blocks of an engine event that leaves its extras out may have derived keys.
//!
//! A derived key (`hashing::derived`) is built from what the event says entered the block's
//! hash: its tokens, its parent, the cache salt and the other extras. vLLM's `extra_keys` is
//! optional in its schema, and an event without it (absent or `nil`) does not say whether a
//! salt, a multimodal item or anything else entered its hashes. A derived key would have to
//! assume "none", which for a salted request is a false hit for every other tenant and a miss
//! for the salted one.
//!
//! So such an event gets derived keys only when the registered profile proves it plain:
//! recomputing the chain from its tokens, for its adapter and no salt, gives every published
//! hash. Otherwise its blocks are kept under their published hashes, which a query finds through
//! the registered profile's chain computed for the query's own salt and adapter
//! (`docs/engine-events.md`, "Events without their extras").
//!
//! A chain-start event is recomputed from the profile's root. A continuation needs its parent's
//! full digest (the event carries only its projection): this proof remembers the digests of the
//! blocks it proved, in a bounded map cleared when full and when the publisher clears its cache,
//! and a continuation of any other block is not proven. Events that carry their extras cost
//! nothing here.

use std::collections::HashMap;

use crate::events::{EngineStored, EventTokens};
use crate::hashing::{BlockHasher, HashProfile, Strategy};
use crate::model::BlockHash;

/// Digests of proven blocks remembered (about 3 MiB); the map is cleared when full.
const MAX_PROVEN: usize = 65_536;

pub struct PlainProof {
    profile: HashProfile,
    /// Published hash → full digest of the blocks proven plain.
    proven: HashMap<BlockHash, [u8; 32]>,
    /// The hasher of the last adapter asked for (`""`: the base model), never salted.
    hasher: Option<(String, BlockHasher)>,
    scratch: Vec<u8>,
    /// The digests of the event being proved, kept between events for their allocation.
    steps: Vec<(BlockHash, [u8; 32])>,
}

/// Its size only: the digests are noise in a debug print.
impl std::fmt::Debug for PlainProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlainProof")
            .field("profile", &self.profile)
            .field("proven", &self.proven.len())
            .finish_non_exhaustive()
    }
}

impl PlainProof {
    pub fn new(profile: &HashProfile) -> Self {
        PlainProof {
            profile: profile.clone(),
            proven: HashMap::new(),
            hasher: None,
            scratch: Vec::new(),
            steps: Vec::new(),
        }
    }

    /// Whether the blocks of `event` may be keyed by the keys derived from what it carries:
    /// always when it carries its extras, otherwise only when the registered profile proves
    /// it plain.
    pub fn derivable(&mut self, event: &EngineStored) -> bool {
        event.extras_carried || self.proves_plain(event)
    }

    /// The publisher cleared its cache: remembered digests no longer name live chains.
    pub fn forget_all(&mut self) {
        self.proven.clear();
    }

    fn proves_plain(&mut self, event: &EngineStored) -> bool {
        // Only vLLM's schema leaves the extras out, and only complete blocks are its blocks.
        if self.profile.strategy() != Strategy::VllmV1 {
            return false;
        }
        let Some(EventTokens::Flat(tokens)) = &event.tokens else {
            return false;
        };
        let size = event.block_size as usize;
        if size == 0 || event.hashes.is_empty() || tokens.len() != event.hashes.len() * size {
            return false;
        }
        let mut parent = match event.parent {
            None => None,
            Some(p) => match self.proven.get(&p) {
                Some(digest) => Some(*digest),
                None => return false,
            },
        };
        let lora = event.lora_name.as_deref().unwrap_or("");
        let hasher = match self.hasher.take() {
            Some(cached) if cached.0 == lora => cached,
            _ => (lora.to_owned(), self.profile.hasher(lora, "")),
        };
        self.steps.clear();
        for (block, published) in tokens.chunks_exact(size).zip(&event.hashes) {
            let step = hasher.1.step(parent.as_ref(), block, &mut self.scratch);
            if step.key != *published {
                break;
            }
            self.steps.push((step.key, step.digest));
            parent = Some(step.digest);
        }
        self.hasher = Some(hasher);
        if self.steps.len() != event.hashes.len() {
            return false;
        }
        if self.proven.len() + self.steps.len() > MAX_PROVEN {
            self.proven.clear();
        }
        self.proven.extend(self.steps.drain(..));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Tier;

    fn profile() -> HashProfile {
        crate::hashing::profile::vllm_cbor_default()
    }

    /// Tokens 1..=8 in blocks of 4 as an engine hashing with the registered profile, `lora`
    /// and `salt` publishes them, without `extra_keys`: blocks 0-1 as one event (`None`: the
    /// whole prompt) or split into a chain start and a continuation.
    fn events(lora: &str, salt: &str) -> (EngineStored, EngineStored, EngineStored) {
        let tokens: Vec<i64> = (1..=8).collect();
        let hasher = profile().hasher(lora, salt);
        let mut chain = hasher.chain(4, &tokens);
        let keys: Vec<BlockHash> = (0..2).map(|i| chain.try_key(i).unwrap()).collect();
        let event =
            |hashes: &[BlockHash], parent: Option<BlockHash>, tokens: &[i64]| EngineStored {
                hashes: hashes.to_vec(),
                parent,
                tokens: Some(EventTokens::Flat(tokens.to_vec())),
                block_size: 4,
                lora_name: (!lora.is_empty()).then(|| lora.to_owned()),
                cache_salt: None,
                extras: Vec::new(),
                extras_carried: false,
                tier: Tier::Device,
                group: Default::default(),
            };
        (
            event(&keys, None, &tokens),
            event(&keys[..1], None, &tokens[..4]),
            event(&keys[1..], Some(keys[0]), &tokens[4..]),
        )
    }

    #[test]
    fn a_plain_event_is_proven_and_so_is_its_continuation() {
        for lora in ["", "ad"] {
            let mut proof = PlainProof::new(&profile());
            let (whole, start, next) = events(lora, "");
            assert!(proof.derivable(&whole), "lora {lora:?}");
            let mut proof = PlainProof::new(&profile());
            assert!(proof.derivable(&start), "lora {lora:?}");
            assert!(proof.derivable(&next), "the parent was proven");
        }
    }

    #[test]
    fn a_salted_event_without_its_extras_is_not_proven_nor_is_its_continuation() {
        for lora in ["", "ad"] {
            let mut proof = PlainProof::new(&profile());
            let (whole, start, next) = events(lora, "s1");
            assert!(!proof.derivable(&whole), "lora {lora:?}");
            assert!(!proof.derivable(&start));
            assert!(!proof.derivable(&next), "its parent was not proven");
            // The same events saying their extras are keyed as they say.
            let said = EngineStored {
                extras_carried: true,
                cache_salt: Some("s1".into()),
                ..whole
            };
            assert!(proof.derivable(&said));
        }
    }

    #[test]
    fn what_cannot_be_recomputed_is_not_proven() {
        let (whole, start, next) = events("", "");
        let mut proof = PlainProof::new(&profile());
        assert!(!proof.derivable(&next), "a parent never proven");
        let no_tokens = EngineStored {
            tokens: None,
            ..whole.clone()
        };
        assert!(!proof.derivable(&no_tokens));
        let short = EngineStored {
            tokens: Some(EventTokens::Flat((1..=7).collect())),
            ..whole.clone()
        };
        assert!(!proof.derivable(&short), "not one block per hash");
        // Another adapter's chain is not this event's.
        let other_adapter = EngineStored {
            lora_name: Some("ad".into()),
            ..whole.clone()
        };
        assert!(!proof.derivable(&other_adapter));
        // A clear forgets the proven parents.
        assert!(proof.derivable(&start));
        proof.forget_all();
        assert!(!proof.derivable(&next));
        // An SGLang-strategy registration proves nothing about a vLLM chain.
        let sglang = HashProfile::resolve(
            Some("sglang"),
            Some("sha256_raw"),
            Some("0"),
            Some("first64_be"),
        )
        .unwrap();
        assert!(!PlainProof::new(&sglang).derivable(&whole));
    }
}
