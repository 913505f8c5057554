//! The engines' own load figures, read beside their descriptions and answered with a query
//! that asks for them (`include_load`): vLLM's `GET /load` (`{"server_load": N}`, the requests
//! its API server is serving) and SGLang's `GET /v1/loads?include=core` (per DP rank
//! `num_running_reqs`, `num_waiting_reqs`, `token_usage`, ...). docs/engine-discovery.md,
//! "Load".

use serde_json::Value;

use crate::gateway::engines_api::{EngineLoad, RankLoad};

use super::fetch::{self, FetchLimits};
use super::spec::{EngineKind, EngineSpec};

/// Read `spec`'s engine's load; `None` when it cannot be read (the last figures stay, older).
pub async fn read_load(
    spec: &EngineSpec,
    limits: FetchLimits,
    max_ranks: usize,
) -> Option<EngineLoad> {
    let parsed = match spec.kind {
        EngineKind::Vllm => {
            let body = fetch::get(&spec.url, "/load", limits).await.ok()?;
            vllm_load(&body)
        }
        EngineKind::Sglang => {
            let body = fetch::get(&spec.url, "/v1/loads?include=core", limits)
                .await
                .ok()?;
            sglang_loads(&body, max_ranks)
        }
    };
    parsed.ok()
}

/// vLLM's `/load`.
pub fn vllm_load(body: &[u8]) -> Result<EngineLoad, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("/load: not JSON ({e})"))?;
    let server_load = value
        .get("server_load")
        .and_then(Value::as_u64)
        .ok_or("/load: expected {\"server_load\": N}")?;
    Ok(EngineLoad {
        server_load: Some(server_load),
        ranks: Vec::new(),
    })
}

/// SGLang's `/v1/loads`: one entry per DP rank.
pub fn sglang_loads(body: &[u8], max_ranks: usize) -> Result<EngineLoad, String> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| format!("/v1/loads: not JSON ({e})"))?;
    let Some(Value::Array(loads)) = value.get("loads") else {
        return Err("/v1/loads: expected an object with a `loads` list".into());
    };
    let mut ranks = Vec::new();
    for (i, load) in loads.iter().take(max_ranks).enumerate() {
        let count = |key: &str| load.get(key).and_then(Value::as_u64).unwrap_or(0);
        let rank = load
            .get("dp_rank")
            .and_then(Value::as_u64)
            .filter(|r| *r <= i32::MAX as u64)
            .ok_or_else(|| format!("/v1/loads: loads[{i}].dp_rank: expected a rank"))?;
        ranks.push((
            rank as u32,
            RankLoad {
                running: count("num_running_reqs"),
                waiting: count("num_waiting_reqs"),
                token_usage: load
                    .get("token_usage")
                    .and_then(Value::as_f64)
                    .unwrap_or(0.0),
            },
        ));
    }
    ranks.sort_by_key(|(r, _)| *r);
    ranks.dedup_by_key(|(r, _)| *r);
    Ok(EngineLoad {
        server_load: None,
        ranks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_engines_load_figures() {
        let v = vllm_load(br#"{"server_load": 7}"#).unwrap();
        assert_eq!((v.server_load, v.ranks.len()), (Some(7), 0));
        assert!(vllm_load(b"{}").is_err());
        let body = br#"{"timestamp": "t", "loads": [
            {"dp_rank": 1, "num_running_reqs": 3, "num_waiting_reqs": 2, "token_usage": 0.5},
            {"dp_rank": 0, "num_running_reqs": 1}]}"#;
        let s = sglang_loads(body, 8).unwrap();
        assert_eq!(s.ranks.len(), 2);
        assert_eq!(s.ranks[0].0, 0);
        assert_eq!((s.ranks[1].1.running, s.ranks[1].1.waiting), (3, 2));
        assert_eq!(s.ranks[1].1.token_usage, 0.5);
        assert!(sglang_loads(br#"{"loads": [{"dp_rank": -1}]}"#, 8).is_err());
        assert!(sglang_loads(b"[]", 8).is_err());
    }
}
