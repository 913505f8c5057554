//! Operational commands on a data directory (the service must not be running on it: RocksDB
//! allows one process): `dump` a context's index as JSON lines (for debugging, or to feed another
//! replica through `/register` and a publisher replay), `verify` that everything loads, and
//! `compact` the store.

use std::io::Write;

use serde_json::json;

use crate::events::{Holder, IndexOp};
use crate::index::ContextSnapshot;
use crate::storage::recovery::recover;
use crate::storage::{KvStore, StorageError, migrations};

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub schema_version: u32,
    pub registrations: usize,
    pub contexts: usize,
    pub pairs: u64,
}

/// Load everything as recovery would, without changing the store.
pub fn verify(store: &dyn KvStore) -> Result<VerifyReport, StorageError> {
    let schema_version = migrations::read_version(store)?.unwrap_or(0);
    if schema_version > migrations::CURRENT_VERSION {
        return Err(StorageError::TooNew {
            path: "the data directory".into(),
            found: schema_version,
            supported: migrations::CURRENT_VERSION,
        });
    }
    let recovered = recover(store)?;
    Ok(VerifyReport {
        schema_version,
        registrations: recovered.registrations.len(),
        contexts: recovered.contexts.len(),
        pairs: recovered.pairs,
    })
}

/// Write every context whose display key (`tenant/model/lora/block_size`) contains `filter` as
/// JSON lines: one header line per context, then one line per (source, holder, tier) with its
/// block hashes.
pub fn dump(store: &dyn KvStore, filter: &str, out: &mut dyn Write) -> Result<usize, StorageError> {
    let io = |e: std::io::Error| StorageError::Io(e.to_string());
    let mut written = 0;
    for index in recover(store)?.contexts {
        let key = index.key().to_string();
        if !key.contains(filter) {
            continue;
        }
        let snapshot = ContextSnapshot::of(&index);
        let profile = &snapshot.profile;
        let header = json!({
            "context": key, "tenant_id": snapshot.key.tenant_id, "model_name": snapshot.key.model_name,
            "lora_name": snapshot.key.lora_name, "block_size": snapshot.key.block_size,
            "prefix_count": index.prefix_count(),
            "hash_profile": {"strategy": profile.strategy().as_str(), "algorithm": profile.algorithm().as_str(),
                "python_hash_seed": profile.python_hash_seed(), "root_digest": profile.root_digest_hex(),
                "index_projection": profile.index_projection().as_str()},
            "ranks": snapshot.attachments.iter().map(|(s, i, r)| json!({"source": s.to_string(), "instance_id": i, "dp_rank": r})).collect::<Vec<_>>(),
        });
        writeln!(out, "{header}").map_err(io)?;
        for batch in &snapshot.batches {
            for op in &batch.ops {
                if let IndexOp::Store {
                    holder,
                    tier,
                    hashes,
                } = op
                {
                    let holder = match holder {
                        Holder::Engine {
                            instance_id,
                            dp_rank,
                        } => json!({"instance_id": instance_id, "dp_rank": dp_rank}),
                        Holder::Shared { backend_id } => json!({"backend_id": backend_id}),
                    };
                    let line = json!({"context": key, "source": batch.source.to_string(), "holder": holder,
                        "tier": tier.as_str(), "blocks": hashes.iter().map(|h| h.0).collect::<Vec<_>>()});
                    writeln!(out, "{line}").map_err(io)?;
                }
            }
        }
        written += 1;
    }
    Ok(written)
}
