//! The bounds on requests both transports apply, written once: which requests need the token
//! (checked from the headers, before any body byte is read), the largest message each gRPC method
//! takes, and the one budget of bytes of large bodies in flight that HTTP bodies and gRPC messages
//! share. What each bound protects against is in `docs/connections.md`.
//!
//! HTTP applies them in its router (`http::require_token`, `http::decode_body`); gRPC in
//! [`GrpcBounds`], a layer in front of tonic's routes that looks at a request before tonic
//! buffers and decodes its message.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tonic::Status;
use tonic::codegen::Service;

use crate::gateway::auth::Access;
use crate::gateway::body_budget::{self, BodyBudget};
use crate::gateway::ops::Ops;

/// Largest message of a gRPC method other than the two queries (registrations, listings,
/// health, snapshot requests): far above any legal one, small enough to buffer freely.
pub const SMALL_MESSAGE_BYTES: usize = 256 << 10;

/// What a query message holds besides its packed ids (names, cache salt, instance filter).
const QUERY_FIELDS_BYTES: usize = 1 << 20;

/// Largest encoding of one packed `int32` / `uint64` id (a negative `int32` takes 10 bytes).
const ID_BYTES: usize = 10;

/// gRPC's message prefix: a compression flag and a 4-byte length.
const PREFIX: usize = 5;

/// Who may send what over HTTP.
pub fn http_access(method: &http::Method, path: &str) -> Access {
    match path {
        "/register" | "/unregister" | "/registry/reupload" | "/registry/accept" => Access::Write,
        "/engines" if method != http::Method::GET => Access::Write,
        p if p.starts_with("/engines/") => Access::Write,
        "/health" => Access::Health,
        _ => Access::Read,
    }
}

/// Who may call a gRPC method (`/package.Service/Method`). Snapshots carry every registration
/// and block, so they need the token whenever one is configured, like registration changes.
pub fn grpc_access(path: &str) -> Access {
    match path {
        "/mooncake.conductor.v1.Conductor/Register"
        | "/mooncake.conductor.v1.Conductor/Unregister"
        | "/mooncake.conductor.v1.Conductor/RegisterEngine"
        | "/mooncake.conductor.v1.Conductor/UnregisterEngine" => Access::Write,
        "/mooncake.conductor.v1.Conductor/Health" => Access::Health,
        p if p.starts_with("/mooncake.conductor.v1.Replica/") => Access::Write,
        _ => Access::Read,
    }
}

/// The largest message of each gRPC method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageLimits {
    pub query: usize,
    pub small: usize,
}

impl MessageLimits {
    /// A query holds at most `max_query_tokens` ids; nothing takes more than `rpc_limit`.
    pub fn new(max_query_tokens: usize, rpc_limit: usize) -> MessageLimits {
        let query = max_query_tokens
            .saturating_mul(ID_BYTES)
            .saturating_add(QUERY_FIELDS_BYTES);
        MessageLimits {
            query: query.min(rpc_limit),
            small: SMALL_MESSAGE_BYTES.min(rpc_limit),
        }
    }

    pub fn of(&self, path: &str) -> usize {
        match path {
            "/mooncake.conductor.v1.Conductor/Query"
            | "/mooncake.conductor.v1.Conductor/QueryByHash" => self.query,
            _ => self.small,
        }
    }
}

/// The gRPC layer: the token checked from the metadata, the message's declared length checked
/// against its method's limit and, when large, given a share of the body budget, all before the
/// message is buffered.
#[derive(Clone)]
pub struct GrpcBounds<S> {
    inner: S,
    shared: Arc<Shared>,
}

struct Shared {
    ops: Ops,
    budget: BodyBudget,
    limits: MessageLimits,
}

impl<S> GrpcBounds<S> {
    pub fn new(inner: S, ops: Ops, budget: BodyBudget, limits: MessageLimits) -> Self {
        GrpcBounds {
            inner,
            shared: Arc::new(Shared {
                ops,
                budget,
                limits,
            }),
        }
    }
}

type Answer = http::Response<tonic::body::Body>;

impl<S> Service<http::Request<Incoming>> for GrpcBounds<S>
where
    S: Service<http::Request<Bounded>, Response = Answer, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Incoming>) -> Self::Future {
        // The ready clone serves this request; the fresh one waits for the next `poll_ready`.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let shared = self.shared.clone();
        Box::pin(async move {
            let path = request.uri().path();
            let authorization = request.headers().get("authorization");
            let refused = shared
                .ops
                .authorize(grpc_access(path), authorization.map(|v| v.as_bytes()))
                .is_err();
            let limit = shared.limits.of(path);
            let (parts, body) = request.into_parts();
            if refused {
                // The method answers the refusal itself from the metadata (its own reply
                // format), handed an empty message: the body sent is never read.
                drop(body);
                let empty = Bounded::Empty(Some(Bytes::from_static(&[0; PREFIX])));
                return inner.call(http::Request::from_parts(parts, empty)).await;
            }
            let (head, rest) = match read_prefix(body).await {
                Ok(read) => read,
                Err(status) => return Ok(status.into_http()),
            };
            let declared = declared_len(&head);
            if declared > limit {
                let message = format!(
                    "{} takes messages of at most {limit} bytes; this one declares {declared}",
                    parts.uri.path()
                );
                return Ok(Status::resource_exhausted(message).into_http());
            }
            let Ok(share) = shared.budget.reserve(declared, body_budget::WAIT).await else {
                let message =
                    "too many large messages in flight (http_inflight_body_bytes); retry later";
                return Ok(Status::unavailable(message).into_http());
            };
            let body = Bounded::Prefixed {
                head: Some(head),
                remaining: limit + PREFIX,
                rest,
            };
            let answer = inner.call(http::Request::from_parts(parts, body)).await;
            // Held while the message is decoded and answered.
            drop(share);
            answer
        })
    }
}

