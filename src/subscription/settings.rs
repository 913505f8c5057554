//! What every subscription is configured with: socket timings and the bounds on what a peer can
//! make it hold.

use std::time::Duration;

use super::socket::SocketTimings;
use crate::config::Config;

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
    /// Longest model or adapter name an event may create a context for.
    pub max_name_bytes: usize,
}

impl SubscriptionSettings {
    pub fn from_config(config: &Config) -> Self {
        SubscriptionSettings {
            timings: SocketTimings::default(),
            max_message_bytes: config.max_publisher_message_bytes as usize,
            max_held_bytes: config.max_replay_held_bytes as usize,
            warn_interval: Duration::from_millis(config.warning_interval_ms),
            max_contexts: config.max_contexts_per_source as usize,
            max_name_bytes: config.max_name_bytes as usize,
        }
    }
}
