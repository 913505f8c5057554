//! A hostile ZeroMQ publisher written against the wire format directly (ZMTP 3.0, NULL
//! mechanism), independent of the service's own reader: it completes the handshake as a PUB and
//! then sends whatever bytes a test asks for.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The 64-byte greeting: signature, version 3.0, mechanism NULL, not a server.
fn greeting() -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[12..16].copy_from_slice(b"NULL");
    g
}

/// A READY command announcing `socket_type`, as one short command frame.
fn ready(socket_type: &str) -> Vec<u8> {
    let mut body = vec![5u8];
    body.extend_from_slice(b"READY");
    body.push(11);
    body.extend_from_slice(b"Socket-Type");
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    let mut frame = vec![0x04, body.len() as u8];
    frame.extend_from_slice(&body);
    frame
}

/// The header of one long message frame that announces `size` bytes (9 bytes on the wire).
pub fn long_frame_header(size: u64) -> Vec<u8> {
    let mut h = vec![0x02];
    h.extend_from_slice(&size.to_be_bytes());
    h
}

/// Read one frame (header and body) and drop it.
async fn skip_frame(stream: &mut TcpStream) -> std::io::Result<()> {
    let flags = stream.read_u8().await?;
    let size = if flags & 0x02 != 0 {
        stream.read_u64().await?
    } else {
        u64::from(stream.read_u8().await?)
    };
    let mut body = vec![0u8; size.min(1 << 20) as usize];
    stream.read_exact(&mut body).await?;
    Ok(())
}

/// Listens on 127.0.0.1; on every connection it greets (as a PUB, or the socket type given), reads
/// the peer's greeting and READY, sends `after_handshake`, and then holds the connection open
/// without a further byte.
pub struct HostilePub {
    pub endpoint: String,
    connections: Arc<AtomicUsize>,
    cancel: CancellationToken,
}

impl HostilePub {
    pub async fn start(after_handshake: Vec<u8>) -> HostilePub {
        HostilePub::start_as("PUB", after_handshake).await
    }

    /// The same as another socket type (`ROUTER` for a replay endpoint).
    pub async fn start_as(socket_type: &'static str, after_handshake: Vec<u8>) -> HostilePub {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("tcp://{}", listener.local_addr().expect("addr"));
        let connections = Arc::new(AtomicUsize::new(0));
        let cancel = CancellationToken::new();
        let (count, stop) = (connections.clone(), cancel.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    _ = stop.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((mut stream, _)) = accepted else {
                    continue;
                };
                let (bytes, stop) = (after_handshake.clone(), stop.clone());
                let count = count.clone();
                tokio::spawn(async move {
                    let exchange = async {
                        stream.write_all(&greeting()).await?;
                        let mut peer = [0u8; 64];
                        stream.read_exact(&mut peer).await?;
                        stream.write_all(&ready(socket_type)).await?;
                        skip_frame(&mut stream).await?;
                        count.fetch_add(1, Ordering::SeqCst);
                        stream.write_all(&bytes).await?;
                        stream.flush().await
                    };
                    if exchange.await.is_ok() {
                        // Half-open from here on: never another byte, never a close.
                        let mut sink = [0u8; 256];
                        loop {
                            tokio::select! {
                                _ = stop.cancelled() => return,
                                r = stream.read(&mut sink) => if matches!(r, Ok(0) | Err(_)) { return },
                            }
                        }
                    }
                });
            }
        });
        HostilePub {
            endpoint,
            connections,
            cancel,
        }
    }

    /// Connections that completed the handshake and received the hostile bytes.
    pub fn handshakes(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for HostilePub {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Connect to `endpoint` as a peer of `socket_type` (`DEALER` at a replay socket, `SUB` at a
/// PUB), complete the handshake, send `bytes`, and wait until the other side closes the
/// connection (`true`) or `timeout` passes (`false`). The connection and handshake are retried
/// until `timeout` while they fail: the peer may still be starting.
pub async fn send_after_handshake(
    endpoint: &str,
    socket_type: &str,
    bytes: &[u8],
    timeout: std::time::Duration,
) -> bool {
    let address = endpoint.strip_prefix("tcp://").expect("tcp endpoint");
    let mut stream = super::until(timeout, async || {
        let handshake = async {
            let mut stream = TcpStream::connect(address).await?;
            stream.write_all(&greeting()).await?;
            let mut peer = [0u8; 64];
            stream.read_exact(&mut peer).await?;
            stream.write_all(&ready(socket_type)).await?;
            skip_frame(&mut stream).await?;
            std::io::Result::Ok(stream)
        };
        (handshake.await).map_err(|e| format!("waiting for a handshake with {endpoint}: {e}"))
    })
    .await;
    stream.write_all(bytes).await.expect("hostile bytes");
    let mut sink = [0u8; 256];
    let closed = async {
        loop {
            if matches!(stream.read(&mut sink).await, Ok(0) | Err(_)) {
                return;
            }
        }
    };
    tokio::time::timeout(timeout, closed).await.is_ok()
}
