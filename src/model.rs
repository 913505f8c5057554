//! Domain newtypes shared by every layer: who publishes, which context a block belongs to, and
//! which tier holds it. Wire formats convert into these; nothing here knows about bytes on a socket.

use std::fmt;

// Defined by `hashing` (below this module: a hash chain yields block keys, and a registration
// carries the profile that computes them); named here with the other domain types.
pub use crate::hashing::{BlockHash, HashProfile};

/// The tenant a request belongs to when it names none (`""` normalizes to this as well).
pub const DEFAULT_TENANT: &str = "default";

/// Normalize a tenant id: empty means [`DEFAULT_TENANT`].
/// Largest accepted block size, in registrations and in store events: far above any engine's,
/// small enough that token counts of a query never overflow.
pub const MAX_BLOCK_SIZE: i128 = 1 << 20;

pub fn normalize_tenant(tenant_id: &str) -> String {
    if tenant_id.is_empty() {
        DEFAULT_TENANT.to_owned()
    } else {
        tenant_id.to_owned()
    }
}

/// Cache tiers in query order. Counts are cumulative: a walk moves device → cpu_local →
/// cpu_share → disk and never back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tier {
    /// Inference-engine device memory (GPU/NPU HBM) of one (instance, rank).
    Device,
    /// Host memory of one (instance, rank): vLLM CPU offload, SGLang HiCache.
    CpuLocal,
    /// A shared CPU pool (Mooncake store) that every instance of the context can load from.
    CpuShare,
    /// Disk: rank-local when an engine reports it, shared when the Mooncake store does.
    Disk,
}

impl Tier {
    pub const ALL: [Tier; 4] = [Tier::Device, Tier::CpuLocal, Tier::CpuShare, Tier::Disk];

    /// The response field name of this tier.
    pub const fn as_str(self) -> &'static str {
        match self {
            Tier::Device => "device",
            Tier::CpuLocal => "cpu_local",
            Tier::CpuShare => "cpu_share",
            Tier::Disk => "disk",
        }
    }

    /// Position in the walk order (device = 0).
    pub const fn index(self) -> usize {
        match self {
            Tier::Device => 0,
            Tier::CpuLocal => 1,
            Tier::CpuShare => 2,
            Tier::Disk => 3,
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the blocks of one KV-cache group are reused, as the engine decides a cache hit over all
/// of a hybrid model's groups (`docs/engine-events.md`, "Cache groups").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum GroupKind {
    /// Full attention, MLA and sink full attention: the leading run of cached blocks.
    #[default]
    Full,
    /// A sliding window of `window` tokens: a boundary needs the `cdiv(window - 1, block_size)`
    /// blocks before it, or a run from block 0.
    SlidingWindow { window: u32 },
    /// Mamba and other linear-attention state: a boundary needs the state cached on the block
    /// that ends there.
    Mamba,
    /// Chunked local attention: its chunk size is not on the wire, so an answer can only be
    /// a bound.
    ChunkedLocal,
    /// A kind this service does not know (or a window without its size): a bound.
    Unknown,
}

impl GroupKind {
    /// The kind of a vLLM `kv_cache_spec_kind` (with `kv_cache_spec_sliding_window`); no kind
    /// and no window is full attention, as vLLM's single-group events before the kinds were.
    pub fn from_vllm(kind: Option<&str>, window: Option<i64>) -> Self {
        let windowed = |window: Option<i64>| match window.and_then(|w| u32::try_from(w).ok()) {
            Some(window) if window > 0 => GroupKind::SlidingWindow { window },
            _ => GroupKind::Unknown,
        };
        let Some(kind) = kind else {
            return match window {
                None => GroupKind::Full,
                Some(_) => windowed(window),
            };
        };
        // Compared in place, case-insensitively: every stored event names its kind, and a
        // lower-cased copy of it would be an allocation per event.
        let is = |names: &[&str]| names.iter().any(|n| kind.eq_ignore_ascii_case(n));
        if is(&["full_attention", "mla_attention", "sink_full_attention"]) && window.is_none() {
            GroupKind::Full
        } else if is(&["sliding_window", "sliding_window_mla"]) {
            windowed(window)
        } else if is(&["mamba"]) {
            GroupKind::Mamba
        } else if is(&["chunked_local_attention"]) {
            GroupKind::ChunkedLocal
        } else {
            GroupKind::Unknown
        }
    }

    /// The name `/services/status`, the answers' status and the metrics use.
    pub const fn family(self) -> &'static str {
        match self {
            GroupKind::Full => "full_attention",
            GroupKind::SlidingWindow { .. } => "sliding_window",
            GroupKind::Mamba => "mamba",
            GroupKind::ChunkedLocal => "chunked_local_attention",
            GroupKind::Unknown => "unknown",
        }
    }

    /// The family names, in [`GroupKind::kind_index`] order (metrics label them).
    pub const KINDS: [&'static str; 5] = [
        "full_attention",
        "sliding_window",
        "mamba",
        "chunked_local_attention",
        "unknown",
    ];

    /// This kind's position in [`GroupKind::KINDS`].
    pub const fn kind_index(self) -> usize {
        match self {
            GroupKind::Full => 0,
            GroupKind::SlidingWindow { .. } => 1,
            GroupKind::Mamba => 2,
            GroupKind::ChunkedLocal => 3,
            GroupKind::Unknown => 4,
        }
    }

    /// The window in tokens of a sliding-window group.
    pub const fn window(self) -> Option<u32> {
        match self {
            GroupKind::SlidingWindow { window } => Some(window),
            _ => None,
        }
    }

    /// Whether the engine's rule for this kind is one the service reproduces exactly.
    pub const fn exact(self) -> bool {
        matches!(
            self,
            GroupKind::Full | GroupKind::SlidingWindow { .. } | GroupKind::Mamba
        )
    }
}

