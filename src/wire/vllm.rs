//! vLLM and SGLang engine events (`BlockStored`, `BlockRemoved`, `AllBlocksCleared`).
//!
//! SGLang copied vLLM's publisher, so one decoder serves both; the differences are a per-engine
//! key set, positional layout and hash rule (README.md in this directory shows the bytes):
//! * vLLM hashes are unsigned (`low64_be` of the digest) or the raw digest as bin;
//! * SGLang hashes are signed int64 (kept as their 64-bit pattern) and `token_ids` may be bigram
//!   pairs; SGLang adds `cache_salt` and omits the nullable keys vLLM always writes.
//!
//! Layout: [`RawEvent`] is the event as the wire spells it (map or positional array); `admit`
//! turns it into a domain [`KvEvent`] or an [`IgnoreReason`].

use super::envelope::{EventResult, Outcome, Problem, invalid, map_key, structural, typed};
use super::medium;
use super::msgpack::{Kind, Reader};
pub(crate) use super::schema::Engine;
use super::schema::{ALL_KEYS, Key, Tag};
use crate::events::{
    CacheGroup, EngineRemoved, EngineStored, EventTokens, IgnoreReason, KvEvent, MAX_CACHE_GROUPS,
};
use crate::hashing::IndexProjection;
use crate::model::{BlockHash, GroupKind};

/// A block hash as sent: the engine's 64-bit value, or the raw digest (vLLM with
/// `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`) that the registered projection reduces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawHash<'a> {
    Int(u64),
    Bin(&'a [u8]),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RawTokens {
    Flat(Vec<i64>),
    Pairs(Vec<(i64, i64)>),
}

/// One engine event as read from the wire, before any domain rule.
#[derive(Debug, Default)]
pub(crate) struct RawEvent<'a> {
    /// Recognized keys seen so far (a `Key::bit` set): duplicates, required and allowed keys.
    seen: u32,
    tag: Option<&'a str>,
    block_hashes: Vec<RawHash<'a>>,
    parent_block_hash: Option<RawHash<'a>>,
    token_ids: Option<RawTokens>,
    block_size: Option<u32>,
    medium: Option<&'a str>,
    lora_name: Option<&'a str>,
    cache_salt: Option<&'a str>,
    group_idx: Option<i64>,
    spec_kind: Option<&'a str>,
    sliding_window: Option<i64>,
    /// Entries of `extra_keys` (one per block hash when present); `None` when the key is absent
    /// or `nil`, which leaves the extras unsaid, where an array (even empty) says them.
    extra_keys: Option<Vec<RawExtra<'a>>>,
}

/// One block's `extra_keys` entry: `nil`, or its elements (strings read, the rest as bytes).
#[derive(Debug, Default)]
pub(crate) struct RawExtra<'a> {
    elements: Vec<ExtraElement<'a>>,
}

#[derive(Debug, Clone, Copy)]
enum ExtraElement<'a> {
    Str(&'a str, &'a [u8]),
    Other(&'a [u8]),
}

impl ExtraElement<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            ExtraElement::Str(_, b) | ExtraElement::Other(b) => b,
        }
    }
}

/// Decode one event at the cursor.
pub(crate) fn decode_event(
    r: &mut Reader<'_>,
    engine: Engine,
    projection: IndexProjection,
) -> EventResult<Outcome> {
    let (raw, tag, positional) = match structural(r.peek())? {
        Kind::Map => {
            let raw = read_map(r, engine)?;
            let Some(tag) = raw.tag else {
                return invalid("type", Problem::Missing);
            };
            (raw, Tag::parse(tag)?, false)
        }
        Kind::Array => {
            let (raw, tag) = read_positional(r, engine)?;
            (raw, tag, true)
        }
        other => {
            return invalid(
                "<event>",
                Problem::WrongType {
                    expected: "map or array",
                    got: other.name(),
                },
            );
        }
    };
    let not_allowed = raw.seen & !tag.allowed(engine);
    if let Some(key) = ALL_KEYS.iter().find(|k| not_allowed & k.bit() != 0) {
        return invalid(key.name(), Problem::NotAllowed { on: tag.name() });
    }
    let missing = engine.required(tag, positional) & !raw.seen;
    if let Some(key) = ALL_KEYS.iter().find(|k| missing & k.bit() != 0) {
        return invalid(key.name(), Problem::Missing);
    }
    admit(raw, tag, engine, projection)
}

