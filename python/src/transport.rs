//! The client's HTTP/2 transport: what the generated tonic client sends its calls through, in
//! place of tonic's `Channel`.
//!
//! Why not `Channel`: it puts a buffer service (a worker task fed by a channel) in front of
//! hyper's client, which hands every call to further tasks (a dispatcher, a body pipe, the
//! connection), and the unary body goes out as a DATA frame followed by an empty END_STREAM one.
//! On the runtime of a client that blocks the calling thread until the answer, each hand-off is
//! a wake-up of another task and, on a multi-threaded runtime, of another thread. Here a call is
//! the caller's own future on h2 directly: the request's message (one buffer, as tonic encodes a
//! unary request) is queued as HEADERS and a single DATA frame with END_STREAM set, so both leave
//! in one write, and the connection task runs on the same thread (see `lib.rs`'s runtime).
//!
//! What stays as with `Channel`: TCP_NODELAY, the connect timeout, hyper's flow-control windows,
//! the request's scheme and authority, and reconnection: a call that finds the connection gone
//! opens a new one. A server closes connections idle for its `connection_idle_timeout_ms`, and a
//! call may be sent just as that happens, before this side has seen the close: a call on a reused
//! connection that ends before any answer (a GOAWAY naming an earlier stream, a refused stream,
//! the socket closed) is sent once more on a new connection. Any other failure, and a second
//! one, reaches tonic, which maps it to a status as before.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use h2::client::SendRequest;
use http_body::Frame;
use http_body_util::BodyExt;
use tokio::sync::Mutex;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Stream and connection windows as hyper's client sets them (the ones `Channel` used): far
/// above one answer, so flow control never waits on the loopback or a LAN.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;

/// One server address and, once connected, the connection's request handle.
#[derive(Clone)]
pub(crate) struct Transport {
    shared: Arc<Shared>,
}

struct Shared {
    /// `host:port` as given to setup() (resolved at each connect, as `Channel` did).
    addr: String,
    /// `http://host:port` (`https://` with TLS): every request's scheme and authority.
    origin: String,
    connect_timeout: Duration,
    /// With `CONDUCTOR_TLS_CA`: each connection's TLS handshake (see `tls.rs`).
    tls: Option<crate::tls::ClientTls>,
    /// `None` until connected, or after the connection was found closed.
    connection: Mutex<Option<Connection>>,
}

/// A request handle and the task that drives its connection.
struct Connection {
    sender: SendRequest<Bytes>,
    task: tokio::task::JoinHandle<()>,
}

/// A ready handle, and whether its connection was opened for this call (`fresh`) or reused.
struct Ready {
    sender: SendRequest<Bytes>,
    fresh: bool,
}

impl Transport {
    /// A transport to `addr` (`host:port`) whose requests name `origin` (`http://host:port`).
    pub(crate) fn new(
        addr: String,
        origin: String,
        connect_timeout: Duration,
        tls: Option<crate::tls::ClientTls>,
    ) -> Transport {
        Transport {
            shared: Arc::new(Shared {
                addr,
                origin,
                connect_timeout,
                tls,
                connection: Mutex::new(None),
            }),
        }
    }

    /// Opens the connection now (setup() proves it with a call right after).
    pub(crate) async fn connect(&self) -> Result<(), BoxError> {
        self.ready_sender().await.map(drop)
    }

    /// A handle ready for one more stream, on the current connection or, if there is none or it
    /// has ended, on a new one.
    async fn ready_sender(&self) -> Result<Ready, BoxError> {
        let mut slot = self.shared.connection.lock().await;
        if let Some(sender) = slot.as_ref().map(|c| c.sender.clone()) {
            match sender.ready().await {
                Ok(sender) => {
                    return Ok(Ready {
                        sender,
                        fresh: false,
                    });
                }
                // The connection has ended (server gone or restarted): reconnect below.
                Err(_) => *slot = None,
            }
        }
        let connection = tokio::time::timeout(self.shared.connect_timeout, self.open())
            .await
            .map_err(|_| "connect timed out")??;
        let sender = connection.sender.clone();
        *slot = Some(connection);
        Ok(Ready {
            sender: sender.ready().await?,
            fresh: true,
        })
    }

