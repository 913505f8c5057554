//! Gateway workers: the HTTP and gRPC servers run on a few threads, each a single-threaded
//! tokio runtime that owns the connections handed to it, round-robin, by two accept loops.
//!
//! Why not the multi-threaded runtime: a query is a short burst of CPU between two socket
//! events. On a work-stealing runtime every such event may wake a second, idle worker to look
//! for work (a futex wake and a context switch that finds nothing), and hyper's per-stream
//! HTTP/2 task may run on another core than its connection. A connection pinned to one thread
//! never hands a request to another thread, and several connections still use several cores.
//! The cost: queries of connections that share a worker run one after the other, which with
//! queries of tens of microseconds and one worker per core is what the cores allow anyway.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::JoinHandle;
use std::time::Duration;

use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tonic::codegen::Service;

use crate::gateway::bounds::GrpcBounds;
use crate::gateway::coalesce::CoalescedWrites;
use crate::gateway::connections::{
    ACCEPT_BACKOFF, Activity, Closed, ConnectionLimits, Connections, Ticket, Watched,
    out_of_resources,
};
use crate::gateway::tls::{Port, ServerTls};

/// A dead gRPC peer is one that leaves a keepalive ping unanswered this long (at most the
/// keepalive interval itself).
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// What each worker serves: both routers are cheap to clone (shared state behind `Arc`s).
#[derive(Clone)]
pub struct Routers {
    pub http: axum::Router,
    pub grpc: GrpcBounds<tonic::service::Routes>,
}

/// The running workers; [`Workers::join`] waits until every connection has finished.
pub struct Workers {
    threads: Vec<JoinHandle<()>>,
}

/// An accepted connection and its place among the open ones.
type Accepted = (std::net::TcpStream, Ticket);

/// Per worker: the connections handed to it by each accept loop.
struct Handoff {
    http: mpsc::UnboundedSender<Accepted>,
    grpc: mpsc::UnboundedSender<Accepted>,
}

/// What a worker needs besides its connections.
#[derive(Clone)]
struct Serving {
    routers: Routers,
    limits: ConnectionLimits,
    connections: Arc<Connections>,
    /// With TLS configured, every connection is TLS (`tls`'s module doc).
    tls: Option<ServerTls>,
    shutdown: CancellationToken,
}

impl Workers {
    /// Start `count` workers and the two accept loops (on the caller's runtime). Everything
    /// stops accepting when `shutdown` is cancelled and finishes its in-flight requests.
    pub fn start(
        count: usize,
        listeners: (TcpListener, TcpListener),
        routers: Routers,
        limits: ConnectionLimits,
        connections: Arc<Connections>,
        tls: Option<ServerTls>,
        shutdown: CancellationToken,
    ) -> std::io::Result<Workers> {
        let (http, grpc) = listeners;
        let mut handoffs = Vec::with_capacity(count);
        let mut threads = Vec::with_capacity(count);
        let serving = Serving {
            routers,
            limits,
            connections: connections.clone(),
            tls,
            shutdown: shutdown.clone(),
        };
        for n in 0..count.max(1) {
            let (http_tx, http_rx) = mpsc::unbounded_channel();
            let (grpc_tx, grpc_rx) = mpsc::unbounded_channel();
            handoffs.push(Handoff {
                http: http_tx,
                grpc: grpc_tx,
            });
            let serving = serving.clone();
            let thread = std::thread::Builder::new()
                .name(format!("gateway-{n}"))
                .spawn(move || run_worker(serving, http_rx, grpc_rx))?;
            threads.push(thread);
        }
        let handoffs = Arc::new(handoffs);
        tokio::spawn(accept(
            http,
            handoffs.clone(),
            |h| &h.http,
            connections.clone(),
            shutdown.clone(),
        ));
        tokio::spawn(accept(grpc, handoffs, |h| &h.grpc, connections, shutdown));
        Ok(Workers { threads })
    }

    /// Wait for every worker to finish (after shutdown), off the async threads.
    pub async fn join(self) {
        let threads = self.threads;
        let joined = tokio::task::spawn_blocking(move || {
            for t in threads {
                if t.join().is_err() {
                    tracing::error!("a gateway worker panicked");
                }
            }
        });
        let _ = joined.await;
    }
}

