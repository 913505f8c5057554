//! Migration 5's step, and 6's (the derived keys changed again): drop the pairs keyed by derived
//! block keys and every alias, keep the pairs keyed by published hashes, and make the sources
//! that lost pairs rebuild from their publishers' replay (see
//! `migrations/0005_derived_keys_rebuilt_from_replay.md`).
//!
//! A migration reads the records of the schema it converts as that schema wrote them, so this
//! step names schema 4's layout, which schema 5 kept, itself (`crate::durability::codec` writes
//! the current one and may move on): a pair key is context id (8 B) + holder id (u32 BE) + block
//! (u64 BE); a holder record is JSON with `source` (`instance_id`, `tenant_id`, `dp_rank`) and,
//! from schema 2 on, `raw_pairs`; a watermark key is context id + `instance|tenant|rank`, its
//! value seq (u64 BE) + payload digest (u64 BE).
//!
//! Which pairs are derived: a derived key is always odd, so an even key is a published hash.
//! An odd key is a published hash too when its holder's pairs all are: a record without
//! `raw_pairs` (schema 1, before derived keys) or one whose `raw_pairs` counts every pair the
//! holder has. Otherwise an odd key may be either, and the step drops it rather than guess.

use serde_json::Value;

use super::{Cf, KvOp, KvStore, StorageError};

/// Pairs deleted per atomic write: a bounded batch whatever the store's size.
pub const DROP_BATCH: usize = 100_000;

/// The watermark value a source that lost pairs resumes from: seq `u64::MAX`, digest 0. No
/// publisher reaches that seq, so a subscription resuming there cannot verify its position: with
/// a replay socket, the replay from it brings nothing, the source's remaining blocks are dropped
/// and it follows its publisher from the stream start, replay included; without one, its first
/// batch is below the position, which reads as a restarted publisher and drops the source too.
pub const REBUILD_POSITION: [u8; 16] = [
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// What the step did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Dropped {
    /// Pairs deleted (derived keys, and odd published hashes that could not be told apart).
    pub pairs: u64,
    /// Holder records whose pairs were dropped (their `raw_pairs` rewritten).
    pub holders: u64,
    /// Watermark rows set to [`REBUILD_POSITION`].
    pub positions: u64,
}

/// The step as the migration runner calls it, for the step to schema `version` (5, and 6,
/// which changed the derived keys again; see `migrations/0006_*`).
pub fn drop_derived_keys(store: &dyn KvStore, version: u32) -> Result<Vec<KvOp>, StorageError> {
    let dropped = drop_in_batches(store, DROP_BATCH)?;
    tracing::info!(
        version,
        pairs = dropped.pairs,
        holders = dropped.holders,
        positions = dropped.positions,
        "pairs under derived keys and all aliases dropped; their sources rebuild from replay"
    );
    Ok(Vec::new())
}

fn corrupt(cf: &'static str, what: impl Into<String>) -> StorageError {
    StorageError::Corrupt {
        cf,
        what: what.into(),
    }
}

/// One holder record: where it is and what it says.
struct Holder {
    key: Vec<u8>,
    record: Value,
    /// The watermark key text of its source.
    source: String,
    raw_pairs: Option<u64>,
}

fn holder(key: &[u8], value: &[u8]) -> Result<Holder, StorageError> {
    const CF: &str = "holders";
    if key.len() != 12 {
        return Err(corrupt(CF, "key is not 12 bytes"));
    }
    let record: Value =
        serde_json::from_slice(value).map_err(|e| corrupt(CF, format!("invalid JSON: {e}")))?;
    let s = record
        .get("source")
        .ok_or_else(|| corrupt(CF, "missing source"))?;
    let text = |field: &str| {
        s.get(field)
            .and_then(Value::as_str)
            .ok_or_else(|| corrupt(CF, format!("missing string `{field}`")))
    };
    let rank = s
        .get("dp_rank")
        .and_then(Value::as_u64)
        .ok_or_else(|| corrupt(CF, "missing integer `dp_rank`"))?;
    let source = format!("{}|{}|{rank}", text("instance_id")?, text("tenant_id")?);
    let raw_pairs = match record.get("raw_pairs") {
        None => None,
        Some(n) => Some(
            n.as_u64()
                .ok_or_else(|| corrupt(CF, "raw_pairs is not a count"))?,
        ),
    };
    Ok(Holder {
        key: key.to_vec(),
        record,
        source,
        raw_pairs,
    })
}

