//! Why a bootstrap attempt failed, and how a failure this replica chose (its deadline, its
//! bounds) is counted.

use std::time::Duration;

use crate::storage::StorageError;

/// Why a bootstrap attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("peer {peer} is unreachable: {reason}")]
    Unreachable { peer: String, reason: String },
    #[error("peer {peer} refused the snapshot: {reason}")]
    Refused { peer: String, reason: String },
    #[error(
        "peer {peer} sends snapshot format {found}, newer than this binary reads ({supported}); \
         bootstrap from a peer of the same version"
    )]
    TooNew {
        peer: String,
        found: u32,
        supported: u32,
    },
    #[error(
        "peer {peer} sends snapshot format {found}, older than this binary reads ({supported}); \
         bootstrap from a peer of the same version"
    )]
    TooOld {
        peer: String,
        found: u32,
        supported: u32,
    },
    #[error("bad snapshot from {peer}: {reason}")]
    Bad { peer: String, reason: String },
    #[error("snapshot from {peer} refused: {reason}")]
    OverLimit { peer: String, reason: String },
    #[error(
        "snapshot from {peer} abandoned: not complete within bootstrap_deadline_ms ({deadline:?})"
    )]
    Deadline { peer: String, deadline: Duration },
    #[error("snapshot from {peer} is truncated: {reason}")]
    Truncated { peer: String, reason: String },
    #[error("snapshot from {peer} cannot be loaded: {0}", peer = .1)]
    Load(StorageError, String),
}

impl PullError {
    /// How an attempt that this replica gave up on is counted: past its deadline, or beyond
    /// its bounds; `None` for the other failures.
    pub fn abandoned(&self) -> Option<&'static str> {
        match self {
            PullError::Deadline { .. } => Some("deadline"),
            PullError::OverLimit { .. } => Some("limit"),
            _ => None,
        }
    }
}
