//! Mooncake store object events (RFC #1527 maps; `docs/reference-behaviour.md`, "Mooncake store
//! events").
//!
//! The store publishes `[timestamp_ms, [event map, …], dp_rank | nil]`; each map is `stored`,
//! `removed` or `cleared` of one object on a shared tier (`cpu` → cpu_share, `disk` → disk).
//! The reference decoder is stricter than it needs to be in places and we relax those; where a
//! field decides *which* context or holder a block lands in, we stay strict. README.md lists
//! each choice.

use super::envelope::{EventResult, Outcome, Problem, invalid, map_key, structural, typed};
use super::medium;
use super::msgpack::{Kind, Reader};
use crate::events::{IgnoreReason, KvEvent, StoreObject};
use crate::hashing::IndexProjection;
use crate::model::{BlockHash, normalize_tenant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    EventId,
    Timestamp,
    EventType,
    LegacyType,
    ModelName,
    BlockSize,
    AdditionalSalt,
    LoraName,
    TenantId,
    BackendId,
    Medium,
    DpRank,
    GroupId,
    ObjectKey,
    ConnectorBlockHash,
    CachePrefix,
    TpRank,
    HeadOrTpRank,
    PcpRank,
    DcpRank,
    PpRank,
    LayerId,
    SeqHashes,
    BlockHashes,
    BaseBlockIdx,
    ParentHash,
    TokenIds,
    ParentBlockHash,
}

const KEYS: [(&str, Field); 28] = [
    ("event_id", Field::EventId),
    ("timestamp", Field::Timestamp),
    ("event_type", Field::EventType),
    ("type", Field::LegacyType),
    ("model_name", Field::ModelName),
    ("block_size", Field::BlockSize),
    ("additional_salt", Field::AdditionalSalt),
    ("lora_name", Field::LoraName),
    ("tenant_id", Field::TenantId),
    ("backend_id", Field::BackendId),
    ("medium", Field::Medium),
    ("dp_rank", Field::DpRank),
    ("group_id", Field::GroupId),
    ("object_key", Field::ObjectKey),
    ("connector_block_hash", Field::ConnectorBlockHash),
    ("cache_prefix", Field::CachePrefix),
    ("tp_rank", Field::TpRank),
    ("head_or_tp_rank", Field::HeadOrTpRank),
    ("pcp_rank", Field::PcpRank),
    ("dcp_rank", Field::DcpRank),
    ("pp_rank", Field::PpRank),
    ("layer_id", Field::LayerId),
    ("seq_hashes", Field::SeqHashes),
    ("block_hashes", Field::BlockHashes),
    ("base_block_idx", Field::BaseBlockIdx),
    ("parent_hash", Field::ParentHash),
    ("token_ids", Field::TokenIds),
    ("parent_block_hash", Field::ParentBlockHash),
];

impl Field {
    const fn bit(self) -> u32 {
        1 << self as u32
    }

    fn name(self) -> &'static str {
        KEYS.iter()
            .find(|(_, k)| *k == self)
            .map_or("<key>", |(name, _)| name)
    }
}

const fn mask(keys: &[Field]) -> u32 {
    let mut m = 0;
    let mut i = 0;
    while i < keys.len() {
        m |= keys[i].bit();
        i += 1;
    }
    m
}

/// Object, hash, topology, parent and token keys: a `cleared` event names no object.
const OBJECT_KEYS: u32 = mask(&[
    Field::GroupId,
    Field::ObjectKey,
    Field::ConnectorBlockHash,
    Field::CachePrefix,
    Field::TpRank,
    Field::HeadOrTpRank,
    Field::PcpRank,
    Field::DcpRank,
    Field::PpRank,
    Field::LayerId,
    Field::SeqHashes,
    Field::BlockHashes,
    Field::BaseBlockIdx,
    Field::ParentHash,
    Field::TokenIds,
    Field::ParentBlockHash,
]);
/// Keys that only make sense on `stored`.
const STORED_ONLY: u32 = mask(&[Field::ParentHash, Field::TokenIds, Field::ParentBlockHash]);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventType {
    Stored,
    Removed,
    Cleared,
}

