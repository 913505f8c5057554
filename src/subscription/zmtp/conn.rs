//! One ZMTP connection over TCP: the handshake, and reading whole messages within a byte budget
//! that is checked against each frame's declared size before anything is allocated for it.

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::ZmtpError;
use super::codec::{
    self, Command, FLAG_COMMAND, FLAG_LONG, FLAG_MORE, GREETING_LEN, MAX_COMMAND_BYTES, SocketType,
};

/// A frame body grows by at most this much per read: memory follows the bytes that arrived,
/// never the size a peer announced.
const READ_CHUNK: usize = 64 * 1024;

/// An established connection (greeting and READY exchanged).
pub struct Connection<S = TcpStream> {
    stream: BufReader<S>,
    /// The most a message (frame bodies plus a per-frame overhead) may take.
    max_message_bytes: u64,
}

impl Connection<TcpStream> {
    /// Connect to `endpoint` (`tcp://host:port`) and complete the handshake as `socket_type`.
    /// The caller bounds it with a timeout: a peer that accepts and stays silent never answers.
    pub async fn connect(
        endpoint: &str,
        socket_type: SocketType,
        max_message_bytes: usize,
    ) -> Result<Self, ZmtpError> {
        let address = endpoint.strip_prefix("tcp://").ok_or_else(|| {
            ZmtpError::Protocol(format!("{endpoint}: only tcp:// endpoints are supported"))
        })?;
        let stream = TcpStream::connect(address).await?;
        // Replay requests and subscriptions are tiny; Nagle would only delay them.
        stream.set_nodelay(true)?;
        Connection::handshake(stream, socket_type, max_message_bytes).await
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Connection<S> {
    /// Exchange greetings and READY commands over an open stream.
    pub async fn handshake(
        stream: S,
        socket_type: SocketType,
        max_message_bytes: usize,
    ) -> Result<Self, ZmtpError> {
        let mut conn = Connection {
            stream: BufReader::new(stream),
            max_message_bytes: max_message_bytes as u64,
        };
        conn.write(&codec::greeting()).await?;
        let mut peer = [0u8; GREETING_LEN];
        conn.stream.read_exact(&mut peer).await?;
        codec::check_greeting(&peer)?;
        conn.write(&codec::ready(socket_type)).await?;
        let (flags, size) = conn.read_header().await?;
        if flags & FLAG_COMMAND == 0 {
            return Err(ZmtpError::Protocol(
                "peer sent a message before READY".into(),
            ));
        }
        let body = conn.read_command_body(size).await?;
        match codec::parse_command(&body)? {
            Command::Ready {
                socket_type: Some(peer_type),
            } if socket_type.accepts(peer_type) => Ok(conn),
            Command::Ready { socket_type: peer } => Err(ZmtpError::Protocol(format!(
                "a {} cannot talk to a peer of socket type {:?}",
                socket_type.name(),
                peer.map(String::from_utf8_lossy)
            ))),
            Command::Error(reason) => Err(ZmtpError::PeerError(reason)),
            _ => Err(ZmtpError::Protocol(
                "peer's first command is not READY".into(),
            )),
        }
    }

    /// Send one multipart message.
    pub async fn send(&mut self, frames: &[&[u8]]) -> Result<(), ZmtpError> {
        self.write(&codec::encode_message(frames)).await
    }

    /// Ask the publisher for every topic (a SUB's only message).
    pub async fn subscribe_all(&mut self) -> Result<(), ZmtpError> {
        self.write(&codec::subscribe_all()).await
    }

    /// The next whole message. Commands between messages are handled here (PING is answered);
    /// a frame that would take the message past the bound ends the connection with
    /// [`ZmtpError::Oversized`] before any of its body is read.
    pub async fn recv(&mut self) -> Result<Vec<Bytes>, ZmtpError> {
        let mut frames = Vec::new();
        let mut used: u64 = 0;
        loop {
            let (flags, size) = self.read_header().await?;
            if flags & FLAG_COMMAND != 0 {
                let body = self.read_command_body(size).await?;
                match codec::parse_command(&body)? {
                    Command::Ping { context } => {
                        let pong = codec::pong(context);
                        self.write(&pong).await?;
                    }
                    Command::Error(reason) => return Err(ZmtpError::PeerError(reason)),
                    Command::Ready { .. } | Command::Other => {}
                }
                continue;
            }
            let total = used.saturating_add(codec::frame_cost(size));
            if total > self.max_message_bytes {
                return Err(ZmtpError::Oversized {
                    declared: total,
                    limit: self.max_message_bytes,
                });
            }
            used = total;
            frames.push(self.read_body(size).await?);
            if flags & FLAG_MORE == 0 {
                return Ok(frames);
            }
        }
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), ZmtpError> {
        let stream = self.stream.get_mut();
        stream.write_all(bytes).await?;
        stream.flush().await?;
        Ok(())
    }

    /// A frame's flags and declared body size.
    async fn read_header(&mut self) -> Result<(u8, u64), ZmtpError> {
        let flags = self.stream.read_u8().await?;
        let size = if flags & FLAG_LONG != 0 {
            self.stream.read_u64().await?
        } else {
            u64::from(self.stream.read_u8().await?)
        };
        Ok((flags, size))
    }

    async fn read_command_body(&mut self, size: u64) -> Result<Bytes, ZmtpError> {
        if size > MAX_COMMAND_BYTES {
            return Err(ZmtpError::Oversized {
                declared: size,
                limit: MAX_COMMAND_BYTES,
            });
        }
        self.read_body(size).await
    }

    /// Read `size` bytes (already checked against the bound), growing the buffer only as they
    /// arrive.
    async fn read_body(&mut self, size: u64) -> Result<Bytes, ZmtpError> {
        let size = usize::try_from(size)
            .map_err(|_| ZmtpError::Protocol("frame larger than memory".into()))?;
        let mut body = BytesMut::with_capacity(size.min(READ_CHUNK));
        while body.len() < size {
            let want = (size - body.len()).min(READ_CHUNK);
            body.reserve(want);
            let n = (&mut self.stream)
                .take(want as u64)
                .read_buf(&mut body)
                .await?;
            if n == 0 {
                return Err(ZmtpError::Closed);
            }
        }
        Ok(body.freeze())
    }
}
