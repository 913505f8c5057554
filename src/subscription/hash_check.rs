//! The runtime hash-profile check: recompute published block hashes from the event's tokens with
//! the registered profile and compare. A wrong seed, algorithm, LoRA path or block size otherwise
//! shows only as a silent 0 % hit rate.
//!
//! A block can be recomputed when its event carries `token_ids` and its parent is the chain start
//! or a block this check already verified (the parent's full digest is needed; the event carries
//! only its projection). Verified digests are remembered in a bounded map.
//!
//! Verdict, over the last [`WINDOW`] recomputed blocks: `unverified` while none was recomputed,
//! `mismatch` while any of them did not match (so one forged block among good ones shows, and a
//! publisher that changes its recipe mid-life is flagged), `ok` when all of them matched. The
//! status also reports the window's mismatch rate. Some honest blocks cannot match: multimodal
//! keys enter vLLM's hash in a form its events do not carry, so such a publisher reads
//! `mismatch` with a rate of its multimodal share. An event that leaves its extras out (vLLM's
//! `extra_keys` absent or `nil`) is recomputed as a plain request: a match counts, a mismatch
//! does not, since it may be a salt the event does not name rather than a wrong recipe.
//!
//! Query answers do not depend on this check: the index keys engine blocks by keys it derives
//! from their contents (see `index`), so a mismatch only means the index is translating. (Blocks
//! of events without their extras are the exception: only a registered profile that reproduces
//! them finds them, see `plain_proof`.) What the check adds is the engine's actual recipe for the
//! status: when a chain-start block does not match the registered profile, the check tries the
//! recipes the engine may really use ([`HashProfile::candidate_recipes`]: the other algorithm,
//! `PYTHONHASHSEED` unset) and names the first that matches, or says why none can (a LoRA path or
//! an adapter namespace the events do not carry).

use std::collections::{HashMap, VecDeque};

use crate::events::{EngineStored, EventTokens};
use crate::hashing::{BlockHasher, HashProfile, Strategy};
use crate::model::{BlockHash, PublisherConfig};

use super::status::HashCheckState;

/// Recomputed blocks the verdict and the mismatch rate are taken over (the most recent ones).
pub const WINDOW: usize = 256;
/// Verified digests remembered (about 3 MiB); the map is cleared when full.
const MAX_KNOWN: usize = 65_536;
/// While the window holds only matches, check one stored event in this many (the check costs a
/// hash per block).
const SAMPLE_AFTER_OK: u64 = 64;

pub struct HashCheck {
    profile: HashProfile,
    block_size: usize,
    service: String,
    known: HashMap<BlockHash, [u8; 32]>,
    hasher: Option<(String, String, BlockHasher)>,
    scratch: Vec<u8>,
    ok: u64,
    mismatch: u64,
    /// The last [`WINDOW`] outcomes (`true`: matched), oldest first.
    recent: VecDeque<bool>,
    /// Mismatches in `recent`.
    recent_mismatches: usize,
    events_seen: u64,
    warned: bool,
    /// The recipe the engine was seen hashing with, when it is not the registered one.
    engine_recipe: Option<String>,
}

impl HashCheck {
    pub fn new(config: &PublisherConfig) -> Self {
        HashCheck {
            profile: config.hash_profile.clone(),
            block_size: config.block_size as usize,
            service: config.subscription_key().to_string(),
            known: HashMap::new(),
            hasher: None,
            scratch: Vec::with_capacity(256),
            ok: 0,
            mismatch: 0,
            recent: VecDeque::with_capacity(WINDOW),
            recent_mismatches: 0,
            events_seen: 0,
            warned: false,
            engine_recipe: None,
        }
    }

    /// The recipe the engine hashes with: the registered profile once verified, another
    /// recipe the check recognized, or why it cannot tell; `None` while nothing is known.
    pub fn engine_recipe(&self) -> Option<String> {
        match self.state() {
            HashCheckState::Ok => Some(self.profile.recipe_name()),
            _ => self.engine_recipe.clone(),
        }
    }

