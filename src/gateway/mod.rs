//! The gateway: gRPC and HTTP adapters over one operation layer.
//!
//! Layout: [`ops`] transport-neutral operations; [`registration`] registration input and its
//! validation; [`value`] JSON/msgpack request documents; [`grpc`] the tonic service and
//! [`grpc_wire`] its hand-written query codecs; [`http`] the HTTP API.

pub mod grpc;
pub mod grpc_wire;
pub mod http;
pub mod http_body;
pub mod ops;
pub mod registration;
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
