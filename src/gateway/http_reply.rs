//! How the HTTP API answers: the body format (`Content-Type` / `Accept`), error bodies, and the
//! fixed-order bodies of the reference's routes. Every map is written in the reference's key
//! order (`docs/http-compat.md`), so JSON and msgpack answers are the same bytes whatever the
//! order serde would pick.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::error::{Code, OpError};
use crate::hashing::HashProfile;
use crate::index::ContextView;
use crate::model::PublisherConfig;

/// A body encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Msgpack,
}

/// The media types a request body may declare. Matched as substrings of the header (as the
/// reference does for `application/msgpack`), case-insensitively.
const MSGPACK_TYPES: [&str; 2] = ["application/msgpack", "application/x-msgpack"];
const JSON_TYPE: &str = "application/json";

impl Format {
    /// The format a request body declares; `None` without a `Content-Type` or with another one.
    pub fn of_content_type(headers: &HeaderMap) -> Option<Format> {
        let ct = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
        let ct = ct.to_ascii_lowercase();
        if MSGPACK_TYPES.iter().any(|t| ct.contains(t)) {
            Some(Format::Msgpack)
        } else if ct.contains(JSON_TYPE) {
            Some(Format::Json)
        } else {
            None
        }
    }

    /// The format to answer in: what `Accept` names, else `default`.
    pub fn for_reply(headers: &HeaderMap, default: Format) -> Format {
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if accept.contains("msgpack") {
            Format::Msgpack
        } else if accept.contains("json") {
            Format::Json
        } else {
            default
        }
    }

    /// The format to answer a request in: `Accept`, else the body's own format, else JSON.
    pub fn of_request(headers: &HeaderMap) -> Format {
        Format::for_reply(
            headers,
            Format::of_content_type(headers).unwrap_or(Format::Json),
        )
    }
}

pub fn encode<T: Serialize + ?Sized>(status: StatusCode, body: &T, format: Format) -> Response {
    let bytes = match format {
        Format::Json => serde_json::to_vec(body).unwrap_or_default(),
        Format::Msgpack => rmp_serde::to_vec_named(body).unwrap_or_default(),
    };
    with_body(status, bytes, format)
}

pub fn with_body(status: StatusCode, bytes: Vec<u8>, format: Format) -> Response {
    let content_type = match format {
        Format::Json => "application/json",
        Format::Msgpack => "application/msgpack",
    };
    let mut response = (status, bytes).into_response();
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// An error body: `{"error", "reason", "field"?, "index"?}`, in that order.
#[derive(Serialize)]
struct ErrorBody<'a> {
    error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    field: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<u64>,
}

/// An answer without a reason: `{"error": message}` (unknown path, wrong method).
pub fn plain_error(status: StatusCode, message: &str, format: Format) -> Response {
    let body = ErrorBody {
        error: message,
        reason: None,
        field: None,
        index: None,
    };
    encode(status, &body, format)
}

/// `{"error", "reason"}` with any status (413 `too_large`).
pub fn reason_error(status: StatusCode, message: &str, reason: &str, format: Format) -> Response {
    let body = ErrorBody {
        error: message,
        reason: Some(reason),
        field: None,
        index: None,
    };
    encode(status, &body, format)
}

pub fn error_response(e: &OpError, format: Format) -> Response {
    let status =
        StatusCode::from_u16(e.code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = ErrorBody {
        error: &e.message,
        reason: Some(e.reason),
        field: e.field.as_deref().filter(|f| !f.is_empty()),
        index: e.index,
    };
    let mut response = encode(status, &body, format);
    if e.code == Code::Unauthorized {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

/// `/register`'s answer.
#[derive(Serialize)]
pub struct Registered<'a> {
    pub status: &'static str,
    pub instance_id: &'a str,
}

/// `/unregister`'s answer.
#[derive(Serialize)]
pub struct Unregistered<'a> {
    pub status: &'static str,
    pub removed_instances: [&'a str; 1],
}

/// A listing: `{"count", "services"}`.
#[derive(Serialize)]
pub struct Listing<T> {
    pub count: usize,
    pub services: Vec<T>,
}

#[derive(Serialize)]
pub struct ProfileBody<'a> {
    strategy: &'static str,
    algorithm: &'static str,
    python_hash_seed: &'a str,
    root_digest: String,
    index_projection: &'static str,
}

impl<'a> ProfileBody<'a> {
    pub fn of(p: &'a HashProfile) -> Self {
        ProfileBody {
            strategy: p.strategy().as_str(),
            algorithm: p.algorithm().as_str(),
            python_hash_seed: p.python_hash_seed(),
            root_digest: p.root_digest_hex(),
            index_projection: p.index_projection().as_str(),
        }
    }
}

/// `/global_view`'s answer.
#[derive(Serialize)]
pub struct GlobalView<'a> {
    pub context_count: usize,
    pub contexts: Vec<ContextRow<'a>>,
}

#[derive(Serialize)]
pub struct ContextRow<'a> {
    model_name: &'a str,
    lora_name: &'a str,
    block_size: u32,
    tenant_id: &'a str,
    prefix_count: u64,
    hash_profile: ProfileBody<'a>,
    instances: &'a BTreeMap<String, BTreeSet<u32>>,
}

impl<'a> ContextRow<'a> {
    pub fn of(v: &'a ContextView) -> Self {
        ContextRow {
            model_name: &v.key.model_name,
            lora_name: &v.key.lora_name,
            block_size: v.key.block_size,
            tenant_id: &v.key.tenant_id,
            prefix_count: v.prefix_count,
            hash_profile: ProfileBody::of(&v.profile),
            instances: &v.instances,
        }
    }
}

/// One `/services` row: the reference's PascalCase keys, in its order.
#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct ServiceRow<'a> {
    endpoint: &'a str,
    replay_endpoint: &'a str,
    #[serde(rename = "Type")]
    publisher_type: &'static str,
    model_name: &'a str,
    lora_name: &'a str,
    #[serde(rename = "TenantID")]
    tenant_id: &'a str,
    #[serde(rename = "InstanceID")]
    instance_id: &'a str,
    block_size: u32,
    #[serde(rename = "DPRank")]
    dp_rank: u32,
    cache_group: Option<u32>,
    hash_profile: ProfileBody<'a>,
}

impl<'a> ServiceRow<'a> {
    pub fn of(c: &'a PublisherConfig) -> Self {
        ServiceRow {
            endpoint: &c.endpoint,
            replay_endpoint: &c.replay_endpoint,
            publisher_type: c.publisher_type.as_str(),
            model_name: &c.model_name,
            lora_name: &c.lora_name,
            tenant_id: &c.tenant_id,
            instance_id: &c.instance_id,
            block_size: c.block_size,
            dp_rank: c.dp_rank,
            cache_group: c.cache_group,
            hash_profile: ProfileBody::of(&c.hash_profile),
        }
    }
}
