//! HTTP `/engines`: register an engine by its URL (`POST`), list the engines followed (`GET`),
//! remove one with all its ranks (`DELETE /engines/{instance_id}?tenant_id=`). Shapes in
//! `docs/engine-discovery.md`, "HTTP".

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::{Value as Json, json};

use crate::error::OpError;
use crate::gateway::engines_api::{EngineReply, EngineRequest, EngineStatus, LoadReport};
use crate::gateway::http_decode::{Http, decode_body};
use crate::gateway::http_register::check_profile;
use crate::gateway::http_reply::{Format, encode, error_response};
use crate::gateway::request::{Kind, Schema};
use crate::gateway::value::{Fields, Val};

/// Fields `POST /engines` accepts.
pub const ENGINE_SCHEMA: Schema = &[
    ("block_size", Kind::Scalar),
    ("hash_profile", Kind::Pairs),
    ("hybrid_parts", Kind::Scalar),
    ("instance_id", Kind::Scalar),
    ("model_name", Kind::Scalar),
    ("tenant_id", Kind::Scalar),
    ("type", Kind::Scalar),
    ("url", Kind::Scalar),
];

/// Read a `POST /engines` body decoded with [`ENGINE_SCHEMA`].
pub fn engine_request(mut f: Fields) -> Result<EngineRequest, OpError> {
    let url = Some(f.req_str("url")?);
    let block_size = match f.get("block_size") {
        None | Some(Val::Null) => None,
        Some(Val::Int(b)) => Some(*b),
        Some(_) => {
            let message = "block_size must be an integer";
            return Err(OpError::invalid("block_size", "invalid_type", message));
        }
    };
    let hash_profile = match f.take("hash_profile") {
        None | Some(Val::Null) => None,
        Some(Val::Pairs(pairs)) => Some(check_profile(pairs)?),
        Some(Val::Invalid(e)) => return Err(e),
        Some(_) => {
            let message = "hash_profile must be a map";
            return Err(OpError::invalid("hash_profile", "invalid_type", message));
        }
    };
    // An optional field sent as null is absent.
    let text = |key: &str| match f.get(key) {
        None | Some(Val::Null) => Ok(None),
        Some(_) => f.opt_str(key),
    };
    Ok(EngineRequest {
        url,
        engine_type: text("type")?,
        instance_id: text("instance_id")?,
        tenant_id: text("tenant_id")?,
        model_name: text("model_name")?,
        block_size,
        hash_profile,
        hybrid_parts: text("hybrid_parts")?,
    })
}

pub(super) async fn register(State(state): State<Http>, request: Request) -> Response {
    let d = match decode_body(&state, request, ENGINE_SCHEMA).await {
        Ok(d) => d,
        Err(r) => return r,
    };
    let result = async {
        let request = engine_request(d.fields)?;
        state.ops.engines()?.register(request).await
    }
    .await;
    match result {
        Ok(reply) => encode(StatusCode::OK, &reply_body(&reply), d.reply),
        Err(e) => error_response(&e, d.reply),
    }
}

#[derive(serde::Deserialize)]
pub(super) struct TenantQuery {
    tenant_id: Option<String>,
}

pub(super) async fn unregister(
    State(state): State<Http>,
    Path(instance_id): Path<String>,
    Query(query): Query<TenantQuery>,
    headers: HeaderMap,
) -> Response {
    let format = Format::of_request(&headers);
    let tenant_id = query.tenant_id.unwrap_or_default();
    let result = async {
        let engines = state.ops.engines()?;
        engines.unregister(instance_id.clone(), tenant_id).await
    }
    .await;
    match result {
        Ok(removed) => {
            let body =
                json!({"status": "removed", "instance_id": instance_id, "ranks_removed": removed});
            encode(StatusCode::OK, &body, format)
        }
        Err(e) => error_response(&e, format),
    }
}

pub(super) async fn list(State(state): State<Http>, headers: HeaderMap) -> Response {
    let format = Format::of_request(&headers);
    match state.ops.engines() {
        Ok(engines) => {
            let rows = status_rows(&engines.list());
            let count = rows.as_array().map_or(0, Vec::len);
            encode(
                StatusCode::OK,
                &json!({"count": count, "engines": rows}),
                format,
            )
        }
        Err(e) => error_response(&e, format),
    }
}

fn reply_body(reply: &EngineReply) -> Json {
    let ranks: Vec<Json> = reply
        .ranks
        .iter()
        .map(|r| {
            json!({
                "dp_rank": r.dp_rank, "endpoint": r.endpoint,
                "replay_endpoint": r.replay_endpoint, "topic": r.topic, "block_size": r.block_size,
            })
        })
        .collect();
    json!({
        "status": "registered successfully", "instance_id": reply.instance_id,
        "tenant_id": reply.tenant_id, "url": reply.url, "type": reply.engine_type,
        "model_name": reply.model_name, "ranks": ranks,
    })
}

/// The engines' rows of `GET /engines` and `/services/status`.
pub fn status_rows(engines: &[EngineStatus]) -> Json {
    let rows: Vec<Json> = engines
        .iter()
        .map(|e| {
            json!({
                "instance_id": e.instance_id, "tenant_id": e.tenant_id, "url": e.url,
                "type": e.engine_type, "model_name": e.model_name, "origin": e.origin,
                "state": e.state, "ranks_found": e.ranks_found,
                "ranks_registered": e.ranks_registered,
                "description_age_ms": e.description_age_ms, "last_error": e.last_error,
                "failing_for_ms": e.failing_for_ms,
            })
        })
        .collect();
    Json::Array(rows)
}

/// The `loads` of a query answer: per instance its engine's last figures and their age, with
/// the engines' own names.
pub fn loads_body(loads: &[(String, LoadReport)]) -> Json {
    let mut out = serde_json::Map::new();
    for (id, report) in loads {
        let ranks: serde_json::Map<String, Json> = (report.load.ranks.iter())
            .map(|(rank, l)| {
                let load = json!({"num_running_reqs": l.running, "num_waiting_reqs": l.waiting,
                                  "token_usage": l.token_usage});
                (rank.to_string(), load)
            })
            .collect();
        let mut entry = json!({"age_ms": report.age_ms, "ranks": ranks});
        if let Some(n) = report.load.server_load {
            entry["server_load"] = json!(n);
        }
        out.insert(id.clone(), entry);
    }
    Json::Object(out)
}