fn read_map<'a>(r: &mut Reader<'a>, engine: Engine) -> EventResult<RawEvent<'a>> {
    let n = structural(r.map_len())?;
    let mut raw = RawEvent::default();
    for _ in 0..n {
        let name = map_key(r)?;
        match Key::parse(engine, name) {
            Some(key) => read_value(r, engine, key, &mut raw)?,
            None => structural(r.skip())?,
        }
    }
    Ok(raw)
}

fn read_positional<'a>(r: &mut Reader<'a>, engine: Engine) -> EventResult<(RawEvent<'a>, Tag)> {
    let n = structural(r.array_len())?;
    if n == 0 {
        return invalid("type", Problem::Missing);
    }
    let tag = Tag::parse(typed(r.str(), "type", "str")?)?;
    let layout = engine.layout(tag);
    let mut raw = RawEvent {
        seen: Key::Type.bit(),
        ..RawEvent::default()
    };
    for i in 1..n as usize {
        match layout.get(i - 1) {
            Some(&key) => read_value(r, engine, key, &mut raw)?,
            // A field appended by a newer release: ignored like an unknown map key.
            None => structural(r.skip())?,
        }
    }
    Ok((raw, tag))
}

fn read_value<'a>(
    r: &mut Reader<'a>,
    engine: Engine,
    key: Key,
    raw: &mut RawEvent<'a>,
) -> EventResult<()> {
    if raw.seen & key.bit() != 0 {
        return invalid(key.name(), Problem::Duplicate);
    }
    raw.seen |= key.bit();
    let field = key.name();
    match key {
        Key::Type => raw.tag = Some(typed(r.str(), field, "str")?),
        Key::BlockHashes => {
            let n = typed(r.array_len(), field, "array")?;
            raw.block_hashes = Vec::with_capacity(r.capacity_for(n));
            for _ in 0..n {
                raw.block_hashes.push(read_hash(r, engine, field)?);
            }
        }
        Key::ParentBlockHash => {
            raw.parent_block_hash = if structural(r.nil())? {
                None
            } else {
                Some(read_hash(r, engine, field)?)
            }
        }
        Key::TokenIds => raw.token_ids = read_tokens(r, engine)?,
        Key::BlockSize => {
            let v = typed(r.int(), field, "int")?;
            match u32::try_from(v) {
                Ok(size) if size > 0 => raw.block_size = Some(size),
                _ => return invalid(field, Problem::Invalid("must be in 1..=4294967295")),
            }
        }
        // `lora_id` is deprecated in vLLM and always nil in SGLang: type-checked, then ignored.
        Key::LoraId => {
            nullable_int(r, field)?;
        }
        Key::Medium => raw.medium = nullable_str(r, field)?,
        Key::LoraName => raw.lora_name = nullable_str(r, field)?,
        Key::CacheSalt => raw.cache_salt = nullable_str(r, field)?,
        Key::SpecKind => raw.spec_kind = nullable_str(r, field)?,
        Key::Locality | Key::Ownership | Key::SessionId => {
            nullable_str(r, field)?;
        }
        Key::GroupIdx => raw.group_idx = nullable_int(r, field)?,
        Key::SlidingWindow => raw.sliding_window = nullable_int(r, field)?,
        Key::ExtraKeys => raw.extra_keys = read_entry_arrays(r, field)?,
        // Read for its shape only: the hash's lookahead tokens never reach the index.
        Key::LookaheadTokenIds => {
            read_entry_arrays(r, field)?;
        }
    }
    Ok(())
}

fn read_hash<'a>(
    r: &mut Reader<'a>,
    engine: Engine,
    field: &'static str,
) -> EventResult<RawHash<'a>> {
    match structural(r.peek())? {
        Kind::Int => {
            let v = structural(r.int())?;
            let bits = match engine {
                // vLLM masks the digest to an unsigned 64-bit value; a negative int is not one.
                Engine::Vllm => u64::try_from(v).ok(),
                // SGLang sends signed int64: keep the bit pattern (two's complement).
                Engine::Sglang => u64::try_from(v)
                    .ok()
                    .or_else(|| i64::try_from(v).ok().map(|s| s as u64)),
            };
            match bits {
                Some(bits) => Ok(RawHash::Int(bits)),
                None => invalid(field, Problem::Invalid("hash outside the 64-bit range")),
            }
        }
        Kind::Bin => Ok(RawHash::Bin(structural(r.bin())?)),
        other => invalid(
            field,
            Problem::WrongType {
                expected: "int or bin",
                got: other.name(),
            },
        ),
    }
}

