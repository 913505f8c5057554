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
    Refused {
        peer: String,
        /// The peer's status code, which tells a peer that exports to no one (no token) from
        /// one that wants another token.
        code: tonic::Code,
        reason: String,
    },
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

/// What a refusal for want of a token means, and its fix: the default `snapshot_export` ("auth")
/// on a peer without `auth_token` hands its snapshot to no one, so every bootstrap from it fails.
pub const NO_TOKEN_HINT: &str = "the peer exports its snapshot to no one: it has no auth_token \
     and its snapshot_export is the default \"auth\"; set the same auth_token on every replica \
     of the fleet, or snapshot_export: \"open\" on the peers where only the fleet reaches their \
     gRPC port";

/// What a refusal of this replica's token means, and its fix.
pub const WRONG_TOKEN_HINT: &str = "the peer wants a token this replica does not present: set \
     the same auth_token on every replica of the fleet";

impl PullError {
    /// The usual cause of this failure and its fix, where the failure names one.
    pub fn hint(&self) -> Option<&'static str> {
        match self {
            PullError::Refused {
                code: tonic::Code::PermissionDenied,
                ..
            } => Some(NO_TOKEN_HINT),
            PullError::Refused {
                code: tonic::Code::Unauthenticated,
                ..
            } => Some(WRONG_TOKEN_HINT),
            _ => None,
        }
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_for_want_of_a_token_names_its_cause_and_fix() {
        let refused = |code| PullError::Refused {
            peer: "http://peer:1".into(),
            code,
            reason: String::new(),
        };
        let no_token = refused(tonic::Code::PermissionDenied).hint();
        assert!(no_token.is_some_and(|h| h.contains("no auth_token") && h.contains("\"open\"")));
        let wrong = refused(tonic::Code::Unauthenticated).hint();
        assert!(wrong.is_some_and(|h| h.contains("same auth_token")));
        assert_eq!(refused(tonic::Code::Unavailable).hint(), None);
        let unreachable = PullError::Unreachable {
            peer: "http://peer:1".into(),
            reason: String::new(),
        };
        assert_eq!(unreachable.hint(), None);
    }
}
