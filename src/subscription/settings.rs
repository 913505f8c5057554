//! What every subscription is configured with: socket timings and the bounds on what a peer can
//! make it hold.

use std::time::Duration;

use super::zmtp::Heartbeat;

#[derive(Debug, Clone, Copy)]
pub struct SubscriptionSettings {
    pub timings: SocketTimings,
    /// The most one publisher or replay message may take (see `zmtp`).
    pub max_message_bytes: usize,
    /// The most the live batches held while a replay runs may take, in payload bytes.
    pub max_held_bytes: usize,
    /// Each kind of per-subscription warning is logged at most once per interval.
    pub warn_interval: Duration,
    /// The most contexts this source's events may feed; events for more are refused.
    pub max_contexts: usize,
    /// The most store backends (holders) this source's events may create in one context.
    pub max_holders: usize,
    /// Longest model or adapter name an event may create a context for.
    pub max_name_bytes: usize,
    /// A publisher unreachable this long (no live connection) has its source dropped; until
    /// then its blocks stay (see `docs/zmtp.md`).
    pub unreachable_grace: Duration,
}

/// A PING every 5 s costs a few bytes per publisher and finds a frozen path within 15 s: three
/// intervals, so one late PONG on a busy publisher is no reason to reconnect.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(15);
/// A publisher away for 30 s (45 s after its path froze) has its blocks dropped: long enough for
/// a brief partition or a publisher's quick restart, short enough that answers do not keep
/// pointing at an engine that is gone.
pub const DEFAULT_UNREACHABLE_GRACE: Duration = Duration::from_secs(30);

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
    /// PINGs to a publisher that speaks ZMTP 3.1, and when a silent one is given up; also the
    /// sockets' TCP keepalive.
    pub heartbeat: Heartbeat,
}

impl Default for SocketTimings {
    fn default() -> Self {
        SocketTimings {
            connect_timeout: Duration::from_secs(1),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(2),
            replay_idle_timeout: Duration::from_secs(2),
            replay_total_timeout: Duration::from_secs(30),
            heartbeat: Heartbeat {
                interval: DEFAULT_HEARTBEAT_INTERVAL,
                timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            },
        }
    }
}
