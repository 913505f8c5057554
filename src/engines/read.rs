//! One reading of an engine's description over its HTTP server, by kind.

use super::describe::{self, Description};
use super::fetch::{self, FetchLimits};
use super::spec::{EngineKind, EngineSpec};

/// The most served model names kept from `/v1/models` (a base model and its adapters).
const MAX_MODELS: usize = 4096;

/// Read `spec`'s engine: vLLM's `/kv_event_sources` and, when the request names no model,
/// `/v1/models`; SGLang's `/server_info`. The error says which route failed and why.
pub async fn read_description(
    spec: &EngineSpec,
    limits: FetchLimits,
    max_ranks: usize,
) -> Result<Description, String> {
    match spec.kind {
        EngineKind::Vllm => {
            let body = fetch::get(&spec.url, "/kv_event_sources", limits).await?;
            let sources = describe::vllm_sources(&body, max_ranks)?;
            let body = fetch::get(&spec.url, "/v1/models", limits).await?;
            let models = describe::vllm_models(&body, MAX_MODELS)?;
            Ok(Description { sources, models })
        }
        EngineKind::Sglang => {
            let body = fetch::get(&spec.url, "/server_info", limits).await?;
            describe::sglang_server_info(&body, max_ranks)
        }
    }
}
