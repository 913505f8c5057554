//! Engine payload builders (vLLM 0.33 map events in an array batch, SGLang, Mooncake store maps)
//! and the block hashes a real engine would publish for a prompt.

use mooncake_conductor::hashing::HashProfile;
use rmpv::Value;

pub fn vllm_cbor_profile() -> serde_json::Value {
    serde_json::json!({
        "strategy": "vllm_v1", "algorithm": "sha256_cbor", "python_hash_seed": "0", "index_projection": "low64_be",
    })
}

pub fn sglang_profile() -> serde_json::Value {
    serde_json::json!({
        "strategy": "sglang", "algorithm": "sha256_raw", "python_hash_seed": "0", "index_projection": "first64_be",
    })
}

fn resolve(profile: &serde_json::Value) -> HashProfile {
    let get = |k: &str| profile.get(k).and_then(|v| v.as_str());
    HashProfile::resolve(
        get("strategy"),
        get("algorithm"),
        get("python_hash_seed"),
        get("index_projection"),
    )
    .expect("test profile")
}

/// The 64-bit keys an engine publishes for the blocks of `tokens` (complete blocks for vLLM;
/// SGLang pages including a partial last one).
pub fn block_keys(
    profile: &serde_json::Value,
    tokens: &[i32],
    block_size: u32,
    lora: &str,
) -> Vec<u64> {
    salted_block_keys(profile, tokens, block_size, lora, "")
}

/// [`block_keys`] of a request with `cache_salt` (`""` for none).
pub fn salted_block_keys(
    profile: &serde_json::Value,
    tokens: &[i32],
    block_size: u32,
    lora: &str,
    cache_salt: &str,
) -> Vec<u64> {
    use mooncake_conductor::hashing::PrefixKeys;
    let profile = resolve(profile);
    let hasher = profile.hasher(lora, cache_salt);
    let mut chain = hasher.chain(block_size, tokens);
    (0..chain.num_blocks()).map(|i| chain.key(i).0).collect()
}

fn s(v: &str) -> Value {
    Value::from(v)
}

fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).expect("encode msgpack");
    out
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (s(k), v)).collect())
}

/// A vLLM 0.33 `BlockStored` map event.
pub fn vllm_stored(
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[i32],
    block_size: u32,
    medium: &str,
    lora: Option<&str>,
) -> Value {
    map(vec![
        ("type", s("BlockStored")),
        (
            "block_hashes",
            Value::Array(hashes.iter().map(|h| Value::from(*h)).collect()),
        ),
        ("parent_block_hash", parent.map_or(Value::Nil, Value::from)),
        (
            "token_ids",
            Value::Array(tokens.iter().map(|t| Value::from(*t)).collect()),
        ),
        ("block_size", Value::from(block_size)),
        (
            "lora_id",
            if lora.is_some() {
                Value::from(1)
            } else {
                Value::Nil
            },
        ),
        ("medium", s(medium)),
        ("lora_name", lora.map_or(Value::Nil, s)),
        (
            "extra_keys",
            Value::Array(hashes.iter().map(|_| Value::Nil).collect()),
        ),
        ("group_idx", Value::from(0)),
        ("kv_cache_spec_kind", s("full_attention")),
    ])
}

/// `event` (a map) without `key`, as a publisher that leaves an optional field out sends it.
pub fn without(event: Value, key: &str) -> Value {
    match event {
        Value::Map(pairs) => Value::Map(
            pairs
                .into_iter()
                .filter(|(k, _)| k.as_str() != Some(key))
                .collect(),
        ),
        other => other,
    }
}

pub fn vllm_removed(hashes: &[u64], medium: &str) -> Value {
    map(vec![
        ("type", s("BlockRemoved")),
        (
            "block_hashes",
            Value::Array(hashes.iter().map(|h| Value::from(*h)).collect()),
        ),
        ("medium", s(medium)),
        ("group_idx", Value::from(0)),
    ])
}

pub fn vllm_cleared() -> Value {
    map(vec![("type", s("AllBlocksCleared"))])
}

/// `[ts, events, dp_rank]`, msgspec's array batch.
pub fn batch(events: Vec<Value>, dp_rank: u32) -> Vec<u8> {
    encode(&Value::Array(vec![
        Value::F64(1_700_000_000.0),
        Value::Array(events),
        Value::from(dp_rank),
    ]))
}

/// Store the blocks of `tokens` on `medium`: one `BlockStored` with every complete block.
pub fn vllm_store_prompt(
    profile: &serde_json::Value,
    tokens: &[i32],
    block_size: u32,
    medium: &str,
    dp_rank: u32,
) -> Vec<u8> {
    let keys = block_keys(profile, tokens, block_size, "");
    let used = keys.len() * block_size as usize;
    batch(
        vec![vllm_stored(
            &keys,
            None,
            &tokens[..used],
            block_size,
            medium,
            None,
        )],
        dp_rank,
    )
}

/// `event` (a map) with `key` set to `value`, replacing it when present.
pub fn with_field(event: Value, key: &str, value: Value) -> Value {
    let Value::Map(mut fields) = event else {
        return event;
    };
    match fields.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
        Some((_, v)) => *v = value,
        None => fields.push((s(key), value)),
    }
    Value::Map(fields)
}

