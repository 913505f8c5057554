//! One bounded HTTP/1.1 GET of an engine route: one connection per read, a deadline over the
//! whole exchange (connect, head, body), and a cap on the body's bytes, so that a slow, huge or
//! hostile engine server costs at most `deadline` and `max_body_bytes` (docs/engine-discovery.md,
//! "Bounds").
//!
//! The address is checked before anything is sent: unless `allow_local`, an engine whose host
//! is or resolves to a loopback, link-local, multicast or unspecified address is refused, so the
//! service cannot be made to read its own host's ports or a cloud metadata address. A name is
//! resolved once, every address it gives is checked, and the connection goes to a checked
//! address (no second resolution between the check and the connection). What a failed read
//! reports is its class only: never the remote's answer, whether its port is open, or how long
//! it took (docs/security.md, "Engines by URL").

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
    /// Engines on loopback, link-local, multicast or unspecified addresses may be read
    /// (`allow_local_engine_addresses`).
    pub allow_local: bool,
}

/// Why an engine's route could not be read, as far as a caller may learn it.
pub const UNREADABLE: &str = "the engine could not be read (its address does not answer, \
     answers no HTTP 200 within engine_read_timeout_ms, or answers more than \
     max_description_bytes)";

/// A loopback, link-local, multicast or unspecified address: the service's own host, a cloud
/// metadata service, or no host at all.
pub fn local_address(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback() || v4.is_link_local() || v4.is_multicast() || v4.is_unspecified()
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => local_address(IpAddr::V4(v4)),
            None => {
                v6.is_loopback()
                    || v6.is_multicast()
                    || v6.is_unspecified()
                    || v6.is_unicast_link_local()
            }
        },
    }
}

/// `GET {url}{path}`: the body of a 200 answer, or why not (for the engine's `last_error`).
pub async fn get(url: &EngineUrl, path: &str, limits: FetchLimits) -> Result<Bytes, String> {
    let target = format!("{}{}", url.to_url(), path);
    let exchange = async {
        let address = checked_address(url, limits.allow_local).await?;
        exchange(address, url, path, limits.max_body_bytes)
            .await
            .map_err(|why| {
                // The detail stays in this service's log: the remote's answer, its port's state
                // and the timing are not for the caller.
                tracing::debug!("GET {target}: {why}");
                UNREADABLE.to_owned()
            })
    };
    match tokio::time::timeout(limits.deadline, exchange).await {
        Ok(result) => result,
        Err(_) => {
            tracing::debug!("GET {target}: no complete answer in time");
            Err(UNREADABLE.to_owned())
        }
    }
}

/// The address to connect to for `url`: its IP, or the first its name resolves to, once every
/// address is checked (see the module doc).
async fn checked_address(
    url: &EngineUrl,
    allow_local: bool,
) -> Result<std::net::SocketAddr, String> {
    let resolved: Vec<std::net::SocketAddr> =
        match tokio::net::lookup_host((url.bare_host(), url.port)).await {
            Ok(addresses) => addresses.collect(),
            Err(e) => {
                tracing::debug!("resolving {}: {e}", url.bare_host());
                return Err(UNREADABLE.to_owned());
            }
        };
    if !allow_local && resolved.iter().any(|a| local_address(a.ip())) {
        return Err(format!(
            "url {:?}: refused: the host is or resolves to a loopback, link-local, multicast \
             or unspecified address (allow_local_engine_addresses allows it)",
            url.to_url()
        ));
    }
    resolved
        .first()
        .copied()
        .ok_or_else(|| UNREADABLE.to_owned())
}

async fn exchange(
    address: std::net::SocketAddr,
    url: &EngineUrl,
    path: &str,
    max_body_bytes: usize,
) -> Result<Bytes, String> {
    let stream = tokio::net::TcpStream::connect(address)
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

#[cfg(test)]
mod address_tests {
    use super::local_address;

    #[test]
    fn loopback_link_local_multicast_and_unspecified_are_local_and_the_rest_is_not() {
        let local = [
            "127.0.0.1",
            "127.8.9.10",
            "169.254.169.254",
            "224.0.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "ff02::1",
            "::",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ];
        for ip in local {
            assert!(local_address(ip.parse().unwrap()), "{ip} is local");
        }
        for ip in [
            "10.0.0.5",
            "192.168.1.2",
            "8.8.8.8",
            "fd00::5",
            "2001:db8::1",
        ] {
            assert!(!local_address(ip.parse().unwrap()), "{ip} is not local");
        }
    }
}
