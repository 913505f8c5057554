//! The HTTP API's registration body and its error shape (`error`, `reason`, `field`).

use serde_json::Value;

use super::engine::Registration;
use super::http;
use super::server::Server;

/// The HTTP registration of vLLM instance `instance` publishing on loopback `port` (model `m`,
/// block size 16).
pub fn reg(instance: &str, port: u16) -> Value {
    Registration::vllm(instance, &format!("tcp://127.0.0.1:{port}"))
        .block_size(16)
        .http()
}

/// POST `body` to `path` and require the error `status` with `reason` naming `field`.
pub async fn expect_error(
    server: &Server,
    path: &str,
    body: Value,
    status: u16,
    reason: &str,
    field: Option<&str>,
) {
    let r = http::post_json(server.http_port, path, &body).await;
    let j = r.json();
    assert_eq!(r.status, status, "{path} {body}: {j}");
    assert_eq!(j["reason"], reason, "{path} {body}: {j}");
    assert_eq!(
        j.get("field").and_then(Value::as_str),
        field,
        "{path} {body}: {j}"
    );
    assert!(j["error"].as_str().is_some_and(|e| !e.is_empty()), "{j}");
}
