//! Engines kept across restarts: one record per engine in the store's `meta` family, under
//! `engine/<tenant>\0<instance id>`, holding what was asked (the spec), never what was found:
//! the ranks are read again from the engine, and compared with what the registry restored
//! (docs/engine-discovery.md, "Restarts"). A record that does not decode is logged and
//! skipped, never fatal.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::OpError;
use crate::gateway::engines_api::EngineRequest;
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
    origin: Origin,
}

/// The records, or nothing to keep them in (tests of the fleet alone).
#[derive(Clone, Default)]
pub struct Records {
    store: Option<Arc<dyn KvStore>>,
}

impl Records {
    pub fn new(store: Arc<dyn KvStore>) -> Records {
        Records { store: Some(store) }
    }

    fn key(tenant_id: &str, instance_id: &str) -> Vec<u8> {
        let mut key = PREFIX.to_vec();
        key.extend_from_slice(tenant_id.as_bytes());
        key.push(0);
        key.extend_from_slice(instance_id.as_bytes());
        key
    }

    /// Keep `spec` (durably: it is written before its ranks are registered).
    pub fn put(&self, spec: &EngineSpec) -> Result<(), OpError> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let record = Record {
            url: spec.url.to_url(),
            kind: spec.kind,
            instance_id: spec.instance_id.clone(),
            tenant_id: spec.tenant_id.clone(),
            model_name: spec.model_name.clone(),
            block_size: spec.block_size,
            hash_profile: spec.hash_profile.clone(),
            origin: spec.origin,
        };
        let value = serde_json::to_vec(&record).map_err(|e| OpError::internal(e.to_string()))?;
        let op = KvOp::Put {
            cf: Cf::Meta,
            key: Self::key(&spec.tenant_id, &spec.instance_id),
            value,
        };
        store
            .write_synced(vec![op])
            .map_err(|e| OpError::unavailable(format!("engine record not written: {e}")))
    }

    pub fn delete(&self, (tenant_id, instance_id): &(String, String)) -> Result<(), OpError> {
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

fn decode(value: &[u8]) -> Result<EngineSpec, String> {
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
    };
    EngineSpec::from_request(request, "type", r.origin).map_err(|e| e.message)
}

#[cfg(test)]
mod tests {
    use super::*;
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

    #[test]
    fn records_round_trip_and_bad_ones_are_skipped() {
        let store: Arc<dyn KvStore> = Arc::new(MemoryStore::new());
        let records = Records::new(store.clone());
        records.put(&spec("a")).unwrap();
        records.put(&spec("b")).unwrap();
        let garbage = KvOp::Put {
            cf: Cf::Meta,
            key: Records::key("default", "c"),
            value: b"{\"url\": 5}".to_vec(),
        };
        store.write(vec![garbage]).unwrap();
        assert_eq!(records.load(), vec![spec("a"), spec("b")]);
        records.delete(&("default".into(), "a".into())).unwrap();
        assert_eq!(records.load(), vec![spec("b")]);
    }
}
