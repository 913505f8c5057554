//! The HTTP API. Bodies are JSON or msgpack: the request's `Content-Type` picks the decoder (a
//! POST without one is refused) and `Accept` (default: the request's type, JSON for GETs and
//! bodies of another type) the encoder, for every answer. Validation errors answer 400
//! `{"error", "reason", "field"?, "index"?}` with the reference's reasons; an unknown service 404;
//! a wrong method 405; a body over the limit 413; internal failures 500. With a service token configured
//! (see [`crate::gateway::auth`]), a request without it answers 401 before its body is read.

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde_json::{Value as Json, json};

use crate::error::OpError;
use crate::gateway::body_budget::BodyBudget;
use crate::gateway::http_register::registration_from_http;
use crate::gateway::http_reply::{
    ContextRow, Format, GlobalView, Listing, Registered, ServiceRow, Unregistered, encode,
    error_response, plain_error, with_body,
};
use crate::gateway::ops::{Ops, QueryByHashInput, QueryInput};
use crate::gateway::registration::{HTTP_NAMES, HTTP_REGISTER_SCHEMA};
use crate::gateway::request::{Kind, Limits, Schema};
use crate::gateway::value::{Fields, Val};
use crate::metrics::Transport;
use crate::registry::ServiceInfo;
use crate::subscription::status::HashCheckState;

use super::http_body::{HitsBody, HitsWith, hits_msgpack, hits_msgpack_with};
use super::http_decode::{Http, decode_body};
use super::{http_engines, http_registry};

/// The bounds on request bodies.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body accepted (413 above it).
    pub body_bytes: usize,
    /// Most `token_ids` / `block_hashes` elements.
    pub max_query_tokens: usize,
}

/// The HTTP router over `ops`.
/// `budget` bounds the bytes of large bodies in flight (see [`body_budget`]), shared with gRPC.
pub fn router(ops: Ops, limits: BodyLimits, budget: BodyBudget) -> Router {
    let state = Http {
        ops,
        body_limit: limits.body_bytes,
        budget,
        limits: Limits {
            max_tokens: limits.max_query_tokens,
        },
    };
    Router::new()
        .route("/register", post(register))
        .route("/unregister", post(unregister))
        .route("/query", post(query))
        .route("/query_by_hash", post(query_by_hash))
        .route("/global_view", get(global_view))
        .route("/services", get(services))
        .route("/services/status", get(services_status))
        .route("/registry/reupload", post(registry_reupload))
        .route("/registry/accept", post(registry_accept))
        .route(
            "/engines",
            post(http_engines::register).get(http_engines::list),
        )
        .route("/engines/{instance_id}", delete(http_engines::unregister))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ))
        .method_not_allowed_fallback(|headers: HeaderMap| async move {
            let format = Format::of_request(&headers);
            plain_error(StatusCode::METHOD_NOT_ALLOWED, "Method not allowed", format)
        })
        .fallback(|headers: HeaderMap| async move {
            plain_error(
                StatusCode::NOT_FOUND,
                "Not found",
                Format::of_request(&headers),
            )
        })
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

/// A query answer: msgpack from the hand-written writer (the common router encoding), JSON
/// through serde.
fn hits_response(answer: crate::index::AnswerView<'_>, format: Format) -> Response {
    match format {
        Format::Msgpack => with_body(StatusCode::OK, hits_msgpack(answer), format),
        Format::Json => encode(StatusCode::OK, &HitsBody(answer), format),
    }
}

/// A query answer, with the engines' load figures (`include_load`: `"loads"`) and how sure the
/// answer is (`include_status`: `"status"`, computed before the query) when the request asked
/// for them; without either the answer's bytes are unchanged.
fn answer_response(
    ops: &Ops,
    tenant_id: &str,
    include_load: bool,
    status: Option<serde_json::Value>,
    answer: crate::index::AnswerView<'_>,
    format: Format,
) -> Response {
    let mut extra = Vec::new();
    if include_load {
        extra.push((
            "loads",
            http_engines::loads_body(&ops.loads_of(tenant_id, answer)),
        ));
    }
    if let Some(status) = status {
        extra.push(("status", status));
    }
    if extra.is_empty() {
        return hits_response(answer, format);
    }
    match format {
        Format::Msgpack => with_body(StatusCode::OK, hits_msgpack_with(answer, &extra), format),
        Format::Json => encode(StatusCode::OK, &HitsWith(answer, &extra), format),
    }
}

