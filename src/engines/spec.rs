//! An engine registration validated ([`EngineSpec`]), and the rank registrations one reading of
//! its description asks for ([`wanted_ranks`]): the request's fields where it gives them, the
//! engine's where it does not, the documented defaults last, and a request that contradicts
//! the engine refused with the field named (docs/engine-discovery.md, "Registering an engine").

use std::collections::BTreeMap;

use crate::error::OpError;
use crate::gateway::engines_api::{EngineRequest, RankRegistration};
use crate::gateway::registration::{MAX_BLOCK_SIZE, RegistrationInput};
use crate::hashing::HashProfile;
use crate::model::{HybridPart, PublisherType, normalize_tenant};

use super::address::{EngineUrl, reachable_endpoint};
use super::describe::Description;

/// vLLM's default `--block-size` on GPUs; vLLM's description does not carry its block size.
pub const DEFAULT_VLLM_BLOCK_SIZE: u32 = 16;

/// The engines that describe their KV-event sources over HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum EngineKind {
    #[serde(rename = "vLLM")]
    Vllm,
    #[serde(rename = "SGLang")]
    Sglang,
}

impl EngineKind {
    pub fn parse(text: &str) -> Option<EngineKind> {
        match text {
            "vLLM" => Some(EngineKind::Vllm),
            "SGLang" => Some(EngineKind::Sglang),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vLLM",
            EngineKind::Sglang => "SGLang",
        }
    }

    /// The recipe an engine started without hash options uses: vLLM 0.33 hashes with `sha256`
    /// (pickle) from a seed it draws at random unless `PYTHONHASHSEED` is set, so the index
    /// keeps its published hashes and derives keys from the token ids its events carry; SGLang
    /// hashes raw SHA-256 and needs no seed.
    pub fn default_profile(self) -> Vec<(String, String)> {
        let pairs: &[(&str, &str)] = match self {
            EngineKind::Vllm => &[
                ("strategy", "vllm_v1"),
                ("algorithm", "sha256"),
                ("python_hash_seed", "random"),
                ("index_projection", "low64_be"),
            ],
            EngineKind::Sglang => &[
                ("strategy", "sglang"),
                ("algorithm", "sha256_raw"),
                ("index_projection", "first64_be"),
            ],
        };
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }
}

/// Where an engine came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    Request,
    Config,
    Dns,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Request => "request",
            Origin::Config => "config",
            Origin::Dns => "dns",
        }
    }
}

/// A validated engine registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineSpec {
    pub url: EngineUrl,
    pub kind: EngineKind,
    pub instance_id: String,
    pub tenant_id: String,
    /// As requested; `None`: the engine's first served model.
    pub model_name: Option<String>,
    /// As requested; `None`: the engine's, else [`DEFAULT_VLLM_BLOCK_SIZE`].
    pub block_size: Option<u32>,
    /// As requested, else the kind's default.
    pub hash_profile: Vec<(String, String)>,
    /// An SGLang hybrid model's parts besides full attention, as requested (SGLang's
    /// description does not say them), each rank registered with them.
    pub hybrid_parts: Vec<HybridPart>,
    pub origin: Origin,
}

