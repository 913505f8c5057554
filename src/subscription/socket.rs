//! ZeroMQ I/O of a subscription: the live SUB stream and the replay DEALER, over [`zmtp`].
//!
//! Both run as tokio tasks and hand what they read to a [`FrameSink`] (the subscription actor),
//! awaiting each hand-off so a slow index pushes back on the socket instead of growing a queue.
//!
//! The live task connects with a short timeout in a retry loop with backoff (an absent publisher
//! never blocks start-up or registration), and reconnects the same way whenever the connection
//! ends: the peer closed it, broke the protocol, sent a message over the bound, or went silent
//! (a publisher of ZMTP 3.1 or later is pinged, see `zmtp`; every socket has TCP keepalive).
//! Backoff resets only after a connection delivered a message, so a peer that misbehaves at once
//! is retried at most every `backoff_max`. A replay request uses a fresh connection and is
//! bounded by timeouts.
//!
//! [`zmtp`]: super::zmtp

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

pub use super::settings::SocketTimings;
use super::settings::SubscriptionSettings;
use super::zmtp::{Connection, SocketType, ZmtpError};

/// The end-of-replay marker's seq (`(-1).to_bytes(8, "big", signed=True)`).
pub const END_OF_REPLAY_SEQ: u64 = u64::MAX;

/// A well-formed live or replayed frame set: `[topic, seq (8 bytes BE), payload]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub seq: u64,
    pub payload: Bytes,
}

/// Why a message was not a frame set (a counted drop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    FrameCount(usize),
    SeqLength(usize),
}

impl FrameError {
    pub const fn as_str(self) -> &'static str {
        match self {
            FrameError::FrameCount(_) => "frame_count",
            FrameError::SeqLength(_) => "seq_length",
        }
    }
}

/// Check the exact three-frame layout; the topic is not used (the registration picks the decoder).
pub fn parse_frames(frames: &[Bytes]) -> Result<Frame, FrameError> {
    let [_topic, seq, payload] = frames else {
        return Err(FrameError::FrameCount(frames.len()));
    };
    let seq: [u8; 8] = seq
        .as_ref()
        .try_into()
        .map_err(|_| FrameError::SeqLength(seq.len()))?;
    Ok(Frame {
        seq: u64::from_be_bytes(seq),
        payload: payload.clone(),
    })
}

/// Where socket tasks deliver. Returning `false` means the receiver is gone: the task ends.
pub trait FrameSink: Send + Sync + 'static {
    fn live(&self, frames: Vec<Bytes>) -> impl Future<Output = bool> + Send;
    fn connected(&self) -> impl Future<Output = bool> + Send;
    /// The live connection ended or could not be set up past TCP; the task reconnects.
    fn link_lost(&self, loss: LinkLoss) -> impl Future<Output = bool> + Send;
    fn replay(&self, generation: u64, event: ReplayEvent) -> impl Future<Output = bool> + Send;
}

/// Why a live connection ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkLoss {
    /// A message over `max_publisher_message_bytes` (or a command over its bound) was announced.
    pub oversized: bool,
    /// The publisher went silent: no answer to our PINGs within the heartbeat timeout, or no
    /// answer to the kernel's keepalive probes.
    pub timed_out: bool,
    pub reason: String,
}

impl LinkLoss {
    fn of(error: &ZmtpError) -> Self {
        LinkLoss {
            oversized: error.is_oversized(),
            timed_out: error.is_timeout(),
            reason: error.to_string(),
        }
    }
}

/// What a replay task reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayEvent {
    /// A replayed message (raw frames after the DEALER's empty delimiter).
    Frames(Vec<Bytes>),
    End,
    Failed {
        reason: String,
        oversized: bool,
    },
}

/// Connect a SUB to `endpoint` (retrying with backoff until cancelled), then forward every
/// message until cancelled or the sink is gone; reconnect whenever the connection ends.
pub async fn run_live<S: FrameSink>(
    endpoint: String,
    sink: S,
    settings: SubscriptionSettings,
    cancel: CancellationToken,
) {
    let timings = settings.timings;
    let mut backoff = timings.backoff_initial;
    let mut first = true;
    loop {
        let attempt = tokio::time::timeout(timings.connect_timeout, open_sub(&endpoint, settings));
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            outcome = attempt => outcome,
        };
        let loss = match outcome {
            Ok(Ok(connection)) => {
                if first {
                    tracing::info!(%endpoint, "subscribed to publisher");
                } else {
                    tracing::debug!(%endpoint, "resubscribed to publisher");
                }
                first = false;
                if !sink.connected().await {
                    return;
                }
                match pump(connection, &sink, &cancel).await {
                    Pumped::Stop => return,
                    Pumped::Lost { error, delivered } => {
                        if delivered {
                            backoff = timings.backoff_initial;
                        }
                        Some(LinkLoss::of(&error))
                    }
                }
            }
            // Refused, reset or closed before the handshake ended: the publisher is not up (yet).
            Ok(Err(e @ (ZmtpError::Io(_) | ZmtpError::Closed))) => {
                tracing::debug!(%endpoint, error = %e, "publisher not reachable yet; retrying");
                None
            }
            Ok(Err(e)) => Some(LinkLoss::of(&e)),
            Err(_) => {
                tracing::debug!(%endpoint, "no handshake within {:?}; retrying", timings.connect_timeout);
                None
            }
        };
        if let Some(loss) = loss
            && !sink.link_lost(loss).await
        {
            return;
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(timings.backoff_max);
    }
}