/// Identity of one prefix index. Every registration feeding a context carries the same resolved
/// hash profile. `cache_salt`, instance and rank are deliberately not part of the key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContextKey {
    pub tenant_id: String,
    pub model_name: String,
    pub lora_name: String,
    pub block_size: u32,
}

impl ContextKey {
    /// Build a key, normalizing an empty tenant to [`DEFAULT_TENANT`].
    pub fn new(tenant_id: &str, model_name: &str, lora_name: &str, block_size: u32) -> Self {
        ContextKey {
            tenant_id: normalize_tenant(tenant_id),
            model_name: model_name.to_owned(),
            lora_name: lora_name.to_owned(),
            block_size,
        }
    }

    /// The same context under another LoRA adapter (events name the adapter that picks the context).
    pub fn with_lora(&self, lora_name: &str) -> Self {
        ContextKey {
            lora_name: lora_name.to_owned(),
            ..self.clone()
        }
    }
}

impl fmt::Display for ContextKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.tenant_id, self.model_name, self.lora_name, self.block_size
        )
    }
}

/// Identity of one publisher subscription; rendered `instance_id|tenant_id|dp_rank` like the
/// reference's service key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubscriptionKey {
    pub instance_id: String,
    pub tenant_id: String,
    pub dp_rank: u32,
}

impl SubscriptionKey {
    pub fn new(instance_id: &str, tenant_id: &str, dp_rank: u32) -> Self {
        SubscriptionKey {
            instance_id: instance_id.to_owned(),
            tenant_id: normalize_tenant(tenant_id),
            dp_rank,
        }
    }

    /// The key its text (`instance|tenant|rank`, [`fmt::Display`]) names; the instance may
    /// itself contain `|`.
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.rsplitn(3, '|');
        let (rank, tenant, instance) = (parts.next()?, parts.next()?, parts.next()?);
        Some(SubscriptionKey::new(instance, tenant, rank.parse().ok()?))
    }
}

impl fmt::Display for SubscriptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}|{}|{}",
            self.instance_id, self.tenant_id, self.dp_rank
        )
    }
}

/// The kind of publisher, which picks the payload decoder. Names are case-sensitive on every API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PublisherType {
    Vllm,
    Sglang,
    Mooncake,
}

impl PublisherType {
    pub const ALL: [PublisherType; 3] = [
        PublisherType::Vllm,
        PublisherType::Sglang,
        PublisherType::Mooncake,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            PublisherType::Vllm => "vLLM",
            PublisherType::Sglang => "SGLang",
            PublisherType::Mooncake => "Mooncake",
        }
    }

    /// Parse the exact (case-sensitive) API name.
    pub fn parse(name: &str) -> Option<Self> {
        PublisherType::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// Engines own their blocks per (instance, rank); the Mooncake store publishes shared tiers.
    pub const fn is_engine(self) -> bool {
        !matches!(self, PublisherType::Mooncake)
    }
}