impl EventType {
    fn parse(name: &str) -> Option<EventType> {
        [
            ("stored", EventType::Stored),
            ("removed", EventType::Removed),
            ("cleared", EventType::Cleared),
            ("BlockStored", EventType::Stored),
            ("BlockRemoved", EventType::Removed),
            ("AllBlocksCleared", EventType::Cleared),
        ]
        .into_iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, t)| t)
    }

    const fn name(self) -> &'static str {
        match self {
            EventType::Stored => "stored",
            EventType::Removed => "removed",
            EventType::Cleared => "cleared",
        }
    }
}

/// One store event as read from the wire.
#[derive(Debug, Default)]
struct RawStoreEvent<'a> {
    seen: u32,
    event_type: Option<&'a str>,
    legacy_type: Option<&'a str>,
    model_name: Option<&'a str>,
    block_size: Option<u32>,
    lora_name: Option<&'a str>,
    tenant_id: Option<&'a str>,
    backend_id: Option<&'a str>,
    medium: Option<&'a str>,
    group: Option<u64>,
    object_key: Option<&'a str>,
    connector_block_hash: Option<&'a str>,
    seq_hashes: Option<Vec<u64>>,
    block_hashes: Option<Vec<u64>>,
    parent_hash: Option<u64>,
    parent_block_hash: Option<u64>,
}

pub(crate) fn decode_event(
    r: &mut Reader<'_>,
    projection: IndexProjection,
) -> EventResult<Outcome> {
    let n = match structural(r.peek())? {
        Kind::Map => structural(r.map_len())?,
        other => {
            return invalid(
                "<event>",
                Problem::WrongType {
                    expected: "map",
                    got: other.name(),
                },
            );
        }
    };
    let mut raw = RawStoreEvent::default();
    for _ in 0..n {
        let name = map_key(r)?;
        match KEYS.iter().find(|(k, _)| *k == name) {
            Some(&(_, key)) => read_value(r, key, &mut raw)?,
            None => structural(r.skip())?,
        }
    }
    admit(raw, projection)
}

fn read_value<'a>(r: &mut Reader<'a>, key: Field, raw: &mut RawStoreEvent<'a>) -> EventResult<()> {
    let field = key.name();
    if raw.seen & key.bit() != 0 {
        return invalid(field, Problem::Duplicate);
    }
    raw.seen |= key.bit();
    match key {
        Field::EventType => raw.event_type = Some(typed(r.str(), field, "str")?),
        Field::LegacyType => raw.legacy_type = nullable_str(r, field)?,
        Field::TenantId => raw.tenant_id = Some(typed(r.str(), field, "str")?),
        Field::BackendId => raw.backend_id = Some(typed(r.str(), field, "str")?),
        Field::ObjectKey => raw.object_key = Some(typed(r.str(), field, "str")?),
        Field::ModelName => raw.model_name = nullable_str(r, field)?,
        Field::LoraName => raw.lora_name = nullable_str(r, field)?,
        Field::Medium => raw.medium = nullable_str(r, field)?,
        Field::ConnectorBlockHash => raw.connector_block_hash = nullable_str(r, field)?,
        Field::AdditionalSalt | Field::CachePrefix => {
            nullable_str(r, field)?;
        }
        Field::BlockSize => {
            // The publisher maps "unknown" to nil; 0 means the same thing.
            raw.block_size =
                match nullable_int(r, field)? {
                    None | Some(0) => None,
                    Some(v) => Some(u32::try_from(v).or_else(|_| {
                        invalid(field, Problem::Invalid("must be in 0..=4294967295"))
                    })?),
                }
        }
        Field::GroupId => raw.group = read_group(r)?,
        Field::EventId
        | Field::Timestamp
        | Field::DpRank
        | Field::TpRank
        | Field::HeadOrTpRank
        | Field::PcpRank
        | Field::DcpRank => {
            nullable_int(r, field)?;
        }
        Field::PpRank | Field::LayerId | Field::BaseBlockIdx => {
            nullable_int(r, field)?;
        }
        Field::SeqHashes => raw.seq_hashes = Some(hash_list(r, field)?),
        Field::BlockHashes => raw.block_hashes = Some(hash_list(r, field)?),
        Field::ParentHash => raw.parent_hash = nullable_hash(r, field)?,
        Field::ParentBlockHash => raw.parent_block_hash = nullable_hash(r, field)?,
        Field::TokenIds => {
            if !structural(r.nil())? {
                let n = typed(r.array_len(), field, "array or nil")?;
                for _ in 0..n {
                    typed(r.int(), field, "int")?;
                }
            }
        }
    }
    Ok(())
}

