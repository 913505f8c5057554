//! The read side of a context: [`IndexReader`], the cloneable handle queries and the global view
//! go through, over what the writer shares with its readers (`shared`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::hashing::derived::{BlockRule, DerivedChain};
use crate::hashing::{HashProfile, PrefixKeys, Token};
use crate::model::{BlockHash, ContextKey, SubscriptionKey};

use super::prompt_keys::{AliasedHashes, TokenKeys};
use super::query;
use crate::index::answer::{AnswerView, QueryHits};
use crate::index::shared::Shared;

/// One context as the global view reports it (`docs/python-api.md`, get_global_view()).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextView {
    pub key: ContextKey,
    pub profile: HashProfile,
    /// Distinct blocks held in any tier.
    pub prefix_count: u64,
    /// Instance id → listed DP ranks.
    pub instances: BTreeMap<String, BTreeSet<u32>>,
    /// Blocks the memory budget evicted from this context since it started (see "Memory
    /// budget" in `docs/durability.md`).
    pub evicted: u64,
}

/// Size figures for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    pub blocks: u64,
    pub holder_blocks: u64,
    /// Interned holders (reclaimed ones not counted).
    pub holders: u64,
    pub invalid_ops: u64,
    /// Pairs keyed by a published hash (see "Keys" in `src/index/README.md`).
    pub raw_pairs: u64,
    /// Blocks stored with a parent the context never saw.
    pub unlinked: u64,
    /// Blocks the memory budget evicted.
    pub evicted: u64,
    /// KV-cache groups of hybrid ranks, by kind (`GroupKind::KINDS` order): engine holders
    /// other than group 0 of full attention, and the group 0 of a rank that has such a one.
    pub groups_by_kind: [u64; 5],
}

/// Evaluate `$walk` with `$keys` bound to the keys of `$tokens`: the index's derived keys, and
/// while it holds blocks by published hash, the registered profile's hash chain beside them. A
/// macro rather than a function taking a closure, because the two key types differ and the walk
/// is compiled for each (a `dyn` key source would cost a call per block in the hot loop).
macro_rules! with_token_keys {
    ($reader:expr, $tokens:expr, $salt:expr, |$keys:ident| $walk:expr) => {{
        let shared = &$reader.shared;
        let (profile, block_size) = (&shared.profile, shared.key.block_size);
        if shared.raw_pairs.load(Ordering::Relaxed) == 0 {
            // Nothing is held by published hash: the registered chain would never be asked
            // for, so its per-request set-up is skipped too.
            let rule = BlockRule::of(profile.strategy());
            let mut chain = DerivedChain::tuned(rule, block_size, $tokens, $salt, shared.tuning);
            let $keys = &mut chain;
            $walk
        } else {
            let hasher = profile.hasher(&shared.key.lora_name, $salt);
            let tuning = (profile.strategy(), shared.tuning);
            let mut chain = TokenKeys::new(&hasher, tuning, block_size, $tokens, $salt);
            let $keys = &mut chain;
            $walk
        }
    }};
}

/// A cheap, cloneable, `Send + Sync` read handle on one context. Queries through it never wait
/// for the writer's mailbox, and their block lookups take no lock: each reads its shard through
/// the shard's sequence lock and retries if the writer changed the shard meanwhile (see
/// `table::view`). A query takes the metadata lock once, to fetch the cached plan, and a query by
/// hash the alias map's read lock once, to translate its hashes.
#[derive(Clone)]
pub struct IndexReader {
    pub(crate) shared: Arc<Shared>,
}

impl IndexReader {
    pub fn key(&self) -> &ContextKey {
        &self.shared.key
    }

    pub fn profile(&self) -> &HashProfile {
        &self.shared.profile
    }

    /// Prefix hits per instance for the prompt behind `keys` (see [`query`]). `instance_filter`
    /// `None` or `Some("")` selects every registered instance.
    pub fn query<K: PrefixKeys + ?Sized>(
        &self,
        keys: &mut K,
        instance_filter: Option<&str>,
    ) -> QueryHits {
        query::walk(&self.shared, keys, instance_filter)
    }

    /// Prefix hits for a prompt's token ids (`cache_salt` "" for none): the walk over the keys
    /// the index derives from tokens, and while it holds blocks by published hash, the
    /// registered profile's hash chain beside them (see "Keys" in `src/index/README.md`).
    pub fn query_tokens<T: Token>(
        &self,
        tokens: &[T],
        cache_salt: &str,
        instance_filter: Option<&str>,
    ) -> QueryHits {
        let mut out = QueryHits::default();
        self.query_tokens_into(tokens, cache_salt, instance_filter, &mut out);
        out
    }