fn token(r: &mut Reader<'_>) -> EventResult<i64> {
    let v = typed(r.int(), "token_ids", "int")?;
    i64::try_from(v).or_else(|_| invalid("token_ids", Problem::Invalid("token id outside int64")))
}

/// `nil`, `[int, …]`, or for SGLang EAGLE `[[int, int], …]`; the first element picks the form.
fn read_tokens(r: &mut Reader<'_>, engine: Engine) -> EventResult<Option<RawTokens>> {
    if structural(r.nil())? {
        return Ok(None);
    }
    let n = typed(r.array_len(), "token_ids", "array or nil")?;
    let pairs = n > 0 && engine == Engine::Sglang && structural(r.peek())? == Kind::Array;
    if !pairs {
        let mut flat = Vec::with_capacity(r.capacity_for(n));
        for _ in 0..n {
            flat.push(token(r)?);
        }
        return Ok(Some(RawTokens::Flat(flat)));
    }
    let mut out = Vec::with_capacity(r.capacity_for(n));
    for _ in 0..n {
        if typed(r.array_len(), "token_ids", "bigram pair")? != 2 {
            return invalid(
                "token_ids",
                Problem::Invalid("a bigram pair must have 2 ids"),
            );
        }
        out.push((token(r)?, token(r)?));
    }
    Ok(Some(RawTokens::Pairs(out)))
}

fn nullable_str<'a>(r: &mut Reader<'a>, field: &'static str) -> EventResult<Option<&'a str>> {
    if structural(r.nil())? {
        Ok(None)
    } else {
        typed(r.str(), field, "str or nil").map(Some)
    }
}

fn nullable_int(r: &mut Reader<'_>, field: &'static str) -> EventResult<Option<i64>> {
    if structural(r.nil())? {
        return Ok(None);
    }
    let v = typed(r.int(), field, "int or nil")?;
    i64::try_from(v)
        .map(Some)
        .or_else(|_| invalid(field, Problem::Invalid("outside int64")))
}

/// `nil`, or one entry per block, each `nil` or an array of elements (`extra_keys`,
/// `lookahead_token_ids`).
fn read_entry_arrays<'a>(
    r: &mut Reader<'a>,
    field: &'static str,
) -> EventResult<Option<Vec<RawExtra<'a>>>> {
    if structural(r.nil())? {
        return Ok(None);
    }
    let n = typed(r.array_len(), field, "array or nil")?;
    let mut entries = Vec::with_capacity(r.capacity_for(n));
    for _ in 0..n {
        let mut entry = RawExtra::default();
        match structural(r.peek())? {
            Kind::Nil => structural(r.skip())?,
            Kind::Array => {
                let len = structural(r.array_len())?;
                entry.elements.reserve(r.capacity_for(len));
                for _ in 0..len {
                    let from = r.pos();
                    let element = if structural(r.peek())? == Kind::Str {
                        let s = typed(r.str(), field, "UTF-8 string")?;
                        ExtraElement::Str(s, r.bytes_between(from, r.pos()))
                    } else {
                        structural(r.skip())?;
                        ExtraElement::Other(r.bytes_between(from, r.pos()))
                    };
                    entry.elements.push(element);
                }
            }
            other => {
                return invalid(
                    field,
                    Problem::WrongType {
                        expected: "array or nil entry",
                        got: other.name(),
                    },
                );
            }
        }
        entries.push(entry);
    }
    Ok(Some(entries))
}

/// vLLM's untagged extra keys of each block, split into what the index needs: the cache salt
/// (a string on the first block of a sequence) and a digest of everything else per block
/// (multimodal items, prompt-embedding digests), 0 for none. The LoRA name, which vLLM puts
/// first on every block of an adapter request, is the context's business and is left out.
fn split_extras(
    entries: &[RawExtra<'_>],
    lora: Option<&str>,
    starts_sequence: bool,
) -> (Vec<u64>, Option<String>) {
    let mut salt = None;
    let mut digests = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let mut elements = entry.elements.as_slice();
        if let (Some(lora), Some(ExtraElement::Str(first, _))) = (lora, elements.first())
            && *first == lora
        {
            elements = &elements[1..];
        }
        let mut salt_at = None;
        if i == 0 && starts_sequence {
            salt_at = elements
                .iter()
                .rposition(|e| matches!(e, ExtraElement::Str(..)));
            if let Some(ExtraElement::Str(s, _)) = salt_at.map(|at| elements[at]) {
                salt = Some(s.to_owned());
            }
        }
        let rest: Vec<u8> = elements
            .iter()
            .enumerate()
            .filter(|(at, _)| Some(*at) != salt_at)
            .flat_map(|(_, e)| e.bytes().iter().copied())
            .collect();
        if !rest.is_empty() {
            digests.resize(entries.len(), 0);
            digests[i] = crate::hashing::derived::bytes_digest(&rest);
        }
    }
    (digests, salt)
}

