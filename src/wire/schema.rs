//! The engine event schema: which keys vLLM and SGLang define, which each event type allows or
//! requires, and the field order of the positional (`array_like`) events of older releases.
//! Sources: `docs/engine-events.md`, "Payload keys"; `docs/reference-behaviour.md`, "vLLM events".

use super::envelope::{EventResult, Problem, invalid};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Engine {
    Vllm,
    Sglang,
}

/// Every key either engine defines (`docs/engine-events.md`, "Payload keys").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Key {
    Type,
    BlockHashes,
    ParentBlockHash,
    TokenIds,
    BlockSize,
    LoraId,
    Medium,
    LoraName,
    ExtraKeys,
    GroupIdx,
    SpecKind,
    SlidingWindow,
    Locality,
    Ownership,
    SessionId,
    LookaheadTokenIds,
    CacheSalt,
}

pub(super) const ALL_KEYS: [Key; 17] = [
    Key::Type,
    Key::BlockHashes,
    Key::ParentBlockHash,
    Key::TokenIds,
    Key::BlockSize,
    Key::LoraId,
    Key::Medium,
    Key::LoraName,
    Key::ExtraKeys,
    Key::GroupIdx,
    Key::SpecKind,
    Key::SlidingWindow,
    Key::Locality,
    Key::Ownership,
    Key::SessionId,
    Key::LookaheadTokenIds,
    Key::CacheSalt,
];

impl Key {
    pub(super) const fn bit(self) -> u32 {
        1 << self as u32
    }

    pub(super) const fn name(self) -> &'static str {
        match self {
            Key::Type => "type",
            Key::BlockHashes => "block_hashes",
            Key::ParentBlockHash => "parent_block_hash",
            Key::TokenIds => "token_ids",
            Key::BlockSize => "block_size",
            Key::LoraId => "lora_id",
            Key::Medium => "medium",
            Key::LoraName => "lora_name",
            Key::ExtraKeys => "extra_keys",
            Key::GroupIdx => "group_idx",
            Key::SpecKind => "kv_cache_spec_kind",
            Key::SlidingWindow => "kv_cache_spec_sliding_window",
            Key::Locality => "locality",
            Key::Ownership => "ownership",
            Key::SessionId => "session_id",
            Key::LookaheadTokenIds => "lookahead_token_ids",
            Key::CacheSalt => "cache_salt",
        }
    }

    /// A key this engine defines; anything else is ignored like any unknown key.
    pub(super) fn parse(engine: Engine, name: &str) -> Option<Key> {
        let key = match name {
            "type" => Key::Type,
            "block_hashes" => Key::BlockHashes,
            "parent_block_hash" => Key::ParentBlockHash,
            "token_ids" => Key::TokenIds,
            "block_size" => Key::BlockSize,
            "lora_id" => Key::LoraId,
            "medium" => Key::Medium,
            "lora_name" => Key::LoraName,
            "extra_keys" => Key::ExtraKeys,
            "group_idx" => Key::GroupIdx,
            "kv_cache_spec_kind" => Key::SpecKind,
            "kv_cache_spec_sliding_window" => Key::SlidingWindow,
            "locality" => Key::Locality,
            "ownership" => Key::Ownership,
            "session_id" => Key::SessionId,
            "lookahead_token_ids" => Key::LookaheadTokenIds,
            "cache_salt" => Key::CacheSalt,
            _ => return None,
        };
        (engine.keys() & key.bit() != 0).then_some(key)
    }
}

const fn mask(keys: &[Key]) -> u32 {
    let mut m = 0;
    let mut i = 0;
    while i < keys.len() {
        m |= keys[i].bit();
        i += 1;
    }
    m
}

/// Keys a `BlockRemoved` may carry; every other recognized key is stored-only.
const REMOVED_KEYS: u32 = mask(&[
    Key::Type,
    Key::BlockHashes,
    Key::Medium,
    Key::GroupIdx,
    Key::Locality,
    Key::Ownership,
]);