/// An optional boolean flag of both queries (`include_load`, `include_status`).
fn flag(f: &Fields, name: &'static str) -> Result<bool, OpError> {
    match f.get(name) {
        None | Some(Val::Null) => Ok(false),
        Some(Val::Bool(b)) => Ok(*b),
        Some(_) => {
            let message = format!("{name} must be a boolean");
            Err(OpError::invalid(name, "invalid_type", message))
        }
    }
}

/// The `status` entry of an answer, when the request has `include_status`.
async fn status_entry(
    ops: &Ops,
    f: &Fields,
    q: crate::gateway::ops::QueryContext<'_>,
) -> Result<Option<serde_json::Value>, OpError> {
    if !flag(f, "include_status")? {
        return Ok(None);
    }
    let statuses = ops.answer_status(q).await?;
    Ok(Some(crate::gateway::answer_status::to_json(&statuses)))
}

/// Refuse a request that needs the service token and lacks it, before its body is read (so an
/// unauthenticated peer cannot make the service decode anything).
async fn require_token(
    State(state): State<Http>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let access = crate::gateway::bounds::http_access(request.method(), request.uri().path());
    let headers = request.headers();
    let authorization = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    if let Err(e) = state.ops.authorize(access, authorization) {
        return error_response(&e, Format::of_request(headers));
    }
    next.run(request).await
}

async fn register(State(state): State<Http>, request: Request) -> Response {
    let d = match decode_body(&state, request, HTTP_REGISTER_SCHEMA).await {
        Ok(d) => d,
        Err(r) => return r,
    };
    let result = async {
        let input = registration_from_http(d.fields)?;
        let reply = state.ops.register(input, HTTP_NAMES).await?;
        Ok::<_, OpError>(reply.instance_id)
    }
    .await;
    match result {
        Ok(instance) => {
            let body = Registered {
                status: "registered successfully",
                instance_id: &instance,
            };
            encode(StatusCode::OK, &body, d.reply)
        }
        Err(e) => error_response(&e, d.reply),
    }
}

async fn unregister(State(state): State<Http>, request: Request) -> Response {
    let d = match decode_body(&state, request, UNREGISTER_SCHEMA).await {
        Ok(d) => d,
        Err(r) => return r,
    };
    let result = async {
        let fields = d.fields;
        let instance = fields.req_str("instance_id")?;
        let tenant = fields.opt_str("tenant_id")?.unwrap_or_default();
        let rank = fields
            .opt_int("dp_rank")?
            .ok_or_else(|| OpError::invalid("dp_rank", "missing", "dp_rank is required"))?;
        state.ops.unregister(&instance, &tenant, rank).await?;
        Ok::<_, OpError>(
            crate::model::SubscriptionKey::new(&instance, &tenant, rank as u32).to_string(),
        )
    }
    .await;
    match result {
        Ok(key) => {
            let body = Unregistered {
                status: "unregistered successfully",
                removed_instances: [&key],
            };
            encode(StatusCode::OK, &body, d.reply)
        }
        Err(e) => error_response(&e, d.reply),
    }
}

const UNREGISTER_SCHEMA: Schema = &[
    ("dp_rank", Kind::Scalar),
    ("instance_id", Kind::Scalar),
    ("tenant_id", Kind::Scalar),
];

/// The fields `/query` and `/query_by_hash` share.
macro_rules! query_schema {
    ($($extra:expr),*) => {
        &[
            ("model", Kind::Scalar),
            ("model_name", Kind::Scalar),
            ("block_size", Kind::Scalar),
            ("tenant_id", Kind::Scalar),
            ("lora_name", Kind::Scalar),
            ("instance_id", Kind::Scalar),
            ("instance_filter", Kind::Scalar),
            ("include_load", Kind::Scalar),
            ("include_status", Kind::Scalar),
            $($extra),*
        ]
    };
}