fn nullable_str<'a>(r: &mut Reader<'a>, field: &'static str) -> EventResult<Option<&'a str>> {
    if structural(r.nil())? {
        Ok(None)
    } else {
        typed(r.str(), field, "str or nil").map(Some)
    }
}

fn nullable_int(r: &mut Reader<'_>, field: &'static str) -> EventResult<Option<i128>> {
    if structural(r.nil())? {
        Ok(None)
    } else {
        typed(r.int(), field, "int or nil").map(Some)
    }
}

/// A 64-bit hash from an unsigned int, or from a signed one as its two's-complement pattern
/// (one store publisher packs hashes ≥ 2^63 as negative int64).
fn hash_bits(v: i128, field: &'static str) -> EventResult<u64> {
    match u64::try_from(v)
        .ok()
        .or_else(|| i64::try_from(v).ok().map(|s| s as u64))
    {
        Some(bits) => Ok(bits),
        None => invalid(field, Problem::Invalid("hash outside the 64-bit range")),
    }
}

fn nullable_hash(r: &mut Reader<'_>, field: &'static str) -> EventResult<Option<u64>> {
    nullable_int(r, field)?
        .map(|v| hash_bits(v, field))
        .transpose()
}

fn hash_list(r: &mut Reader<'_>, field: &'static str) -> EventResult<Vec<u64>> {
    let n = typed(r.array_len(), field, "array")?;
    let mut out = Vec::with_capacity(r.capacity_for(n));
    for _ in 0..n {
        out.push(hash_bits(typed(r.int(), field, "int")?, field)?);
    }
    Ok(out)
}

/// `nil`, `""`, a decimal (`"0"`), the key's own spelling `"group:N"`, or an int.
fn read_group(r: &mut Reader<'_>) -> EventResult<Option<u64>> {
    const FIELD: &str = "group_id";
    match structural(r.peek())? {
        Kind::Nil => structural(r.skip()).map(|()| None),
        Kind::Int => match u64::try_from(structural(r.int())?) {
            Ok(g) => Ok(Some(g)),
            Err(_) => invalid(FIELD, Problem::Invalid("must not be negative")),
        },
        Kind::Str => {
            let s = typed(r.str(), FIELD, "str")?;
            let digits = s.strip_prefix("group:").unwrap_or(s);
            if digits.is_empty() && s.is_empty() {
                return Ok(None);
            }
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return invalid(
                    FIELD,
                    Problem::Invalid("must be a decimal integer, group:N or nil"),
                );
            }
            // Only zero is admitted, so an overlong decimal is simply "another group".
            Ok(Some(digits.parse::<u64>().unwrap_or(u64::MAX)))
        }
        other => invalid(
            FIELD,
            Problem::WrongType {
                expected: "str, int or nil",
                got: other.name(),
            },
        ),
    }
}

/// The full digest named by `connector_block_hash`: hex with an optional `0x`, at least 8 bytes.
fn connector_digest(hex: &str) -> EventResult<Vec<u8>> {
    const FIELD: &str = "connector_block_hash";
    let hex = hex
        .strip_prefix("0x")
        .or_else(|| hex.strip_prefix("0X"))
        .unwrap_or(hex);
    if hex.len() < 16 || !hex.len().is_multiple_of(2) {
        return invalid(
            FIELD,
            Problem::Invalid("must be an even number (at least 16) of hex digits"),
        );
    }
    let nibble = |c: u8| (c as char).to_digit(16);
    hex.as_bytes()
        .chunks_exact(2)
        .map(|pair| match (nibble(pair[0]), nibble(pair[1])) {
            (Some(hi), Some(lo)) => Ok((hi * 16 + lo) as u8),
            _ => invalid(FIELD, Problem::Invalid("not hex")),
        })
        .collect()
}