async fn open_sub(endpoint: &str, settings: SubscriptionSettings) -> Result<Connection, ZmtpError> {
    let mut connection = Connection::connect(
        endpoint,
        SocketType::Sub,
        settings.max_message_bytes,
        Some(settings.timings.heartbeat),
    )
    .await?;
    connection.subscribe_all().await?;
    Ok(connection)
}

enum Pumped {
    /// Cancelled, or the sink is gone.
    Stop,
    Lost {
        error: ZmtpError,
        delivered: bool,
    },
}

async fn pump<S: FrameSink>(
    mut connection: Connection,
    sink: &S,
    cancel: &CancellationToken,
) -> Pumped {
    let mut delivered = false;
    loop {
        let message = tokio::select! {
            _ = cancel.cancelled() => return Pumped::Stop,
            message = connection.recv() => message,
        };
        match message {
            Ok(frames) => {
                delivered = true;
                if !sink.live(frames).await {
                    return Pumped::Stop;
                }
            }
            Err(error) => return Pumped::Lost { error, delivered },
        }
    }
}

/// Ask `replay_endpoint` for every buffered batch from `from_seq` on, with vLLM's framing
/// (`[b"", start_seq BE8]` from a DEALER), and forward the answers until the end marker.
pub async fn run_replay<S: FrameSink>(
    replay_endpoint: String,
    from_seq: u64,
    generation: u64,
    sink: S,
    settings: SubscriptionSettings,
    cancel: CancellationToken,
) {
    let timings = settings.timings;
    let outcome = tokio::select! {
        _ = cancel.cancelled() => return,
        outcome = tokio::time::timeout(
            timings.replay_total_timeout,
            replay_exchange(&replay_endpoint, from_seq, generation, &sink, settings),
        ) => outcome,
    };
    let event = match outcome {
        Ok(Ok(true)) => ReplayEvent::End,
        Ok(Ok(false)) => return, // the sink is gone
        Ok(Err(e)) => ReplayEvent::Failed {
            oversized: e.is_oversized(),
            reason: e.to_string(),
        },
        Err(_) => ReplayEvent::Failed {
            reason: format!(
                "replay did not finish within {:?}",
                timings.replay_total_timeout
            ),
            oversized: false,
        },
    };
    sink.replay(generation, event).await;
}

/// Returns `Ok(true)` at the end marker, `Ok(false)` when the sink is gone.
async fn replay_exchange<S: FrameSink>(
    endpoint: &str,
    from_seq: u64,
    generation: u64,
    sink: &S,
    settings: SubscriptionSettings,
) -> Result<bool, ZmtpError> {
    let timings = settings.timings;
    let connect = Connection::connect(
        endpoint,
        SocketType::Dealer,
        settings.max_message_bytes,
        Some(timings.heartbeat),
    );
    let mut connection = tokio::time::timeout(timings.connect_timeout, connect)
        .await
        .map_err(|_| {
            ZmtpError::Timeout(format!(
                "no handshake with {endpoint} within {:?}",
                timings.connect_timeout
            ))
        })??;
    connection.send(&[b"", &from_seq.to_be_bytes()]).await?;
    loop {
        let mut frames = tokio::time::timeout(timings.replay_idle_timeout, connection.recv())
            .await
            .map_err(|_| {
                ZmtpError::Timeout(format!(
                    "no replay message within {:?}",
                    timings.replay_idle_timeout
                ))
            })??;
        // A DEALER sees the ROUTER's empty delimiter first.
        if frames.first().is_some_and(|f| f.is_empty()) && frames.len() == 4 {
            frames.remove(0);
        }
        let is_end = frames.len() == 3 && frames[1].as_ref() == END_OF_REPLAY_SEQ.to_be_bytes();
        if is_end {
            return Ok(true);
        }
        if !sink.replay(generation, ReplayEvent::Frames(frames)).await {
            return Ok(false);
        }
    }
}
