//! The open connections of both servers: how many may be open at once, when one counts as idle,
//! and the accept loops' back-off when the process runs out of descriptors. What each bound
//! protects against is in `docs/connections.md`.
//!
//! Every accepted connection, HTTP or gRPC, takes a [`Ticket`] from one shared [`Connections`]
//! before it is handed to a worker, and gives it back when it closes: from accept, so a TLS
//! handshake under way holds one. At the cap, an idle connection (no request in flight, or a
//! handshake not yet complete) is closed to admit the new one, whatever its age: the longest
//! idle of the peer address that holds the most idle connections. Without an idle connection
//! the new one is refused (closed at once). So a flood of idle sockets, however fast, cannot
//! keep `/health` out (a new connection reads its request within moments, long before the flood
//! has gone round every slot), a flooding address evicts its own sockets first, and busy
//! connections are never cut.
//!
//! A connection is idle once, for the idle timeout, either nothing was read from its peer, or it
//! had no request in flight and none began. The second half matters on HTTP/2: a peer answering
//! the server's keepalive pings sends bytes without ever sending a request.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

/// Connections closed to make room whose socket their worker has not dropped yet, at most: the
/// accept loops wait beyond this, so that open sockets stay within the cap plus a small margin
/// however far the workers fall behind a flood (`docs/connections.md`).
pub const EVICTED_UNCLOSED_MAX: usize = 8;

/// How long an accept loop pauses when the process (or the system) is out of descriptors.
pub const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Descriptors kept out of the connection cap's default: RocksDB's files, ZeroMQ and etcd
/// sockets, the listeners, logs (see `docs/connections.md`).
const RESERVED_DESCRIPTORS: u64 = 128;

/// The transport settings both servers share (from the configuration).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    pub max_connections: usize,
    pub idle_timeout: Duration,
    pub header_read_timeout: Duration,
    pub grpc_keepalive: Duration,
    pub grpc_max_concurrent_streams: u32,
}

/// The cap on open connections: the configured one, at most what the descriptor limit leaves
/// after [`RESERVED_DESCRIPTORS`] and a quarter of the limit for subscriptions and storage.
pub fn effective_max_connections(configured: u64, descriptor_limit: Option<u64>) -> usize {
    let by_descriptors = descriptor_limit
        .map(|n| n.saturating_sub(RESERVED_DESCRIPTORS + n / 4).max(16))
        .unwrap_or(u64::MAX);
    configured
        .min(by_descriptors)
        .try_into()
        .unwrap_or(usize::MAX)
}

/// The soft `RLIMIT_NOFILE` of this process (`None`: unlimited or unknown).
pub fn descriptor_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// One open connection's activity, shared by its IO wrapper, its request counter and the
/// registry.
#[derive(Debug)]
pub struct Activity {
    epoch: Instant,
    /// Milliseconds since `epoch` of the last byte read from the peer.
    last_read: AtomicU64,
    /// Milliseconds since `epoch` a request last began or ended.
    last_request: AtomicU64,
    in_flight: AtomicU32,
    close: Notify,
}

impl Activity {
    fn new(epoch: Instant) -> Activity {
        let now = epoch.elapsed().as_millis() as u64;
        Activity {
            epoch,
            last_read: AtomicU64::new(now),
            last_request: AtomicU64::new(now),
            in_flight: AtomicU32::new(0),
            close: Notify::new(),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn read(&self) {
        self.last_read.store(self.now(), Ordering::Relaxed);
    }

    /// A request began; the returned guard ends it.
    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.last_request.store(self.now(), Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// How long until the connection counts as idle (zero: it is idle now).
    fn until_idle(&self, idle: Duration) -> Duration {
        let idle = idle.as_millis() as u64;
        let now = self.now();
        let by_reads = (self.last_read.load(Ordering::Relaxed) + idle).saturating_sub(now);
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Duration::from_millis(by_reads);
        }
        let by_requests = (self.last_request.load(Ordering::Relaxed) + idle).saturating_sub(now);
        Duration::from_millis(by_reads.min(by_requests))
    }

    /// How long the connection has been idle for eviction: `None` while a request is in flight.
    fn idle_for(&self) -> Option<u64> {
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return None;
        }
        let last =
            (self.last_read.load(Ordering::Relaxed)).max(self.last_request.load(Ordering::Relaxed));
        Some(self.now().saturating_sub(last))
    }

    /// Resolves once the connection has been chosen to make room (at once if it already was).
    pub async fn evicted(&self) {
        self.close.notified().await
    }

    /// Resolves once the connection is idle for `idle`, or has been chosen to make room.
    pub async fn closing(&self, idle: Duration) -> Closed {
        loop {
            let wait = self.until_idle(idle);
            if wait.is_zero() {
                return Closed::Idle;
            }
            tokio::select! {
                _ = self.close.notified() => return Closed::Evicted,
                // At least 10 ms between checks: a connection read from constantly needs no
                // more precision than that.
                _ = tokio::time::sleep(wait.max(Duration::from_millis(10))) => {}
            }
        }
    }
}

/// Why a connection is closed by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closed {
    Idle,
    Evicted,
}

