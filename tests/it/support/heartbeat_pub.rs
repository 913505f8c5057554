//! A publisher that speaks ZMTP 3.1 the way libzmq (>= 4.2, which vLLM and SGLang publish with
//! through pyzmq) does where liveness is concerned: it answers every PING with a PONG echoing the
//! PING's context, by itself. The `zeromq` crate the other tests publish with announces 3.0 and
//! has no heartbeat, and libzmq cannot be linked here, so this one is written against the wire
//! format directly, independent of the service's reader. It has a live PUB and a replay ROUTER
//! with vLLM's framing over one buffer, counts the PINGs it receives, and can announce 3.0
//! instead (then a correct subscriber never pings it).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const MORE: u8 = 0x01;
const LONG: u8 = 0x02;
const COMMAND: u8 = 0x04;

fn greeting(minor: u8) -> [u8; 64] {
    let mut g = [0u8; 64];
    g[0] = 0xFF;
    g[9] = 0x7F;
    g[10] = 3;
    g[11] = minor;
    g[12..16].copy_from_slice(b"NULL");
    g[32] = 1; // as-server: we bind
    g
}

fn frame(flags: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 9);
    if body.len() > 255 {
        out.push(flags | LONG);
        out.extend_from_slice(&(body.len() as u64).to_be_bytes());
    } else {
        out.push(flags);
        out.push(body.len() as u8);
    }
    out.extend_from_slice(body);
    out
}

fn message(parts: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        let more = if i + 1 < parts.len() { MORE } else { 0 };
        out.extend_from_slice(&frame(more, part));
    }
    out
}

fn ready(socket_type: &str) -> Vec<u8> {
    let mut body = b"\x05READY\x0bSocket-Type".to_vec();
    body.extend_from_slice(&(socket_type.len() as u32).to_be_bytes());
    body.extend_from_slice(socket_type.as_bytes());
    frame(COMMAND, &body)
}

async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> std::io::Result<(u8, Vec<u8>)> {
    let flags = r.read_u8().await?;
    let size = if flags & LONG != 0 {
        r.read_u64().await?
    } else {
        u64::from(r.read_u8().await?)
    };
    let mut body = vec![0u8; size.min(1 << 20) as usize];
    r.read_exact(&mut body).await?;
    Ok((flags, body))
}

/// Greet as `socket_type` and read the peer's greeting and READY.
async fn handshake(stream: &mut TcpStream, minor: u8, socket_type: &str) -> std::io::Result<()> {
    stream.write_all(&greeting(minor)).await?;
    let mut peer = [0u8; 64];
    stream.read_exact(&mut peer).await?;
    stream.write_all(&ready(socket_type)).await?;
    read_frame(stream).await?;
    Ok(())
}

type Writer = Arc<tokio::sync::Mutex<OwnedWriteHalf>>;

#[derive(Default)]
struct Inner {
    minor: u8,
    next_seq: AtomicU64,
    buffer: Mutex<Vec<(u64, Vec<u8>)>>,
    subscribers: Mutex<Vec<Writer>>,
    subscriptions: AtomicUsize,
    pings: AtomicUsize,
    /// The TTL field of the last PING, in tenths of a second.
    last_ttl: Mutex<Option<u16>>,
}

impl Inner {
    /// Answer a command frame as libzmq does: PONG with the PING's context.
    async fn command(&self, body: &[u8], writer: &Writer) -> std::io::Result<()> {
        if let Some(rest) = body.strip_prefix(b"\x04PING")
            && rest.len() >= 2
        {
            self.pings.fetch_add(1, Ordering::SeqCst);
            *self.last_ttl.lock().unwrap() = Some(u16::from_be_bytes([rest[0], rest[1]]));
            let mut pong = b"\x04PONG".to_vec();
            pong.extend_from_slice(&rest[2..rest.len().min(18)]);
            writer
                .lock()
                .await
                .write_all(&frame(COMMAND, &pong))
                .await?;
        }
        Ok(())
    }
}

pub struct HeartbeatPub {
    pub endpoint: String,
    pub replay_endpoint: String,
    inner: Arc<Inner>,
    cancel: CancellationToken,
}

impl HeartbeatPub {
    /// Bind a PUB and a replay ROUTER on free loopback ports, announcing ZMTP 3.`minor`; the
    /// sequence starts at 0, as an engine's does.
    pub async fn start(minor: u8) -> HeartbeatPub {
        let inner = Arc::new(Inner {
            minor,
            ..Inner::default()
        });
        let cancel = CancellationToken::new();
        let live = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let replay = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let endpoint = format!("tcp://{}", live.local_addr().expect("addr"));
        let replay_endpoint = format!("tcp://{}", replay.local_addr().expect("addr"));
        accept(live, inner.clone(), cancel.clone(), serve_subscriber);
        accept(replay, inner.clone(), cancel.clone(), serve_replay);
        HeartbeatPub {
            endpoint,
            replay_endpoint,
            inner,
            cancel,
        }
    }

