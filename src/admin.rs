//! Operational commands on a data directory (the service must not be running on it: RocksDB
//! allows one process): `dump` a context's index as JSON lines (for debugging, or to feed another
//! replica through `/register` and a publisher replay), `verify` that everything loads,
//! `compact` the store, and `unregister` a publisher (the way out when a registration keeps a
//! service from working; the service must be stopped).

use std::io::Write;

use serde_json::json;

use crate::durability::checkpoint::delete_registration;
use crate::durability::recovery::recover;
use crate::events::{Holder, IndexOp};
use crate::index::ContextSnapshot;
use crate::model::SubscriptionKey;
use crate::storage::{Cf, KvStore, StorageError, migrations};

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub schema_version: u32,
    pub registrations: usize,
    pub contexts: usize,
    pub pairs: u64,
}

/// The store's schema version, refused when it is newer than this binary.
fn supported_version(store: &dyn KvStore) -> Result<u32, StorageError> {
    let schema_version = migrations::read_version(store)?.unwrap_or(0);
    if schema_version > migrations::CURRENT_VERSION {
        return Err(StorageError::TooNew {
            path: "the data directory".into(),
            found: schema_version,
            supported: migrations::CURRENT_VERSION,
        });
    }
    Ok(schema_version)
}

/// Load everything as recovery would, without changing the store.
pub fn verify(store: &dyn KvStore) -> Result<VerifyReport, StorageError> {
    let schema_version = supported_version(store)?;
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
            "ranks": snapshot.attachments.iter().map(|a| json!({"source": a.source.to_string(), "instance_id": a.instance_id, "dp_rank": a.dp_rank})).collect::<Vec<_>>(),
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
                            ..
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

/// The arguments of `unregister INSTANCE [--tenant T] [--dp-rank R]` (tenant `default`, rank 0
/// when omitted, as over HTTP).
pub fn parse_unregister_args(args: &[String]) -> Result<SubscriptionKey, String> {
    let mut instance = None;
    let (mut tenant, mut dp_rank) = (String::new(), 0u32);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_owned())),
            _ => (arg.as_str(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name {
            "--tenant" => tenant = value(name)?,
            "--dp-rank" => {
                let text = value(name)?;
                dp_rank = text
                    .parse::<u32>()
                    .ok()
                    .filter(|r| *r <= i32::MAX as u32)
                    .ok_or_else(|| format!("--dp-rank {text:?} is not a non-negative int"))?;
            }
            option if option.starts_with("--") => {
                return Err(format!("unknown option {option}"));
            }
            _ if instance.is_none() && !arg.is_empty() => instance = Some(arg.clone()),
            _ => return Err(format!("unexpected argument {arg:?}")),
        }
    }
    let instance = instance.ok_or("the instance id is required")?;
    Ok(SubscriptionKey::new(&instance, &tenant, dp_rank))
}

/// Remove the registration of `key` from a stopped service's store. What the source indexed is
/// dropped at the next start (recovery never keeps a source that is no longer registered).
/// `Ok(false)` when there is no such registration. Works on the key alone, so it also removes a
/// registration whose record cannot be read.
pub fn unregister(store: &dyn KvStore, key: &SubscriptionKey) -> Result<bool, StorageError> {
    supported_version(store)?;
    if store
        .get(Cf::Registrations, key.to_string().as_bytes())?
        .is_none()
    {
        return Ok(false);
    }
    delete_registration(store, key)?;
    Ok(true)
}

/// Every registered service key, in key order.
pub fn registered_keys(store: &dyn KvStore) -> Result<Vec<String>, StorageError> {
    let mut keys = Vec::new();
    store.scan_prefix(Cf::Registrations, b"", &mut |key, _| {
        keys.push(String::from_utf8_lossy(key).into_owned());
        Ok(())
    })?;
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::KvOp;
    use crate::storage::memory::MemoryStore;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn unregister_arguments_default_like_http() {
        let key = parse_unregister_args(&args(&["vllm-0"])).unwrap();
        assert_eq!(key.to_string(), "vllm-0|default|0");
        let key = parse_unregister_args(&args(&["a", "--tenant", "t1", "--dp-rank=3"])).unwrap();
        assert_eq!(key.to_string(), "a|t1|3");
        let key = parse_unregister_args(&args(&["--dp-rank", "2", "b", "--tenant="])).unwrap();
        assert_eq!(key.to_string(), "b|default|2");
        for bad in [
            &[][..],
            &["--tenant", "t"][..],
            &["a", "b"][..],
            &["a", "--dp-rank", "-1"][..],
            &["a", "--dp-rank"][..],
            &["a", "--rank", "1"][..],
        ] {
            assert!(parse_unregister_args(&args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn unregister_removes_only_that_key_even_if_its_record_is_unreadable() {
        let store = MemoryStore::new();
        let put = |key: &str, value: &[u8]| {
            store
                .write(vec![KvOp::Put {
                    cf: Cf::Registrations,
                    key: key.as_bytes().to_vec(),
                    value: value.to_vec(),
                }])
                .unwrap()
        };
        put("a|default|0", b"not a registration");
        put("b|default|0", b"{}");
        let a = SubscriptionKey::new("a", "", 0);
        assert!(unregister(&store, &a).unwrap());
        assert!(!unregister(&store, &a).unwrap(), "already gone");
        assert_eq!(registered_keys(&store).unwrap(), ["b|default|0"]);
    }
}
