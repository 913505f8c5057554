//! The HTTP side of registrations shared through etcd: the `registry` section of
//! `/services/status`, and the operator's answers to a suspected etcd reset,
//! `POST /registry/reupload` and `POST /registry/accept` (both need the service token like a
//! registration change; see `docs/replicas.md`).

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value as Json, json};

use crate::gateway::http_reply::{Format, encode, error_response};
use crate::gateway::ops::Ops;

/// `{"shared": "etcd", "etcd_up", "revision", "on_reset", "reset_suspected": null | {...}}`,
/// or `None` for a replica whose registrations are its own.
pub fn status_section(ops: &Ops) -> Option<Json> {
    let status = ops.registry_status()?;
    let held = status.held.map(|h| {
        let refused: Vec<Json> = (h.refused.iter())
            .map(|(service, error)| json!({"service": service, "error": error}))
            .collect();
        json!({
            "reason": h.reason.label(), "detail": h.detail, "held": h.services,
            "since_ms": h.since_ms, "refused": refused, "summary": h.describe(),
        })
    });
    Some(json!({
        "shared": "etcd", "etcd_up": status.etcd_up, "revision": status.revision,
        "on_reset": status.on_reset, "reset_suspected": held,
    }))
}

/// Write every held registration back into etcd: `{"reuploaded": [...], "refused": [...]}`.
pub async fn reupload(ops: &Ops, format: Format) -> Response {
    match ops.reupload_held().await {
        Ok(done) => {
            let refused: Vec<Json> = (done.refused.iter())
                .map(|(service, error)| json!({"service": service, "error": error}))
                .collect();
            let body = json!({"reuploaded": done.reuploaded, "refused": refused});
            encode(StatusCode::OK, &body, format)
        }
        Err(e) => error_response(&e, format),
    }
}

/// Confirm etcd's listing: every held registration is stopped, `{"stopped": [...]}`.
pub async fn accept(ops: &Ops, format: Format) -> Response {
    match ops.accept_held().await {
        Ok(stopped) => encode(StatusCode::OK, &json!({"stopped": stopped}), format),
        Err(e) => error_response(&e, format),
    }
}
