//! Keys and values of the on-disk layout (see the module doc of [`super`]).

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::events::{Holder, MAX_CACHE_GROUPS};
use crate::hashing::HashProfile;
use crate::index::{HolderRecord, Watermark};
use crate::model::{
    ContextKey, GroupKind, HybridPart, PublisherConfig, PublisherType, SubscriptionKey,
};

use crate::storage::StorageError;

/// Stable 8-byte id of a context.
pub fn context_id(key: &ContextKey) -> [u8; 8] {
    let mut h = Sha256::new();
    for part in [
        key.tenant_id.as_bytes(),
        key.model_name.as_bytes(),
        key.lora_name.as_bytes(),
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    h.update(key.block_size.to_be_bytes());
    let digest: [u8; 32] = h.finalize().into();
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest[..8]);
    id
}

fn corrupt(cf: &'static str, what: impl Into<String>) -> StorageError {
    StorageError::Corrupt {
        cf,
        what: what.into(),
    }
}

fn parse(cf: &'static str, bytes: &[u8]) -> Result<Value, StorageError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(cf, format!("invalid JSON: {e}")))
}

fn text<'a>(cf: &'static str, v: &'a Value, field: &str) -> Result<&'a str, StorageError> {
    v.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| corrupt(cf, format!("missing string `{field}`")))
}

fn uint(cf: &'static str, v: &Value, field: &str) -> Result<u32, StorageError> {
    v.get(field)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| corrupt(cf, format!("missing integer `{field}`")))
}

fn profile_json(p: &HashProfile) -> Value {
    json!({
        "strategy": p.strategy().as_str(), "algorithm": p.algorithm().as_str(),
        "python_hash_seed": p.python_hash_seed(), "index_projection": p.index_projection().as_str(),
    })
}

fn profile_from(cf: &'static str, v: &Value) -> Result<HashProfile, StorageError> {
    let p = v
        .get("hash_profile")
        .ok_or_else(|| corrupt(cf, "missing hash_profile"))?;
    let get = |k: &str| p.get(k).and_then(Value::as_str);
    HashProfile::resolve(
        get("strategy"),
        get("algorithm"),
        get("python_hash_seed"),
        get("index_projection"),
    )
    .map_err(|e| corrupt(cf, format!("hash profile: {e}")))
}

pub fn context_value(key: &ContextKey, profile: &HashProfile) -> Vec<u8> {
    let v = json!({
        "tenant_id": key.tenant_id, "model_name": key.model_name, "lora_name": key.lora_name,
        "block_size": key.block_size, "hash_profile": profile_json(profile),
    });
    v.to_string().into_bytes()
}

pub fn decode_context(bytes: &[u8]) -> Result<(ContextKey, HashProfile), StorageError> {
    const CF: &str = "contexts";
    let v = parse(CF, bytes)?;
    let key = ContextKey::new(
        text(CF, &v, "tenant_id")?,
        text(CF, &v, "model_name")?,
        text(CF, &v, "lora_name")?,
        uint(CF, &v, "block_size")?,
    );
    Ok((key, profile_from(CF, &v)?))
}

fn source_json(s: &SubscriptionKey) -> Value {
    json!({"instance_id": s.instance_id, "tenant_id": s.tenant_id, "dp_rank": s.dp_rank})
}

fn source_from(cf: &'static str, v: &Value) -> Result<SubscriptionKey, StorageError> {
    let s = v
        .get("source")
        .ok_or_else(|| corrupt(cf, "missing source"))?;
    Ok(SubscriptionKey::new(
        text(cf, s, "instance_id")?,
        text(cf, s, "tenant_id")?,
        uint(cf, s, "dp_rank")?,
    ))
}

