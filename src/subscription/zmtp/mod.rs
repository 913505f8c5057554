//! A small ZMTP 3.1 implementation of our own for the socket kinds the subscriber uses (SUB for
//! the live stream, DEALER for replay requests) and the two the fixture publisher serves (PUB
//! and ROUTER, `crate::fixture::serve`), over TCP with the NULL mechanism.
//!
//! Why not the `zeromq` crate here: its decoder reserves a frame's declared length before the
//! body arrives, and it has no size limit, so one peer announcing a 2^62-byte frame (9 bytes on
//! the wire) aborts the whole process on the failed allocation. This reader checks every declared
//! size against its bound (`max_publisher_message_bytes` for the subscriber) before reading the
//! body, and grows buffers only as bytes arrive. The crate stays where it serves: parsing
//! endpoints at registration, and the load tool's publishers.
//!
//! The protocol facts it relies on (ZMTP 3.0, RFC 23 at rfc.zeromq.org; 3.1, RFC 37, adds the
//! PING and PONG heartbeat commands):
//!
//! * Each side first sends a 64-byte greeting: `0xFF`, 8 padding bytes, `0x7F`, major and minor
//!   version, the mechanism name zero-padded to 20 bytes (`NULL`), an as-server byte, 31 zero
//!   bytes. We announce 3.1 and send nothing a 3.0 peer would not understand unless the peer
//!   announced 3.1 or later too.
//! * Then frames: a flags byte (bit 0 MORE: another frame of this message follows; bit 1 LONG:
//!   the size is 8 bytes big-endian instead of 1; bit 2 COMMAND) and the body.
//! * A command body is a name-length byte, the name, and command data. READY's data is
//!   properties: name-length byte, name, 4-byte big-endian value length, value. Each side sends
//!   READY with its `Socket-Type`; a DEALER also sends an `Identity` (empty: the ROUTER picks
//!   one). ERROR carries a reason; PING (3.1 heartbeat) a 2-byte big-endian TTL in tenths of a
//!   second and a context of at most 16 bytes, which the PONG answering it echoes. libzmq 4.2
//!   and later answer PING by themselves, whatever their own heartbeat options.
//! * A 3.0 SUB subscribes with a message whose single frame is `0x01` followed by the topic
//!   (empty: everything). libzmq (hence pyzmq, which vLLM and SGLang publish with) and zmq.rs
//!   both accept it.
//!
//! Bounds: a message may take `max_publisher_message_bytes` (bodies plus 32 bytes per frame, so
//! a message of countless empty frames is bounded too); a command 64 KiB. Going over drops the
//! connection with [`ZmtpError::Oversized`] and the subscription reconnects with backoff. A peer
//! that stalls mid-frame holds at most what it sent.
//!
//! Liveness ([`liveness`]): a peer of 3.1 or later is pinged every heartbeat interval and given
//! up ([`ZmtpError::Silent`]) when nothing came from it for the heartbeat timeout; every socket
//! has TCP keepalive, which covers a 3.0 peer's host.
//!
//! `docs/zmtp.md` has the options weighed, the reasoning behind the default bound, and the ingest
//! throughput measured before and after.

mod codec;
mod conn;
#[cfg(test)]
mod conn_tests;
mod liveness;

pub use codec::{MAX_COMMAND_BYTES, PeerVersion, SocketType};
pub use conn::Connection;
pub use liveness::Heartbeat;

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
    /// A peer we ping sent nothing at all (no message, no PONG) for this long, past the
    /// heartbeat timeout: its path is presumed frozen.
    #[error("no byte from the peer for {silent_for:?}, past the heartbeat timeout")]
    Silent { silent_for: std::time::Duration },
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

    /// The peer went silent: our heartbeat timed out, or the kernel's keepalive probes went
    /// unanswered.
    pub fn is_timeout(&self) -> bool {
        match self {
            ZmtpError::Silent { .. } => true,
            ZmtpError::Io(e) => e.kind() == std::io::ErrorKind::TimedOut,
            _ => false,
        }
    }
}
