//! A small ZMTP 3.0 client of our own for the two socket kinds the subscriber uses: SUB for the
//! live stream and DEALER for replay requests, over TCP with the NULL mechanism.
//!
//! Why not the `zeromq` crate here: its decoder reserves a frame's declared length before the
//! body arrives, and it has no size limit, so one peer announcing a 2^62-byte frame (9 bytes on
//! the wire) aborts the whole process on the failed allocation. This reader checks every declared
//! size against `max_publisher_message_bytes` before reading the body, and grows buffers only as
//! bytes arrive. The crate stays where it serves: parsing endpoints at registration, and the test
//! and load-tool publishers.
//!
//! The protocol facts it relies on (ZMTP 3.0, RFC 23 at rfc.zeromq.org; 3.1, RFC 37, adds
//! commands this reader tolerates):
//!
//! * Each side first sends a 64-byte greeting: `0xFF`, 8 padding bytes, `0x7F`, major and minor
//!   version, the mechanism name zero-padded to 20 bytes (`NULL`), an as-server byte, 31 zero
//!   bytes. We announce 3.0; a 3.1 peer then follows 3.0 rules.
//! * Then frames: a flags byte (bit 0 MORE: another frame of this message follows; bit 1 LONG:
//!   the size is 8 bytes big-endian instead of 1; bit 2 COMMAND) and the body.
//! * A command body is a name-length byte, the name, and command data. READY's data is
//!   properties: name-length byte, name, 4-byte big-endian value length, value. Each side sends
//!   READY with its `Socket-Type`; a DEALER also sends an `Identity` (empty: the ROUTER picks
//!   one). ERROR carries a reason; PING (3.1 heartbeat) a 2-byte TTL and a context that PONG
//!   echoes.
//! * A 3.0 SUB subscribes with a message whose single frame is `0x01` followed by the topic
//!   (empty: everything). libzmq (hence pyzmq, which vLLM and SGLang publish with) and zmq.rs
//!   both accept it.
//!
//! Bounds: a message may take `max_publisher_message_bytes` (bodies plus 32 bytes per frame, so
//! a message of countless empty frames is bounded too); a command 64 KiB. Going over drops the
//! connection with [`ZmtpError::Oversized`] and the subscription reconnects with backoff. A peer
//! that stalls mid-frame holds at most what it sent.
//!
//! `docs/zmtp.md` has the options weighed, the reasoning behind the default bound, and the ingest
//! throughput measured before and after.

mod codec;
mod conn;
#[cfg(test)]
mod conn_tests;

pub use codec::{MAX_COMMAND_BYTES, SocketType};
pub use conn::Connection;

/// Why a ZMTP connection ended.
#[derive(Debug, thiserror::Error)]
pub enum ZmtpError {
    #[error("{0}")]
    Io(std::io::Error),
    #[error("the peer closed the connection")]
    Closed,
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("{0}")]
    Timeout(String),
    #[error("the peer refused the connection: {0}")]
    PeerError(String),
    /// A frame or message declared more than the bound; nothing of it was read.
    #[error("message of {declared} bytes or more exceeds the limit of {limit} bytes")]
    Oversized { declared: u64, limit: u64 },
}

impl From<std::io::Error> for ZmtpError {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ZmtpError::Closed
        } else {
            ZmtpError::Io(e)
        }
    }
}

impl ZmtpError {
    pub fn is_oversized(&self) -> bool {
        matches!(self, ZmtpError::Oversized { .. })
    }
}