    /// Forget the current connection if it has ended, so that the next call opens a new one
    /// (a concurrent call may already have replaced it with a live one, which stays).
    async fn forget_if_ended(&self) {
        let mut slot = self.shared.connection.lock().await;
        if slot.as_ref().is_some_and(|c| c.task.is_finished()) {
            *slot = None;
        }
    }

    /// Closes the connection: the server sees it end now, not when this runtime next runs.
    /// Waits at most `wait` for the connection's task (calls still in flight keep it open).
    pub(crate) async fn close(&self, wait: Duration) {
        let connection = self.shared.connection.lock().await.take();
        if let Some(Connection { sender, task }) = connection {
            drop(sender);
            let _ = tokio::time::timeout(wait, task).await;
        }
    }

    async fn open(&self) -> Result<Connection, BoxError> {
        let tcp = tokio::net::TcpStream::connect(self.shared.addr.as_str()).await?;
        // A request leaves in one segment; without NODELAY it could wait for the last ACK.
        tcp.set_nodelay(true)?;
        match &self.shared.tls {
            None => h2_over(tcp).await,
            Some(tls) => h2_over(tls.connector.connect(tls.name.clone(), tcp).await?).await,
        }
    }

    async fn unary(
        self,
        request: http::Request<tonic::body::Body>,
    ) -> Result<http::Response<ResponseBody>, BoxError> {
        let (mut parts, body) = request.into_parts();
        // A unary request's body is one encoded message: wait for all of it, send it in one frame.
        let message = body.collect().await?.to_bytes();
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        parts.uri = format!("{}{path}", self.shared.origin).parse()?;
        let ready = self.ready_sender().await?;
        match send(ready.sender, &parts, message.clone()).await {
            Ok(response) => Ok(response.map(ResponseBody::new)),
            Err(e) if !ready.fresh && closed_before_answer(&e) => {
                self.forget_if_ended().await;
                let again = self.ready_sender().await?;
                Ok(send(again.sender, &parts, message)
                    .await?
                    .map(ResponseBody::new))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Send one request (HEADERS, then its message in one DATA frame) and wait for the answer's head.
async fn send(
    mut sender: SendRequest<Bytes>,
    parts: &http::request::Parts,
    message: Bytes,
) -> Result<http::Response<h2::RecvStream>, h2::Error> {
    let mut request = http::Request::new(());
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    let end_with_headers = message.is_empty();
    let (response, mut stream) = sender.send_request(request, end_with_headers)?;
    if !end_with_headers {
        stream.send_data(message, true)?;
    }
    response.await
}

/// The connection ended under the call before an answer: the server closed it (idle, or going
/// away) or refused the stream, so the call was not served and may be sent again.
fn closed_before_answer(e: &h2::Error) -> bool {
    e.is_go_away() || e.is_io() || e.reason() == Some(h2::Reason::REFUSED_STREAM)
}

impl tower_service::Service<http::Request<tonic::body::Body>> for Transport {
    type Response = http::Response<ResponseBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // Stream capacity is waited for in the call, where the connection may be replaced.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.clone().unary(request))
    }
}

/// An answer's body as tonic reads it: DATA frames (their window given back as they are read),
/// then the trailers.
pub(crate) struct ResponseBody {
    stream: h2::RecvStream,
    data_done: bool,
    done: bool,
}

impl ResponseBody {
    fn new(stream: h2::RecvStream) -> ResponseBody {
        ResponseBody {
            stream,
            data_done: false,
            done: false,
        }
    }
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if !this.data_done {
            match ready!(this.stream.poll_data(cx)) {
                Some(Ok(chunk)) => {
                    // Its bytes are read: the server may send as many again.
                    let _ = this.stream.flow_control().release_capacity(chunk.len());
                    return Poll::Ready(Some(Ok(Frame::data(chunk))));
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => this.data_done = true,
            }
        }
        let trailers = ready!(this.stream.poll_trailers(cx));
        this.done = true;
        Poll::Ready(trailers.transpose().map(|t| t.map(Frame::trailers)))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }
}

/// The HTTP/2 handshake over `io` (TCP, or TLS over it), and the task that drives the connection.
async fn h2_over<T>(io: T) -> Result<Connection, BoxError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = h2::client::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .enable_push(false)
        .handshake(io)
        .await?;
    // Ends when the server closes the connection or every handle to it is dropped.
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(Connection { sender, task })
}
