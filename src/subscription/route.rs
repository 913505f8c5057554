//! Turn one decoded batch of one subscription into index batches, one per context it touches.
//!
//! Engine blocks go to the registration's context, or to the adapter context their event names
//! (a registration with `lora_name` "" indexes base blocks and every adapter its publisher reports;
//! a registration for one adapter accepts only that adapter's blocks). Removals and clears carry
//! no adapter, so they go to every context this source has fed. Store events name their context
//! themselves (model, lora, block size), falling back to the registration's model and block size
//! when the publisher leaves them out.
//!
//! What a publisher's events may ask for is bounded, event by event (the rest of the batch still
//! applies): a store's events stay in its registered tenant, their block sizes follow the
//! registration rules, names are at most `max_name_bytes`, and one source feeds at most
//! `max_contexts_per_source` contexts. Each refusal is reported as [`Refused`], by field.

use std::collections::BTreeSet;

use crate::events::{
    BlockContents, DecodedBatch, EngineStored, EventTokens, Holder, IgnoreReason, IndexOp, KvEvent,
    StoreObject,
};
use crate::hashing::Strategy;
use crate::hashing::derived::{self, BlockRule};
use crate::model::{ContextKey, MAX_BLOCK_SIZE, PublisherConfig, normalize_tenant};

/// Bounds on what one source's events may create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteLimits {
    pub max_contexts: usize,
    pub max_name_bytes: usize,
}

impl Default for RouteLimits {
    fn default() -> Self {
        RouteLimits {
            max_contexts: usize::MAX,
            max_name_bytes: usize::MAX,
        }
    }
}

/// An event refused by a bound: the field (or limit) it broke, and what it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub field: &'static str,
    pub detail: String,
}

/// At most this many characters of a refused name go into a message (a name may be megabytes).
const PREVIEW_CHARS: usize = 64;

fn preview(text: &str) -> String {
    match text.char_indices().nth(PREVIEW_CHARS) {
        None => format!("{text:?}"),
        Some((end, _)) => format!("{:?}... ({} bytes)", &text[..end], text.len()),
    }
}

/// Per-subscription routing state.
#[derive(Debug)]
pub struct Router {
    base: ContextKey,
    engine_holder: Holder,
    registered_lora: String,
    block_size: u32,
    model_name: String,
    /// The profile hashes a final partial page (SGLang strategies).
    partial_pages: bool,
    /// How the registered profile splits prompts into blocks (the derived keys follow it).
    rule: BlockRule,
    /// Every context this source sent blocks to (removals and clears go to all of them).
    fed: BTreeSet<ContextKey>,
    /// The registered tenant: a store's events are confined to it.
    tenant: String,
    limits: RouteLimits,
    /// Refusals since the last [`Router::take_refused`].
    refused: Vec<Refused>,
}

/// The ops of one batch for one context, in event order.
pub type Routed = Vec<(ContextKey, Vec<IndexOp>)>;

impl Router {
    pub fn new(config: &PublisherConfig) -> Self {
        let base = config.context_key();
        let mut fed = BTreeSet::new();
        if config.publisher_type.is_engine() {
            fed.insert(base.clone());
        }
        Router {
            base,
            engine_holder: Holder::Engine {
                instance_id: config.instance_id.clone(),
                dp_rank: config.dp_rank,
            },
            registered_lora: config.lora_name.clone(),
            block_size: config.block_size,
            model_name: config.model_name.clone(),
            partial_pages: config.hash_profile.strategy() != Strategy::VllmV1,
            rule: BlockRule::of(config.hash_profile.strategy()),
            fed,
            tenant: config.tenant_id.clone(),
            limits: RouteLimits::default(),
            refused: Vec::new(),
        }
    }

