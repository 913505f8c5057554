//! One ZMTP connection over TCP: the handshake, and reading whole messages within a byte budget
//! that is checked against each frame's declared size before anything is allocated for it.
//! While it waits for the peer, it sends PINGs when due and gives a silent peer up (see
//! [`super::liveness`]); every wait is a single cancel-safe read raced against that timer, so a
//! partly read message is never lost to it.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::ZmtpError;
use super::codec::{
    self, Command, FLAG_COMMAND, FLAG_LONG, FLAG_MORE, GREETING_LEN, MAX_COMMAND_BYTES,
    PeerVersion, SocketType,
};
use super::liveness::{Due, Heartbeat, Liveness};

/// A frame body grows by at most this much per read: memory follows the bytes that arrived,
/// never the size a peer announced.
const READ_CHUNK: usize = 64 * 1024;

/// An established connection (greeting and READY exchanged).
pub struct Connection<S = TcpStream> {
    stream: BufReader<S>,
    /// The most a message (frame bodies plus a per-frame overhead) may take.
    max_message_bytes: u64,
    peer_version: PeerVersion,
    liveness: Liveness,
}

impl Connection<TcpStream> {
    /// Connect to `endpoint` (`tcp://host:port`) and complete the handshake as `socket_type`.
    /// With a `heartbeat`, the socket gets TCP keepalive and a peer of ZMTP 3.1 or later is
    /// pinged. The caller bounds it with a timeout: a peer that accepts and stays silent never
    /// answers.
    pub async fn connect(
        endpoint: &str,
        socket_type: SocketType,
        max_message_bytes: usize,
        heartbeat: Option<Heartbeat>,
    ) -> Result<Self, ZmtpError> {
        let address = endpoint.strip_prefix("tcp://").ok_or_else(|| {
            ZmtpError::Protocol(format!("{endpoint}: only tcp:// endpoints are supported"))
        })?;
        let stream = TcpStream::connect(address).await?;
        // Replay requests and subscriptions are tiny; Nagle would only delay them.
        stream.set_nodelay(true)?;
        if let Some(heartbeat) = heartbeat {
            // A dead host under a quiet (3.0, never pinged) peer is found by the kernel.
            socket2::SockRef::from(&stream).set_tcp_keepalive(&heartbeat.keepalive())?;
        }
        let connection = Connection::handshake(stream, socket_type, max_message_bytes).await?;
        Ok(connection.with_heartbeat(heartbeat))
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
            peer_version: PeerVersion { major: 3, minor: 0 },
            liveness: Liveness::new(None, Instant::now()),
        };
        conn.write(&codec::greeting()).await?;
        let mut peer = [0u8; GREETING_LEN];
        conn.stream.read_exact(&mut peer).await?;
        conn.peer_version = codec::check_greeting(&peer)?;
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

    /// Ping the peer with `heartbeat` from now on, if it speaks ZMTP 3.1 or later (a 3.0 peer is
    /// never pinged, so never timed out either).
    pub fn with_heartbeat(mut self, heartbeat: Option<Heartbeat>) -> Self {
        let heartbeat = heartbeat.filter(|_| self.peer_version.answers_ping());
        self.liveness = Liveness::new(heartbeat, Instant::now());
        self
    }

    /// The ZMTP version the peer announced.
    pub fn peer_version(&self) -> PeerVersion {
        self.peer_version
    }

