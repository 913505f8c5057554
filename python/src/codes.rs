//! Result codes of the Python API (`docs/python-api.md`, "Error codes") and the mapping of transport
//! failures onto them. The server sends its own codes in `ret`; these constants only name them and
//! add the client-side ones (RPC_FAIL, RPC_TIMEOUT, CONDUCTOR_UNAVAILABLE). The values come from the
//! table the service uses (`mooncake-conductor-codes`).

use mooncake_conductor_codes::Code as Table;
use tonic::{Code, Status};

// The values are the service's own table's: the server sends them in `ret` unchanged.
pub const OK: i32 = Table::Ok.value();
pub const INTERNAL_ERROR: i32 = Table::InternalError.value();
pub const INVALID_PARAMS: i32 = Table::InvalidParams.value();
pub const RPC_FAIL: i32 = Table::RpcFail.value();
pub const RPC_TIMEOUT: i32 = Table::RpcTimeout.value();
pub const CONDUCTOR_UNAVAILABLE: i32 = Table::ConductorUnavailable.value();
pub const SERVICE_NOT_FOUND: i32 = Table::ServiceNotFound.value();
/// The service requires a token (`CONDUCTOR_AUTH_TOKEN`) and the request had none or a wrong one.
pub const UNAUTHORIZED: i32 = Table::Unauthorized.value();

/// `health_check()` statuses: a separate, non-negative scale.
pub const HEALTH_OK: i32 = 0;
pub const HEALTH_NOT_INITIALIZED: i32 = 1;
pub const HEALTH_UNREACHABLE: i32 = 2;

/// The code for a call that failed at the gRPC layer (the server's own failures travel in `ret`).
///
/// Only a deadline is distinguished: the caller can retry with a longer timeout. tonic reports an
/// expired `grpc-timeout` as CANCELLED, on the client's channel and on a tonic server alike, so
/// CANCELLED counts as a deadline too; this client never cancels a call for any other reason.
/// Every other status (refused or lost connection, a peer that is not a Conductor, an
/// unimplemented method) is one transport failure to the caller, who cannot act differently on it.
pub fn from_status(status: &Status) -> i32 {
    match status.code() {
        Code::DeadlineExceeded | Code::Cancelled => RPC_TIMEOUT,
        _ => RPC_FAIL,
    }
}

/// Splits `host:port` (`[v6]:port` for IPv6) into the URI tonic connects to.
///
/// Returns `None` for anything that is not exactly a host and a port: a missing port separator,
/// an empty host, a port outside 1..=65535, or a URL scheme (the spec asks for a bare address).
pub fn endpoint_uri(addr: &str) -> Option<String> {
    if addr.contains("://") || addr.contains('/') || addr.chars().any(char::is_whitespace) {
        return None;
    }
    let (host, port) = addr.rsplit_once(':')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let port: u16 = port.parse().ok().filter(|p| *p != 0)?;
    let valid_host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        // IPv6 literal: brackets are what keep its colons apart from the port separator.
        Some(v6) => !v6.is_empty() && !v6.contains(['[', ']']),
        None => !host.is_empty() && !host.contains([':', '[', ']']),
    };
    if !valid_host {
        return None;
    }
    Some(format!("http://{host}:{port}"))
}
