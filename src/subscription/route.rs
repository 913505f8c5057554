//! Turn one decoded batch of one subscription into index batches, one per context it touches.
//!
//! Engine blocks go to the registration's context, or to the adapter context their event names
//! (a registration with `lora_name` "" indexes base blocks and every adapter its publisher reports;
//! a registration for one adapter accepts only that adapter's blocks). Removals and clears carry
//! no adapter, so they go to every context this source has fed. Store events name their context
//! themselves (model, lora, block size), falling back to the registration's model and block size
//! when the publisher leaves them out.
//!
//! Engine blocks go with their contents (for the index to key by derived keys) when their event
//! carries tokens. An event that leaves its extras out goes so only when the registered profile
//! proves it plain ([`PlainProof`]); otherwise it goes by its published hashes only, counted in
//! [`Router::take_kept_as_published`].
//!
//! What a publisher's events may ask for is bounded, event by event (the rest of the batch still
//! applies): a store's events stay in its registered tenant, their block sizes follow the
//! registration rules, names are at most `max_name_bytes`, and one source feeds at most
//! `max_contexts_per_source` contexts. A store's `backend_id` names a holder the index keeps for
//! as long as it holds blocks, so a new one is at most `max_name_bytes` long and one source
//! makes at most `max_holders_per_context` of them in each context (see
//! `docs/engine-events.md`). Each refusal is reported as [`Refused`], by field.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};

use crate::events::{
    BlockContents, CacheGroup, DecodedBatch, EngineStored, EventTokens, Holder, IgnoreReason,
    IndexOp, KvEvent, StoreObject,
};
use crate::hashing::Strategy;
use crate::hashing::derived::{self, BlockRule};
use crate::model::{ContextKey, GroupKind, MAX_BLOCK_SIZE, PublisherConfig, normalize_tenant};

use super::plain_proof::PlainProof;
use super::sparse::{self, Placement};

/// Bounds on what one source's events may create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteLimits {
    pub max_contexts: usize,
    pub max_name_bytes: usize,
    /// Store backends (holders) one source may create in one context.
    pub max_holders: usize,
}

