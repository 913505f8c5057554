//! The new replica's side of one attempt: pull one snapshot from a peer into this replica's
//! (empty) store, then recover from it exactly as after a restart, each source resuming from the
//! position the snapshot names for it ([`super::positions`]).
//!
//! Nothing is served from the snapshot before it is complete and loaded: the records, each
//! checked against this replica's bounds as it arrives ([`super::receive`]), go to the store as
//! they arrive (a writer thread, so the network and the disk overlap; a bulk load, see
//! `storage::bulk`), and meanwhile a builder thread makes the contexts and decodes the
//! registrations from the same records (`build`), which are loaded only after the end mark; a
//! stream not in the store's order is instead recovered from the store, as after a restart. Any
//! failure (unreachable peer, refused call, unknown format, a gap, more than announced or than
//! this replica holds, truncation, the attempt's deadline, records recovery cannot read) clears
//! what was written before it is returned; the caller retries ([`super::attempts`]). A process
//! killed mid-way leaves the data directory's "bootstrap pending" mark ([`super::pending`]), so
//! the next start clears it and bootstraps again.

use std::sync::Arc;
use std::time::Duration;

use crate::durability::recovery::{Recovered, recover};
use crate::gateway::pb;
use crate::gateway::pb::replica_client::ReplicaClient;
use crate::storage::{Cf, KvOp, KvStore, StorageError};

use super::build::StreamBuild;
pub use super::failure::PullError;
use super::format::MAX_CHUNK_BYTES;
use super::positions::{self, Positions};
use super::progress::Progress;
use super::receive::{Limits, Received, STALL_TIMEOUT, receive};

/// Connecting to the peer gives up after this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The HTTP/2 flow-control window the stream gets: several chunks in flight.
const WINDOW_BYTES: u32 = 4 * MAX_CHUNK_BYTES as u32;

/// The peer's identity as it announced it, and what was loaded.
pub struct Pulled {
    pub peer_id: String,
    pub recovered: Recovered,
}

/// Pull a snapshot from `peer` into `store` (which holds no registrations) and recover it.
pub async fn pull(
    peer: &str,
    token: Option<&[u8]>,
    tls: Option<&tonic::transport::ClientTlsConfig>,
    store: &Arc<dyn KvStore>,
    progress: &Progress,
    limits: &Limits,
) -> Result<Pulled, PullError> {
    let started = std::time::Instant::now();
    clear(store.as_ref()).map_err(|e| PullError::Load(e, peer.to_owned()))?;
    let result = fetch(peer, token, tls, store, progress, limits).await;
    let result = match result {
        Ok(fetched) => {
            tracing::info!(peer, elapsed = ?started.elapsed(), "snapshot received; loading it");
            progress.loading();
            let store = store.clone();
            let loaded = tokio::task::spawn_blocking(move || {
                load(
                    fetched.build,
                    &fetched.registered,
                    &fetched.positions,
                    store.as_ref(),
                )
            })
            .await
            .unwrap_or_else(|_| Err(StorageError::Io("loading the snapshot panicked".into())));
            loaded
                .map(|recovered| Pulled {
                    peer_id: fetched.peer_id,
                    recovered,
                })
                .map_err(|e| PullError::Load(e, peer.to_owned()))
        }
        Err(e) => Err(e),
    };
    if result.is_err() {
        // Never a partial state: whatever arrived goes.
        if let Err(e) = clear(store.as_ref()) {
            tracing::error!("cannot clear a failed bootstrap's records: {e}");
        }
    }
    result
}

/// A snapshot received whole and written to the store.
struct Fetched {
    peer_id: String,
    /// The contexts built as the records arrived; `None` when the stream was not in the
    /// store's order and recovery has to read it back.
    build: Option<StreamBuild>,
    /// Each registration's source and incarnation.
    registered: Vec<(crate::model::SubscriptionKey, u64)>,
    positions: Positions,
}

/// The contexts built from the stream when it could be, else recovered from the store. Either
/// way they are what a restart would recover from the records written.
fn load(
    build: Option<StreamBuild>,
    registered: &[(crate::model::SubscriptionKey, u64)],
    positions: &Positions,
    store: &dyn KvStore,
) -> Result<Recovered, StorageError> {
    let records = positions::source_records(registered, positions);
    // Synced: with them, the records bulk-loaded before are on disk too.
    store.write_synced(positions::record_ops(&records))?;
    if let Some(build) = build {
        match build.finish(records) {
            Ok(recovered) => return Ok(recovered),
            Err(reason) => {
                tracing::warn!(
                    "snapshot not built as it arrived ({reason}); recovering it from the store"
                );
            }
        }
    }
    recover(store)
}

