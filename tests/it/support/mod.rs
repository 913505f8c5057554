//! Test support: the real binary on free loopback ports, a fixture player that publishes over
//! real PUB/ROUTER sockets, a minimal HTTP client, and builders for engine payloads.

#![allow(dead_code)]

pub mod engine;
pub mod etcd;
pub mod grpc;
pub mod heartbeat_pub;
pub mod http;
pub mod player;
pub mod proxy;
pub mod raw_zmtp;
pub mod relay;
pub mod server;
pub mod tls;
pub mod tool;

use std::future::Future;
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1 (bound and released; the OS does not hand it out again at once).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// Poll `check` until it returns `Some` or `timeout` passes; panics with `what` on timeout.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub const WAIT: Duration = Duration::from_secs(10);