const QUERY_SCHEMA: Schema =
    query_schema!(("token_ids", Kind::Tokens), ("cache_salt", Kind::Scalar));
const QUERY_BY_HASH_SCHEMA: Schema = query_schema!(("block_hashes", Kind::Hashes));

/// The query fields checked before the prompt: the model (`model_name` wins over `model`) and
/// the block size.
fn model_and_block_size(f: &Fields) -> Result<(String, i128), OpError> {
    let model = match f.opt_str("model_name")? {
        Some(m) => m,
        None => f.req_str("model")?,
    };
    let block_size = match f.get("block_size") {
        None => {
            let message = "block_size is required";
            return Err(OpError::invalid("block_size", "missing", message));
        }
        Some(Val::Int(b)) if *b > 0 => *b,
        Some(Val::Int(_)) => {
            let message = "block_size must be a positive integer";
            return Err(OpError::invalid("block_size", "out_of_range", message));
        }
        Some(_) => {
            let message = "block_size must be an integer";
            return Err(OpError::invalid("block_size", "invalid_type", message));
        }
    };
    Ok((model, block_size))
}

/// The query fields checked after the prompt: (tenant, lora) then, after `cache_salt` for
/// `/query`, the instance filter (`instance_filter` wins over `instance_id`).
fn tenant_and_lora(f: &Fields) -> Result<(String, String), OpError> {
    let tenant = f.opt_str("tenant_id")?.unwrap_or_default();
    Ok((tenant, f.opt_str("lora_name")?.unwrap_or_default()))
}

fn instance_filter(f: &Fields) -> Result<String, OpError> {
    Ok(match f.opt_str("instance_filter")? {
        Some(v) => v,
        None => f.opt_str("instance_id")?.unwrap_or_default(),
    })
}

/// A number array field, already checked by its decoder.
fn numbers<T>(
    f: &mut Fields,
    field: &str,
    what: &str,
    take: impl FnOnce(Val) -> Option<Vec<T>>,
) -> Result<Vec<T>, OpError> {
    match f.take(field) {
        None => Err(OpError::invalid(
            field,
            "missing",
            format!("{field} is required"),
        )),
        Some(Val::Invalid(e)) => Err(e),
        Some(v) => take(v).ok_or_else(|| {
            OpError::invalid(field, "invalid_type", format!("{field} must be {what}"))
        }),
    }
}

async fn query(State(state): State<Http>, request: Request) -> Response {
    let d = match decode_body(&state, request, QUERY_SCHEMA).await {
        Ok(d) => d,
        Err(r) => return r,
    };
    let result = async {
        let mut f = d.fields;
        let (model_name, block_size) = model_and_block_size(&f)?;
        let token_ids = numbers(&mut f, "token_ids", "a bin or an array", |v| match v {
            Val::Tokens(t) => Some(t),
            _ => None,
        })?;
        let (tenant_id, lora_name) = tenant_and_lora(&f)?;
        let cache_salt = match f.get("cache_salt") {
            None | Some(Val::Null) => String::new(),
            Some(Val::Str(s)) => s.clone(),
            Some(_) => {
                return Err(OpError::invalid(
                    "cache_salt",
                    "invalid_type",
                    "cache_salt must be a string or null",
                ));
            }
        };
        let input = QueryInput {
            model_name,
            lora_name,
            block_size,
            tenant_id,
            token_ids,
            cache_salt,
            instance_filter: instance_filter(&f)?,
        };
        let (reply, loads, ops) = (d.reply, flag(&f, "include_load")?, &state.ops);
        let status = status_entry(ops, &f, input.context()).await?;
        ops.query_with(&input, Transport::Http, |a| {
            answer_response(ops, &input.tenant_id, loads, status, a, reply)
        })
    }
    .await;
    result.unwrap_or_else(|e| error_response(&e, d.reply))
}