impl EngineSpec {
    /// Validate a request; `type_field` is how the caller spells the engine type's field.
    pub fn from_request(
        request: EngineRequest,
        type_field: &'static str,
        origin: Origin,
    ) -> Result<EngineSpec, OpError> {
        let url_text = request
            .url
            .filter(|u| !u.is_empty())
            .ok_or_else(|| OpError::invalid("url", "missing", "url is required"))?;
        let url = EngineUrl::parse(&url_text).map_err(|why| {
            OpError::invalid("url", "invalid_value", format!("url {url_text:?}: {why}"))
        })?;
        let type_name = request.engine_type.unwrap_or_else(|| "vLLM".to_owned());
        let kind = EngineKind::parse(&type_name).ok_or_else(|| {
            let message = format!(
                "{type_field} must be vLLM or SGLang (the engines that describe their event sources), got {type_name:?}"
            );
            OpError::invalid(type_field, "invalid_value", message)
        })?;
        let instance_id = match request.instance_id {
            None => url.authority(),
            Some(id) if id.is_empty() => {
                let message = "instance_id must not be empty";
                return Err(OpError::invalid("instance_id", "invalid_value", message));
            }
            Some(id) => id,
        };
        let block_size = match request.block_size {
            None => None,
            Some(b) if (1..=MAX_BLOCK_SIZE).contains(&b) => Some(b as u32),
            Some(_) => {
                let message = format!("block_size must be in 1..={MAX_BLOCK_SIZE}");
                return Err(OpError::invalid("block_size", "out_of_range", message));
            }
        };
        if request.model_name.as_deref() == Some("") {
            let message = "model_name must not be empty";
            return Err(OpError::invalid("model_name", "invalid_value", message));
        }
        let hash_profile = request
            .hash_profile
            .unwrap_or_else(|| kind.default_profile());
        HashProfile::from_pairs(hash_profile.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map_err(|e| OpError::invalid(e.field, e.reason, e.to_string()))?;
        let publisher = match kind {
            EngineKind::Vllm => PublisherType::Vllm,
            EngineKind::Sglang => PublisherType::Sglang,
        };
        let hybrid_parts = crate::gateway::registration::hybrid_parts(
            publisher,
            request.hybrid_parts.unwrap_or_default(),
        )?;
        Ok(EngineSpec {
            url,
            kind,
            instance_id,
            tenant_id: normalize_tenant(request.tenant_id.as_deref().unwrap_or("")),
            model_name: request.model_name,
            block_size,
            hash_profile,
            hybrid_parts,
            origin,
        })
    }

    /// The engine's key among engines: its ranks' registrations share it.
    pub fn key(&self) -> (String, String) {
        (self.tenant_id.clone(), self.instance_id.clone())
    }
}

/// One rank as registered: what a later description is compared with.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RankPlan {
    pub endpoint: String,
    pub replay_endpoint: String,
    pub topic: String,
    pub block_size: u32,
    pub model_name: String,
}

impl RankPlan {
    pub fn report(&self, dp_rank: u32) -> RankRegistration {
        RankRegistration {
            dp_rank,
            endpoint: self.endpoint.clone(),
            replay_endpoint: self.replay_endpoint.clone(),
            topic: self.topic.clone(),
            block_size: self.block_size,
        }
    }

    /// Whether both plans register the same subscription (the topic is reported only).
    pub fn registers_as(&self, other: &RankPlan) -> bool {
        (
            &self.endpoint,
            &self.replay_endpoint,
            self.block_size,
            &self.model_name,
        ) == (
            &other.endpoint,
            &other.replay_endpoint,
            other.block_size,
            &other.model_name,
        )
    }

    /// The registration of this rank, as `register()` takes it.
    pub fn input(&self, spec: &EngineSpec, dp_rank: u32) -> RegistrationInput {
        RegistrationInput {
            instance_id: Some(spec.instance_id.clone()),
            endpoint: Some(self.endpoint.clone()),
            replay_endpoint: Some(self.replay_endpoint.clone()),
            publisher_type: Some(spec.kind.as_str().to_owned()),
            model_name: Some(self.model_name.clone()),
            lora_name: None,
            tenant_id: Some(spec.tenant_id.clone()),
            block_size: Some(self.block_size as i128),
            dp_rank: Some(dp_rank as i128),
            cache_group: None,
            hybrid_parts: Some(parts_text(&spec.hybrid_parts)),
            hash_profile: Some(spec.hash_profile.clone()),
        }
    }
}

