//! One reading of an engine's description over its HTTP server, by kind.

use super::describe::{self, Description};
use super::fetch::{self, FetchLimits};
use super::spec::{EngineKind, EngineSpec};

/// The most served model names kept from `/v1/models` (a base model and its adapters).
const MAX_MODELS: usize = 4096;

/// Read `spec`'s engine: vLLM's `/kv_event_sources` and, when the request names no model,
/// `/v1/models`; SGLang's `/server_info`. The error is a class, never the engine's answer
/// (a key, an endpoint, a count of it): the detail goes to this service's log only, so a URL
/// cannot be used to learn what another service on the network answers.
pub async fn read_description(
    spec: &EngineSpec,
    limits: FetchLimits,
    max_ranks: usize,
) -> Result<Description, String> {
    read_detailed(spec, limits, max_ranks)
        .await
        .map_err(|why| match why {
            Detail::Fetch(class) => class,
            Detail::Description(detail) => {
                tracing::debug!("engine {}: {detail}", spec.url.to_url());
                description_class(&detail).to_owned()
            }
        })
}

/// Why a read failed: a fetch's class (already fit for the caller), or what was wrong with
/// the answer (for the log).
enum Detail {
    Fetch(String),
    Description(String),
}

/// The class of a description the service does not take.
fn description_class(detail: &str) -> &'static str {
    if detail.contains("max_ranks_per_engine") {
        "the engine's description names more ranks than max_ranks_per_engine allows"
    } else if detail.contains("tcp://") || detail.contains("port") {
        "a rank's endpoint in the engine's description is not a tcp://host:port another host \
         can subscribe to"
    } else {
        "the engine's answer is not a description this service reads (the service's log has \
         the detail at debug level)"
    }
}

async fn read_detailed(
    spec: &EngineSpec,
    limits: FetchLimits,
    max_ranks: usize,
) -> Result<Description, Detail> {
    let fetch = |path: &'static str| async move {
        fetch::get(&spec.url, path, limits)
            .await
            .map_err(Detail::Fetch)
    };
    match spec.kind {
        EngineKind::Vllm => {
            let body = fetch("/kv_event_sources").await?;
            let sources = describe::vllm_sources(&body, max_ranks).map_err(Detail::Description)?;
            let body = fetch("/v1/models").await?;
            let models = describe::vllm_models(&body, MAX_MODELS).map_err(Detail::Description)?;
            Ok(Description { sources, models })
        }
        EngineKind::Sglang => {
            let body = fetch("/server_info").await?;
            describe::sglang_server_info(&body, max_ranks).map_err(Detail::Description)
        }
    }
}