    /// Publish `[topic, seq, payload]` with the next seq to every subscriber (and keep it for
    /// replay). A subscriber whose path does not take the bytes within a second is dropped.
    pub async fn publish(&self, payload: Vec<u8>) -> u64 {
        let seq = self.inner.next_seq.fetch_add(1, Ordering::SeqCst);
        let wire = message(&[b"kv-events", &seq.to_be_bytes(), &payload]);
        self.inner.buffer.lock().unwrap().push((seq, payload));
        let subscribers = self.inner.subscribers.lock().unwrap().clone();
        for writer in subscribers {
            let write = async { writer.lock().await.write_all(&wire).await };
            if !matches!(
                tokio::time::timeout(Duration::from_secs(1), write).await,
                Ok(Ok(()))
            ) {
                self.forget(&writer);
            }
        }
        seq
    }

    /// The publisher process restarted: seq starts over, the replay buffer is empty, and the old
    /// process's connections are gone.
    pub async fn restart(&self) {
        self.inner.next_seq.store(0, Ordering::SeqCst);
        self.inner.buffer.lock().unwrap().clear();
        let old = std::mem::take(&mut *self.inner.subscribers.lock().unwrap());
        for writer in old {
            let _ = writer.lock().await.shutdown().await;
        }
    }

    /// Subscriptions received so far (one per subscriber connection).
    pub fn subscriptions(&self) -> usize {
        self.inner.subscriptions.load(Ordering::SeqCst)
    }

    /// PINGs received so far, on any connection.
    pub fn pings(&self) -> usize {
        self.inner.pings.load(Ordering::SeqCst)
    }

    /// The TTL of the last PING received, in tenths of a second.
    pub fn last_ttl(&self) -> Option<u16> {
        *self.inner.last_ttl.lock().unwrap()
    }

    fn forget(&self, writer: &Writer) {
        forget(&self.inner, writer);
    }
}

fn forget(inner: &Inner, writer: &Writer) {
    inner
        .subscribers
        .lock()
        .unwrap()
        .retain(|w| !Arc::ptr_eq(w, writer));
}

impl Drop for HeartbeatPub {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

fn accept<F, Fut>(listener: TcpListener, inner: Arc<Inner>, cancel: CancellationToken, serve: F)
where
    F: Fn(TcpStream, Arc<Inner>) -> Fut + Send + 'static,
    Fut: Future<Output = std::io::Result<()>> + Send + 'static,
{
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                _ = cancel.cancelled() => return,
                a = listener.accept() => match a {
                    Ok((stream, _)) => stream,
                    Err(_) => continue,
                },
            };
            let connection = serve(stream, inner.clone());
            let stop = cancel.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = connection => {}
                }
            });
        }
    });
}

/// A subscriber's connection: handshake, then answer PINGs and take its subscription, until it
/// ends.
async fn serve_subscriber(mut stream: TcpStream, inner: Arc<Inner>) -> std::io::Result<()> {
    handshake(&mut stream, inner.minor, "PUB").await?;
    let (mut rd, wr) = stream.into_split();
    let writer: Writer = Arc::new(tokio::sync::Mutex::new(wr));
    let result = async {
        loop {
            let (flags, body) = read_frame(&mut rd).await?;
            if flags & COMMAND != 0 {
                inner.command(&body, &writer).await?;
            } else if body.first() == Some(&1) {
                inner.subscriptions.fetch_add(1, Ordering::SeqCst);
                inner.subscribers.lock().unwrap().push(writer.clone());
            }
        }
    }
    .await;
    forget(&inner, &writer);
    result
}

/// A replay connection (vLLM's framing): the DEALER sends `[b"", start_seq]`; every buffered
/// batch from there is answered as `[b"", seq, payload]`, then the end marker.
async fn serve_replay(mut stream: TcpStream, inner: Arc<Inner>) -> std::io::Result<()> {
    handshake(&mut stream, inner.minor, "ROUTER").await?;
    let (mut rd, wr) = stream.into_split();
    let writer: Writer = Arc::new(tokio::sync::Mutex::new(wr));
    let mut request = Vec::new();
    loop {
        let (flags, body) = read_frame(&mut rd).await?;
        if flags & COMMAND != 0 {
            inner.command(&body, &writer).await?;
            continue;
        }
        request.push(body);
        if flags & MORE == 0 {
            break;
        }
    }
    let start = request
        .get(1)
        .and_then(|s| <[u8; 8]>::try_from(s.as_slice()).ok())
        .map_or(0, u64::from_be_bytes);
    let batches: Vec<(u64, Vec<u8>)> = inner
        .buffer
        .lock()
        .unwrap()
        .iter()
        .filter(|(seq, _)| *seq >= start)
        .cloned()
        .collect();
    {
        let mut w = writer.lock().await;
        for (seq, payload) in batches {
            w.write_all(&message(&[b"", &seq.to_be_bytes(), &payload]))
                .await?;
        }
        w.write_all(&message(&[b"", &u64::MAX.to_be_bytes(), b""]))
            .await?;
    }
    // Keep answering PINGs until the subscriber closes.
    loop {
        let (flags, body) = read_frame(&mut rd).await?;
        if flags & COMMAND != 0 {
            inner.command(&body, &writer).await?;
        }
    }
}