    /// Whether this connection pings its peer.
    pub fn pings(&self) -> bool {
        self.liveness.heartbeat().is_some()
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
    /// A peer pinged by this connection that sends nothing at all for the heartbeat's timeout
    /// ends it with [`ZmtpError::Silent`].
    pub async fn recv(&mut self) -> Result<Vec<Bytes>, ZmtpError> {
        self.liveness.listening(Instant::now());
        loop {
            if let Some(frames) = self.next_message().await? {
                return Ok(frames);
            }
        }
    }

    /// Wait until bytes from the peer are buffered. Cancel safe on a connection that pings no
    /// one (nothing is written while it waits): a server that also sends races it against its
    /// own sends, then takes one [`Self::next_message`].
    pub async fn readable(&mut self) -> Result<(), ZmtpError> {
        self.fill().await.map(|_| ())
    }

    /// One step of [`Self::recv`]: the next whole message, or `None` once a command that came
    /// between messages was handled (a PING answered), so that a peer's heartbeat never holds a
    /// server's sends back while it waits for a message.
    pub async fn next_message(&mut self) -> Result<Option<Vec<Bytes>>, ZmtpError> {
        let mut frames = Vec::new();
        let mut used: u64 = 0;
        loop {
            let (flags, size) = self.read_header().await?;
            if flags & FLAG_COMMAND != 0 {
                let body = self.read_command_body(size).await?;
                match codec::parse_command(&body)? {
                    Command::Ping { context } => {
                        let pong = codec::pong(context);
                        self.write_bounded(&pong).await?;
                    }
                    Command::Error(reason) => return Err(ZmtpError::PeerError(reason)),
                    // A PONG has done its work by arriving (see `fill`).
                    Command::Ready { .. } | Command::Pong { .. } | Command::Other => {}
                }
                if frames.is_empty() {
                    return Ok(None);
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
                return Ok(Some(frames));
            }
        }
    }

    async fn write(&mut self, bytes: &[u8]) -> Result<(), ZmtpError> {
        let stream = self.stream.get_mut();
        stream.write_all(bytes).await?;
        stream.flush().await?;
        Ok(())
    }

    /// [`Self::write`], given up when the peer counts as silent: a frozen path stops taking our
    /// bytes once the socket's send buffer is full.
    async fn write_bounded(&mut self, bytes: &[u8]) -> Result<(), ZmtpError> {
        let Some(deadline) = self.liveness.silent_at() else {
            return self.write(bytes).await;
        };
        match tokio::time::timeout_at(deadline, self.write(bytes)).await {
            Ok(result) => result,
            Err(_) => Err(self.silent(Instant::now())),
        }
    }

    fn silent(&self, now: Instant) -> ZmtpError {
        let timeout = self
            .liveness
            .heartbeat()
            .map_or(Duration::ZERO, |h| h.timeout);
        let silent_at = self.liveness.silent_at().unwrap_or(now);
        ZmtpError::Silent {
            silent_for: timeout + now.saturating_duration_since(silent_at),
        }
    }

    /// The liveness timer fired: send a PING, or give the silent peer up.
    async fn on_timer(&mut self) -> Result<(), ZmtpError> {
        let now = Instant::now();
        match self.liveness.due(now) {
            Due::Nothing => Ok(()),
            Due::Ping(n) => {
                let ttl = self
                    .liveness
                    .heartbeat()
                    .map_or(Duration::ZERO, |h| h.timeout);
                let ping = codec::ping(ttl, &n.to_be_bytes());
                self.write_bounded(&ping).await
            }
            Due::Silent(silent_for) => Err(ZmtpError::Silent { silent_for }),
        }
    }

    /// Wait until the read buffer holds bytes and return how many. Meanwhile PINGs go out when
    /// due, and a peer silent past the timeout ends the connection.
    async fn fill(&mut self) -> Result<usize, ZmtpError> {
        let buffered = self.stream.buffer().len();
        if buffered > 0 {
            return Ok(buffered);
        }
        loop {
            let wake = self.liveness.wake_at();
            // `fill_buf` is cancel safe: when the timer wins, no byte was taken.
            let filled = tokio::select! {
                biased;
                filled = self.stream.fill_buf() => Some(filled?.len()),
                () = sleep_until(wake) => None,
            };
            match filled {
                Some(0) => return Err(ZmtpError::Closed),
                Some(n) => {
                    self.liveness.heard(Instant::now());
                    return Ok(n);
                }
                None => self.on_timer().await?,
            }
        }
    }

    /// Fill `out` from the stream (a frame header: a few bytes).
    async fn read_small(&mut self, out: &mut [u8]) -> Result<(), ZmtpError> {
        let mut done = 0;
        while done < out.len() {
            let n = self.fill().await?.min(out.len() - done);
            out[done..done + n].copy_from_slice(&self.stream.buffer()[..n]);
            self.stream.consume(n);
            done += n;
        }
        Ok(())
    }

    /// A frame's flags and declared body size.
    async fn read_header(&mut self) -> Result<(u8, u64), ZmtpError> {
        let mut flags = [0u8; 1];
        self.read_small(&mut flags).await?;
        let flags = flags[0];
        let size = if flags & FLAG_LONG != 0 {
            let mut size = [0u8; 8];
            self.read_small(&mut size).await?;
            u64::from_be_bytes(size)
        } else {
            let mut size = [0u8; 1];
            self.read_small(&mut size).await?;
            u64::from(size[0])
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
    /// arrive. Large bodies are read straight into it, past the stream's small buffer.
    async fn read_body(&mut self, size: u64) -> Result<Bytes, ZmtpError> {
        let size = usize::try_from(size)
            .map_err(|_| ZmtpError::Protocol("frame larger than memory".into()))?;
        let mut body = BytesMut::with_capacity(size.min(READ_CHUNK));
        while body.len() < size {
            let want = (size - body.len()).min(READ_CHUNK);
            body.reserve(want);
            let wake = self.liveness.wake_at();
            let read = {
                let mut limited = (&mut self.stream).take(want as u64);
                // `read_buf` is cancel safe: when the timer wins, no byte was read.
                tokio::select! {
                    biased;
                    read = limited.read_buf(&mut body) => Some(read?),
                    () = sleep_until(wake) => None,
                }
            };
            match read {
                Some(0) => return Err(ZmtpError::Closed),
                Some(_) => self.liveness.heard(Instant::now()),
                None => self.on_timer().await?,
            }
        }
        Ok(body.freeze())
    }
}

/// Sleep until `deadline`, or for ever without one.
async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
