//! The `Replica` gRPC service a new replica bootstraps from: one snapshot per call, streamed in
//! size-bounded chunks as the client takes them (tonic's flow control holds the producer back).
//! A replica that is not ready itself (still restoring, or bootstrapping with nothing loaded
//! yet) refuses with `UNAVAILABLE` and its reason: the caller retries, and never takes a state
//! that is not one.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use tonic::{Request, Response, Status};

use crate::gateway::auth::Access;
use crate::gateway::ops::Ops;
use crate::gateway::pb;
use crate::gateway::pb_server::replica_server::Replica;
use crate::registry::{ContextDirectory, SubscriptionDirectory};
use crate::storage::KvStore;

use super::cut::Cut;
use super::format::CHUNK_BYTES;

pub struct SnapshotService {
    ops: Ops,
    store: Arc<dyn KvStore>,
    contexts: ContextDirectory,
    subscriptions: SubscriptionDirectory,
    replica_id: String,
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
        }
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
        // A snapshot is every registration and every block: as guarded as a registration change.
        let authorization = request.metadata().get("authorization");
        self.ops
            .authorize(Access::Write, authorization.map(|v| v.as_bytes()))
            .map_err(|e| Status::unauthenticated(e.message))?;
        if let Some(reason) = self.ops.not_ready_reason() {
            return Err(Status::unavailable(format!(
                "this replica is not ready ({reason})"
            )));
        }
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
        let chunks = cut.into_chunks(self.replica_id.clone(), CHUNK_BYTES);
        Ok(Response::new(Box::pin(futures::stream::iter(
            chunks.map(Ok),
        ))))
    }
}
