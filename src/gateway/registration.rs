//! Registration input from any transport, validated once into a [`PublisherConfig`].
//!
//! gRPC and the Python client use the Python field names (`model_name`, `publisher_type`); HTTP
//! `/register` and the config file's `kvevent_instance` entries use the reference's HTTP names
//! (`modelname`, `type`). Both become a [`RegistrationInput`]; [`RegistrationInput::validate`]
//! applies the rules of `docs/python-api.md`, register(), and reports the field by the name the
//! caller used.

use crate::error::OpError;
use crate::gateway::request::{Kind, Schema};
use crate::hashing::HashProfile;
use crate::model::{HybridPart, PublisherConfig, PublisherType, normalize_tenant};

pub use crate::model::{FieldNames, HTTP_NAMES, MAX_BLOCK_SIZE, PYTHON_NAMES};

/// Fields HTTP `/register` and static config entries accept.
pub const HTTP_REGISTER_SCHEMA: Schema = &[
    ("block_size", Kind::Scalar),
    ("cache_group", Kind::Scalar),
    ("dp_rank", Kind::Scalar),
    ("endpoint", Kind::Scalar),
    ("hash_profile", Kind::Pairs),
    ("hybrid_parts", Kind::Scalar),
    ("instance_id", Kind::Scalar),
    ("lora_name", Kind::Scalar),
    ("modelname", Kind::Scalar),
    ("replay_endpoint", Kind::Scalar),
    ("tenant_id", Kind::Scalar),
    ("type", Kind::Scalar),
];

/// A registration as received, before validation. `None` means the field was absent.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegistrationInput {
    pub instance_id: Option<String>,
    pub endpoint: Option<String>,
    pub replay_endpoint: Option<String>,
    pub publisher_type: Option<String>,
    pub model_name: Option<String>,
    pub lora_name: Option<String>,
    pub tenant_id: Option<String>,
    pub block_size: Option<i128>,
    pub dp_rank: Option<i128>,
    pub cache_group: Option<i128>,
    /// Comma-separated part names (`"sliding_window,mamba"`).
    pub hybrid_parts: Option<String>,
    pub hash_profile: Option<Vec<(String, String)>>,
}

impl RegistrationInput {
    /// Apply the registration rules; errors name the field as the caller spelled it.
    pub fn validate(self, names: FieldNames) -> Result<PublisherConfig, OpError> {
        let endpoint = required(self.endpoint, "endpoint")?;
        check_endpoint("endpoint", &endpoint)?;
        let replay_endpoint = self.replay_endpoint.unwrap_or_default();
        if !replay_endpoint.is_empty() {
            check_endpoint("replay_endpoint", &replay_endpoint)?;
        }
        let type_name = self
            .publisher_type
            .unwrap_or_else(|| PublisherType::Vllm.as_str().to_owned());
        let publisher_type = PublisherType::parse(&type_name).ok_or_else(|| {
            OpError::invalid(
                names.publisher_type,
                "invalid_value",
                format!(
                    "{} must be vLLM, SGLang or Mooncake (case-sensitive), got {type_name:?}",
                    names.publisher_type
                ),
            )
        })?;
        let model_name = required(self.model_name, names.model_name)?;
        let instance_id = match (self.instance_id, publisher_type.is_engine()) {
            (Some(id), _) if !id.is_empty() => id,
            (Some(_), _) => {
                return Err(OpError::invalid(
                    "instance_id",
                    "invalid_value",
                    "instance_id must not be empty",
                ));
            }
            // A store publisher is not a routing target; its endpoint identifies it.
            (None, false) => endpoint.clone(),
            (None, true) => {
                return Err(OpError::invalid(
                    "instance_id",
                    "missing",
                    "instance_id is required",
                ));
            }
        };
        let block_size = match self.block_size {
            None => {
                return Err(OpError::invalid(
                    "block_size",
                    "missing",
                    "block_size is required",
                ));
            }
            Some(b) if (1..=MAX_BLOCK_SIZE).contains(&b) => b as u32,
            Some(_) => {
                return Err(OpError::invalid(
                    "block_size",
                    "out_of_range",
                    format!("block_size must be in 1..={MAX_BLOCK_SIZE}"),
                ));
            }
        };
        let dp_rank = match self.dp_rank.unwrap_or(0) {
            r if (0..=i32::MAX as i128).contains(&r) => r as u32,
            _ => {
                return Err(OpError::invalid(
                    "dp_rank",
                    "out_of_range",
                    "dp_rank must be a non-negative int",
                ));
            }
        };
        let cache_group = self.cache_group.map(cache_group).transpose()?;
        let pairs = self.hash_profile.ok_or_else(|| {
            OpError::invalid("hash_profile", "missing", "hash_profile is required")
        })?;
        let hash_profile =
            HashProfile::from_pairs(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())))
                .map_err(|e| OpError::invalid(e.field, e.reason, e.to_string()))?;
        let hybrid_parts = hybrid_parts(publisher_type, self.hybrid_parts.unwrap_or_default())?;
        Ok(PublisherConfig {
            instance_id,
            endpoint,
            replay_endpoint,
            publisher_type,
            model_name,
            lora_name: self.lora_name.unwrap_or_default(),
            tenant_id: normalize_tenant(self.tenant_id.as_deref().unwrap_or("")),
            block_size,
            dp_rank,
            cache_group,
            hybrid_parts,
            hash_profile,
        })
    }
}

