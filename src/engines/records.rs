//! Engines kept across restarts: one record per engine in the store's `meta` family, under
//! `engine/<tenant>\0<instance id>`, holding what was asked (the spec), never what was found:
//! the ranks are read again from the engine, and compared with what the registry restored
//! (docs/engine-discovery.md, "Restarts"). A record that does not decode is logged and
//! skipped, never fatal.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::OpError;
use crate::gateway::engines_api::EngineRequest;
use crate::registry::shared::etcd::EtcdRegistry;
use crate::storage::{Cf, KvOp, KvStore};

use super::spec::{EngineKind, EngineSpec, Origin};

const PREFIX: &[u8] = b"engine/";
/// A record is a few hundred bytes; a larger one was not written by this code.
const MAX_RECORD_BYTES: usize = 64 * 1024;

#[derive(Serialize, Deserialize)]
struct Record {
    url: String,
    kind: EngineKind,
    instance_id: String,
    tenant_id: String,
    model_name: Option<String>,
    block_size: Option<u32>,
    hash_profile: Vec<(String, String)>,
    /// Absent in records written before hybrid parts existed: none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    hybrid_parts: String,
    origin: Origin,
}

/// The records, or nothing to keep them in (tests of the fleet alone).
#[derive(Clone, Default)]
pub struct Records {
    store: Option<Arc<dyn KvStore>>,
    /// With registrations shared through etcd, engines registered by request are shared too.
    shared: Option<Arc<EtcdRegistry>>,
}

impl Records {
    pub fn new(store: Arc<dyn KvStore>, shared: Option<Arc<EtcdRegistry>>) -> Records {
        Records {
            store: Some(store),
            shared,
        }
    }

    /// The engines registered by request on any replica, as etcd lists them; `None` without
    /// etcd, or when it cannot be read (nothing is concluded from an unreadable etcd).
    pub async fn shared_specs(&self) -> Option<Vec<EngineSpec>> {
        let listed = self.shared.as_ref()?.list_engines().await.ok()?;
        let mut specs = Vec::new();
        for (name, value) in listed {
            match decode(&value) {
                Ok(spec) => specs.push(spec),
                Err(why) => tracing::warn!("shared engine record {name:?} skipped: {why}"),
            }
        }
        Some(specs)
    }

    /// Whether engines registered by request are shared through etcd.
    /// With etcd: whether `spec`'s record is still there (another replica may have removed
    /// the engine since this one last listed them); `None` without etcd or when it cannot be
    /// read.
    pub async fn still_shared(&self, spec: &EngineSpec) -> Option<bool> {
        let shared = self.shared.as_ref()?;
        shared.engine_listed(&shared_name(&spec.key())).await.ok()
    }

    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    fn key(tenant_id: &str, instance_id: &str) -> Vec<u8> {
        let mut key = PREFIX.to_vec();
        key.extend_from_slice(tenant_id.as_bytes());
        key.push(0);
        key.extend_from_slice(instance_id.as_bytes());
        key
    }

    /// Keep `spec` (durably: it is written before its ranks are registered), and share it
    /// through etcd when it was registered by request.
    pub async fn put(&self, spec: &EngineSpec) -> Result<(), OpError> {
        if let (Some(shared), Origin::Request) = (&self.shared, spec.origin) {
            shared
                .put_engine(&shared_name(&spec.key()), encode(spec)?)
                .await?;
        }
        let Some(store) = &self.store else {
            return Ok(());
        };
        let value = encode(spec)?;
        let op = KvOp::Put {
            cf: Cf::Meta,
            key: Self::key(&spec.tenant_id, &spec.instance_id),
            value,
        };
        store
            .write_synced(vec![op])
            .map_err(|e| OpError::unavailable(format!("engine record not written: {e}")))
    }

    pub async fn delete(&self, key: &(String, String)) -> Result<(), OpError> {
        if let Some(shared) = &self.shared {
            shared.delete_engine(&shared_name(key)).await?;
        }
        let (tenant_id, instance_id) = key;
        let Some(store) = &self.store else {
            return Ok(());
        };
        let op = KvOp::Delete {
            cf: Cf::Meta,
            key: Self::key(tenant_id, instance_id),
        };
        store
            .write_synced(vec![op])
            .map_err(|e| OpError::unavailable(format!("engine record not deleted: {e}")))
    }