/// The index keys of an object event. A connector digest is authoritative (projected like the
/// engine's own hashes) and `seq_hashes`, when given, must agree with it. Without a digest,
/// `seq_hashes` (or legacy `block_hashes`) are the keys.
fn object_hashes(
    raw: &RawStoreEvent<'_>,
    projection: IndexProjection,
) -> EventResult<Vec<BlockHash>> {
    if let (Some(seq), Some(legacy)) = (&raw.seq_hashes, &raw.block_hashes)
        && seq != legacy
    {
        return invalid(
            "block_hashes",
            Problem::Invalid("conflicts with seq_hashes"),
        );
    }
    let listed = raw.seq_hashes.as_ref().or(raw.block_hashes.as_ref());
    let Some(hex) = raw.connector_block_hash else {
        return Ok(listed
            .map(|l| l.iter().map(|&h| BlockHash(h)).collect())
            .unwrap_or_default());
    };
    let digest = connector_digest(hex)?;
    let Some(key) = projection.project(&digest) else {
        return invalid("connector_block_hash", Problem::Invalid("digest too short"));
    };
    // The publisher's seq_hash is always the digest's last 8 bytes, whatever our projection.
    if let Some(list) = listed.filter(|l| !l.is_empty())
        && (list.len() != 1
            || IndexProjection::Low64Be.project(&digest) != Some(BlockHash(list[0])))
    {
        return invalid(
            "seq_hashes",
            Problem::Invalid("conflicts with connector_block_hash"),
        );
    }
    Ok(vec![key])
}

fn admit(raw: RawStoreEvent<'_>, projection: IndexProjection) -> EventResult<Outcome> {
    let Some(type_name) = raw.event_type else {
        return invalid("event_type", Problem::Missing);
    };
    let Some(kind) = EventType::parse(type_name) else {
        return invalid(
            "event_type",
            Problem::Invalid("must be stored, removed or cleared"),
        );
    };
    if raw
        .legacy_type
        .and_then(EventType::parse)
        .is_some_and(|legacy| legacy != kind)
    {
        return invalid("type", Problem::Invalid("conflicts with event_type"));
    }
    let forbidden = match kind {
        EventType::Cleared => OBJECT_KEYS,
        EventType::Removed => STORED_ONLY,
        EventType::Stored => 0,
    };
    if let Some((name, _)) = KEYS
        .iter()
        .find(|(_, k)| raw.seen & forbidden & k.bit() != 0)
    {
        return invalid(name, Problem::NotAllowed { on: kind.name() });
    }
    // Tenant and backend pick the context and the holder: never defaulted.
    let Some(tenant) = raw.tenant_id else {
        return invalid("tenant_id", Problem::Missing);
    };
    let backend_id = match raw.backend_id {
        None => return invalid("backend_id", Problem::Missing),
        Some("") => return invalid("backend_id", Problem::Invalid("must not be empty")),
        Some(b) => b.to_owned(),
    };
    let tenant_id = normalize_tenant(tenant);
    if kind == EventType::Cleared {
        return Ok(Outcome::Event(KvEvent::StoreCleared {
            backend_id,
            tenant_id,
        }));
    }
    let object_key = match raw.object_key {
        None => return invalid("object_key", Problem::Missing),
        Some("") => return invalid("object_key", Problem::Invalid("must not be empty")),
        Some(k) => k.to_owned(),
    };
    if raw.seen & Field::ParentHash.bit() != 0
        && raw.seen & Field::ParentBlockHash.bit() != 0
        && raw.parent_hash != raw.parent_block_hash
    {
        return invalid(
            "parent_block_hash",
            Problem::Invalid("conflicts with parent_hash"),
        );
    }
    let hashes = object_hashes(&raw, projection)?;
    if kind == EventType::Stored && hashes.is_empty() {
        return invalid(
            "seq_hashes",
            Problem::Invalid("a stored object needs a block hash"),
        );
    }
    if raw.group.is_some_and(|g| g != 0) {
        return Ok(Outcome::Ignored(IgnoreReason::OtherCacheGroup));
    }
    let Some(tier) = medium::store_tier(raw.medium) else {
        return Ok(Outcome::Ignored(IgnoreReason::UnknownMedium));
    };
    let non_empty = |s: Option<&str>| s.filter(|s| !s.is_empty()).map(str::to_owned);
    let object = StoreObject {
        backend_id,
        object_key,
        tenant_id,
        model_name: non_empty(raw.model_name),
        lora_name: non_empty(raw.lora_name),
        block_size: raw.block_size,
        tier,
        hashes,
    };
    Ok(Outcome::Event(match kind {
        EventType::Stored => KvEvent::StoreStored(object),
        _ => KvEvent::StoreRemoved(object),
    }))
}
