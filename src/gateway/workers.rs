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

use std::net::SocketAddr;
use std::thread::JoinHandle;

use futures::StreamExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::gateway::coalesce::CoalescedWrites;
use crate::gateway::tls::{self, Conn, ServerTls};

/// What each worker serves: both routers are cheap to clone (shared state behind `Arc`s).
#[derive(Clone)]
pub struct Routers {
    pub http: axum::Router,
    pub grpc: tonic::service::Routes,
}

/// The running workers; [`Workers::join`] waits until every connection has finished.
pub struct Workers {
    threads: Vec<JoinHandle<()>>,
}

/// Per worker: the connections handed to it by each accept loop.
struct Handoff {
    http: mpsc::UnboundedSender<std::net::TcpStream>,
    grpc: mpsc::UnboundedSender<std::net::TcpStream>,
}

impl Workers {
    /// Start `count` workers and the two accept loops (on the caller's runtime). Everything
    /// stops accepting when `shutdown` is cancelled and finishes its in-flight requests.
    pub fn start(
        count: usize,
        http: TcpListener,
        grpc: TcpListener,
        routers: Routers,
        tls: Option<ServerTls>,
        shutdown: CancellationToken,
    ) -> std::io::Result<Workers> {
        let mut handoffs = Vec::with_capacity(count);
        let mut threads = Vec::with_capacity(count);
        for n in 0..count.max(1) {
            let (http_tx, http_rx) = mpsc::unbounded_channel();
            let (grpc_tx, grpc_rx) = mpsc::unbounded_channel();
            handoffs.push(Handoff {
                http: http_tx,
                grpc: grpc_tx,
            });
            let (routers, tls, stop) = (routers.clone(), tls.clone(), shutdown.clone());
            let local = http.local_addr()?;
            let thread = std::thread::Builder::new()
                .name(format!("gateway-{n}"))
                .spawn(move || serve(routers, tls, local, http_rx, grpc_rx, stop))?;
            threads.push(thread);
        }
        let handoffs = std::sync::Arc::new(handoffs);
        tokio::spawn(accept(
            http,
            handoffs.clone(),
            |h| &h.http,
            shutdown.clone(),
        ));
        tokio::spawn(accept(grpc, handoffs, |h| &h.grpc, shutdown));
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

/// Accept connections until shutdown and hand them out round-robin. Dropping the handoffs at
/// the end closes every worker's stream of new connections.
async fn accept(
    listener: TcpListener,
    handoffs: std::sync::Arc<Vec<Handoff>>,
    channel: fn(&Handoff) -> &mpsc::UnboundedSender<std::net::TcpStream>,
    shutdown: CancellationToken,
) {
    let mut next = 0;
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Per-connection failures (reset before accept, out of descriptors): go on.
                tracing::debug!("accept failed: {e}");
                continue;
            }
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
        let _ = channel(&handoffs[next]).send(stream);
    }
}

/// One worker: both servers on a single-threaded runtime until shutdown.
fn serve(
    routers: Routers,
    tls: Option<ServerTls>,
    http_local: SocketAddr,
    http: mpsc::UnboundedReceiver<std::net::TcpStream>,
    grpc: mpsc::UnboundedReceiver<std::net::TcpStream>,
    shutdown: CancellationToken,
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
        // The TLS handshakes (when configured) run here, on this worker, one task each.
        let http = tls::connections(http, tls.clone(), tls::Port::Http);
        let mut grpc = tls::connections(grpc, tls, tls::Port::Grpc);
        let stop = shutdown.clone();
        let http_server = axum::serve(
            Handed {
                connections: http,
                local: http_local,
            },
            routers.http,
        )
        .with_graceful_shutdown(async move { stop.cancelled().await });
        // One write per gRPC answer instead of h2's two (see `coalesce`).
        let incoming = futures::stream::poll_fn(move |cx| grpc.poll_recv(cx))
            .map(|conn| Ok::<_, std::io::Error>(CoalescedWrites::new(conn)));
        let grpc_server = tonic::transport::Server::builder()
            // The transport settings and why are in `gateway`'s module doc; the ones that
            // matter are spelled out so that a changed tonic default cannot change them.
            .http2_adaptive_window(Some(false))
            .http2_keepalive_interval(None)
            .add_routes(routers.grpc)
            .serve_with_incoming_shutdown(incoming, async move { shutdown.cancelled().await });
        let (http_result, grpc_result) = tokio::join!(http_server, grpc_server);
        if let Err(e) = http_result {
            tracing::warn!("HTTP server ended with an error: {e}");
        }
        if let Err(e) = grpc_result {
            tracing::warn!("gRPC server ended with an error: {e}");
        }
    });
}

/// The connections an accept loop handed to this worker, as axum's listener.
struct Handed {
    connections: mpsc::UnboundedReceiver<Conn>,
    local: SocketAddr,
}

impl axum::serve::Listener for Handed {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        loop {
            let Some(conn) = self.connections.recv().await else {
                // No more connections: shutdown has begun, and axum stops on its signal.
                return std::future::pending().await;
            };
            match conn.tcp().peer_addr() {
                Ok(peer) => return (conn, peer),
                Err(e) => tracing::debug!("handed connection dropped: {e}"),
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}