pub fn holder_value(record: &HolderRecord) -> Vec<u8> {
    let holder = match &record.holder {
        Holder::Engine {
            instance_id,
            dp_rank,
            group: 0,
        } => json!({"engine": {"instance_id": instance_id, "dp_rank": dp_rank}}),
        Holder::Engine {
            instance_id,
            dp_rank,
            group,
        } => json!({"engine": {"instance_id": instance_id, "dp_rank": dp_rank, "group": group}}),
        Holder::Shared { backend_id } => json!({"shared": {"backend_id": backend_id}}),
    };
    let mut v = json!({"source": source_json(&record.source), "holder": holder});
    if let Some(n) = record.raw_pairs {
        v["raw_pairs"] = json!(n);
    }
    if record.kind != GroupKind::Full {
        v["kind"] = json!(record.kind.family());
        if let Some(window) = record.kind.window() {
            v["window"] = json!(window);
        }
    }
    v.to_string().into_bytes()
}

pub fn decode_holder(id: u32, bytes: &[u8]) -> Result<HolderRecord, StorageError> {
    const CF: &str = "holders";
    let v = parse(CF, bytes)?;
    let h = v
        .get("holder")
        .ok_or_else(|| corrupt(CF, "missing holder"))?;
    let holder = if let Some(e) = h.get("engine") {
        Holder::Engine {
            instance_id: text(CF, e, "instance_id")?.to_owned(),
            dp_rank: uint(CF, e, "dp_rank")?,
            group: match e.get("group") {
                None => 0,
                Some(_) => Some(uint(CF, e, "group")?)
                    .filter(|&g| g < MAX_CACHE_GROUPS)
                    .ok_or_else(|| corrupt(CF, "group is past the most KV-cache groups"))?,
            },
        }
    } else if let Some(s) = h.get("shared") {
        Holder::Shared {
            backend_id: text(CF, s, "backend_id")?.to_owned(),
        }
    } else {
        return Err(corrupt(CF, "holder is neither engine nor shared"));
    };
    let raw_pairs = match v.get("raw_pairs") {
        None => None,
        Some(n) => Some(
            n.as_u64()
                .ok_or_else(|| corrupt(CF, "raw_pairs is not a count"))?,
        ),
    };
    let kind = match v.get("kind") {
        None => GroupKind::Full,
        Some(_) => group_kind(CF, &v)?,
    };
    Ok(HolderRecord {
        id,
        source: source_from(CF, &v)?,
        holder,
        raw_pairs,
        kind,
    })
}

/// A holder record's group kind: its family name, and a sliding window's size.
fn group_kind(cf: &'static str, v: &Value) -> Result<GroupKind, StorageError> {
    Ok(match text(cf, v, "kind")? {
        "full_attention" => GroupKind::Full,
        "sliding_window" => GroupKind::SlidingWindow {
            window: Some(uint(cf, v, "window")?)
                .filter(|&w| w > 0)
                .ok_or_else(|| corrupt(cf, "window is 0"))?,
        },
        "mamba" => GroupKind::Mamba,
        "chunked_local_attention" => GroupKind::ChunkedLocal,
        "unknown" => GroupKind::Unknown,
        _ => return Err(corrupt(cf, "kind is not a KV-cache group kind")),
    })
}

pub fn attachment_value(source: &SubscriptionKey, instance_id: &str, dp_rank: u32) -> Vec<u8> {
    json!({"source": source_json(source), "instance_id": instance_id, "dp_rank": dp_rank})
        .to_string()
        .into_bytes()
}

pub fn decode_attachment(bytes: &[u8]) -> Result<crate::index::Attachment, StorageError> {
    const CF: &str = "attachments";
    let v = parse(CF, bytes)?;
    Ok(crate::index::Attachment {
        source: source_from(CF, &v)?,
        instance_id: text(CF, &v, "instance_id")?.to_owned(),
        dp_rank: uint(CF, &v, "dp_rank")?,
    })
}

pub fn watermark_value(mark: Watermark) -> Vec<u8> {
    let mut v = mark.seq.to_be_bytes().to_vec();
    v.extend_from_slice(&mark.digest.to_be_bytes());
    v
}

pub fn decode_watermark(bytes: &[u8]) -> Result<Watermark, StorageError> {
    let bytes: [u8; 16] = bytes
        .try_into()
        .map_err(|_| corrupt("watermarks", "value is not 16 bytes"))?;
    let (seq, digest) = bytes.split_at(8);
    Ok(Watermark {
        seq: u64::from_be_bytes(seq.try_into().unwrap_or_default()),
        digest: u64::from_be_bytes(digest.try_into().unwrap_or_default()),
    })
}

