//! The gateway: gRPC and HTTP adapters over one operation layer.
//!
//! Layout: [`auth`] the optional shared token; [`ops`] transport-neutral operations;
//! [`readiness`] what `/health` reports; [`registration`] registration input and its validation;
//! [`request`] request bodies decoded field by field (JSON through serde_json, msgpack through
//! [`msgpack_de`]) into [`value`]'s fields; [`body_budget`] the bytes of large bodies in flight;
//! [`grpc`] the tonic service and
//! [`grpc_wire`] its hand-written query codecs; [`http`] the HTTP API, `http_decode` its state
//! and POST bodies, [`http_register`] its
//! `/register` checks, [`http_reply`] its answer formats and error bodies, [`http_body`] its
//! query answers and [`http_registry`] the shared registry's status and operator commands;
//! [`engines_api`] engines registered by URL as the transports see them, [`http_engines`] their
//! HTTP routes;
//! [`bounds`] the request bounds both transports share; [`connections`] the open connections,
//! their cap and timeouts; [`workers`] the threads both servers run on; [`tls`] TLS on both
//! servers (optional) and a replica's TLS towards its peer.
//!
//! # Transport settings, and why
//!
//! A query is a few kilobytes each way (a 2048-token prompt is ~5 KB of protobuf or 8 KB of
//! msgpack; an answer for 32 instances x 2 ranks is 2.4 KB of protobuf, 6 KB of msgpack) and
//! tens of microseconds of CPU, so what costs is per-request work and thread hand-offs, not
//! bandwidth:
//!
//! - TCP_NODELAY on every accepted connection, both transports.
//! - Each connection lives on one gateway worker (a single-threaded runtime per core, see
//!   [`workers`]): no request is handed to another thread, and no idle thread is woken to
//!   look for work.
//! - HTTP/2: hyper's windows (1 MiB per stream and per connection, received by the server),
//!   far above one request, so flow control never waits; 16 KiB frames (a request of up to
//!   ~6k tokens is one DATA frame); adaptive window off (its BDP pings would add frames to
//!   every answer); keepalive pings only after `grpc_keepalive_ms` without a frame from the
//!   peer (never while queries flow); no compression (it would cost more CPU than it saves
//!   on such answers); one layer ([`bounds::GrpcBounds`]: the token and the message's declared
//!   size, checked from the headers and the first 5 bytes) and no per-request tracing span.
//! - The query messages bypass prost's generic code on the server: [`grpc_wire`] writes the
//!   answer from the index's result without a message tree and reads packed prompts straight
//!   from the receive buffer; [`http_body::hits_msgpack`] writes the msgpack answer by hand.
//! - One write per gRPC answer: h2 alone writes a unary answer in two (it flushes a DATA frame
//!   of more than 256 bytes before it encodes the trailers); [`coalesce`] holds what one poll of
//!   the connection writes and sends it on the next poll.
//!
//! What remains is HTTP/2's own per call (HPACK for headers and trailers, stream state, hyper's
//! task per stream) and, with tonic's generated client on its `Channel`, three writes per
//! request (HEADERS, DATA, an empty END_STREAM DATA; the unary handler waits for the last), two
//! task hand-offs, ~11 us encoding a 2048-token request and ~21 us decoding an answer into maps
//! (`benches/answers.rs`). The clients this project ships send a request in one write with no
//! hand-off (the Python client's `transport.rs`, the load tool's `lean_grpc.rs`). Where the
//! microseconds went, and the measured effect of each change, is in `docs/grpc-path.md`.

pub mod answer_status;
pub mod auth;
pub mod body_budget;
pub mod bounds;
pub mod coalesce;
pub mod connections;
pub mod engines_api;
pub mod grpc;
mod grpc_answer;
pub mod grpc_wire;
pub mod http;
pub mod http_body;
mod http_decode;
pub mod http_engines;
pub mod http_register;
pub mod http_registry;
pub mod http_reply;
pub mod msgpack_de;
pub mod ops;
pub mod readiness;
pub mod registration;
mod repeated_rows;
pub mod request;
pub mod tls;
pub mod value;
pub mod workers;

/// Generated gRPC types (`proto/conductor.proto`).
pub mod pb {
    tonic::include_proto!("mooncake.conductor.v1");

    /// Descriptor set for gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("conductor_descriptor");
}

/// The generated gRPC server: [`pb`]'s messages, except the query path's, which are
/// [`grpc_wire`]'s codecs (same bytes on the wire).
pub mod pb_server {
    include!(concat!(env!("OUT_DIR"), "/server/mooncake.conductor.v1.rs"));
}

/// A rank as both transports key it: its decimal digits (never empty), written into `digits`
/// so that an answer needs no string per rank.
fn rank_key(rank: u32, digits: &mut [u8; 10]) -> &[u8] {
    let mut at = digits.len();
    let mut r = rank;
    loop {
        at -= 1;
        digits[at] = b'0' + (r % 10) as u8;
        r /= 10;
        if r == 0 {
            return &digits[at..];
        }
    }
}
