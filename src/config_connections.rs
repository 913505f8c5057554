//! The configuration keys of the servers' connections (see `docs/connections.md`), parsed apart
//! from the rest of [`crate::config`] so that the transport's bounds stay in one place.

use std::time::Duration;

use serde_json::Value;

use crate::gateway::connections::{ConnectionLimits, descriptor_limit, effective_max_connections};

/// The keys, with their defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// Open HTTP and gRPC connections at most, before the descriptor limit lowers it.
    pub max_connections: u64,
    pub http_header_read_timeout_ms: u64,
    pub connection_idle_timeout_ms: u64,
    pub grpc_keepalive_ms: u64,
    pub grpc_max_concurrent_streams: u64,
}

/// Far above what a fleet's routers open to one replica; the descriptor limit usually decides.
pub const DEFAULT_MAX_CONNECTIONS: u64 = 16_384;
/// A client sends a request head in one write: seconds are generous even over a slow network.
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// Routers query constantly; a connection quiet for five minutes belongs to a gone client.
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 300_000;
/// A dead gRPC peer (a host gone without FIN) is found within a minute and 20 s.
pub const DEFAULT_GRPC_KEEPALIVE_MS: u64 = 60_000;
/// Calls running at once on one gRPC connection.
pub const DEFAULT_GRPC_MAX_CONCURRENT_STREAMS: u64 = 256;

impl Default for ConnectionConfig {
    fn default() -> Self {
        ConnectionConfig {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            http_header_read_timeout_ms: DEFAULT_HEADER_READ_TIMEOUT_MS,
            connection_idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            grpc_keepalive_ms: DEFAULT_GRPC_KEEPALIVE_MS,
            grpc_max_concurrent_streams: DEFAULT_GRPC_MAX_CONCURRENT_STREAMS,
        }
    }
}

/// A day: the longest timing any of these keys takes.
const MAX_MS: u64 = 86_400_000;

impl ConnectionConfig {
    /// Set `key` from `value`; `None`: not one of these keys. The error message names the range.
    pub fn set(&mut self, key: &str, value: &Value) -> Option<Result<(), String>> {
        let (slot, min, max) = match key {
            "max_connections" => (&mut self.max_connections, 1, 1 << 24),
            "http_header_read_timeout_ms" => (&mut self.http_header_read_timeout_ms, 100, MAX_MS),
            "connection_idle_timeout_ms" => (&mut self.connection_idle_timeout_ms, 100, MAX_MS),
            "grpc_keepalive_ms" => (&mut self.grpc_keepalive_ms, 1000, MAX_MS),
            "grpc_max_concurrent_streams" => (&mut self.grpc_max_concurrent_streams, 1, 1 << 20),
            _ => return None,
        };
        Some(match value.as_u64() {
            Some(n) if (min..=max).contains(&n) => {
                *slot = n;
                Ok(())
            }
            _ => Err(format!("must be an integer in {min}..={max}")),
        })
    }

    /// The limits the servers run with: the connection cap lowered to what this process's
    /// descriptor limit leaves for connections.
    pub fn limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: effective_max_connections(self.max_connections, descriptor_limit()),
            idle_timeout: Duration::from_millis(self.connection_idle_timeout_ms),
            header_read_timeout: Duration::from_millis(self.http_header_read_timeout_ms),
            grpc_keepalive: Duration::from_millis(self.grpc_keepalive_ms),
            grpc_max_concurrent_streams: self.grpc_max_concurrent_streams as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_take_integers_in_their_range() {
        let mut c = ConnectionConfig::default();
        assert_eq!(c.set("other", &json!(1)), None);
        assert_eq!(c.set("max_connections", &json!(300)), Some(Ok(())));
        assert_eq!(c.max_connections, 300);
        for bad in [json!(0), json!(-1), json!("5"), json!(1.5)] {
            let e = c.set("max_connections", &bad).unwrap().unwrap_err();
            assert!(e.contains("1..="), "{e}");
        }
        assert!(
            c.set("connection_idle_timeout_ms", &json!(10))
                .unwrap()
                .is_err()
        );
        assert_eq!(
            c.set("connection_idle_timeout_ms", &json!(1500)),
            Some(Ok(()))
        );
        assert_eq!(c.limits().idle_timeout, Duration::from_millis(1500));
        assert!(c.set("grpc_keepalive_ms", &json!(999)).unwrap().is_err());
    }
}
