//! Turn one decoded batch of one subscription into index batches, one per context it touches.
//!
//! Engine blocks go to the registration's context, or to the adapter context their event names
//! (a registration with `lora_name` "" indexes base blocks and every adapter its publisher reports;
//! a registration for one adapter accepts only that adapter's blocks). Removals and clears carry
//! no adapter, so they go to every context this source has fed. Store events name their context
//! themselves (tenant, model, lora, block size), falling back to the registration's model and
//! block size when the publisher leaves them out.

use std::collections::BTreeSet;

use crate::events::{
    BlockContents, DecodedBatch, EngineStored, EventTokens, Holder, IgnoreReason, IndexOp, KvEvent,
    StoreObject,
};
use crate::hashing::Strategy;
use crate::hashing::derived::{self, BlockRule};
use crate::model::{ContextKey, PublisherConfig, normalize_tenant};

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
        }
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
                    self.fed.insert(context.clone());
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
                    let Some(context) = self.store_context(&object) else {
                        ignored.push(IgnoreReason::NoContext);
                        continue;
                    };
                    self.fed.insert(context.clone());
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
                    let Some(context) = self.store_context(&object) else {
                        ignored.push(IgnoreReason::NoContext);
                        continue;
                    };
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

    fn store_context(&self, object: &StoreObject) -> Option<ContextKey> {
        let model = object
            .model_name
            .as_deref()
            .filter(|m| !m.is_empty())
            .unwrap_or(&self.model_name);
        let block_size = object.block_size.unwrap_or(self.block_size);
        if model.is_empty() || block_size == 0 {
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

    #[test]
    fn store_events_name_their_context_and_clears_follow_the_tenant() {
        let mut r = Router::new(&config("", PublisherType::Mooncake));
        let object = |tenant: &str, model: Option<&str>| StoreObject {
            backend_id: "b".into(),
            object_key: "o".into(),
            tenant_id: tenant.into(),
            model_name: model.map(str::to_owned),
            lora_name: None,
            block_size: Some(32),
            tier: Tier::CpuShare,
            hashes: vec![BlockHash(9)],
        };
        let mut ignored = Vec::new();
        let batch = DecodedBatch {
            events: vec![
                KvEvent::StoreStored(object("t1", Some("x"))),
                KvEvent::StoreStored(object("", None)),
                KvEvent::StoreCleared {
                    backend_id: "b".into(),
                    tenant_id: "t1".into(),
                },
            ],
            ..Default::default()
        };
        let routed = r.route(batch, &mut ignored);
        let names: Vec<String> = routed
            .iter()
            .map(|(c, ops)| format!("{c}:{}", ops.len()))
            .collect();
        assert_eq!(
            names,
            ["t1/x//32:2", "default/m//32:1"],
            "model falls back to the registration's"
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
