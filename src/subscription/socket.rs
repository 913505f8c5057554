//! ZeroMQ I/O of a subscription: the live SUB stream and the replay DEALER.
//!
//! Both run as tokio tasks and hand what they read to a [`FrameSink`] (the subscription actor),
//! awaiting each hand-off so a slow index pushes back on the socket instead of growing a queue.
//!
//! zmq.rs specifics handled here: `connect()` blocks until the peer is up, so it runs with a short
//! timeout in a retry loop with backoff (an absent publisher never blocks start-up or
//! registration); a SUB reconnects by itself once connected; a DEALER never reconnects, so every
//! replay request uses a fresh socket and is bounded by timeouts.

use std::time::Duration;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use zeromq::{DealerSocket, Socket, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// The end-of-replay marker's seq (`(-1).to_bytes(8, "big", signed=True)`).
pub const END_OF_REPLAY_SEQ: u64 = u64::MAX;

/// Timeouts and backoff of the socket tasks.
#[derive(Debug, Clone, Copy)]
pub struct SocketTimings {
    /// One connection attempt.
    pub connect_timeout: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// Longest wait for the next replay message (vLLM serves replay between 100 ms queue polls).
    pub replay_idle_timeout: Duration,
    /// Longest whole replay.
    pub replay_total_timeout: Duration,
}

impl Default for SocketTimings {
    fn default() -> Self {
        SocketTimings {
            connect_timeout: Duration::from_secs(1),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            replay_idle_timeout: Duration::from_secs(2),
            replay_total_timeout: Duration::from_secs(30),
        }
    }
}

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
    fn replay(&self, generation: u64, event: ReplayEvent) -> impl Future<Output = bool> + Send;
}

/// What a replay task reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayEvent {
    /// A replayed message (raw frames after the DEALER's empty delimiter).
    Frames(Vec<Bytes>),
    End,
    Failed(String),
}

/// Connect a SUB socket to `endpoint` (retrying with backoff until cancelled), then forward every
/// message until cancelled or the sink is gone.
pub async fn run_live<S: FrameSink>(
    endpoint: String,
    sink: S,
    timings: SocketTimings,
    cancel: CancellationToken,
) {
    let mut backoff = timings.backoff_initial;
    let mut socket = loop {
        let mut options = SocketOptions::default();
        options.connect_timeout(timings.connect_timeout);
        let mut socket = SubSocket::with_options(options);
        let attempt = async {
            socket.connect(&endpoint).await?;
            socket.subscribe("").await
        };
        tokio::select! {
            _ = cancel.cancelled() => return,
            result = attempt => match result {
                Ok(()) => break socket,
                Err(e) => tracing::debug!(%endpoint, error = %e, "publisher not reachable yet; retrying"),
            }
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(timings.backoff_max);
    };
    tracing::info!(%endpoint, "subscribed to publisher");
    if !sink.connected().await {
        return;
    }
    loop {
        let message = tokio::select! {
            _ = cancel.cancelled() => break,
            message = socket.recv() => message,
        };
        match message {
            Ok(message) => {
                if !sink.live(message.into_vec()).await {
                    break;
                }
            }
            Err(e) => {
                // The SUB socket reconnects by itself; a receive error is logged and waited out.
                tracing::warn!(%endpoint, error = %e, "live stream receive error");
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(timings.backoff_initial) => {}
                }
            }
        }
    }
    socket.close().await;
}

/// Ask `replay_endpoint` for every buffered batch from `from_seq` on, with vLLM's framing
/// (`[b"", start_seq BE8]` from a DEALER), and forward the answers until the end marker.
pub async fn run_replay<S: FrameSink>(
    replay_endpoint: String,
    from_seq: u64,
    generation: u64,
    sink: S,
    timings: SocketTimings,
    cancel: CancellationToken,
) {
    let outcome = tokio::select! {
        _ = cancel.cancelled() => return,
        outcome = tokio::time::timeout(
            timings.replay_total_timeout,
            replay_exchange(&replay_endpoint, from_seq, generation, &sink, timings),
        ) => outcome,
    };
    let event = match outcome {
        Ok(Ok(true)) => ReplayEvent::End,
        Ok(Ok(false)) => return, // the sink is gone
        Ok(Err(reason)) => ReplayEvent::Failed(reason),
        Err(_) => ReplayEvent::Failed(format!(
            "replay did not finish within {:?}",
            timings.replay_total_timeout
        )),
    };
    sink.replay(generation, event).await;
}

/// Returns `Ok(true)` at the end marker, `Ok(false)` when the sink is gone.
async fn replay_exchange<S: FrameSink>(
    endpoint: &str,
    from_seq: u64,
    generation: u64,
    sink: &S,
    timings: SocketTimings,
) -> Result<bool, String> {
    let mut options = SocketOptions::default();
    options.connect_timeout(timings.connect_timeout);
    let mut socket = DealerSocket::with_options(options);
    socket
        .connect(endpoint)
        .await
        .map_err(|e| format!("connect {endpoint}: {e}"))?;
    let request = vec![
        Bytes::new(),
        Bytes::copy_from_slice(&from_seq.to_be_bytes()),
    ];
    let request = ZmqMessage::try_from(request).map_err(|e| format!("build request: {e}"))?;
    socket
        .send(request)
        .await
        .map_err(|e| format!("send replay request: {e}"))?;
    let result = loop {
        let message = match tokio::time::timeout(timings.replay_idle_timeout, socket.recv()).await {
            Ok(Ok(message)) => message,
            Ok(Err(e)) => break Err(format!("receive: {e}")),
            Err(_) => {
                break Err(format!(
                    "no replay message within {:?}",
                    timings.replay_idle_timeout
                ));
            }
        };
        let mut frames = message.into_vec();
        // A DEALER sees the ROUTER's empty delimiter first.
        if frames.first().is_some_and(|f| f.is_empty()) && frames.len() == 4 {
            frames.remove(0);
        }
        let is_end = frames.len() == 3 && frames[1].as_ref() == END_OF_REPLAY_SEQ.to_be_bytes();
        if is_end {
            break Ok(true);
        }
        if !sink.replay(generation, ReplayEvent::Frames(frames)).await {
            break Ok(false);
        }
    };
    socket.close().await;
    result
}