/// A request in flight on a connection, until dropped.
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.0.last_request.store(self.0.now(), Ordering::Relaxed);
    }
}

/// The open connections of both servers and what happened to the ones refused or closed.
#[derive(Debug)]
pub struct Connections {
    max: usize,
    epoch: Instant,
    open: Mutex<Open>,
    /// Connections evicted whose ticket (and socket) is not dropped yet, and its decrease.
    evicted_unclosed: AtomicUsize,
    evicted_closed: Notify,
    pub counts: ConnectionCounts,
}

#[derive(Debug, Default)]
struct Open {
    next_id: u64,
    by_id: HashMap<u64, (IpAddr, Arc<Activity>)>,
}

impl Open {
    /// The connection to close at the cap: of the peer address holding the most idle
    /// connections, the one idle the longest; `None` when every one has a request in flight.
    /// Preferring the address that holds the most, rather than capping each address, keeps
    /// clients that share one (a proxy, a NAT, every client on this host) from being refused
    /// while slots are free, and still makes a flooding address pay with its own sockets.
    fn victim(&self) -> Option<u64> {
        // A scan of the open connections, only at the cap: cheaper than keeping them ordered
        // by activity on every read.
        let mut idle = Vec::with_capacity(self.by_id.len());
        let mut per_peer: HashMap<IpAddr, usize> = HashMap::new();
        for (id, (peer, activity)) in &self.by_id {
            if let Some(for_ms) = activity.idle_for() {
                idle.push((*id, *peer, for_ms));
                *per_peer.entry(*peer).or_default() += 1;
            }
        }
        let (&peer, _) = per_peer.iter().max_by_key(|(_, n)| **n)?;
        idle.into_iter()
            .filter(|(_, p, _)| *p == peer)
            .max_by_key(|(_, _, for_ms)| *for_ms)
            .map(|(id, _, _)| id)
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct ConnectionCounts {
    pub refused: AtomicU64,
    pub evicted: AtomicU64,
    pub idle_closed: AtomicU64,
    pub accept_backoffs: AtomicU64,
}

/// An admitted connection's place in [`Connections`], given back when dropped.
#[derive(Debug)]
pub struct Ticket {
    id: u64,
    pub activity: Arc<Activity>,
    registry: Arc<Connections>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self.registry.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.by_id.remove(&self.id).is_none() {
            // Evicted: out of the count already; its socket goes with this ticket's task.
            drop(open);
            let registry = &self.registry;
            registry.evicted_unclosed.fetch_sub(1, Ordering::Relaxed);
            registry.evicted_closed.notify_waiters();
        }
    }
}

impl Connections {
    pub fn new(max: usize) -> Arc<Connections> {
        Arc::new(Connections {
            max: max.max(1),
            epoch: Instant::now(),
            open: Mutex::default(),
            evicted_unclosed: AtomicUsize::new(0),
            evicted_closed: Notify::new(),
            counts: ConnectionCounts::default(),
        })
    }

    pub fn open(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .len()
    }

    /// Resolves once fewer than [`EVICTED_UNCLOSED_MAX`] evicted connections still hold their
    /// socket; an accept loop waits for this before accepting.
    pub async fn evictions_closed(&self) {
        loop {
            let closed = self.evicted_closed.notified();
            tokio::pin!(closed);
            // Registered before the check, so that a drop between the two is not missed.
            closed.as_mut().enable();
            if self.evicted_unclosed.load(Ordering::Relaxed) < EVICTED_UNCLOSED_MAX {
                return;
            }
            closed.await;
        }
    }