    pub fn with_limits(mut self, limits: RouteLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The events refused by [`Router::route`] since the last call.
    pub fn take_refused(&mut self) -> Vec<Refused> {
        std::mem::take(&mut self.refused)
    }

    fn refuse(&mut self, field: &'static str, detail: String) {
        self.refused.push(Refused { field, detail });
    }

    /// Whether this source may send blocks to `context`: one it feeds already, or a new one with
    /// names within bounds while it feeds fewer than `max_contexts`.
    fn admit(&mut self, context: &ContextKey) -> bool {
        if self.fed.contains(context) {
            return true;
        }
        let max_name = self.limits.max_name_bytes;
        for (field, name) in [
            ("model_name", &context.model_name),
            ("lora_name", &context.lora_name),
        ] {
            if name.len() > max_name {
                let detail = format!(
                    "{field} {} is longer than {max_name} bytes (max_name_bytes)",
                    preview(name)
                );
                self.refuse(field, detail);
                return false;
            }
        }
        if self.fed.len() >= self.limits.max_contexts {
            let detail = format!(
                "context {context} would be context {} of this source (max_contexts_per_source = {})",
                self.fed.len() + 1,
                self.limits.max_contexts
            );
            self.refuse("max_contexts_per_source", detail);
            return false;
        }
        self.fed.insert(context.clone());
        true
    }

    /// A store event's tenant must be the registered one.
    fn own_tenant(&mut self, tenant_id: &str) -> bool {
        if normalize_tenant(tenant_id) == self.tenant {
            return true;
        }
        let detail = format!(
            "tenant_id {} is not this store's registered tenant {:?}",
            preview(tenant_id),
            self.tenant
        );
        self.refuse("tenant_id", detail);
        false
    }

    /// Route this source's removals and clears to `context` too: one it fed before a restart.
    pub fn feed(&mut self, context: ContextKey) {
        self.fed.insert(context);
    }

    pub fn fed_contexts(&self) -> impl Iterator<Item = &ContextKey> {
        self.fed.iter()
    }

    /// Route every admitted event; skipped events are appended to `ignored`.
    pub fn route(&mut self, batch: DecodedBatch, ignored: &mut Vec<IgnoreReason>) -> Routed {
        let mut out: Routed = Vec::new();
        for event in batch.events {
            match event {
                KvEvent::Stored(stored) => {
                    // SGLang may publish a short final page (its token count); everything else
                    // must match the registration's block size.
                    let short_page_ok = self.partial_pages && stored.block_size < self.block_size;
                    if stored.block_size != self.block_size && !short_page_ok {
                        ignored.push(IgnoreReason::BlockSizeMismatch);
                        continue;
                    }
                    let lora = stored.lora_name.as_deref().unwrap_or("");
                    let context = match (self.registered_lora.as_str(), lora) {
                        ("", "") => self.base.clone(),
                        ("", adapter) => self.base.with_lora(adapter),
                        (registered, adapter) if registered == adapter => self.base.clone(),
                        _ => {
                            ignored.push(IgnoreReason::OtherLora);
                            continue;
                        }
                    };
                    if !self.admit(&context) {
                        continue;
                    }
                    let holder = self.engine_holder.clone();
                    let op = match block_contents(self.rule, &stored) {
                        Some(contents) => IndexOp::StoreChained {
                            holder,
                            tier: stored.tier,
                            hashes: stored.hashes,
                            contents,
                        },
                        None => IndexOp::StoreAliased {
                            holder,
                            tier: stored.tier,
                            hashes: stored.hashes,
                        },
                    };
                    push(&mut out, context, op);
                }
                KvEvent::Removed(removed) => {
                    // vLLM sends one BlockRemoved per evicted block: copy the hashes only for the
                    // second and later contexts, move them into the last.
                    let mut hashes = Some(removed.hashes);
                    let last = self.fed.len().saturating_sub(1);
                    for (i, context) in self.fed.iter().enumerate() {
                        let hashes = if i == last {
                            hashes.take()
                        } else {
                            hashes.clone()
                        };
                        let op = IndexOp::Remove {
                            holder: self.engine_holder.clone(),
                            tier: removed.tier,
                            hashes: hashes.unwrap_or_default(),
                        };
                        push(&mut out, context.clone(), op);
                    }
                }
                KvEvent::AllCleared => {
                    for context in &self.fed {
                        push(
                            &mut out,
                            context.clone(),
                            IndexOp::ClearHolder {
                                holder: self.engine_holder.clone(),
                            },
                        );
                    }
                }
                KvEvent::StoreStored(object) => {
                    let Some(context) = self.store_context(&object, ignored) else {
                        continue;
                    };
                    if !self.admit(&context) {
                        continue;
                    }
                    let holder = Holder::Shared {
                        backend_id: object.backend_id,
                    };
                    push(
                        &mut out,
                        context,
                        IndexOp::StoreAliased {
                            holder,
                            tier: object.tier,
                            hashes: object.hashes,
                        },
                    );
                }
                KvEvent::StoreRemoved(object) => {
                    let Some(context) = self.store_context(&object, ignored) else {
                        continue;
                    };
                    // Nothing of this source is in a context it never fed: a removal must not
                    // create one.
                    if !self.fed.contains(&context) {
                        continue;
                    }
                    let holder = Holder::Shared {
                        backend_id: object.backend_id,
                    };
                    push(
                        &mut out,
                        context,
                        IndexOp::Remove {
                            holder,
                            tier: object.tier,
                            hashes: object.hashes,
                        },
                    );
                }
                KvEvent::StoreCleared {
                    backend_id,
                    tenant_id,
                } => {
                    if !self.own_tenant(&tenant_id) {
                        continue;
                    }
                    let tenant = normalize_tenant(&tenant_id);
                    for context in self.fed.iter().filter(|c| c.tenant_id == tenant) {
                        let holder = Holder::Shared {
                            backend_id: backend_id.clone(),
                        };
                        push(&mut out, context.clone(), IndexOp::ClearHolder { holder });
                    }
                }
            }
        }
        out
    }

    /// The context a store event names: `None` when it is refused (tenant, block size) or
    /// names none (counted in `ignored`).
    fn store_context(
        &mut self,
        object: &StoreObject,
        ignored: &mut Vec<IgnoreReason>,
    ) -> Option<ContextKey> {
        if !self.own_tenant(&object.tenant_id) {
            return None;
        }
        let block_size = object.block_size.unwrap_or(self.block_size);
        if !(1..=MAX_BLOCK_SIZE).contains(&i128::from(block_size)) {
            let detail = format!("block_size {block_size} is outside 1..={MAX_BLOCK_SIZE}");
            self.refuse("block_size", detail);
            return None;
        }
        let model = object
            .model_name
            .as_deref()
            .filter(|m| !m.is_empty())
            .unwrap_or(&self.model_name);
        if model.is_empty() {
            ignored.push(IgnoreReason::NoContext);
            return None;
        }
        let lora = object.lora_name.as_deref().unwrap_or("");
        Some(ContextKey::new(&object.tenant_id, model, lora, block_size))
    }
}

/// The contents of an engine event's blocks, for the keys the index derives (see
/// `hashing::derived`): `None` when the event carries no tokens, or tokens that do not split
/// into one block per published hash under the registered block rule.
fn block_contents(rule: BlockRule, stored: &EngineStored) -> Option<BlockContents> {
    let size = stored.block_size as usize;
    let n = stored.hashes.len();
    if size == 0 || n == 0 {
        return None;
    }
    let extra = |i: usize| stored.extras.get(i).copied().unwrap_or(0);
    let digests: Vec<u64> = match (rule, stored.tokens.as_ref()?) {
        (BlockRule::FullBlocks | BlockRule::PartialFinal, EventTokens::Flat(tokens)) => {
            if tokens.len().div_ceil(size) != n
                || (rule == BlockRule::FullBlocks && tokens.len() != n * size)
            {
                return None;
            }
            tokens
                .chunks(size)
                .enumerate()
                .map(|(i, block)| derived::content_of(block, extra(i)))
                .collect()
        }
        (BlockRule::Bigram, EventTokens::Bigram(pairs)) => {
            if pairs.len().div_ceil(size) != n {
                return None;
            }
            pairs
                .chunks(size)
                .enumerate()
                .map(|(i, block)| {
                    let words = block.iter().flat_map(|&(a, b)| [a, b]);
                    derived::content(words, block.len(), extra(i))
                })
                .collect()
        }
        _ => return None,
    };
    Some(BlockContents {
        parent: stored.parent,
        root: derived::root(stored.cache_salt.as_deref().unwrap_or("")),
        digests,
    })
}

/// Append an op to its context's list, keeping contexts in first-touch order.
fn push(out: &mut Routed, context: ContextKey, op: IndexOp) {
    match out.iter_mut().find(|(c, _)| *c == context) {
        Some((_, ops)) => ops.push(op),
        None => out.push((context, vec![op])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{EngineRemoved, EngineStored};
    use crate::hashing::HashProfile;
    use crate::model::{BlockHash, PublisherType, Tier};

    fn config(lora: &str, kind: PublisherType) -> PublisherConfig {
        let profile = crate::hashing::profile::test_vllm_cbor();
        PublisherConfig {
            instance_id: "i".into(),
            endpoint: "tcp://127.0.0.1:1".into(),
            replay_endpoint: String::new(),
            publisher_type: kind,
            model_name: "m".into(),
            lora_name: lora.into(),
            tenant_id: "default".into(),
            block_size: 16,
            dp_rank: 2,
            cache_group: None,
            hash_profile: profile,
        }
    }

    fn stored(lora: Option<&str>, block_size: u32) -> KvEvent {
        KvEvent::Stored(EngineStored {
            hashes: vec![BlockHash(1)],
            parent: None,
            tokens: None,
            block_size,
            lora_name: lora.map(str::to_owned),
            cache_salt: None,
            extras: Vec::new(),
            tier: Tier::Device,
        })
    }

    fn route(router: &mut Router, events: Vec<KvEvent>) -> (Vec<String>, Vec<IgnoreReason>) {
        let mut ignored = Vec::new();
        let batch = DecodedBatch {
            events,
            ..Default::default()
        };
        let routed = router.route(batch, &mut ignored);
        (
            routed
                .iter()
                .map(|(c, ops)| format!("{}:{}", c.lora_name, ops.len()))
                .collect(),
            ignored,
        )
    }

    #[test]
    fn a_base_registration_indexes_every_adapter_in_its_own_context() {
        let mut r = Router::new(&config("", PublisherType::Vllm));
        let (routed, ignored) = route(
            &mut r,
            vec![
                stored(None, 16),
                stored(Some("ad"), 16),
                stored(Some(""), 16),
            ],
        );
        assert_eq!(routed, [":2", "ad:1"]);
        assert!(ignored.is_empty());
        // Removals and clears carry no adapter: they go to every context this source fed.
        let removed = KvEvent::Removed(EngineRemoved {
            hashes: vec![BlockHash(1)],
            tier: Tier::Device,
        });
        let (routed, _) = route(&mut r, vec![removed, KvEvent::AllCleared]);
        assert_eq!(routed, [":2", "ad:2"]);
    }

    #[test]
    fn an_adapter_registration_accepts_only_its_adapter() {
        let mut r = Router::new(&config("ad", PublisherType::Vllm));
        let (routed, ignored) = route(
            &mut r,
            vec![
                stored(Some("ad"), 16),
                stored(Some("other"), 16),
                stored(None, 16),
            ],
        );
        assert_eq!(routed, ["ad:1"]);
        assert_eq!(ignored, [IgnoreReason::OtherLora, IgnoreReason::OtherLora]);
    }

    #[test]
    fn another_block_size_is_ignored_for_vllm() {
        let mut r = Router::new(&config("", PublisherType::Vllm));
        let (routed, ignored) = route(&mut r, vec![stored(None, 8)]);
        assert!(routed.is_empty());
        assert_eq!(ignored, [IgnoreReason::BlockSizeMismatch]);
    }

    fn object(tenant: &str, model: Option<&str>, block_size: Option<u32>) -> StoreObject {
        StoreObject {
            backend_id: "b".into(),
            object_key: "o".into(),
            tenant_id: tenant.into(),
            model_name: model.map(str::to_owned),
            lora_name: None,
            block_size,
            tier: Tier::CpuShare,
            hashes: vec![BlockHash(9)],
        }
    }

    fn store_router(tenant: &str) -> Router {
        let mut cfg = config("", PublisherType::Mooncake);
        cfg.tenant_id = tenant.into();
        Router::new(&cfg)
    }

    fn names(routed: &Routed) -> Vec<String> {
        routed
            .iter()
            .map(|(c, ops)| format!("{c}:{}", ops.len()))
            .collect()
    }

    fn fields(refused: &[Refused]) -> Vec<&'static str> {
        refused.iter().map(|r| r.field).collect()
    }

    #[test]
    fn store_events_name_their_context_and_clears_follow_the_tenant() {
        let mut r = store_router("t1");
        let mut ignored = Vec::new();
        let batch = DecodedBatch {
            events: vec![
                KvEvent::StoreStored(object("t1", Some("x"), Some(32))),
                KvEvent::StoreStored(object("t1", None, Some(32))),
                KvEvent::StoreCleared {
                    backend_id: "b".into(),
                    tenant_id: "t1".into(),
                },
            ],
            ..Default::default()
        };
        let routed = r.route(batch, &mut ignored);
        assert_eq!(
            names(&routed),
            ["t1/x//32:2", "t1/m//32:2"],
            "model falls back to the registration's"
        );
        assert!(r.take_refused().is_empty());
    }

    #[test]
    fn a_store_is_confined_to_its_tenant_and_to_valid_block_sizes() {
        let mut r = store_router("t1");
        let mut ignored = Vec::new();
        let batch = DecodedBatch {
            events: vec![
                KvEvent::StoreStored(object("intruder", Some("x"), Some(32))),
                KvEvent::StoreStored(object("", Some("x"), Some(32))),
                KvEvent::StoreStored(object("t1", Some("x"), Some(0))),
                KvEvent::StoreStored(object("t1", Some("x"), Some((1 << 20) + 1))),
                KvEvent::StoreStored(object("t1", Some("x"), None)),
                KvEvent::StoreRemoved(object("intruder", Some("x"), Some(32))),
                KvEvent::StoreCleared {
                    backend_id: "b".into(),
                    tenant_id: "intruder".into(),
                },
            ],
            ..Default::default()
        };
        let routed = r.route(batch, &mut ignored);
        assert_eq!(
            names(&routed),
            ["t1/x//16:1"],
            "the good event still routes"
        );
        assert_eq!(
            fields(&r.take_refused()),
            [
                "tenant_id",
                "tenant_id",
                "block_size",
                "block_size",
                "tenant_id",
                "tenant_id"
            ]
        );
        assert!(ignored.is_empty());
        // A default-tenant store accepts events without a tenant.
        let mut r = store_router("default");
        let routed = r.route(
            DecodedBatch {
                events: vec![KvEvent::StoreStored(object("", None, None))],
                ..Default::default()
            },
            &mut ignored,
        );
        assert_eq!(names(&routed), ["default/m//16:1"]);
    }

    #[test]
    fn a_removal_never_creates_a_context() {
        let mut r = store_router("t1");
        let routed = r.route(
            DecodedBatch {
                events: vec![KvEvent::StoreRemoved(object("t1", Some("x"), Some(32)))],
                ..Default::default()
            },
            &mut Vec::new(),
        );
        assert!(routed.is_empty());
    }

    #[test]
    fn one_source_feeds_at_most_max_contexts() {
        let limits = RouteLimits {
            max_contexts: 2,
            max_name_bytes: 8,
        };
        let mut r = Router::new(&config("", PublisherType::Vllm)).with_limits(limits);
        let (routed, ignored) = route(
            &mut r,
            vec![
                stored(Some("a"), 16),
                stored(Some("b"), 16),
                stored(None, 16),
                stored(Some("a"), 16),
                stored(Some("adapter-name-too-long"), 16),
            ],
        );
        assert_eq!(
            routed,
            ["a:2", ":1"],
            "the base context was fed from the start"
        );
        assert!(ignored.is_empty());
        let refused = r.take_refused();
        assert_eq!(fields(&refused), ["max_contexts_per_source", "lora_name"]);
        assert!(
            refused[0].detail.contains("max_contexts_per_source = 2"),
            "{refused:?}"
        );
        assert!(r.take_refused().is_empty(), "taken");

        let mut r = store_router("t1").with_limits(limits);
        let long = "m".repeat(10_000);
        let mut ignored = Vec::new();
        r.route(
            DecodedBatch {
                events: vec![KvEvent::StoreStored(object("t1", Some(&long), Some(16)))],
                ..Default::default()
            },
            &mut ignored,
        );
        let refused = r.take_refused();
        assert_eq!(fields(&refused), ["model_name"]);
        assert!(
            refused[0].detail.len() < 200,
            "a preview only: {}",
            refused[0].detail
        );
    }

    /// Route one stored event of `strategy` and apply it to a fresh context of that profile;
    /// the answer for the same prompt tokens from a query.
    fn ingest_then_query(profile: HashProfile, stored: EngineStored, query: &[i32]) -> u64 {
        let mut cfg = config("", PublisherType::Sglang);
        cfg.hash_profile = profile.clone();
        cfg.block_size = 4;
        let mut r = Router::new(&cfg);
        let batch = DecodedBatch {
            events: vec![KvEvent::Stored(stored)],
            ..Default::default()
        };
        let routed = r.route(batch, &mut Vec::new());
        let (key, ops) = routed.into_iter().next().expect("one context");
        assert!(
            matches!(ops[0], IndexOp::StoreChained { .. }),
            "{:?}",
            ops[0]
        );
        let mut index = crate::index::ContextIndex::new(key, profile);
        index.apply(&crate::events::IndexBatch {
            source: cfg.subscription_key(),
            ops,
        });
        let hits = index.reader().query_tokens(query, "", None);
        hits.hits["i"].rank_matches[&2].device
    }

    fn engine_event(tokens: EventTokens, n_hashes: u64, block_size: u32) -> EngineStored {
        EngineStored {
            hashes: (0..n_hashes).map(|h| BlockHash(0xabc0 + h)).collect(),
            parent: None,
            tokens: Some(tokens),
            block_size,
            lora_name: None,
            cache_salt: None,
            extras: Vec::new(),
            tier: Tier::Device,
        }
    }

    #[test]
    fn ingested_contents_and_query_tokens_give_the_same_keys() {
        let vllm = config("", PublisherType::Vllm).hash_profile;
        let tokens: Vec<i64> = (1..=8).collect();
        let query: Vec<i32> = (1..=10).collect();
        let event = engine_event(EventTokens::Flat(tokens.clone()), 2, 4);
        assert_eq!(ingest_then_query(vllm, event, &query), 8);

        // SGLang: a short final page of two tokens is its own block.
        let sglang =
            HashProfile::resolve(Some("sglang"), Some("sha256_raw"), None, Some("first64_be"))
                .unwrap();
        let event = engine_event(EventTokens::Flat((1..=10).collect()), 3, 4);
        assert_eq!(ingest_then_query(sglang, event, &query), 10);

        // Bigram: 10 tokens are 9 pairs, pages of 4 pairs, the last one short.
        let bigram = HashProfile::resolve(
            Some("sglang_bigram"),
            Some("sha256_raw"),
            None,
            Some("first64_be"),
        )
        .unwrap();
        let pairs: Vec<(i64, i64)> = (1..10).map(|t| (t, t + 1)).collect();
        let event = engine_event(EventTokens::Bigram(pairs), 3, 4);
        assert_eq!(ingest_then_query(bigram, event, &query), 9);
    }

    #[test]
    fn contents_that_do_not_split_into_the_published_blocks_are_not_used() {
        let rule = BlockRule::FullBlocks;
        let short = engine_event(EventTokens::Flat((1..=7).collect()), 2, 4);
        assert_eq!(
            block_contents(rule, &short),
            None,
            "7 tokens are not 2 full blocks"
        );
        let extra = engine_event(EventTokens::Flat((1..=12).collect()), 2, 4);
        assert_eq!(block_contents(rule, &extra), None, "12 tokens are 3 blocks");
        let pairs = engine_event(EventTokens::Bigram(vec![(1, 2)]), 1, 4);
        assert_eq!(
            block_contents(rule, &pairs),
            None,
            "pairs under a flat rule"
        );
        let mut no_tokens = engine_event(EventTokens::Flat(vec![]), 1, 4);
        no_tokens.tokens = None;
        assert_eq!(block_contents(rule, &no_tokens), None);
        let mut salted = engine_event(EventTokens::Flat((1..=4).collect()), 1, 4);
        salted.cache_salt = Some("s".into());
        assert_eq!(
            block_contents(rule, &salted).unwrap().root,
            derived::root("s")
        );
    }
}