    pub fn state(&self) -> HashCheckState {
        if self.recent.is_empty() {
            HashCheckState::Unverified
        } else if self.recent_mismatches > 0 {
            HashCheckState::Mismatch
        } else {
            HashCheckState::Ok
        }
    }

    /// Mismatches among the last [`WINDOW`] recomputed blocks, as a fraction (0 when none).
    pub fn mismatch_rate(&self) -> f64 {
        if self.recent.is_empty() {
            0.0
        } else {
            self.recent_mismatches as f64 / self.recent.len() as f64
        }
    }

    /// (state, blocks matched, blocks mismatched, recent mismatch rate).
    pub fn summary(&self) -> (HashCheckState, u64, u64, f64) {
        (self.state(), self.ok, self.mismatch, self.mismatch_rate())
    }

    fn record(&mut self, matched: bool) {
        if self.recent.len() == WINDOW && self.recent.pop_front() == Some(false) {
            self.recent_mismatches -= 1;
        }
        self.recent.push_back(matched);
        if matched {
            self.ok += 1;
        } else {
            self.mismatch += 1;
            self.recent_mismatches += 1;
        }
    }

    /// The publisher cleared its cache: remembered digests no longer prove anything.
    pub fn forget_all(&mut self) {
        self.known.clear();
    }

    pub fn observe_stored(&mut self, event: &EngineStored) {
        self.events_seen += 1;
        let all_good = self.state() == HashCheckState::Ok;
        if all_good && !self.events_seen.is_multiple_of(SAMPLE_AFTER_OK) {
            return;
        }
        let Some(tokens) = &event.tokens else { return };
        let mut parent = match event.parent {
            None => None,
            Some(p) => match self.known.get(&p) {
                Some(digest) => Some(*digest),
                None => return, // cannot recompute without the parent's full digest
            },
        };
        let lora = event.lora_name.as_deref().unwrap_or("");
        let salt = event.cache_salt.as_deref().unwrap_or("");
        let raw = match tokens {
            EventTokens::Flat(t) => t.clone(),
            // Bigram pages hash raw tokens: t0 then the second element of every pair.
            EventTokens::Bigram(pairs) => {
                let mut raw: Vec<i64> = pairs.first().map(|p| vec![p.0]).unwrap_or_default();
                raw.extend(pairs.iter().map(|p| p.1));
                raw
            }
        };
        let bigram = self.profile.strategy() == Strategy::SglangBigram;
        let units = if bigram {
            raw.len().saturating_sub(1)
        } else {
            raw.len()
        };
        let block = self.block_size.max(1);
        if units != event.hashes.len() * block {
            // Partial or inconsistent token lists cannot be split into the published blocks.
            return;
        }
        let cached = self.take_hasher(lora, salt);
        let hasher = &cached.2;
        for (i, published) in event.hashes.iter().enumerate() {
            let start = i * block;
            let end = if bigram {
                start + block + 1
            } else {
                start + block
            };
            let step = hasher.step(parent.as_ref(), &raw[start..end], &mut self.scratch);
            if step.key != *published && !event.extras_carried {
                // Recomputed without the salt or extras the event leaves unsaid: no verdict.
                break;
            }
            if step.key != *published {
                self.record(false);
                if i == 0 && event.parent.is_none() && self.engine_recipe.is_none() {
                    self.engine_recipe = Some(self.identify(&raw[..end], *published, lora, salt));
                }
                self.warn_once();
                break;
            }
            self.record(true);
            if self.recent_mismatches == 0 {
                // Back to all good: a later mismatch is news again.
                self.warned = false;
            }
            if self.known.len() >= MAX_KNOWN {
                self.known.clear();
            }
            self.known.insert(step.key, step.digest);
            parent = Some(step.digest);
        }
        self.hasher = Some(cached);
    }