/// Store the blocks of `tokens` as a window-first hybrid model does (Gemma: group 0 a sliding
/// window of `window` tokens, group 1 full attention), in one step: the window group keeps only
/// its last `window_blocks` blocks (the others are its null blocks, left out of its
/// `block_hashes` while its `token_ids` cover the whole range), the full group every block.
pub fn vllm_store_prompt_window_first(
    profile: &serde_json::Value,
    tokens: &[i32],
    block_size: u32,
    window: u32,
    window_blocks: usize,
) -> Vec<u8> {
    let keys = block_keys(profile, tokens, block_size, "");
    let used = keys.len() * block_size as usize;
    let kept = &keys[keys.len().saturating_sub(window_blocks)..];
    let mut window_group = vllm_stored(kept, None, &tokens[..used], block_size, "GPU", None);
    window_group = with_field(window_group, "kv_cache_spec_kind", s("sliding_window"));
    window_group = with_field(
        window_group,
        "kv_cache_spec_sliding_window",
        Value::from(window),
    );
    let full = vllm_stored(&keys, None, &tokens[..used], block_size, "GPU", None);
    let full = with_field(full, "group_idx", Value::from(1));
    batch(vec![window_group, full], 0)
}

/// A Mooncake store object event (dev/conductor publisher maps).
pub fn mooncake_event(
    kind: &str,
    model: &str,
    block_size: u32,
    backend: &str,
    object_key: &str,
    medium: &str,
    hash: u64,
) -> Value {
    let mut fields = vec![
        ("event_id", Value::from(1)),
        ("timestamp", Value::from(1_700_000_000_000u64)),
        ("event_type", s(kind)),
        ("model_name", s(model)),
        ("block_size", Value::from(block_size)),
        ("additional_salt", Value::Nil),
        ("lora_name", Value::Nil),
        ("tenant_id", s("default")),
        ("backend_id", s(backend)),
        ("medium", s(medium)),
        ("dp_rank", Value::from(0)),
        ("group_id", Value::Nil),
        ("object_key", s(object_key)),
        ("seq_hashes", Value::Array(vec![Value::from(hash)])),
        ("base_block_idx", Value::Nil),
    ];
    // Only `stored` events carry the (nil) parent and token fields, as the store publisher does.
    if kind == "stored" {
        fields.push(("parent_hash", Value::Nil));
        fields.push(("token_ids", Value::Nil));
    }
    map(fields)
}

/// `[timestamp_ms, events, dp_rank]` of the Mooncake store publisher.
pub fn mooncake_batch(events: Vec<Value>) -> Vec<u8> {
    encode(&Value::Array(vec![
        Value::from(1_700_000_000_000u64),
        Value::Array(events),
        Value::from(0),
    ]))
}

/// A registration, built from the common case: a vLLM publisher of model `m`, block size 4,
/// DP rank 0, the vLLM CBOR hash profile, no replay endpoint.
#[derive(Debug, Clone)]
pub struct Registration {
    instance: String,
    endpoint: String,
    replay: Option<String>,
    kind: String,
    model: String,
    block_size: u32,
    rank: u32,
    profile: serde_json::Value,
}

impl Registration {
    /// A publisher of type `kind` (`vLLM`, `SGLang`, `Mooncake`) with the defaults.
    pub fn new(kind: &str, instance: &str, endpoint: &str) -> Registration {
        Registration {
            instance: instance.to_owned(),
            endpoint: endpoint.to_owned(),
            replay: None,
            kind: kind.to_owned(),
            model: "m".to_owned(),
            block_size: 4,
            rank: 0,
            profile: vllm_cbor_profile(),
        }
    }

    pub fn vllm(instance: &str, endpoint: &str) -> Registration {
        Registration::new("vLLM", instance, endpoint)
    }

    /// An SGLang publisher, with SGLang's hash profile.
    pub fn sglang(instance: &str, endpoint: &str) -> Registration {
        Registration::new("SGLang", instance, endpoint).profile(sglang_profile())
    }

    pub fn mooncake(instance: &str, endpoint: &str) -> Registration {
        Registration::new("Mooncake", instance, endpoint)
    }

    pub fn replay(mut self, replay: Option<&str>) -> Registration {
        self.replay = replay.map(str::to_owned);
        self
    }

    pub fn model(mut self, model: &str) -> Registration {
        self.model = model.to_owned();
        self
    }

    pub fn block_size(mut self, block_size: u32) -> Registration {
        self.block_size = block_size;
        self
    }

    pub fn rank(mut self, rank: u32) -> Registration {
        self.rank = rank;
        self
    }

    pub fn profile(mut self, profile: serde_json::Value) -> Registration {
        self.profile = profile;
        self
    }

    /// In Python field names (gRPC), as JSON for convenience.
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "instance_id": self.instance, "endpoint": self.endpoint,
            "replay_endpoint": self.replay.as_deref().unwrap_or(""),
            "publisher_type": self.kind, "model_name": self.model,
            "block_size": self.block_size, "dp_rank": self.rank, "hash_profile": self.profile,
        })
    }

    /// With the HTTP names (`modelname`, `type`).
    pub fn http(&self) -> serde_json::Value {
        http_registration(&self.json())
    }
}

/// The same registration with the HTTP names (`modelname`, `type`).
pub fn http_registration(python: &serde_json::Value) -> serde_json::Value {
    let mut m = python.as_object().cloned().unwrap_or_default();
    if let Some(v) = m.remove("model_name") {
        m.insert("modelname".into(), v);
    }
    if let Some(v) = m.remove("publisher_type") {
        m.insert("type".into(), v);
    }
    serde_json::Value::Object(m)
}