impl Default for RouteLimits {
    fn default() -> Self {
        RouteLimits {
            max_contexts: usize::MAX,
            max_name_bytes: usize::MAX,
            max_holders: usize::MAX,
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
    instance_id: String,
    dp_rank: u32,
    /// The registration's `cache_group`: events of other groups are ignored.
    only_group: Option<u32>,
    /// Per context, the kind of each KV-cache group this router last sent (see
    /// [`IndexOp::GroupKind`]); a group not listed is full attention as far as it knows.
    group_kinds: HashMap<ContextKey, HashMap<u32, GroupKind>>,
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
    /// Whether events that leave their extras out may have derived keys.
    proof: PlainProof,
    /// Blocks of such events sent by published hash since the last
    /// [`Router::take_kept_as_published`].
    kept_as_published: u64,
    /// Per context, the store backends this source stored blocks under, by a hash of their id
    /// (keyed per process, so no peer can aim for a collision): eight bytes each, however long
    /// the ids. A backend's holder may be reclaimed by the index once it holds nothing; it
    /// stays counted here, as a real store's backends come back.
    backends: HashMap<ContextKey, HashSet<u64>>,
    backend_hasher: RandomState,
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
            instance_id: config.instance_id.clone(),
            dp_rank: config.dp_rank,
            only_group: config.cache_group,
            group_kinds: HashMap::new(),
            registered_lora: config.lora_name.clone(),
            block_size: config.block_size,
            model_name: config.model_name.clone(),
            partial_pages: config.hash_profile.strategy() != Strategy::VllmV1,
            rule: BlockRule::of(config.hash_profile.strategy()),
            fed,
            tenant: config.tenant_id.clone(),
            limits: RouteLimits::default(),
            refused: Vec::new(),
            proof: PlainProof::new(&config.hash_profile),
            kept_as_published: 0,
            backends: HashMap::new(),
            backend_hasher: RandomState::new(),
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

    /// Blocks of events without their extras that [`Router::route`] sent by published hash,
    /// not proven plain, since the last call.
    pub fn take_kept_as_published(&mut self) -> u64 {
        std::mem::take(&mut self.kept_as_published)
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

    /// Whether a store object of `backend_id` may be stored in `context` (which this source
    /// feeds): a backend it stored there before, or a new one while it has fewer than
    /// `max_holders` there. The name's length is checked first, by [`Router::backend_name_ok`].
    fn admit_backend(&mut self, context: &ContextKey, backend_id: &str) -> bool {
        let hash = self.backend_hasher.hash_one(backend_id);
        let max = self.limits.max_holders;
        let known = self.backends.entry(context.clone()).or_default();
        if known.contains(&hash) {
            return true;
        }
        if known.len() >= max {
            let detail = format!(
                "backend_id {} would be holder {} of this source in context {context} \
                 (max_holders_per_context = {max})",
                preview(backend_id),
                known.len() + 1,
            );
            self.refuse("max_holders_per_context", detail);
            return false;
        }
        known.insert(hash);
        true
    }

    /// A store's `backend_id` names a holder: at most `max_name_bytes` long.
    fn backend_name_ok(&mut self, backend_id: &str) -> bool {
        let max_name = self.limits.max_name_bytes;
        if backend_id.len() <= max_name {
            return true;
        }
        let detail = format!(
            "backend_id {} is longer than {max_name} bytes (max_name_bytes)",
            preview(backend_id)
        );
        self.refuse("backend_id", detail);
        false
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
        let mut placements = self.placements(&batch.events);
        for (at, event) in batch.events.into_iter().enumerate() {
            match event {
                KvEvent::Stored(stored) if self.other_group(stored.group.idx) => {
                    ignored.push(IgnoreReason::OtherCacheGroup);
                }
                KvEvent::Removed(removed) if self.other_group(removed.group) => {
                    ignored.push(IgnoreReason::OtherCacheGroup);
                }
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
                    let holder = self.engine_holder(stored.group.idx);
                    self.note_group_kind(&mut out, &context, stored.group);
                    if let Some(placement) = placements.remove(&at) {
                        let op = IndexOp::StoreSparse {
                            holder,
                            tier: stored.tier,
                            hashes: placement.hashes,
                            contents: placement.contents,
                            present: placement.present,
                        };
                        push(&mut out, context, op);
                        continue;
                    }
                    let contents = if stored.tokens.is_some() && sparse::sparse(&stored) {
                        // Some blocks of the range are the group's null blocks and no sibling
                        // event of the batch says which: each hash is found through its alias.
                        None
                    } else if self.proof.derivable(&stored) {
                        block_contents(self.rule, &stored)
                    } else {
                        self.kept_as_published += stored.hashes.len() as u64;
                        None
                    };
                    let op = match contents {
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
                            holder: self.engine_holder(removed.group),
                            tier: removed.tier,
                            hashes: hashes.unwrap_or_default(),
                        };
                        push(&mut out, context.clone(), op);
                    }
                }
                KvEvent::AllCleared => {
                    self.proof.forget_all();
                    for context in &self.fed {
                        push(
                            &mut out,
                            context.clone(),
                            // Clears every KV-cache group of the rank (see `IndexOp::ClearHolder`).
                            IndexOp::ClearHolder {
                                holder: self.engine_holder(0),
                            },
                        );
                    }
                }
                KvEvent::StoreStored(object) => {
                    self.route_store_object(&mut out, object, StoreChange::Stored, ignored)
                }
                KvEvent::StoreRemoved(object) => {
                    self.route_store_object(&mut out, object, StoreChange::Removed, ignored)
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

    /// Whether the registration's `cache_group` leaves KV-cache group `group` out.
    fn other_group(&self, group: u32) -> bool {
        self.only_group.is_some_and(|g| g != group)
    }

    /// The holder of this source's engine rank for KV-cache group `group`.
    fn engine_holder(&self, group: u32) -> Holder {
        Holder::Engine {
            instance_id: self.instance_id.clone(),
            dp_rank: self.dp_rank,
            group,
        }
    }

    /// Tell `context` the kind of `group` before its blocks, when it is not the one this
    /// router told it last (full attention when never told).
    fn note_group_kind(&mut self, out: &mut Routed, context: &ContextKey, group: CacheGroup) {
        // Looked up by reference: every store passes here, and most are group 0 of full
        // attention, which needs no op and no entry.
        let known = (self.group_kinds.get(context)).and_then(|groups| groups.get(&group.idx));
        let told = match known {
            Some(&kind) => kind == group.kind,
            None => group.idx == 0 && group.kind == GroupKind::Full,
        };
        if told {
            return;
        }
        (self.group_kinds.entry(context.clone()).or_default()).insert(group.idx, group.kind);
        let op = IndexOp::GroupKind {
            holder: self.engine_holder(group.idx),
            kind: group.kind,
        };
        push(out, context.clone(), op);
    }

    /// Where each sparse store of `events` sits in its range ([`sparse::siblings`]), with the
    /// contents of the whole range, when the sibling that places it may have derived keys.
    fn placements(&mut self, events: &[KvEvent]) -> HashMap<usize, Placement> {
        let mut out = HashMap::new();
        for (at, (index, present)) in sparse::siblings(events) {
            let Some(KvEvent::Stored(sibling)) = events.get(index) else {
                continue;
            };
            if !self.proof.derivable(sibling) {
                continue;
            }
            if let Some(contents) = block_contents(self.rule, sibling) {
                let hashes = sibling.hashes.clone();
                out.insert(
                    at,
                    Placement {
                        hashes,
                        contents,
                        present,
                    },
                );
            }
        }
        out
    }

    /// A store object's blocks stored or removed, under the shared holder of its backend.
    fn route_store_object(
        &mut self,
        out: &mut Routed,
        object: StoreObject,
        change: StoreChange,
        ignored: &mut Vec<IgnoreReason>,
    ) {
        let Some(context) = self.store_context(&object, ignored) else {
            return;
        };
        let routed = match change {
            // Only a store makes a holder: removals of an unknown backend find none.
            StoreChange::Stored => {
                self.backend_name_ok(&object.backend_id)
                    && self.admit(&context)
                    && self.admit_backend(&context, &object.backend_id)
            }
            // Nothing of this source is in a context it never fed: a removal must not create one.
            StoreChange::Removed => self.fed.contains(&context),
        };
        if !routed {
            return;
        }
        let holder = Holder::Shared {
            backend_id: object.backend_id,
        };
        let (tier, hashes) = (object.tier, object.hashes);
        let op = match change {
            StoreChange::Stored => IndexOp::StoreAliased {
                holder,
                tier,
                hashes,
            },
            StoreChange::Removed => IndexOp::Remove {
                holder,
                tier,
                hashes,
            },
        };
        push(out, context, op);
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
/// Whether a store event adds blocks or takes them away.
#[derive(Clone, Copy)]
enum StoreChange {
    Stored,
    Removed,
}

fn push(out: &mut Routed, context: ContextKey, op: IndexOp) {
    match out.iter_mut().find(|(c, _)| *c == context) {
        Some((_, ops)) => ops.push(op),
        None => out.push((context, vec![op])),
    }
}

#[cfg(test)]
#[path = "route_tests.rs"]
mod tests;