    /// Name the recipe that hashes a chain's first block (`tokens`) to `published`.
    fn identify(&mut self, tokens: &[i64], published: BlockHash, lora: &str, salt: &str) -> String {
        for candidate in self.profile.candidate_recipes() {
            let step = candidate
                .hasher(lora, salt)
                .step(None, tokens, &mut self.scratch);
            if step.key == published {
                return candidate.recipe_name();
            }
        }
        match (self.profile.strategy(), lora.is_empty()) {
            (Strategy::VllmV1, false) => {
                "unknown: vLLM hashes a LoRA adapter's path, which its events do not carry".into()
            }
            (_, false) => {
                "unknown: SGLang namespaces an adapter's hashes by an id its events do not carry"
                    .into()
            }
            _ => "unknown: no supported recipe reproduces the published hashes".into(),
        }
    }

    /// The prepared hasher for this (lora, salt), reusing the last one when it matches.
    fn take_hasher(&mut self, lora: &str, salt: &str) -> (String, String, BlockHasher) {
        match self.hasher.take() {
            Some(cached) if cached.0 == lora && cached.1 == salt => cached,
            _ => (
                lora.to_owned(),
                salt.to_owned(),
                self.profile.hasher(lora, salt),
            ),
        }
    }

    /// Warn once each time the verdict turns to `mismatch`.
    fn warn_once(&mut self) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(
                service = %self.service,
                profile = %self.profile,
                engine_recipe = self.engine_recipe.as_deref().unwrap_or("unknown"),
                "published block hashes do not match the registered hash profile; answers stay exact \
                 (blocks are keyed by their contents), queries by hash need the engine's hashes. \
                 Likely causes: PYTHONHASHSEED unset or different (python_hash_seed), a different \
                 --prefix-caching-hash-algo (algorithm), a LoRA path, or a different block size"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::profile::VLLM_UNSET_SEED;
    use crate::model::Tier;

    fn config(seed: &str) -> PublisherConfig {
        PublisherConfig {
            block_size: 4,
            hash_profile: HashProfile::resolve(
                Some("vllm_v1"),
                Some("sha256"),
                Some(seed),
                Some("low64_be"),
            )
            .unwrap(),
            ..PublisherConfig::test_vllm("i", "tcp://127.0.0.1:1")
        }
    }

    /// A chain-start event as an engine hashing with `profile` publishes it.
    fn event(profile: &HashProfile, lora: Option<&str>) -> EngineStored {
        let tokens: Vec<i64> = (1..=8).collect();
        let hasher = profile.hasher(lora.unwrap_or(""), "");
        let mut chain = hasher.chain(4, &tokens);
        EngineStored {
            hashes: (0..2).map(|i| chain.try_key(i).unwrap()).collect(),
            parent: None,
            tokens: Some(EventTokens::Flat(tokens.clone())),
            block_size: 4,
            lora_name: lora.map(str::to_owned),
            cache_salt: None,
            extras: Vec::new(),
            extras_carried: true,
            tier: Tier::Device,
            group: Default::default(),
        }
    }

    #[test]
    fn an_event_without_its_extras_counts_when_it_matches_and_never_as_a_mismatch() {
        let registered = config("42");
        let profile = &registered.hash_profile;
        let tokens: Vec<i64> = (1..=8).collect();
        let salted = profile.hasher("", "s1");
        let mut chain = salted.chain(4, &tokens);
        let unsaid = |hashes: Vec<BlockHash>| EngineStored {
            hashes,
            extras_carried: false,
            ..event(profile, None)
        };
        let mut check = HashCheck::new(&registered);
        check.observe_stored(&unsaid((0..2).map(|i| chain.try_key(i).unwrap()).collect()));
        assert_eq!(check.summary(), (HashCheckState::Unverified, 0, 0, 0.0));
        assert_eq!(check.engine_recipe(), None);
        check.observe_stored(&unsaid(event(profile, None).hashes));
        assert_eq!(check.summary(), (HashCheckState::Ok, 2, 0, 0.0));
    }

    #[test]
    fn the_engine_recipe_is_named_when_it_is_not_the_registered_one() {
        let registered = config("42");
        let unset = registered
            .hash_profile
            .candidate_recipes()
            .into_iter()
            .find(|p| p.python_hash_seed() == VLLM_UNSET_SEED && p.algorithm().as_str() == "sha256")
            .expect("the unset-seed recipe is a candidate");
        let mut check = HashCheck::new(&registered);
        check.observe_stored(&event(&unset, None));
        assert_eq!(check.state(), HashCheckState::Mismatch);
        assert_eq!(
            check.engine_recipe().as_deref(),
            Some("vllm_v1/sha256/PYTHONHASHSEED unset/low64_be")
        );

        // The registered recipe itself: verified, and named as registered.
        let mut ok = HashCheck::new(&registered);
        ok.observe_stored(&event(&registered.hash_profile, None));
        assert_eq!(ok.state(), HashCheckState::Ok);
        assert_eq!(
            ok.engine_recipe().as_deref(),
            Some("vllm_v1/sha256/seed=42/low64_be")
        );

        // A seed nobody can guess, with an adapter: the status says why it cannot tell.
        let other = config("7").hash_profile;
        let mut lora = HashCheck::new(&registered);
        lora.observe_stored(&event(&other, Some("ad")));
        assert!(
            lora.engine_recipe()
                .unwrap()
                .contains("LoRA adapter's path")
        );
    }

    #[test]
    fn one_forged_block_among_good_ones_flips_to_mismatch_until_it_ages_out() {
        let registered = config("42");
        let good = event(&registered.hash_profile, None);
        let mut forged = good.clone();
        forged.hashes[0].0 ^= 1;
        let mut check = HashCheck::new(&registered);
        assert_eq!(check.state(), HashCheckState::Unverified);
        check.observe_stored(&good);
        assert_eq!(check.summary(), (HashCheckState::Ok, 2, 0, 0.0));
        // Verified publishers are sampled: within one sampling period the forgery is seen.
        let mut sent = 0;
        while check.state() == HashCheckState::Ok && sent < SAMPLE_AFTER_OK {
            check.observe_stored(&forged);
            sent += 1;
        }
        let (state, ok, mismatch, rate) = check.summary();
        assert_eq!((state, ok, mismatch), (HashCheckState::Mismatch, 2, 1));
        assert!((rate - 1.0 / 3.0).abs() < 1e-9, "{rate}");
        // Every event is checked while the window holds a mismatch; it ages out after WINDOW
        // good blocks (two per event).
        for _ in 0..WINDOW / 2 - 1 {
            check.observe_stored(&good);
        }
        assert_eq!(check.state(), HashCheckState::Mismatch);
        check.observe_stored(&good);
        assert_eq!(check.state(), HashCheckState::Ok);
        assert_eq!(check.mismatch_rate(), 0.0);
    }

    #[test]
    fn a_publisher_that_changes_its_recipe_mid_life_is_flagged() {
        let registered = config("42");
        let mut check = HashCheck::new(&registered);
        check.observe_stored(&event(&registered.hash_profile, None));
        assert_eq!(check.state(), HashCheckState::Ok);
        let other = config("7").hash_profile;
        for _ in 0..SAMPLE_AFTER_OK {
            check.observe_stored(&event(&other, None));
        }
        assert_eq!(check.state(), HashCheckState::Mismatch);
        assert!(check.mismatch_rate() > 0.0);
        // From then on every event is checked, and every one mismatches.
        for _ in 0..WINDOW {
            check.observe_stored(&event(&other, None));
        }
        assert_eq!(check.mismatch_rate(), 1.0);
    }
}
