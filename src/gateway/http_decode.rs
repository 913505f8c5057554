//! The HTTP API's shared state and its POST bodies: read within the body limit and the
//! budget of large bodies in flight, then decoded field by field against a route's schema.

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::Response;

use crate::error::OpError;
use crate::gateway::body_budget::{self, BodyBudget, Share};
use crate::gateway::http_reply::{Format, error_response, reason_error};
use crate::gateway::ops::Ops;
use crate::gateway::request::{self, Limits, RootSeed, Schema};
use crate::gateway::value::Fields;

/// The state every HTTP handler gets.
#[derive(Clone)]
pub(super) struct Http {
    pub(super) ops: Ops,
    pub(super) body_limit: usize,
    pub(super) budget: BodyBudget,
    pub(super) limits: Limits,
}

/// A decoded POST body, with the format to answer in and the body budget's share it holds
/// until the request is answered.
pub(super) struct Decoded {
    pub(super) fields: Fields,
    pub(super) reply: Format,
    _share: Option<Share>,
}

/// Read and decode a POST body against `schema`: at most `body_limit` bytes, read into one
/// buffer of the declared size (a large body first takes its share of the budget), then decoded
/// field by field (see [`request`]).
pub(super) async fn decode_body(
    state: &Http,
    request: Request,
    schema: Schema,
) -> Result<Decoded, Response> {
    let headers = request.headers().clone();
    let Some(format) = Format::of_content_type(&headers) else {
        let e = OpError::invalid(
            "",
            "unsupported_content_type",
            "Content-Type must be application/json or application/msgpack",
        );
        return Err(error_response(&e, Format::of_request(&headers)));
    };
    let reply = Format::for_reply(&headers, format);
    let too_large = || {
        let message = format!("request body exceeds {} bytes", state.body_limit);
        reason_error(StatusCode::PAYLOAD_TOO_LARGE, &message, "too_large", reply)
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > state.body_limit) {
        return Err(too_large());
    }
    let busy = || {
        let e = OpError::unavailable(
            "too many large request bodies in flight (http_inflight_body_bytes); retry later",
        );
        error_response(&e, reply)
    };
    // A body without a length takes the share of the largest body once it outgrows a small one.
    let mut share = match declared {
        Some(n) => Some(
            state
                .budget
                .reserve(n, body_budget::WAIT)
                .await
                .map_err(|_| busy())?,
        ),
        None => None,
    };
    let mut body = Vec::with_capacity(declared.unwrap_or(0));
    let mut stream = request.into_body().into_data_stream();
    while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
        let Ok(chunk) = chunk else {
            return Err(too_large());
        };
        if body.len() + chunk.len() > state.body_limit {
            return Err(too_large());
        }
        if share.is_none() && body.len() + chunk.len() > body_budget::LARGE_BODY_BYTES {
            let reserved = state
                .budget
                .reserve(state.body_limit, body_budget::WAIT)
                .await;
            share = Some(reserved.map_err(|_| busy())?);
        }
        body.extend_from_slice(&chunk);
    }
    let seed = RootSeed {
        schema,
        limits: state.limits,
    };
    let fields = match format {
        Format::Json => request::from_json(&body, seed),
        Format::Msgpack => request::from_msgpack(&body, seed),
    };
    drop(body);
    match fields {
        Ok(fields) => Ok(Decoded {
            fields,
            reply,
            _share: share,
        }),
        Err(e) => Err(error_response(&e, reply)),
    }
}