/// Field order of the positional (`array_like`) events of older releases, after the tag.
const VLLM_STORED_LAYOUT: &[Key] = &[
    Key::BlockHashes,
    Key::ParentBlockHash,
    Key::TokenIds,
    Key::BlockSize,
    Key::LoraId,
    Key::Medium,
    Key::LoraName,
    Key::ExtraKeys,
    Key::GroupIdx,
    Key::SpecKind,
    Key::SlidingWindow,
    Key::Locality,
    Key::Ownership,
    Key::SessionId,
    Key::LookaheadTokenIds,
];
const VLLM_REMOVED_LAYOUT: &[Key] = &[
    Key::BlockHashes,
    Key::Medium,
    Key::GroupIdx,
    Key::Locality,
    Key::Ownership,
];
const SGLANG_STORED_LAYOUT: &[Key] = &[
    Key::BlockHashes,
    Key::ParentBlockHash,
    Key::TokenIds,
    Key::BlockSize,
    Key::LoraId,
    Key::Medium,
    Key::CacheSalt,
    Key::SessionId,
    Key::LoraName,
];
const SGLANG_REMOVED_LAYOUT: &[Key] = &[Key::BlockHashes, Key::Medium];

impl Engine {
    pub(super) const fn keys(self) -> u32 {
        match self {
            Engine::Vllm => mask(&ALL_KEYS) & !Key::CacheSalt.bit(),
            Engine::Sglang => mask(&[
                Key::Type,
                Key::BlockHashes,
                Key::ParentBlockHash,
                Key::TokenIds,
                Key::BlockSize,
                Key::LoraId,
                Key::Medium,
                Key::CacheSalt,
                Key::SessionId,
                Key::LoraName,
            ]),
        }
    }

    pub(super) fn layout(self, tag: Tag) -> &'static [Key] {
        match (self, tag) {
            (Engine::Vllm, Tag::Stored) => VLLM_STORED_LAYOUT,
            (Engine::Vllm, Tag::Removed) => VLLM_REMOVED_LAYOUT,
            (Engine::Sglang, Tag::Stored) => SGLANG_STORED_LAYOUT,
            (Engine::Sglang, Tag::Removed) => SGLANG_REMOVED_LAYOUT,
            (_, Tag::Cleared) => &[],
        }
    }

    /// Keys an event must carry. vLLM writes `medium` and `lora_name` on every map event (no
    /// default in its schema), so their absence means a foreign producer; a missing `lora_name`
    /// in particular must not silently land LoRA blocks in the base model. `lora_id` is never
    /// required: it is ignored (LoRA is matched by name). Positional events of older releases
    /// predate `medium`, so only their leading fields are required.
    pub(super) fn required(self, tag: Tag, positional: bool) -> u32 {
        let stored = mask(&[
            Key::BlockHashes,
            Key::ParentBlockHash,
            Key::TokenIds,
            Key::BlockSize,
        ]);
        match (tag, self, positional) {
            (Tag::Cleared, ..) => 0,
            (Tag::Stored, Engine::Vllm, false) => stored | Key::Medium.bit() | Key::LoraName.bit(),
            (Tag::Stored, ..) => stored,
            (Tag::Removed, Engine::Vllm, false) => Key::BlockHashes.bit() | Key::Medium.bit(),
            (Tag::Removed, ..) => Key::BlockHashes.bit(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tag {
    Stored,
    Removed,
    Cleared,
}

impl Tag {
    pub(super) fn parse(tag: &str) -> EventResult<Tag> {
        match tag {
            "BlockStored" => Ok(Tag::Stored),
            "BlockRemoved" => Ok(Tag::Removed),
            "AllBlocksCleared" => Ok(Tag::Cleared),
            _ => invalid("type", Problem::Invalid("unknown event type")),
        }
    }

    pub(super) const fn name(self) -> &'static str {
        match self {
            Tag::Stored => "BlockStored",
            Tag::Removed => "BlockRemoved",
            Tag::Cleared => "AllBlocksCleared",
        }
    }

    pub(super) const fn allowed(self, engine: Engine) -> u32 {
        match self {
            Tag::Stored => engine.keys(),
            Tag::Removed => REMOVED_KEYS & engine.keys(),
            Tag::Cleared => Key::Type.bit(),
        }
    }
}
