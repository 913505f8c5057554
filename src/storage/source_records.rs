//! Migration 7's step (`migrations/0007_source_records.md`): every registration gets the source
//! record recovery resumes it from. Before schema 7 a source resumed from the lowest position
//! among the contexts it fed, so that position becomes its record, under the registration's
//! incarnation (0, the incarnation of every registration written before schema 7).
//!
//! The byte layout is `durability::codec`'s (a watermark key is the context id, 8 bytes, then
//! the service key text; a registration's key is the service key text; a source record is the
//! incarnation, 8 bytes, then the watermark's 16). This module repeats only what it needs of it,
//! since the storage layer sits below the durability module.

use std::collections::HashMap;

use super::{Cf, KvOp, KvStore, StorageError};

pub fn add_source_records(store: &dyn KvStore) -> Result<Vec<KvOp>, StorageError> {
    let mut registered = Vec::new();
    store.scan_prefix(Cf::Registrations, b"", &mut |k, v| {
        // Registrations before schema 7 carry no incarnation (0); one that does keeps its own.
        let incarnation = serde_json::from_slice::<serde_json::Value>(v)
            .ok()
            .and_then(|r| r.get("incarnation")?.as_u64())
            .unwrap_or(0);
        registered.push((k.to_vec(), incarnation));
        Ok(())
    })?;
    let mut lowest: HashMap<Vec<u8>, [u8; 16]> = HashMap::new();
    store.scan_prefix(Cf::Watermarks, b"", &mut |k, v| {
        let (Some(source), Ok(mark)) = (k.get(8..), <[u8; 16]>::try_from(v)) else {
            return Err(StorageError::Corrupt {
                cf: "watermarks",
                what: "a record whose key or value is too short".into(),
            });
        };
        let seq = |m: &[u8; 16]| u64::from_be_bytes(m[..8].try_into().unwrap_or_default());
        let entry = lowest.entry(source.to_vec()).or_insert(mark);
        if seq(&mark) < seq(entry) {
            *entry = mark;
        }
        Ok(())
    })?;
    Ok(registered
        .into_iter()
        .filter_map(|(key, incarnation)| {
            let mark = lowest.get(&key)?;
            let mut value = incarnation.to_be_bytes().to_vec();
            value.extend_from_slice(mark);
            Some(KvOp::Put {
                cf: Cf::Sources,
                key,
                value,
            })
        })
        .collect())
}
