//! One bounded HTTP/1.1 GET of an engine route: one connection per read, a deadline over the
//! whole exchange (connect, head, body), and a cap on the body's bytes, so that a slow, huge or
//! hostile engine server costs at most `deadline` and `max_body_bytes` (docs/engine-discovery.md,
//! "Bounds").

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;

use super::address::EngineUrl;

/// The bounds of one read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchLimits {
    pub deadline: Duration,
    pub max_body_bytes: usize,
}

/// `GET {url}{path}`: the body of a 200 answer, or why not (for the engine's `last_error`).
pub async fn get(url: &EngineUrl, path: &str, limits: FetchLimits) -> Result<Bytes, String> {
    let target = format!("{}{}", url.to_url(), path);
    match tokio::time::timeout(limits.deadline, exchange(url, path, limits.max_body_bytes)).await {
        Ok(result) => result.map_err(|e| format!("GET {target}: {e}")),
        Err(_) => Err(format!(
            "GET {target}: no complete answer within {} ms",
            limits.deadline.as_millis()
        )),
    }
}

async fn exchange(url: &EngineUrl, path: &str, max_body_bytes: usize) -> Result<Bytes, String> {
    let stream = tokio::net::TcpStream::connect((url.bare_host(), url.port))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    // The connection is driven while the answer is read, and dropped with this future.
    let driver = tokio::spawn(connection);
    let request = http::Request::get(format!("{}{path}", url.prefix))
        .header(http::header::HOST, url.authority())
        .header(http::header::ACCEPT, "application/json")
        .header(http::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| format!("request: {e}"))?;
    let answer = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("{e}"))?;
        let status = response.status();
        if status != http::StatusCode::OK {
            return Err(format!("answered {status}"));
        }
        let declared = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max_body_bytes as u64) {
            return Err(format!(
                "the body is {} bytes; the limit is {max_body_bytes} (max_description_bytes)",
                declared.unwrap_or_default()
            ));
        }
        let body = Limited::new(response.into_body(), max_body_bytes)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    format!("the body exceeds {max_body_bytes} bytes (max_description_bytes)")
                } else {
                    format!("reading the body: {e}")
                }
            })?;
        Ok(body.to_bytes())
    }
    .await;
    driver.abort();
    answer
}