    /// [`Self::query_tokens`] written into `out` (see [`Self::query_into`]).
    pub fn query_tokens_into<T: Token>(
        &self,
        tokens: &[T],
        cache_salt: &str,
        instance_filter: Option<&str>,
        out: &mut QueryHits,
    ) {
        with_token_keys!(self, tokens, cache_salt, |keys| query::walk_into(
            &self.shared,
            keys,
            instance_filter,
            out
        ))
    }

    /// [`Self::query_tokens`] handed to `answer` as an [`AnswerView`]: the path the service's
    /// transports take, which encode the answer straight from the walk's counts and build
    /// nothing per instance.
    pub fn query_tokens_with<T: Token, R>(
        &self,
        tokens: &[T],
        cache_salt: &str,
        instance_filter: Option<&str>,
        answer: impl FnOnce(AnswerView<'_>) -> R,
    ) -> R {
        with_token_keys!(self, tokens, cache_salt, |keys| query::walk_view(
            &self.shared,
            keys,
            instance_filter,
            answer
        ))
    }

    /// Prefix hits for a prompt named by its blocks' published hashes (query by hash), each
    /// translated through the context's aliases.
    pub fn query_hashes(&self, hashes: &[u64], instance_filter: Option<&str>) -> QueryHits {
        self.query_hashes_with(hashes, instance_filter, |answer| answer.to_hits())
    }

    /// [`Self::query_hashes`] handed to `answer` as an [`AnswerView`] (see
    /// [`Self::query_tokens_with`]).
    pub fn query_hashes_with<R>(
        &self,
        hashes: &[u64],
        instance_filter: Option<&str>,
        answer: impl FnOnce(AnswerView<'_>) -> R,
    ) -> R {
        let mut keys = AliasedHashes {
            hashes: hashes.iter().map(|&h| BlockHash(h)).collect(),
            aliases: self.shared.aliases.resolve(hashes.iter().copied()),
            block_size: self.shared.key.block_size,
        };
        query::walk_view(&self.shared, &mut keys, instance_filter, answer)
    }

    /// [`Self::query`] written into `out`. When `out` holds an earlier answer with the same
    /// instances and ranks (the same query repeated, as a router does per request), its maps are
    /// reused and nothing is allocated for the answer.
    pub fn query_into<K: PrefixKeys + ?Sized>(
        &self,
        keys: &mut K,
        instance_filter: Option<&str>,
        out: &mut QueryHits,
    ) {
        query::walk_into(&self.shared, keys, instance_filter, out)
    }

    /// Distinct blocks held in any tier.
    /// How sure this context's answers are for each (instance, rank) `instance_filter`
    /// selects, in answer order (see [`crate::index::RankStatus`]).
    pub fn rank_statuses(&self, instance_filter: Option<&str>) -> Vec<crate::index::RankStatus> {
        let filter = instance_filter.filter(|f| !f.is_empty());
        self.shared.meta.plan().rank_statuses(filter)
    }

    pub fn prefix_count(&self) -> u64 {
        self.shared.blocks.load(Ordering::Relaxed)
    }

    /// Whether `source` reported blocks into this context (it has a holder here).
    pub fn fed_by(&self, source: &SubscriptionKey) -> bool {
        self.shared.meta.read().sources.contains(source)
    }

    /// Registered instances and their listed ranks.
    pub fn instances(&self) -> BTreeMap<String, BTreeSet<u32>> {
        self.shared.meta.read().instances()
    }

    pub fn view(&self) -> ContextView {
        ContextView {
            key: self.shared.key.clone(),
            profile: self.shared.profile.clone(),
            prefix_count: self.prefix_count(),
            instances: self.instances(),
            evicted: self.shared.evicted.load(Ordering::Relaxed),
        }
    }

    pub fn stats(&self) -> IndexStats {
        IndexStats {
            blocks: self.shared.blocks.load(Ordering::Relaxed),
            holder_blocks: self.shared.holder_blocks.load(Ordering::Relaxed),
            holders: self.shared.meta.read().holders as u64,
            invalid_ops: self.shared.invalid_ops.load(Ordering::Relaxed),
            raw_pairs: self.shared.raw_pairs.load(Ordering::Relaxed),
            unlinked: self.shared.unlinked.load(Ordering::Relaxed),
            evicted: self.shared.evicted.load(Ordering::Relaxed),
            groups_by_kind: self.shared.meta.plan().groups_by_kind(),
        }
    }

    /// True when no lock of this context is held (tests: hashing must run unlocked).
    #[cfg(test)]
    pub(crate) fn all_unlocked(&self) -> bool {
        self.shared.table.all_unlocked() && self.shared.meta.is_unlocked()
    }
}