async fn query_by_hash(State(state): State<Http>, request: Request) -> Response {
    let d = match decode_body(&state, request, QUERY_BY_HASH_SCHEMA).await {
        Ok(d) => d,
        Err(r) => return r,
    };
    let result = async {
        let mut f = d.fields;
        let (model_name, block_size) = model_and_block_size(&f)?;
        let block_hashes = numbers(&mut f, "block_hashes", "an array", |v| match v {
            Val::Hashes(h) => Some(h),
            _ => None,
        })?;
        let (tenant_id, lora_name) = tenant_and_lora(&f)?;
        let instance_filter = instance_filter(&f)?;
        let input = QueryByHashInput {
            model_name,
            lora_name,
            block_size,
            tenant_id,
            block_hashes,
            instance_filter,
        };
        let (reply, loads, ops) = (d.reply, flag(&f, "include_load")?, &state.ops);
        let status = status_entry(ops, &f, input.context()).await?;
        ops.query_by_hash_with(&input, Transport::Http, |a| {
            answer_response(ops, &input.tenant_id, loads, status, a, reply)
        })
    }
    .await;
    result.unwrap_or_else(|e| error_response(&e, d.reply))
}

fn get_format(headers: &HeaderMap) -> Format {
    Format::for_reply(headers, Format::Json)
}

async fn global_view(State(state): State<Http>, headers: HeaderMap) -> Response {
    let views = state.ops.global_view();
    let contexts: Vec<ContextRow> = views.iter().map(ContextRow::of).collect();
    let body = GlobalView {
        context_count: contexts.len(),
        contexts,
    };
    encode(StatusCode::OK, &body, get_format(&headers))
}

/// Every service with the answer's format, or the error answer.
async fn service_list(
    state: &Http,
    headers: &HeaderMap,
) -> Result<(Vec<ServiceInfo>, Format), Response> {
    let format = get_format(headers);
    match state.ops.list_services().await {
        Ok(list) => Ok((list, format)),
        Err(e) => Err(error_response(&e, format)),
    }
}

/// A listing: `{"count", "services": [...]}`.
fn listing<T: serde::Serialize>(services: Vec<T>, format: Format) -> Response {
    let body = Listing {
        count: services.len(),
        services,
    };
    encode(StatusCode::OK, &body, format)
}

/// The reference's export keys, exactly, in its order.
async fn services(State(state): State<Http>, headers: HeaderMap) -> Response {
    match service_list(&state, &headers).await {
        Ok((list, format)) => listing(
            list.iter().map(|s| ServiceRow::of(&s.config)).collect(),
            format,
        ),
        Err(r) => r,
    }
}

/// Subscription health, apart from the seed's listing so its shape stays exact.
async fn services_status(State(state): State<Http>, headers: HeaderMap) -> Response {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let (list, format) = match service_list(&state, &headers).await {
        Ok(l) => l,
        Err(r) => return r,
    };
    let rows = list.iter().map(|s| {
        let st = &s.status;
        json!({
            "service": s.config.subscription_key().to_string(), "state": st.phase_name(),
            "connected": st.connected, "last_seq": st.last_seq,
            "lag_ms": st.last_batch_ts_ms.map(|ts| now_ms.saturating_sub(ts)),
            "hash_check": st.hash_check.as_str(), "hash_check_ok": st.hash_check_ok,
            "hash_check_mismatch": st.hash_check_mismatch,
            "hash_check_mismatch_rate": st.hash_check_mismatch_rate, "engine_recipe": st.engine_recipe,
            "translating": st.hash_check == HashCheckState::Mismatch, "batches": st.seq.applied,
            "events": st.events, "ignored": st.ignored, "refused": st.refused,
            "blocks_kept_as_published": st.blocks_kept_as_published,
            "decode_errors": st.decode_errors,
            "frame_errors": st.frame_errors, "invalid_events": st.invalid_events,
            "oversized_messages": st.oversized_messages, "disconnects": st.disconnects,
            "timeouts": st.timeouts, "unreachable_drops": st.unreachable_drops,
            "rank_mismatches": st.rank_mismatches, "gaps": st.seq.gaps, "restarts": st.seq.restarts,
            "replays_ok": st.seq.replays_ok, "replays_failed": st.seq.replays_failed,
            "sources_dropped": st.seq.sources_dropped,
            "pending_batches": st.pending_batches, "backpressure_waits": st.backpressure_waits,
        })
    });
    let rows = rows.collect::<Vec<Json>>();
    let mut body = json!({"count": rows.len(), "services": rows});
    if let Some(registry) = http_registry::status_section(&state.ops) {
        body["registry"] = registry;
    }
    body["memory_budget"] = budget_section(&state.ops);
    body["cache_groups"] = groups_section(&state.ops).await;
    if let Ok(engines) = state.ops.engines() {
        body["engines"] = http_engines::status_rows(&engines.list());
    }
    encode(StatusCode::OK, &body, format)
}