    /// Every record that decodes into a valid spec.
    pub fn load(&self) -> Vec<EngineSpec> {
        let Some(store) = &self.store else {
            return Vec::new();
        };
        let mut specs = Vec::new();
        let scanned = store.scan_prefix(Cf::Meta, PREFIX, &mut |key, value| {
            match decode(value) {
                Ok(spec) => specs.push(spec),
                Err(why) => tracing::warn!(
                    "engine record {:?} skipped: {why}",
                    String::from_utf8_lossy(key)
                ),
            }
            Ok(())
        });
        if let Err(e) = scanned {
            tracing::warn!("engine records not read: {e}");
        }
        specs
    }
}

/// A spec as its record's bytes (the store's value, and etcd's).
pub fn encode(spec: &EngineSpec) -> Result<Vec<u8>, OpError> {
    let record = Record {
        url: spec.url.to_url(),
        kind: spec.kind,
        instance_id: spec.instance_id.clone(),
        tenant_id: spec.tenant_id.clone(),
        model_name: spec.model_name.clone(),
        block_size: spec.block_size,
        hash_profile: spec.hash_profile.clone(),
        hybrid_parts: super::spec::parts_text(&spec.hybrid_parts),
        origin: spec.origin,
    };
    serde_json::to_vec(&record).map_err(|e| OpError::internal(e.to_string()))
}

/// An engine's name among shared records: its tenant and instance id in hex (any bytes of
/// either are safe in a key).
pub fn shared_name((tenant_id, instance_id): &(String, String)) -> String {
    let hex = |s: &str| s.bytes().map(|b| format!("{b:02x}")).collect::<String>();
    format!("{}.{}", hex(tenant_id), hex(instance_id))
}

/// A record's bytes as a spec; the error says why not.
pub fn decode(value: &[u8]) -> Result<EngineSpec, String> {
    if value.len() > MAX_RECORD_BYTES {
        return Err(format!("{} bytes", value.len()));
    }
    let r: Record = serde_json::from_slice(value).map_err(|e| e.to_string())?;
    let request = EngineRequest {
        url: Some(r.url),
        engine_type: Some(r.kind.as_str().to_owned()),
        instance_id: Some(r.instance_id),
        tenant_id: Some(r.tenant_id),
        model_name: r.model_name,
        block_size: r.block_size.map(i128::from),
        hash_profile: Some(r.hash_profile),
        hybrid_parts: Some(r.hybrid_parts),
    };
    EngineSpec::from_request(request, "type", r.origin).map_err(|e| e.message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::HybridPart;
    use crate::storage::memory::MemoryStore;

    fn spec(instance: &str) -> EngineSpec {
        let request = EngineRequest {
            url: Some("http://[fd00::1]:8000/v".into()),
            engine_type: Some("SGLang".into()),
            instance_id: Some(instance.into()),
            block_size: Some(64),
            ..Default::default()
        };
        EngineSpec::from_request(request, "type", Origin::Request).unwrap()
    }

    #[tokio::test]
    async fn records_round_trip_and_bad_ones_are_skipped() {
        let store: Arc<dyn KvStore> = Arc::new(MemoryStore::new());
        let records = Records::new(store.clone(), None);
        records.put(&spec("a")).await.unwrap();
        records.put(&spec("b")).await.unwrap();
        let garbage = KvOp::Put {
            cf: Cf::Meta,
            key: Records::key("default", "c"),
            value: b"{\"url\": 5}".to_vec(),
        };
        store.write(vec![garbage]).unwrap();
        assert_eq!(records.load(), vec![spec("a"), spec("b")]);
        records
            .delete(&("default".into(), "a".into()))
            .await
            .unwrap();
        assert_eq!(records.load(), vec![spec("b")]);
    }

    #[test]
    fn declared_hybrid_parts_are_kept_and_an_older_record_has_none() {
        let request = EngineRequest {
            url: Some("http://sglang-host:30000".into()),
            engine_type: Some("SGLang".into()),
            hybrid_parts: Some("mamba,sliding_window".into()),
            ..Default::default()
        };
        let hybrid = EngineSpec::from_request(request, "type", Origin::Request).unwrap();
        assert_eq!(
            hybrid.hybrid_parts,
            [HybridPart::SlidingWindow, HybridPart::Mamba]
        );
        assert_eq!(decode(&encode(&hybrid).unwrap()), Ok(hybrid));
        let plain = spec("a");
        let bytes = encode(&plain).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains("hybrid_parts"),
            "a record without parts is written as before"
        );
        assert_eq!(decode(&bytes), Ok(plain));
    }
}