/// Receive every chunk, build the contexts from its records and write them; the peer's replica
/// id, the build and the registrations' sources once the end mark came. Past `limits.deadline`
/// from its start, the attempt is abandoned.
async fn fetch(
    peer: &str,
    token: Option<&[u8]>,
    tls: Option<&tonic::transport::ClientTlsConfig>,
    store: &Arc<dyn KvStore>,
    progress: &Progress,
    limits: &Limits,
) -> Result<Fetched, PullError> {
    let deadline = tokio::time::Instant::now() + limits.deadline;
    let past_deadline = || PullError::Deadline {
        peer: peer.to_owned(),
        deadline: limits.deadline,
    };
    let unreachable = |reason: String| PullError::Unreachable {
        peer: peer.to_owned(),
        reason,
    };
    let mut endpoint = tonic::transport::Endpoint::from_shared(peer.to_owned())
        .map_err(|e| unreachable(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        // HTTP/2's default 64 KiB window would have the peer wait for a window update every
        // 64 KiB of a stream of hundreds of megabytes.
        .initial_stream_window_size(WINDOW_BYTES)
        .initial_connection_window_size(WINDOW_BYTES);
    // Config checks that an https:// peer comes with its CA, and a plain one is on this host or
    // opted into (docs/security.md).
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.clone())
            .map_err(|e| unreachable(source_chain(&e)))?;
    }
    let channel = tokio::time::timeout(CONNECT_TIMEOUT, endpoint.connect())
        .await
        .map_err(|_| unreachable(format!("no connection within {CONNECT_TIMEOUT:?}")))?
        .map_err(|e| unreachable(source_chain(&e)))?;
    let mut client = ReplicaClient::new(channel).max_decoding_message_size(MAX_CHUNK_BYTES);
    let mut request = tonic::Request::new(pb::SnapshotRequest {});
    if let Some(token) = token {
        let mut value = b"Bearer ".to_vec();
        value.extend_from_slice(token);
        if let Ok(v) = tonic::metadata::MetadataValue::try_from(value.as_slice()) {
            request.metadata_mut().insert("authorization", v);
        }
    }
    let answer_by = deadline.min(tokio::time::Instant::now() + STALL_TIMEOUT);
    let mut stream = tokio::time::timeout_at(answer_by, client.snapshot(request))
        .await
        .map_err(|_| {
            if answer_by == deadline {
                past_deadline()
            } else {
                unreachable(format!("no answer within {STALL_TIMEOUT:?}"))
            }
        })?
        .map_err(|s| PullError::Refused {
            peer: peer.to_owned(),
            code: s.code(),
            reason: format!("{:?}: {}", s.code(), s.message()),
        })?
        .into_inner();

    // Two threads after the stream: one builds the contexts from each chunk's records, then
    // hands them to the other, which writes them (the store's writes block, the stream's reads
    // must not). Decoding, writing and receiving the next chunk overlap.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<KvOp>>(4);
    let (to_writer, from_builder) = std::sync::mpsc::sync_channel::<Vec<KvOp>>(4);
    let spawn_error =
        |e: std::io::Error| PullError::Load(StorageError::Io(e.to_string()), peer.to_owned());
    let writer = {
        let store = store.clone();
        std::thread::Builder::new()
            .name("bootstrap-writer".into())
            .spawn(move || {
                // The store holds none of these records yet (it was cleared): a bulk load,
                // which for RocksDB bypasses the log, the memtables and compactions.
                store.bulk_load(&mut |sink| {
                    for ops in &from_builder {
                        for op in ops {
                            let KvOp::Put { cf, key, value } = op else {
                                continue;
                            };
                            sink.put(cf, &key, &value)?;
                        }
                    }
                    Ok(())
                })
            })
            .map_err(spawn_error)?
    };
    let builder = std::thread::Builder::new()
        .name("bootstrap-builder".into())
        .spawn(move || {
            let mut build = Some(StreamBuild::default());
            while let Some(ops) = rx.blocking_recv() {
                if let Some(b) = &mut build
                    && let Err(reason) = b.feed(&ops)
                {
                    tracing::warn!(
                        "snapshot not built as it arrives ({reason}); recovering it from the store"
                    );
                    build = None;
                }
                if to_writer.send(ops).is_err() {
                    // The writer stopped on a store error, which the caller reports.
                    break;
                }
            }
            build
        })
        .map_err(spawn_error)?;
    // The deadline ends the stream, not the threads: they stop once `tx` is dropped, and are
    // joined before the caller clears what they wrote.
    let received =
        tokio::time::timeout_at(deadline, receive(&mut stream, &tx, progress, peer, limits))
            .await
            .unwrap_or_else(|_| Err(past_deadline()));
    drop(tx);
    let build = builder.join().unwrap_or_else(|_| {
        tracing::error!("the snapshot builder panicked; recovering the snapshot from the store");
        None
    });
    let written = writer
        .join()
        .unwrap_or_else(|_| Err(StorageError::Io("bootstrap writer panicked".into())));
    let Received {
        peer_id,
        registered,
        positions,
    } = received?;
    written.map_err(|e| PullError::Load(e, peer.to_owned()))?;
    Ok(Fetched {
        peer_id,
        build,
        registered,
        positions,
    })
}

/// Delete every record but the schema version. Keys are at most a context id, a holder id and
/// a block (20 bytes) or a context id and UTF-8 text (never a 0xff byte), so they all sort
/// below 64 bytes of 0xff.
pub fn clear(store: &dyn KvStore) -> Result<(), StorageError> {
    let ops = Cf::ALL
        .into_iter()
        .filter(|&cf| cf != Cf::Meta)
        .map(|cf| KvOp::DeleteRange {
            cf,
            from: Vec::new(),
            to: vec![0xff; 64],
        })
        .collect();
    store.write_synced(ops)
}

/// An error with its causes, for a log line that says what actually failed.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