fn project(
    hash: RawHash<'_>,
    projection: IndexProjection,
    field: &'static str,
) -> EventResult<BlockHash> {
    match hash {
        RawHash::Int(bits) => Ok(BlockHash(bits)),
        RawHash::Bin(digest) => match projection.project(digest) {
            Some(h) => Ok(h),
            None => invalid(field, Problem::Invalid("bin hash shorter than 8 bytes")),
        },
    }
}

fn project_all(hashes: &[RawHash<'_>], projection: IndexProjection) -> EventResult<Vec<BlockHash>> {
    hashes
        .iter()
        .map(|&h| project(h, projection, "block_hashes"))
        .collect()
}

/// `""` means "none" for both names (vLLM's base model, SGLang's unsalted request).
fn non_empty(s: Option<&str>) -> Option<String> {
    s.filter(|s| !s.is_empty()).map(str::to_owned)
}

/// The KV-cache group an event names (`group_idx`, 0 when absent), `None` beyond
/// [`MAX_CACHE_GROUPS`] or negative.
fn cache_group(group_idx: Option<i64>) -> Option<u32> {
    match group_idx {
        None => Some(0),
        Some(g) => u32::try_from(g).ok().filter(|&g| g < MAX_CACHE_GROUPS),
    }
}

/// Apply the domain rules: validation first (an invalid event is an error even when it would be
/// ignored), then the ignore rules in order cache group, spec kind, medium.
fn admit(
    raw: RawEvent<'_>,
    tag: Tag,
    engine: Engine,
    projection: IndexProjection,
) -> EventResult<Outcome> {
    match tag {
        Tag::Cleared => Ok(Outcome::Event(KvEvent::AllCleared)),
        Tag::Removed => {
            let hashes = project_all(&raw.block_hashes, projection)?;
            let Some(group) = cache_group(raw.group_idx) else {
                return Ok(Outcome::Ignored(IgnoreReason::OtherCacheGroup));
            };
            let Some(tier) = medium::engine_tier(raw.medium) else {
                return Ok(Outcome::Ignored(IgnoreReason::UnknownMedium));
            };
            Ok(Outcome::Event(KvEvent::Removed(EngineRemoved {
                hashes,
                tier,
                group,
            })))
        }
        Tag::Stored => {
            if raw
                .extra_keys
                .as_ref()
                .is_some_and(|e| e.len() != raw.block_hashes.len())
            {
                return invalid(
                    "extra_keys",
                    Problem::Invalid("must have one entry per block hash"),
                );
            }
            let Some(block_size) = raw.block_size else {
                return invalid("block_size", Problem::Missing);
            };
            let hashes = project_all(&raw.block_hashes, projection)?;
            let parent = raw
                .parent_block_hash
                .map(|h| project(h, projection, "parent_block_hash"))
                .transpose()?;
            let Some(idx) = cache_group(raw.group_idx) else {
                return Ok(Outcome::Ignored(IgnoreReason::OtherCacheGroup));
            };
            let group = CacheGroup {
                idx,
                kind: GroupKind::from_vllm(raw.spec_kind, raw.sliding_window),
            };
            let Some(tier) = medium::engine_tier(raw.medium) else {
                return Ok(Outcome::Ignored(IgnoreReason::UnknownMedium));
            };
            let tokens = raw.token_ids.map(|t| match t {
                RawTokens::Flat(ids) => EventTokens::Flat(ids),
                RawTokens::Pairs(pairs) => EventTokens::Bigram(pairs),
            });
            let lora_name = non_empty(raw.lora_name);
            // SGLang writes `cache_salt` whenever it is set; vLLM says its extras only in
            // `extra_keys`, which its schema lets a publisher leave out.
            let extras_carried = engine == Engine::Sglang || raw.extra_keys.is_some();
            let (extras, vllm_salt) = split_extras(
                raw.extra_keys.as_deref().unwrap_or_default(),
                lora_name.as_deref(),
                parent.is_none(),
            );
            Ok(Outcome::Event(KvEvent::Stored(EngineStored {
                hashes,
                parent,
                tokens,
                block_size,
                lora_name,
                cache_salt: non_empty(raw.cache_salt).or(vllm_salt),
                extras,
                extras_carried,
                tier,
                group,
            })))
        }
    }
}