fn block_of(key: &[u8]) -> Result<u64, StorageError> {
    let block: [u8; 8] = key
        .get(12..)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("pairs", "key is not 20 bytes"))?;
    Ok(u64::from_be_bytes(block))
}

/// [`drop_derived_keys`] with `batch` pairs deleted per write at most.
///
/// Resumable: the first write that deletes pairs of a holder also rewrites its record's
/// `raw_pairs` to its even pairs and sets its source's positions to [`REBUILD_POSITION`], so a
/// process killed between two writes leaves a holder whose record counts fewer raw pairs than
/// it has pairs, which the next run reads as "odd keys left to drop" and finishes. The aliases
/// go in one range delete; nothing of the step is read back before the version is written.
pub fn drop_in_batches(store: &dyn KvStore, batch: usize) -> Result<Dropped, StorageError> {
    let batch = batch.max(1);
    // Holder records and watermarks are a few per source and context: read whole. The pairs
    // are read holder by holder and never held.
    let mut holders = Vec::new();
    store.scan_prefix(Cf::Holders, b"", &mut |k, v| {
        holders.push(holder(k, v)?);
        Ok(())
    })?;
    let mut positions: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    store.scan_prefix(Cf::Watermarks, b"", &mut |k, v| {
        positions.push((k.to_vec(), v.to_vec()));
        Ok(())
    })?;
    let mut dropped = Dropped::default();
    for h in holders {
        // A record without the count is schema 1's: every pair of it is a published hash.
        let Some(raw) = h.raw_pairs else {
            continue;
        };
        let (mut even, mut odd) = (0u64, 0u64);
        store.scan_prefix(Cf::Pairs, &h.key, &mut |k, _| {
            if block_of(k)? & 1 == 0 {
                even += 1;
            } else {
                odd += 1;
            }
            Ok(())
        })?;
        if odd == 0 || raw >= even + odd {
            continue;
        }
        let mut first = holder_ops(&h, even);
        for (key, value) in positions.iter_mut() {
            if key.get(8..) == Some(h.source.as_bytes()) && value.as_slice() != REBUILD_POSITION {
                *value = REBUILD_POSITION.to_vec();
                dropped.positions += 1;
                first.push(KvOp::Put {
                    cf: Cf::Watermarks,
                    key: key.clone(),
                    value: value.clone(),
                });
            }
        }
        let mut ops = first;
        let mut deletes = 0;
        store.scan_prefix(Cf::Pairs, &h.key, &mut |k, _| {
            if block_of(k)? & 1 == 1 {
                ops.push(KvOp::Delete {
                    cf: Cf::Pairs,
                    key: k.to_vec(),
                });
                deletes += 1;
                if deletes == batch {
                    store.write(std::mem::take(&mut ops))?;
                    dropped.pairs += deletes as u64;
                    deletes = 0;
                }
            }
            Ok(())
        })?;
        if !ops.is_empty() {
            store.write(ops)?;
            dropped.pairs += deletes as u64;
        }
        dropped.holders += 1;
    }
    // Every alias names a derived key. One range delete covers every context's (a run of 0xff
    // longer than an alias key is past them all).
    store.write(vec![KvOp::DeleteRange {
        cf: Cf::Aliases,
        from: Vec::new(),
        to: vec![0xff; 17],
    }])?;
    // Removed records are merge operands (and the aliases a range delete) until a compaction
    // folds them: a restart would otherwise step over each of them. A bucket whose records all
    // went folds into an empty value, which the compaction filter drops only when a compaction
    // reads it again: hence the second one (a holder whose blocks were mostly derived keys
    // leaves nearly all of its buckets empty, millions in a large store).
    store.compact()?;
    store.compact()?;
    Ok(dropped)
}

/// The holder's record with `raw_pairs` set to what will be left: its even pairs.
fn holder_ops(h: &Holder, even: u64) -> Vec<KvOp> {
    let mut record = h.record.clone();
    record["raw_pairs"] = Value::from(even);
    vec![KvOp::Put {
        cf: Cf::Holders,
        key: h.key.clone(),
        value: record.to_string().into_bytes(),
    }]
}
