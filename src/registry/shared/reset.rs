//! Telling the fleet's own changes from an etcd that lost them: a listing that does not continue
//! the history this replica followed is a suspected reset, and removes nothing
//! (`docs/replicas.md`, "An etcd that comes back empty").
//!
//! Three facts identify the history: the cluster id of etcd's response headers, the store
//! revision (never lower in one history), and the fleet's epoch, a random value the first
//! replica to list an etcd without one writes under `<prefix>epoch`. A wiped etcd started again
//! with the same flags has the same cluster id (etcd derives it from the member names and peer
//! addresses) and, once other clients wrote to it, possibly a higher revision than before; it
//! has no epoch, or a new one. A restore from an older backup has the old epoch but a lower
//! revision. The member id is no signal: it changes whenever the client moves to another member
//! of the same cluster.

use std::fmt;

/// The etcd key (below the configured prefix) that holds the fleet's epoch.
pub const EPOCH: &str = "epoch";

/// The etcd key of the fleet's epoch.
pub fn epoch_key(prefix: &str) -> String {
    format!("{prefix}{EPOCH}")
}

/// What etcd said about the history a listing (or a read before a resumed watch) belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    pub revision: i64,
    /// 0 when etcd did not say (a response without a header).
    pub cluster_id: u64,
    /// The epoch etcd holds, `None` when it holds none.
    pub epoch: Option<String>,
}

/// The history a replica follows: kept in its store between runs (`marker`) so that a restart
/// tells a reset from the fleet's changes too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct History {
    /// `None` until a listing found (or this replica wrote) one.
    pub epoch: Option<String>,
    pub cluster_id: u64,
    /// The revision everything up to which was applied.
    pub revision: i64,
}

/// Why a listing is suspected of coming from an etcd that lost the fleet's registrations; the
/// label of `conductor_registry_resets_suspected_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ResetReason {
    /// etcd's cluster id is not the one this replica followed.
    ClusterChanged,
    /// etcd no longer holds the epoch this replica followed (wiped, reinstalled, or its prefix
    /// deleted by hand).
    HistoryLost,
    /// etcd's revision, or a registration's, is below one this replica already applied
    /// (restored from an older backup).
    RevisionBackwards,
    /// No history to compare with (a store from a build that kept none), and etcd holds no
    /// registration while this replica runs some.
    AllRemoved,
}

impl ResetReason {
    pub const ALL: [ResetReason; 4] = [
        ResetReason::ClusterChanged,
        ResetReason::HistoryLost,
        ResetReason::RevisionBackwards,
        ResetReason::AllRemoved,
    ];

    pub const fn label(self) -> &'static str {
        match self {
            ResetReason::ClusterChanged => "cluster_changed",
            ResetReason::HistoryLost => "history_lost",
            ResetReason::RevisionBackwards => "revision_backwards",
            ResetReason::AllRemoved => "all_removed",
        }
    }
}

impl fmt::Display for ResetReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// A listing judged not to continue the followed history: why, in words for the log and
/// `/health`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspicion {
    pub reason: ResetReason,
    pub detail: String,
}

/// Whether `listed` continues `followed`. `regressed` names a registration etcd lists with a
/// lower modification revision than this replica applied for it; `lists_none_of_running` says
/// that etcd lists no registration while this replica runs some. Cluster first, then epoch,
/// then revisions: the first that fails is the reason.
pub fn judge(
    followed: Option<&History>,
    listed: &Listed,
    regressed: Option<(&str, i64, i64)>,
    lists_none_of_running: bool,
) -> Option<Suspicion> {
    let suspicion = |reason, detail: String| Some(Suspicion { reason, detail });
    let Some(h) = followed else {
        return if lists_none_of_running {
            suspicion(
                ResetReason::AllRemoved,
                "etcd holds no registration while this replica runs some, and this replica \
                 has no history to tell a deliberate removal from a reset"
                    .into(),
            )
        } else {
            None
        };
    };
    if h.cluster_id != 0 && listed.cluster_id != 0 && h.cluster_id != listed.cluster_id {
        return suspicion(
            ResetReason::ClusterChanged,
            format!(
                "etcd answers as cluster {:x}, this replica followed cluster {:x}",
                listed.cluster_id, h.cluster_id
            ),
        );
    }
    if let Some(epoch) = &h.epoch
        && listed.epoch.as_ref() != Some(epoch)
    {
        let now = match &listed.epoch {
            None => "holds none".to_owned(),
            Some(other) => format!("holds {other}"),
        };
        return suspicion(
            ResetReason::HistoryLost,
            format!(
                "etcd no longer holds the epoch this replica followed ({epoch}; it {now}): \
                 wiped, reinstalled or its prefix deleted"
            ),
        );
    }
    if listed.revision < h.revision {
        return suspicion(
            ResetReason::RevisionBackwards,
            format!(
                "etcd is at revision {}, below the {} this replica applied: restored from an \
                 older backup",
                listed.revision, h.revision
            ),
        );
    }
    if let Some((service, listed_at, applied_at)) = regressed {
        return suspicion(
            ResetReason::RevisionBackwards,
            format!(
                "etcd lists {service} as modified at revision {listed_at}, before the {applied_at} \
                 this replica applied: restored from an older backup"
            ),
        );
    }
    None
}

/// A fresh epoch value: the time and a per-process random number, so that an etcd set up again
/// never gets an epoch it had before.
pub fn new_epoch() -> String {
    use std::hash::{BuildHasher, Hasher};
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let mut random = std::collections::hash_map::RandomState::new().build_hasher();
    random.write_u128(nanos);
    random.write_u32(std::process::id());
    format!("{nanos:x}-{:016x}", random.finish())
}