/// The source a watermark key names: ctx id (8 bytes) + service key text.
pub fn decode_watermark_source(key: &[u8]) -> Result<SubscriptionKey, StorageError> {
    let text = std::str::from_utf8(key.get(8..).unwrap_or_default())
        .map_err(|_| corrupt("watermarks", "key is not UTF-8"))?;
    SubscriptionKey::parse(text)
        .ok_or_else(|| corrupt("watermarks", format!("bad source key {text:?}")))
}

pub fn registration_value(c: &PublisherConfig) -> Vec<u8> {
    registration_json(c).to_string().into_bytes()
}

fn registration_json(c: &PublisherConfig) -> Value {
    let mut v = json!({
        "instance_id": c.instance_id, "endpoint": c.endpoint, "replay_endpoint": c.replay_endpoint,
        "publisher_type": c.publisher_type.as_str(), "model_name": c.model_name, "lora_name": c.lora_name,
        "tenant_id": c.tenant_id, "block_size": c.block_size, "dp_rank": c.dp_rank, "cache_group": c.cache_group,
        "hash_profile": profile_json(&c.hash_profile),
    });
    if !c.hybrid_parts.is_empty() {
        let parts: Vec<&str> = c.hybrid_parts.iter().map(|p| p.as_str()).collect();
        v["hybrid_parts"] = json!(parts);
    }
    v
}

/// A registration as this replica stores it: the shared fields of [`registration_value`] and
/// the incarnation of this registration here (see [`crate::durability::sources`]).
pub fn local_registration_value(c: &PublisherConfig, incarnation: u64) -> Vec<u8> {
    let mut v = registration_json(c);
    if let Some(fields) = v.as_object_mut() {
        fields.insert("incarnation".into(), json!(incarnation));
    }
    v.to_string().into_bytes()
}

/// The incarnation a stored registration carries: 0 for a record written before incarnations
/// existed (migration 7 gives its source the same).
pub fn decode_incarnation(bytes: &[u8]) -> Result<u64, StorageError> {
    let v = parse("registrations", bytes)?;
    match v.get("incarnation") {
        None => Ok(0),
        Some(n) => n
            .as_u64()
            .ok_or_else(|| corrupt("registrations", "`incarnation` is not an integer")),
    }
}

/// A source record: the incarnation of the registration it belongs to, then the position
/// (seq and payload digest) every context of the checkpoint it was written with covers.
pub fn source_value(incarnation: u64, mark: Watermark) -> Vec<u8> {
    let mut v = incarnation.to_be_bytes().to_vec();
    v.extend_from_slice(&watermark_value(mark));
    v
}

pub fn decode_source(bytes: &[u8]) -> Result<(u64, Watermark), StorageError> {
    let bytes: &[u8; 24] = bytes
        .try_into()
        .map_err(|_| corrupt("sources", "value is not 24 bytes"))?;
    let (incarnation, mark) = bytes.split_at(8);
    let incarnation = u64::from_be_bytes(incarnation.try_into().unwrap_or_default());
    Ok((incarnation, decode_watermark(mark)?))
}

pub fn decode_registration(bytes: &[u8]) -> Result<PublisherConfig, StorageError> {
    const CF: &str = "registrations";
    let v = parse(CF, bytes)?;
    let kind = text(CF, &v, "publisher_type")?;
    Ok(PublisherConfig {
        instance_id: text(CF, &v, "instance_id")?.to_owned(),
        endpoint: text(CF, &v, "endpoint")?.to_owned(),
        replay_endpoint: text(CF, &v, "replay_endpoint")?.to_owned(),
        publisher_type: PublisherType::parse(kind)
            .ok_or_else(|| corrupt(CF, format!("unknown publisher type {kind:?}")))?,
        model_name: text(CF, &v, "model_name")?.to_owned(),
        lora_name: text(CF, &v, "lora_name")?.to_owned(),
        tenant_id: text(CF, &v, "tenant_id")?.to_owned(),
        block_size: uint(CF, &v, "block_size")?,
        dp_rank: uint(CF, &v, "dp_rank")?,
        cache_group: match v.get("cache_group") {
            None | Some(Value::Null) => None,
            Some(_) => Some(
                Some(uint(CF, &v, "cache_group")?)
                    .filter(|&g| g < MAX_CACHE_GROUPS)
                    .ok_or_else(|| corrupt(CF, "cache_group is past the most KV-cache groups"))?,
            ),
        },
        hybrid_parts: match v.get("hybrid_parts") {
            None => Vec::new(),
            Some(parts) => hybrid_parts(CF, parts)?,
        },
        hash_profile: profile_from(CF, &v)?,
    })
}