impl fmt::Display for PublisherType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One validated publisher registration, with the seed's field names and defaults
/// (`docs/python-api.md`, register()). Built only by the registration validator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherConfig {
    pub instance_id: String,
    pub endpoint: String,
    /// `""` when the publisher has no replay socket.
    pub replay_endpoint: String,
    pub publisher_type: PublisherType,
    pub model_name: String,
    /// `""` selects the base model.
    pub lora_name: String,
    /// Already normalized: never empty.
    pub tenant_id: String,
    pub block_size: u32,
    pub dp_rank: u32,
    /// `None`: every KV-cache group of the engine is indexed; `Some(g)`: only group `g` (the
    /// answer is then that group's alone: for a hybrid model a bound, which `include_status`
    /// says).
    pub cache_group: Option<u32>,
    /// An SGLang hybrid model's parts besides full attention, as its registration declares
    /// them (SGLang's events do not say): its answers are then bounds (`include_status`).
    pub hybrid_parts: Vec<HybridPart>,
    pub hash_profile: HashProfile,
}

/// A part of a hybrid model besides full attention, as a registration names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HybridPart {
    SlidingWindow,
    Mamba,
}

impl HybridPart {
    pub const ALL: [HybridPart; 2] = [HybridPart::SlidingWindow, HybridPart::Mamba];

    pub const fn as_str(self) -> &'static str {
        match self {
            HybridPart::SlidingWindow => "sliding_window",
            HybridPart::Mamba => "mamba",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        HybridPart::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

impl PublisherConfig {
    pub fn subscription_key(&self) -> SubscriptionKey {
        SubscriptionKey::new(&self.instance_id, &self.tenant_id, self.dp_rank)
    }

    /// The context this registration feeds with base-model blocks.
    pub fn context_key(&self) -> ContextKey {
        ContextKey::new(
            &self.tenant_id,
            &self.model_name,
            &self.lora_name,
            self.block_size,
        )
    }
}

/// Which names the caller used for the two [`PublisherConfig`] fields whose names differ between
/// APIs (Python and gRPC, or HTTP and the config file), so that an error names the field as sent.
#[derive(Debug, Clone, Copy)]
pub struct FieldNames {
    pub model_name: &'static str,
    pub publisher_type: &'static str,
}

pub const PYTHON_NAMES: FieldNames = FieldNames {
    model_name: "model_name",
    publisher_type: "publisher_type",
};
pub const HTTP_NAMES: FieldNames = FieldNames {
    model_name: "modelname",
    publisher_type: "type",
};

/// The registration most unit tests start from (and change a field or two of).
#[cfg(test)]
impl PublisherConfig {
    /// vLLM at `endpoint`: model "m", the default tenant, block size 16, rank 0, the
    /// `vllm_cbor_default` profile.
    pub(crate) fn test_vllm(instance_id: &str, endpoint: &str) -> Self {
        PublisherConfig {
            instance_id: instance_id.into(),
            endpoint: endpoint.into(),
            replay_endpoint: String::new(),
            publisher_type: PublisherType::Vllm,
            model_name: "m".into(),
            lora_name: String::new(),
            tenant_id: DEFAULT_TENANT.into(),
            block_size: 16,
            dp_rank: 0,
            cache_group: None,
            hybrid_parts: Vec::new(),
            hash_profile: crate::hashing::profile::vllm_cbor_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_tenant_is_default() {
        assert_eq!(ContextKey::new("", "m", "", 16).tenant_id, "default");
        assert_eq!(SubscriptionKey::new("i", "", 3).to_string(), "i|default|3");
        assert_eq!(SubscriptionKey::new("i", "t", 0).to_string(), "i|t|0");
    }

    #[test]
    fn publisher_type_is_case_sensitive() {
        assert_eq!(PublisherType::parse("vLLM"), Some(PublisherType::Vllm));
        assert_eq!(PublisherType::parse("SGLang"), Some(PublisherType::Sglang));
        assert_eq!(
            PublisherType::parse("Mooncake"),
            Some(PublisherType::Mooncake)
        );
        assert_eq!(PublisherType::parse("vllm"), None);
        assert_eq!(PublisherType::parse("sglang"), None);
    }

    #[test]
    fn tiers_walk_in_order() {
        let order: Vec<usize> = Tier::ALL.iter().map(|t| t.index()).collect();
        assert_eq!(order, vec![0, 1, 2, 3]);
        assert!(Tier::Device < Tier::CpuLocal && Tier::CpuShare < Tier::Disk);
    }
}
