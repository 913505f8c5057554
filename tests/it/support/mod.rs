//! Test support: the real binary on free loopback ports, a fixture player that publishes over
//! real PUB/ROUTER sockets, a minimal HTTP client, builders for engine payloads and
//! registrations, the fleet most tests register and its prompts, the queries tests ask,
//! delivery until a batch is applied, and the one deadline loop every wait runs on ([`poll`]).

#![allow(dead_code)]

pub mod api;
pub mod deliver;
pub mod engine;
pub mod engine_http;
pub mod etcd;
pub mod fleet;
pub mod flood;
pub mod grpc;
pub mod heartbeat_pub;
pub mod http;
pub mod memory;
pub mod player;
pub mod proxy;
pub mod query;
pub mod raw_zmtp;
pub mod relay;
pub mod server;
pub mod tls;
pub mod tool;

use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1 (bound and released; the OS does not hand it out again at once).
pub fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// Poll `check` until it returns `Some` or `timeout` passes; panics with `what` on timeout.
/// An async closure may borrow what it checks mutably (a player it re-sends with).
pub async fn eventually<T>(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    until(timeout, async || {
        check().await.ok_or_else(|| format!("waiting for {what}"))
    })
    .await
}

/// Poll `check` until it returns `Ok` or `timeout` passes; panics with the last `Err` on timeout,
/// so that the message shows the state the check last saw.
pub async fn until<T, E: std::fmt::Display>(
    timeout: Duration,
    check: impl AsyncFnMut() -> Result<T, E>,
) -> T {
    match poll(timeout, check).await {
        Ok(v) => v,
        Err(why) => panic!("timed out after {timeout:?} {why}"),
    }
}

/// Poll `check` until it returns `Ok` or `timeout` passes, and hand back the last `Err` then: for
/// a test that asserts on what it saw last, with its own messages.
pub async fn poll<T, E>(
    timeout: Duration,
    mut check: impl AsyncFnMut() -> Result<T, E>,
) -> Result<T, E> {
    let deadline = Instant::now() + timeout;
    loop {
        match check().await {
            Ok(v) => return Ok(v),
            Err(why) if Instant::now() >= deadline => return Err(why),
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// [`eventually`] for synchronous tests and support code that run outside an async context.
pub fn eventually_blocking<T>(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    until_blocking(timeout, || {
        check().ok_or_else(|| format!("waiting for {what}"))
    })
}

/// [`until`] for synchronous tests and support code that run outside an async context.
pub fn until_blocking<T, E: std::fmt::Display>(
    timeout: Duration,
    mut check: impl FnMut() -> Result<T, E>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(v) => return v,
            Err(why) if Instant::now() >= deadline => panic!("timed out after {timeout:?} {why}"),
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// Between two polls of a condition.
const POLL: Duration = Duration::from_millis(20);

pub const WAIT: Duration = Duration::from_secs(10);
