//! The `Replica` gRPC service a new replica bootstraps from: one snapshot per call, streamed in
//! size-bounded chunks as the client takes them (tonic's flow control holds the producer back).
//! A replica that is not ready itself (still restoring, or bootstrapping with nothing loaded
//! yet) refuses with `UNAVAILABLE` and its reason: the caller retries, and never takes a state
//! that is not one.
//!
//! A snapshot is every registration with its endpoints and every block, so it is guarded: with
//! a token configured it needs the token (as a registration change does); without one it is
//! refused (`PERMISSION_DENIED`) unless `snapshot_export: "open"` says anyone may take it. One
//! export runs at a time (each holds a whole cut in memory until its stream ends); another is
//! refused with `RESOURCE_EXHAUSTED`, which a bootstrapping replica retries after its back-off.
//! Every export is counted, served or refused by why (docs/replicas.md, "Snapshot export").

use std::fmt::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::gateway::auth::Access;
use crate::gateway::ops::Ops;
use crate::gateway::pb;
use crate::gateway::pb_server::replica_server::Replica;
use crate::registry::{ContextDirectory, SubscriptionDirectory};
use crate::storage::KvStore;

use super::cut::Cut;
use super::format::CHUNK_BYTES;

/// Why an export was refused, as `/metrics` labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Served,
    /// No token configured and the export is not opened (`snapshot_export: "auth"`).
    NoToken,
    /// A token is configured and the call did not carry it.
    Unauthorized,
    /// Another export is running.
    Busy,
    /// This replica is not ready itself.
    NotReady,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::Served,
        Outcome::NoToken,
        Outcome::Unauthorized,
        Outcome::Busy,
        Outcome::NotReady,
    ];

    const fn label(self) -> &'static str {
        match self {
            Outcome::Served => "served",
            Outcome::NoToken => "no_token",
            Outcome::Unauthorized => "unauthorized",
            Outcome::Busy => "busy",
            Outcome::NotReady => "not_ready",
        }
    }
}

/// Snapshot exports by outcome, for `/metrics`.
#[derive(Debug, Default)]
pub struct ExportCounts {
    counts: [AtomicU64; Outcome::ALL.len()],
}

impl ExportCounts {
    fn count(&self, outcome: Outcome) {
        self.counts[outcome as usize].fetch_add(1, Ordering::Relaxed);
    }
}

impl crate::metrics::Section for ExportCounts {
    fn render(&self, w: &mut String) {
        let _ = writeln!(
            w,
            "# HELP conductor_snapshot_exports_total Replica.Snapshot calls, served or refused (docs/replicas.md)\n\
             # TYPE conductor_snapshot_exports_total counter"
        );
        for outcome in Outcome::ALL {
            let _ = writeln!(
                w,
                "conductor_snapshot_exports_total{{outcome=\"{}\"}} {}",
                outcome.label(),
                self.counts[outcome as usize].load(Ordering::Relaxed)
            );
        }
    }
}

pub struct SnapshotService {
    ops: Ops,
    store: Arc<dyn KvStore>,
    contexts: ContextDirectory,
    subscriptions: SubscriptionDirectory,
    replica_id: String,
    /// Whether a token is configured (then every export needs it).
    token_configured: bool,
    /// Without a token, whether anyone may take a snapshot (`snapshot_export: "open"`).
    open: bool,
    /// The one export at a time: held until its stream is dropped.
    running: Arc<tokio::sync::Semaphore>,
    counts: Arc<ExportCounts>,
}

impl SnapshotService {
    pub fn new(
        ops: Ops,
        store: Arc<dyn KvStore>,
        contexts: ContextDirectory,
        subscriptions: SubscriptionDirectory,
        replica_id: String,
    ) -> Self {
        SnapshotService {
            ops,
            store,
            contexts,
            subscriptions,
            replica_id,
            token_configured: false,
            open: false,
            running: Arc::new(tokio::sync::Semaphore::new(1)),
            counts: Arc::default(),
        }
    }

    /// Who may take a snapshot: with `token_configured`, callers with the token; without,
    /// anyone if `open` (`snapshot_export: "open"`), else no one.
    pub fn guarded(mut self, token_configured: bool, open: bool) -> Self {
        self.token_configured = token_configured;
        self.open = open;
        self
    }

    /// Count the exports in `counts` (a `/metrics` section).
    pub fn counting(mut self, counts: Arc<ExportCounts>) -> Self {
        self.counts = counts;
        self
    }

    /// The call's authorization, else the refusal (counted).
    fn admit(&self, authorization: Option<&[u8]>) -> Result<(), Status> {
        if !self.token_configured && !self.open {
            self.counts.count(Outcome::NoToken);
            return Err(Status::permission_denied(
                "snapshot export is disabled: this replica has no auth_token; configure one \
                 (on every replica) or set snapshot_export: \"open\"",
            ));
        }
        // A snapshot is every registration and every block: as guarded as a registration
        // change.
        self.ops
            .authorize(Access::Write, authorization)
            .map_err(|e| {
                self.counts.count(Outcome::Unauthorized);
                Status::unauthenticated(e.message)
            })
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::SnapshotChunk, Status>> + Send>>;

#[tonic::async_trait]
impl Replica for SnapshotService {
    type SnapshotStream = ChunkStream;

    async fn snapshot(
        &self,
        request: Request<pb::SnapshotRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let authorization = request.metadata().get("authorization");
        self.admit(authorization.map(|v| v.as_bytes()))?;
        if let Some(reason) = self.ops.not_ready_reason() {
            self.counts.count(Outcome::NotReady);
            return Err(Status::unavailable(format!(
                "this replica is not ready ({reason})"
            )));
        }
        let Ok(permit) = self.running.clone().try_acquire_owned() else {
            self.counts.count(Outcome::Busy);
            return Err(Status::resource_exhausted(
                "another snapshot export is running on this replica (one at a time); retry later",
            ));
        };
        let started = std::time::Instant::now();
        let cut = Cut::take(self.store.as_ref(), &self.contexts, &self.subscriptions)
            .await
            .map_err(|e| Status::unavailable(format!("cannot read the registrations: {e}")))?;
        let pairs: usize = cut.contexts.iter().map(|c| c.pairs.len()).sum();
        tracing::info!(
            contexts = cut.contexts.len(),
            pairs,
            registrations = cut.registrations.len(),
            elapsed = ?started.elapsed(),
            "serving a snapshot to a new replica: cut taken"
        );
        self.counts.count(Outcome::Served);
        let chunks = cut.into_chunks(self.replica_id.clone(), CHUNK_BYTES);
        // The permit lives as long as the stream: the next export starts once this one's is
        // sent whole or dropped by its client.
        Ok(Response::new(Box::pin(futures::stream::iter(chunks).map(
            move |chunk| {
                let _running = &permit;
                Ok(chunk)
            },
        ))))
    }
}