/// Read until the first message's prefix is in (or the body ends).
async fn read_prefix(mut body: Incoming) -> Result<(Bytes, Incoming), Status> {
    let mut head = BytesMut::new();
    while head.len() < PREFIX {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => head.extend_from_slice(&data),
                Err(_) => break,
            },
            Some(Err(e)) => return Err(Status::cancelled(format!("request body: {e}"))),
        }
    }
    Ok((head.freeze(), body))
}

/// The length the first message's prefix declares (0 while there is no whole prefix).
fn declared_len(head: &[u8]) -> usize {
    match head.get(1..PREFIX) {
        Some(len) => u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize,
        None => 0,
    }
}

/// A gRPC request body after [`GrpcBounds`]: an empty message in place of a refused one, or the
/// bytes read so far followed by the rest, at most the method's limit in all.
pub enum Bounded {
    Empty(Option<Bytes>),
    Prefixed {
        head: Option<Bytes>,
        remaining: usize,
        rest: Incoming,
    },
}

impl Body for Bounded {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        match self.get_mut() {
            Bounded::Empty(message) => Poll::Ready(message.take().map(|m| Ok(Frame::data(m)))),
            Bounded::Prefixed {
                head,
                remaining,
                rest,
            } => {
                let frame = match head.take() {
                    Some(head) => Frame::data(head),
                    None => match Pin::new(rest).poll_frame(cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(None) => return Poll::Ready(None),
                        Poll::Ready(Some(Err(e))) => {
                            let status = Status::cancelled(format!("request body: {e}"));
                            return Poll::Ready(Some(Err(status)));
                        }
                        Poll::Ready(Some(Ok(frame))) => frame,
                    },
                };
                if let Some(data) = frame.data_ref() {
                    // A unary request is one message: more bytes than its limit allows are
                    // refused as they arrive, never buffered.
                    let Some(left) = remaining.checked_sub(data.len()) else {
                        let status =
                            Status::resource_exhausted("request exceeds its method's limit");
                        return Poll::Ready(Some(Err(status)));
                    };
                    *remaining = left;
                }
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Bounded::Empty(message) => message.is_none(),
            Bounded::Prefixed { head, rest, .. } => head.is_none() && rest.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_may_take_what_its_token_cap_allows_and_other_methods_little() {
        let limits = MessageLimits::new(1000, 64 << 20);
        assert_eq!(
            limits.of("/mooncake.conductor.v1.Conductor/Query"),
            10_000 + (1 << 20)
        );
        assert_eq!(
            limits.of("/mooncake.conductor.v1.Conductor/QueryByHash"),
            limits.query
        );
        assert_eq!(
            limits.of("/mooncake.conductor.v1.Conductor/Register"),
            SMALL_MESSAGE_BYTES
        );
        assert_eq!(
            limits.of("/grpc.reflection.v1.ServerReflection/x"),
            SMALL_MESSAGE_BYTES
        );
        let capped = MessageLimits::new(1 << 30, 4 << 20);
        assert_eq!((capped.query, capped.small), (4 << 20, SMALL_MESSAGE_BYTES));
    }

    #[test]
    fn access_by_route_on_both_transports() {
        use http::Method;
        assert_eq!(http_access(&Method::POST, "/register"), Access::Write);
        assert_eq!(http_access(&Method::GET, "/health"), Access::Health);
        assert_eq!(http_access(&Method::POST, "/query"), Access::Read);
        assert_eq!(http_access(&Method::GET, "/engines"), Access::Read);
        assert_eq!(http_access(&Method::POST, "/engines"), Access::Write);
        assert_eq!(http_access(&Method::DELETE, "/engines/e1"), Access::Write);
        assert_eq!(
            grpc_access("/mooncake.conductor.v1.Conductor/RegisterEngine"),
            Access::Write
        );
        assert_eq!(
            grpc_access("/mooncake.conductor.v1.Conductor/Unregister"),
            Access::Write
        );
        assert_eq!(
            grpc_access("/mooncake.conductor.v1.Conductor/Health"),
            Access::Health
        );
        assert_eq!(
            grpc_access("/mooncake.conductor.v1.Conductor/Query"),
            Access::Read
        );
        assert_eq!(
            grpc_access("/mooncake.conductor.v1.Replica/Snapshot"),
            Access::Write
        );
    }

    #[test]
    fn the_declared_length_is_the_prefix_big_endian() {
        assert_eq!(declared_len(&[0, 0, 0, 1, 0]), 256);
        assert_eq!(declared_len(&[0, 3, 0xc0, 0, 0, 9]), 0x03c0_0000);
        assert_eq!(declared_len(&[0, 0]), 0);
    }
}