/// A registration's declared hybrid parts: a list of their names.
fn hybrid_parts(cf: &'static str, v: &Value) -> Result<Vec<HybridPart>, StorageError> {
    let bad = || corrupt(cf, "hybrid_parts is not a list of part names");
    let list = v.as_array().ok_or_else(bad)?;
    if list.len() > HybridPart::ALL.len() {
        return Err(bad());
    }
    list.iter()
        .map(|p| p.as_str().and_then(HybridPart::parse).ok_or_else(bad))
        .collect()
}

pub fn pair_key(ctx: &[u8; 8], holder: u32, block: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(20);
    k.extend_from_slice(ctx);
    k.extend_from_slice(&holder.to_be_bytes());
    k.extend_from_slice(&block.to_be_bytes());
    k
}

pub fn decode_pair_key(key: &[u8]) -> Result<(u32, u64), StorageError> {
    if key.len() != 20 {
        return Err(corrupt("pairs", "key is not 20 bytes"));
    }
    let holder = u32::from_be_bytes([key[8], key[9], key[10], key[11]]);
    let mut block = [0u8; 8];
    block.copy_from_slice(&key[12..20]);
    Ok((holder, u64::from_be_bytes(block)))
}

/// A pair's value: its tier bits, then for each tier announced more than once its bit and the
/// announcements beyond the first (u32 BE). Schema 1 values are the bits alone, which read the
/// same: one announcement per tier.
pub fn pair_value(bits: u8, repeats: impl IntoIterator<Item = (u8, u32)>) -> Vec<u8> {
    let mut v = vec![bits];
    for (bit, extra) in repeats {
        v.push(bit);
        v.extend_from_slice(&extra.to_be_bytes());
    }
    v
}

/// The tier bits of a pair value and its repeat counts, `(tier bit, extra)`, in order.
pub fn decode_pair_value(
    v: &[u8],
) -> Result<(u8, impl Iterator<Item = (u8, u32)> + '_), StorageError> {
    let (&bits, rest) = v
        .split_first()
        .ok_or_else(|| corrupt("pairs", "empty value"))?;
    if rest.len() % 5 != 0 {
        return Err(corrupt("pairs", "repeat counts are not 5-byte records"));
    }
    let bad = rest
        .chunks_exact(5)
        .any(|r| !r[0].is_power_of_two() || bits & r[0] == 0);
    if bad {
        return Err(corrupt(
            "pairs",
            "a repeat count names a tier the pair does not hold",
        ));
    }
    let repeats = rest
        .chunks_exact(5)
        .map(|r| (r[0], u32::from_be_bytes([r[1], r[2], r[3], r[4]])));
    Ok((bits, repeats))
}

pub fn alias_key(ctx: &[u8; 8], hash: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(16);
    k.extend_from_slice(ctx);
    k.extend_from_slice(&hash.to_be_bytes());
    k
}

/// (engine hash, derived key) of an alias row.
pub fn decode_alias(key: &[u8], value: &[u8]) -> Result<(u64, u64), StorageError> {
    let hash: [u8; 8] = key
        .get(8..)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| corrupt("aliases", "key is not 16 bytes"))?;
    let derived: [u8; 8] = value
        .try_into()
        .map_err(|_| corrupt("aliases", "value is not 8 bytes"))?;
    Ok((u64::from_be_bytes(hash), u64::from_be_bytes(derived)))
}

pub fn indexed_key(ctx: &[u8; 8], n: u32) -> Vec<u8> {
    let mut k = ctx.to_vec();
    k.extend_from_slice(&n.to_be_bytes());
    k
}
