//! What tests ask a running server: gRPC queries, the fleet's answers, the replicas' listings and
//! the registry's health.

use mooncake_conductor::gateway::pb;

use super::fleet::{BS, MODEL, PROMPTS, prompt};
use super::http;
use super::server::Server;

pub async fn grpc_query(
    server: &Server,
    model: &str,
    tokens: Vec<i32>,
    block_size: i64,
) -> pb::QueryResponse {
    let mut client = server.grpc().await;
    let request = pb::QueryRequest {
        model_name: model.into(),
        block_size,
        token_ids: tokens,
        ..Default::default()
    };
    client
        .query(request)
        .await
        .expect("gRPC query")
        .into_inner()
}

/// Device tokens `instance` holds of `tokens` (model `m`, block size 4); 0 when it holds none.
pub async fn device_hits(server: &Server, instance: &str, tokens: &[i32]) -> i64 {
    let r = grpc_query(server, "m", tokens.to_vec(), 4).await;
    r.hits.get(instance).map_or(0, |h| h.device)
}

/// Every prompt's hits (instance e), as (device, cpu_local, disk).
pub async fn answers(server: &Server) -> Vec<(i64, i64, i64)> {
    let mut out = Vec::new();
    for p in 0..PROMPTS {
        let r = grpc_query(server, MODEL, prompt(p), BS as i64).await;
        out.push(
            r.hits
                .get("e")
                .map_or((-1, -1, -1), |h| (h.device, h.cpu_local, h.disk)),
        );
    }
    out
}

/// Device tokens instance `e` holds of prompt `p` in the adapter context `lora`.
pub async fn adapter_hits(server: &Server, lora: &str, p: i32) -> i64 {
    let request = pb::QueryRequest {
        model_name: MODEL.into(),
        lora_name: lora.into(),
        block_size: BS.into(),
        token_ids: prompt(p),
        ..Default::default()
    };
    let r = server
        .grpc()
        .await
        .query(request)
        .await
        .unwrap()
        .into_inner();
    r.hits.get("e").map_or(-1, |h| h.device)
}

/// Endpoint of every service the replica runs, by service key.
pub async fn endpoints(server: &Server) -> Vec<(String, String)> {
    let listing = http::get(server.http_port, "/services").await.json();
    let rows = listing["services"].as_array().cloned().unwrap_or_default();
    let mut out: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            let key = format!(
                "{}|{}|{}",
                r["InstanceID"].as_str().unwrap_or_default(),
                r["TenantID"].as_str().unwrap_or_default(),
                r["DPRank"]
            );
            (key, r["Endpoint"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    out.sort();
    out
}

/// `conductor_registry_etcd_up` from `/metrics`.
pub async fn etcd_up(server: &Server) -> Option<bool> {
    let text = http::get(server.http_port, "/metrics").await.text();
    let line = text
        .lines()
        .find(|l| l.starts_with("conductor_registry_etcd_up "))?;
    Some(line.ends_with(" 1"))
}