    /// Admit a new connection from `peer`, closing an idle one at the cap ([`Open::victim`]);
    /// `None`: refused (and counted).
    pub fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Ticket> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.by_id.len() >= self.max {
            let Some(id) = open.victim() else {
                self.counts.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            // Out of the count now, so that it is chosen once; its worker drops its socket on
            // its next turn, in a handshake or not (the margin in `docs/connections.md`).
            if let Some((_, activity)) = open.by_id.remove(&id) {
                self.evicted_unclosed.fetch_add(1, Ordering::Relaxed);
                activity.close.notify_one();
            }
            self.counts.evicted.fetch_add(1, Ordering::Relaxed);
        }
        let id = open.next_id;
        open.next_id += 1;
        let activity = Arc::new(Activity::new(self.epoch));
        open.by_id.insert(id, (peer, activity.clone()));
        Some(Ticket {
            id,
            activity,
            registry: self.clone(),
        })
    }
}

impl crate::metrics::Section for Connections {
    fn render(&self, w: &mut String) {
        use std::fmt::Write;
        let c = &self.counts;
        let rows = [
            (
                "conductor_connections_open",
                "gauge",
                "Open HTTP and gRPC connections",
                self.open() as u64,
            ),
            (
                "conductor_connections_max",
                "gauge",
                "The cap on open connections (max_connections, or what the descriptor limit allows)",
                self.max as u64,
            ),
            (
                "conductor_connections_refused_total",
                "counter",
                "Connections closed at accept: the cap was reached and no open one was idle",
                c.refused.load(Ordering::Relaxed),
            ),
            (
                "conductor_connections_evicted_total",
                "counter",
                "Idle connections closed to admit a new one at the cap",
                c.evicted.load(Ordering::Relaxed),
            ),
            (
                "conductor_connections_idle_closed_total",
                "counter",
                "Connections closed after connection_idle_timeout_ms without activity",
                c.idle_closed.load(Ordering::Relaxed),
            ),
            (
                "conductor_accept_backoffs_total",
                "counter",
                "Accept loop pauses because the process or system was out of descriptors",
                c.accept_backoffs.load(Ordering::Relaxed),
            ),
        ];
        for (name, kind, help, value) in rows {
            let _ = writeln!(
                w,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
    }
}

/// Whether an accept error means the process or system is out of descriptors or buffers (the
/// accept loop backs off instead of retrying at once).
pub fn out_of_resources(e: &io::Error) -> bool {
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    const ENOBUFS: i32 = 105;
    const ENOMEM: i32 = 12;
    matches!(e.raw_os_error(), Some(EMFILE | ENFILE | ENOBUFS | ENOMEM))
}

/// A connection's IO that notes every read from the peer in its [`Activity`]. Generic over the
/// stream, so that a TLS stream can be watched the same way.
pub struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> Watched<T> {
    pub fn new(inner: T, activity: Arc<Activity>) -> Watched<T> {
        Watched { inner, activity }
    }

    pub fn get_ref(&self) -> &T {
        &self.inner
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_leaves_descriptors_for_storage_and_subscriptions() {
        assert_eq!(effective_max_connections(10_000, None), 10_000);
        assert_eq!(effective_max_connections(10_000, Some(256)), 64);
        assert_eq!(effective_max_connections(10_000, Some(1024)), 640);
        assert_eq!(effective_max_connections(100, Some(1 << 20)), 100);
        assert_eq!(effective_max_connections(10_000, Some(10)), 16);
    }

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

    #[tokio::test]
    async fn at_the_cap_the_longest_idle_makes_room_whatever_its_age_and_busy_ones_never_do() {
        let connections = Connections::new(2);
        let first = connections.admit(A).expect("room");
        std::thread::sleep(Duration::from_millis(10));
        let second = connections.admit(A).expect("room");
        let busy = second.activity.begin();
        // Idle for milliseconds only: still the one to go.
        let third = connections.admit(A).expect("the idle one makes room");
        assert_eq!(
            first.activity.closing(Duration::from_secs(3600)).await,
            Closed::Evicted
        );
        assert_eq!(connections.counts.evicted.load(Ordering::Relaxed), 1);
        let _busy_too = third.activity.begin();
        // Every open one is busy: refused.
        assert!(connections.admit(A).is_none());
        assert_eq!(connections.counts.refused.load(Ordering::Relaxed), 1);
        drop(busy);
        let fourth = connections
            .admit(A)
            .expect("the one no longer busy makes room");
        second.activity.evicted().await;
        assert_eq!(connections.open(), 2);
        // Both evicted still hold their sockets; the accept loops wait once enough do.
        assert_eq!(connections.evicted_unclosed.load(Ordering::Relaxed), 2);
        drop((first, second, third));
        assert_eq!(connections.evicted_unclosed.load(Ordering::Relaxed), 0);
        connections.evictions_closed().await;
        assert_eq!(connections.open(), 1);
        drop(fourth);
        assert_eq!(connections.open(), 0);
    }

    #[tokio::test]
    async fn the_address_holding_the_most_idle_connections_gives_one_up_first() {
        let connections = Connections::new(4);
        let quiet = connections.admit(B).expect("room");
        std::thread::sleep(Duration::from_millis(20));
        let flood: Vec<_> = (0..3)
            .map(|_| connections.admit(A).expect("room"))
            .collect();
        // `quiet` is idle the longest, but A holds three idle connections to its one.
        let _new = connections.admit(B).expect("room made");
        let registered = |ticket: &Ticket| {
            let open = connections.open.lock().unwrap();
            open.by_id.contains_key(&ticket.id)
        };
        assert!(registered(&quiet));
        assert_eq!(flood.iter().filter(|t| !registered(t)).count(), 1);
        assert_eq!(connections.open(), 4);
        assert_eq!(connections.counts.evicted.load(Ordering::Relaxed), 1);
    }

    #[tokio::test]
    async fn a_connection_is_idle_without_reads_or_without_requests() {
        let activity = Arc::new(Activity::new(Instant::now()));
        let idle = Duration::from_millis(50);
        assert!(!activity.until_idle(idle).is_zero());
        let request = activity.begin();
        std::thread::sleep(idle);
        assert!(
            activity.until_idle(idle).is_zero(),
            "no reads for the idle time"
        );
        activity.read();
        assert!(!activity.until_idle(idle).is_zero());
        drop(request);
        assert_eq!(activity.closing(idle).await, Closed::Idle);
    }
}