/// A registration's `cache_group`: one of a hybrid model's KV-cache groups (its answer is then
/// that group's alone, a bound for a hybrid: see `docs/engine-events.md`, "Cache groups").
pub fn cache_group(g: i128) -> Result<u32, OpError> {
    let max = crate::events::MAX_CACHE_GROUPS;
    if (0..i128::from(max)).contains(&g) {
        return Ok(g as u32);
    }
    Err(OpError::invalid(
        "cache_group",
        "out_of_range",
        format!("cache_group must be in 0..{max} (or null: every group)"),
    ))
}

/// The parts an SGLang hybrid model has besides full attention: known names, each once. Only
/// SGLang's events leave them unsaid (vLLM names each group's kind on its events).
pub fn hybrid_parts(kind: PublisherType, names: String) -> Result<Vec<HybridPart>, OpError> {
    if names.is_empty() {
        return Ok(Vec::new());
    }
    if kind != PublisherType::Sglang {
        return Err(OpError::invalid(
            "hybrid_parts",
            "invalid_value",
            "hybrid_parts is for SGLang: vLLM's events name each KV-cache group's kind",
        ));
    }
    let mut parts = Vec::new();
    for name in names.split(',').map(str::trim) {
        let part = HybridPart::parse(name).ok_or_else(|| {
            let shown: String = name.chars().take(64).collect();
            OpError::invalid(
                "hybrid_parts",
                "invalid_value",
                format!("hybrid_parts entries must be sliding_window or mamba, got {shown:?}"),
            )
        })?;
        if parts.contains(&part) {
            return Err(OpError::invalid(
                "hybrid_parts",
                "invalid_value",
                format!("hybrid_parts names {} twice", part.as_str()),
            ));
        }
        parts.push(part);
    }
    parts.sort();
    Ok(parts)
}

fn required(value: Option<String>, field: &str) -> Result<String, OpError> {
    match value {
        None => Err(OpError::invalid(
            field,
            "missing",
            format!("{field} is required"),
        )),
        Some(v) if v.is_empty() => Err(OpError::invalid(
            field,
            "invalid_value",
            format!("{field} must not be empty"),
        )),
        Some(v) => Ok(v),
    }
}

/// A ZeroMQ endpoint the subscriber can connect to: `tcp://host:port` (IPv4, `[IPv6]` or a host
/// name) with a non-zero port.
pub fn check_endpoint(field: &str, endpoint: &str) -> Result<(), OpError> {
    let bad = |why: &str| {
        OpError::invalid(
            field,
            "invalid_value",
            format!("{field} {endpoint:?} is malformed: {why}"),
        )
    };
    let rest = endpoint
        .strip_prefix("tcp://")
        .ok_or_else(|| bad("expected tcp://host:port"))?;
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("missing :port"))?;
    let port: u16 = port
        .parse()
        .map_err(|_| bad("port must be a number in 1..=65535"))?;
    if port == 0 {
        return Err(bad("port must be a number in 1..=65535"));
    }
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host != "*"
            && host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '_')
    };
    if !host_ok {
        return Err(bad("host must be an IP address or a host name"));
    }
    endpoint
        .parse::<zeromq::Endpoint>()
        .map_err(|e| bad(&e.to_string()))?;
    Ok(())
}