/// Accept connections until shutdown and hand them out round-robin, each with its ticket of the
/// shared connection cap (refused ones are closed at once). Out of descriptors, the loop pauses
/// instead of retrying at once: the failed accept leaves the connection queued, so an immediate
/// retry fails again and spins a core. Dropping the handoffs at the end closes every worker's
/// stream of new connections.
async fn accept(
    listener: TcpListener,
    handoffs: Arc<Vec<Handoff>>,
    channel: fn(&Handoff) -> &mpsc::UnboundedSender<Accepted>,
    connections: Arc<Connections>,
    shutdown: CancellationToken,
) {
    let mut next = 0;
    loop {
        // New connections wait in the listen queue, holding no descriptor of this process,
        // while the workers have yet to drop the sockets of those closed to make room.
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = connections.evictions_closed() => {}
        }
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) if out_of_resources(&e) => {
                let backoffs = connections
                    .counts
                    .accept_backoffs
                    .fetch_add(1, Ordering::Relaxed);
                if backoffs.is_power_of_two() {
                    tracing::warn!(backoffs = backoffs + 1, "accept failed, pausing: {e}");
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                }
            }
            Err(e) => {
                // Per-connection failures (reset before accept): go on.
                tracing::debug!("accept failed: {e}");
                continue;
            }
        };
        let Some(ticket) = connections.admit(peer.ip()) else {
            tracing::debug!("connection refused: max_connections reached and none idle");
            continue;
        };
        // Requests and answers go out in one write each; no Nagle delay on either side.
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY not set: {e}");
        }
        let Ok(stream) = stream.into_std() else {
            continue;
        };
        next = (next + 1) % handoffs.len();
        // A send fails only once that worker has stopped, i.e. during shutdown.
        let _ = channel(&handoffs[next]).send((stream, ticket));
    }
}

/// One worker: both servers' connections on a single-threaded runtime until shutdown, then
/// until each has finished its requests.
fn run_worker(
    serving: Serving,
    mut http: mpsc::UnboundedReceiver<Accepted>,
    mut grpc: mpsc::UnboundedReceiver<Accepted>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!("gateway worker not started: {e}");
            return;
        }
    };
    runtime.block_on(async move {
        let mut open = JoinSet::new();
        loop {
            tokio::select! {
                _ = serving.shutdown.cancelled() => break,
                Some((stream, ticket)) = http.recv() => {
                    if let Ok(stream) = TcpStream::from_std(stream) {
                        open.spawn(serve(stream, Port::Http, ticket, serving.clone()));
                    }
                }
                Some((stream, ticket)) = grpc.recv() => {
                    if let Ok(stream) = TcpStream::from_std(stream) {
                        open.spawn(serve(stream, Port::Grpc, ticket, serving.clone()));
                    }
                }
                Some(_) = open.join_next(), if !open.is_empty() => {}
                else => break,
            }
        }
        while open.join_next().await.is_some() {}
    });
}

/// One connection, after its TLS handshake when TLS is configured (run here, in the
/// connection's own task: a slow handshake holds up no other connection). The ticket is held
/// meanwhile, so handshakes under way count against `max_connections`; one chosen to make room
/// ends the handshake and drops its socket at once, so that the descriptors open stay within
/// the cap (a handshake left to its timeout would hold its socket outside the count). The
/// handshake's reads count as activity: a client that is handshaking is not the idle one.
async fn serve(stream: TcpStream, port: Port, ticket: Ticket, serving: Serving) {
    let tls = match &serving.tls {
        None => {
            return match port {
                Port::Http => serve_http(stream, ticket, serving).await,
                Port::Grpc => serve_grpc(stream, ticket, serving).await,
            };
        }
        Some(tls) => tls.clone(),
    };
    let stream = Watched::new(stream, ticket.activity.clone());
    let stream = tokio::select! {
        // Checked first: a connection evicted while queued for this worker never handshakes.
        biased;
        _ = ticket.activity.evicted() => return,
        stream = tls.handshake(stream, port) => stream,
    };
    let Some(stream) = stream else {
        return;
    };
    match port {
        Port::Http => serve_http(stream, ticket, serving).await,
        Port::Grpc => serve_grpc(stream, ticket, serving).await,
    }
}

