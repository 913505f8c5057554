//! Turn one decoded batch of one subscription into index batches, one per context it touches.
//!
//! Engine blocks go to the registration's context, or to the adapter context their event names
//! (a registration with `lora_name` "" indexes base blocks and every adapter its publisher reports;
//! a registration for one adapter accepts only that adapter's blocks). Removals and clears carry
//! no adapter, so they go to every context this source has fed. Store events name their context
//! themselves (tenant, model, lora, block size), falling back to the registration's model and
//! block size when the publisher leaves them out.

use std::collections::BTreeSet;

use crate::events::{DecodedBatch, Holder, IgnoreReason, IndexOp, KvEvent, StoreObject};
use crate::model::{ContextKey, PublisherConfig, normalize_tenant};

/// Per-subscription routing state.
#[derive(Debug)]
pub struct Router {
    base: ContextKey,
    engine_holder: Holder,
    registered_lora: String,
    block_size: u32,
    model_name: String,
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
            fed,
        }
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
                    if stored.block_size != self.block_size {
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
                    let op = IndexOp::Store {
                        holder: self.engine_holder.clone(),
                        tier: stored.tier,
                        hashes: stored.hashes,
                    };
                    push(&mut out, context, op);
                }
                KvEvent::Removed(removed) => {
                    for context in &self.fed {
                        let op = IndexOp::Remove {
                            holder: self.engine_holder.clone(),
                            tier: removed.tier,
                            hashes: removed.hashes.clone(),
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
                        IndexOp::Store {
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

/// Append an op to its context's list, keeping contexts in first-touch order.
fn push(out: &mut Routed, context: ContextKey, op: IndexOp) {
    match out.iter_mut().find(|(c, _)| *c == context) {
        Some((_, ops)) => ops.push(op),
        None => out.push((context, vec![op])),
    }
}