/// The KV-cache groups of hybrid models (`docs/engine-events.md`, "Cache groups"): per context,
/// each hybrid rank's groups with their kind, window and block count, as the events showed them.
async fn groups_section(ops: &crate::gateway::ops::Ops) -> Json {
    let contexts: Vec<Json> = (ops.group_layouts().await.into_iter())
        .map(|(key, groups)| {
            let groups: Vec<Json> = (groups.iter())
                .map(|g| {
                    json!({
                        "service": g.source.to_string(), "instance_id": g.instance_id,
                        "dp_rank": g.dp_rank, "group": g.group, "kind": g.kind.family(),
                        "sliding_window": g.kind.window(), "blocks": g.blocks,
                    })
                })
                .collect();
            json!({
                "model_name": key.model_name, "lora_name": key.lora_name,
                "tenant_id": key.tenant_id, "block_size": key.block_size, "groups": groups,
            })
        })
        .collect();
    json!(contexts)
}

/// The memory budget's part of `/services/status` (see "Memory budget" in
/// `docs/durability.md`): its bounds, the estimate, and per context what it evicted.
fn budget_section(ops: &crate::gateway::ops::Ops) -> Json {
    let budget = ops.budget();
    let contexts: Vec<Json> = (ops.global_view().iter())
        .filter(|v| v.evicted > 0)
        .map(|v| {
            json!({
                "model_name": v.key.model_name, "lora_name": v.key.lora_name,
                "tenant_id": v.key.tenant_id, "block_size": v.key.block_size,
                "blocks": v.prefix_count, "evicted_blocks": v.evicted,
            })
        })
        .collect();
    json!({
        "max_index_bytes": budget.max_index_bytes(),
        "max_context_blocks": budget.max_context_blocks(),
        "estimated_bytes": budget.bytes(), "evicted_blocks": budget.evicted(),
        "evicting": budget.degraded().is_some(), "contexts": contexts,
    })
}

async fn registry_reupload(State(state): State<Http>, headers: HeaderMap) -> Response {
    http_registry::reupload(&state.ops, get_format(&headers)).await
}

async fn registry_accept(State(state): State<Http>, headers: HeaderMap) -> Response {
    http_registry::accept(&state.ops, get_format(&headers)).await
}

async fn health(State(state): State<Http>, headers: HeaderMap) -> Response {
    let (status, body) = match state.ops.not_ready_reason() {
        // Degraded still serves (queries, ingest), so still 200: the reason says what is behind.
        None => match state.ops.degraded_reason() {
            None => (StatusCode::OK, json!({ "status": "ready" })),
            Some(reason) => (
                StatusCode::OK,
                json!({ "status": "degraded", "reason": reason }),
            ),
        },
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({ "status": "starting", "reason": reason }),
        ),
    };
    encode(status, &body, get_format(&headers))
}

async fn metrics(State(state): State<Http>) -> Response {
    match state.ops.metrics_text().await {
        Ok(text) => {
            let mut r = Body::from(text).into_response();
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            r
        }
        Err(e) => error_response(&e, Format::Json),
    }
}