/// The rank registrations `description` asks for under `spec`. An engine that names no
/// source, or a request that contradicts it, is an error naming the field.
/// `allow_local`: endpoints may name loopback, link-local, multicast or unspecified addresses
/// (`allow_local_engine_addresses`; a loopback or wildcard endpoint already stands for the
/// engine's own host and becomes the URL's host).
pub fn wanted_ranks(
    spec: &EngineSpec,
    description: &Description,
    allow_local: bool,
) -> Result<BTreeMap<u32, RankPlan>, OpError> {
    let url = spec.url.to_url();
    if description.sources.is_empty() {
        let message = format!(
            "the engine at {url} reports no KV-event source: start it with KV events on a ZeroMQ publisher (docs/engine-discovery.md)"
        );
        return Err(OpError::invalid("url", "no_event_sources", message));
    }
    let model_name = match (&spec.model_name, description.models.first()) {
        (Some(asked), _) if description.models.is_empty() || description.models.contains(asked) => {
            asked.clone()
        }
        (Some(asked), _) => {
            // Which models it serves is the engine's answer: not echoed to the caller.
            let message = format!("model_name {asked:?}: the engine at {url} does not serve it");
            return Err(OpError::invalid("model_name", "conflict", message));
        }
        (None, Some(served)) => served.clone(),
        (None, None) => {
            let message = format!("the engine at {url} names no served model: give model_name");
            return Err(OpError::invalid("model_name", "missing", message));
        }
    };
    let mut wanted = BTreeMap::new();
    for (rank, source) in &description.sources {
        let block_size = match (spec.block_size, source.block_size) {
            (Some(asked), Some(reported)) if asked != reported => {
                let message = format!(
                    "block_size {asked}: the engine at {url} reports {reported} for DP rank {rank}"
                );
                return Err(OpError::invalid("block_size", "conflict", message));
            }
            (Some(b), _) | (None, Some(b)) => b,
            (None, None) => DEFAULT_VLLM_BLOCK_SIZE,
        };
        let rewrite = |reported: &str| {
            let endpoint = reachable_endpoint(reported, &spec.url).map_err(|why| {
                // The endpoint is the engine's answer: logged, not echoed to the caller.
                tracing::debug!("the engine at {url} describes DP rank {rank}: {why}");
                let message = format!(
                    "the engine at {url} describes DP rank {rank} with an endpoint that is not \
                     a tcp://host:port another host can subscribe to"
                );
                OpError::invalid("url", "bad_description", message)
            })?;
            if !allow_local && local_endpoint(&endpoint) {
                let message = format!(
                    "the engine at {url} describes DP rank {rank} with an endpoint on a \
                     link-local, multicast or unspecified address (allow_local_engine_addresses \
                     allows it)"
                );
                return Err(OpError::invalid("url", "not_allowed", message));
            }
            Ok(endpoint)
        };
        let endpoint = rewrite(&source.endpoint)?;
        let replay_endpoint = match &source.replay_endpoint {
            Some(r) => rewrite(r)?,
            None => String::new(),
        };
        let plan = RankPlan {
            endpoint,
            replay_endpoint,
            topic: source.topic.clone(),
            block_size,
            model_name: model_name.clone(),
        };
        wanted.insert(*rank, plan);
    }
    Ok(wanted)
}

/// Whether a `tcp://host:port` endpoint names a loopback, link-local, multicast or unspecified
/// IP address (a host name is checked by the registration policy, never resolved here).
fn local_endpoint(endpoint: &str) -> bool {
    let host = endpoint
        .strip_prefix("tcp://")
        .and_then(|rest| rest.rsplit_once(':'))
        .map_or("", |(host, _)| host);
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<std::net::IpAddr>()
        .is_ok_and(super::fetch::local_address)
}

/// Hybrid parts as a registration names them: comma-separated.
pub fn parts_text(parts: &[HybridPart]) -> String {
    parts
        .iter()
        .map(|p| p.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::local_endpoint;

    #[test]
    fn endpoints_on_local_addresses_are_told_apart_from_the_rest() {
        for e in [
            "tcp://169.254.1.2:5557",
            "tcp://224.0.0.1:5557",
            "tcp://[fe80::1]:5557",
        ] {
            assert!(local_endpoint(e), "{e}");
        }
        for e in [
            "tcp://10.0.0.5:5557",
            "tcp://[fd00::5]:5557",
            "tcp://vllm-0.ns.svc:5557",
        ] {
            assert!(!local_endpoint(e), "{e}");
        }
    }
}