/// One HTTP/1.1 connection: the request head must arrive within the header-read timeout.
async fn serve_http<T>(io: T, ticket: Ticket, serving: Serving)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = ticket.activity.clone();
    let router = serving.routers.http.clone();
    let service = tracked(activity.clone(), move |request: http::Request<Incoming>| {
        let mut router = router.clone();
        async move { router.call(request).await }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(serving.limits.header_read_timeout);
    let io = TokioIo::new(Watched::new(io, activity));
    let connection = builder.serve_connection(io, service);
    drive(connection, ticket, serving).await;
}

/// One gRPC (HTTP/2) connection: keepalive pings find dead peers, and at most
/// `grpc_max_concurrent_streams` calls run at once.
async fn serve_grpc<T>(io: T, ticket: Ticket, serving: Serving)
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = ticket.activity.clone();
    let routes = serving.routers.grpc.clone();
    let service = tracked(activity.clone(), move |request: http::Request<Incoming>| {
        let mut routes = routes.clone();
        async move { routes.call(request).await }
    });
    let limits = serving.limits;
    let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
    // The transport settings and why are in `gateway`'s module doc.
    builder
        .timer(TokioTimer::new())
        .adaptive_window(false)
        .keep_alive_interval(Some(limits.grpc_keepalive))
        .keep_alive_timeout(KEEPALIVE_TIMEOUT.min(limits.grpc_keepalive))
        .max_concurrent_streams(limits.grpc_max_concurrent_streams);
    // One write per gRPC answer instead of h2's two (see `coalesce`).
    let io = TokioIo::new(CoalescedWrites::new(Watched::new(io, activity)));
    let connection = builder.serve_connection(io, service);
    drive(connection, ticket, serving).await;
}

/// A service that counts its requests in flight on the connection's activity.
fn tracked<F, Fut, B>(
    activity: Arc<Activity>,
    call: F,
) -> impl hyper::service::Service<
    http::Request<Incoming>,
    Response = http::Response<B>,
    Error = Infallible,
    Future = impl Future<Output = Result<http::Response<B>, Infallible>> + Send,
> + Clone
where
    F: Fn(http::Request<Incoming>) -> Fut + Clone + Send,
    Fut: Future<Output = Result<http::Response<B>, Infallible>> + Send,
    B: http_body::Body,
{
    hyper::service::service_fn(move |request| {
        let in_flight = activity.begin();
        let answer = call(request);
        async move {
            let answer = answer.await;
            drop(in_flight);
            answer
        }
    })
}

/// The two hyper connection types, for [`drive`].
trait Graceful: Future {
    fn graceful_shutdown(self: std::pin::Pin<&mut Self>);
}

impl<I, S, B> Graceful for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn graceful_shutdown(self: std::pin::Pin<&mut Self>) {
        hyper::server::conn::http1::Connection::graceful_shutdown(self)
    }
}

impl<I, S, B, E> Graceful for hyper::server::conn::http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: http_body::Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: std::pin::Pin<&mut Self>) {
        hyper::server::conn::http2::Connection::graceful_shutdown(self)
    }
}

/// Run a connection until it ends, goes idle, is chosen to make room, or the service shuts
/// down (then it finishes its requests, still closed if it goes idle).
async fn drive<C, E>(connection: C, ticket: Ticket, serving: Serving)
where
    C: Graceful<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let idle = serving.limits.idle_timeout;
    let closing = ticket.activity.closing(idle);
    tokio::pin!(connection, closing);
    let closed = tokio::select! {
        ended = connection.as_mut() => {
            if let Err(e) = ended {
                tracing::debug!("connection ended: {e}");
            }
            return;
        }
        closed = &mut closing => closed,
        _ = serving.shutdown.cancelled() => {
            connection.as_mut().graceful_shutdown();
            tokio::select! {
                _ = connection => return,
                closed = closing => closed,
            }
        }
    };
    if closed == Closed::Idle {
        let counts = &serving.connections.counts;
        counts.idle_closed.fetch_add(1, Ordering::Relaxed);
    }
    // Dropping the connection closes the socket; the ticket goes with it.
}
