//! The peer's side of a snapshot: one cut of every context's state with its watermarks, each
//! source's resume position, and the records and chunks it streams.
//!
//! The cut is taken like a checkpoint round (`durability::checkpoint`): every subscription first
//! pushes its position to the contexts it feeds, and that position is kept, once for the whole
//! cut, as where the source resumes on the reader ([`super::positions`]). Then the contexts are
//! listed and each exports its state in one call on its single writer, so the watermarks a
//! context hands over describe exactly the pairs beside them, and every context the source fed
//! up to its position is in the listing (the subscription creates a context before it hands it
//! a batch, and the push replies behind every batch handed over). A context created after the
//! listing was created by a batch after the position, so the reader's replay from the position
//! brings it back, while the exported contexts, whose watermarks may be past the position, skip
//! what they already hold. Registrations are read last: a source unregistered during the cut is
//! then missing from them, and the reader's recovery drops what the contexts still held of it,
//! as after its own restart.

use std::collections::VecDeque;

use crate::durability::checkpoint::context_ops;
use crate::durability::codec::context_id;
use crate::gateway::pb;
use crate::hashing::derived::ChainTuning;
use crate::index::ContextChanges;
use crate::index::actor::ExportState;
use crate::registry::{ContextDirectory, SubscriptionDirectory};
use crate::storage::{Cf, KvStore, StorageError};

use super::format::{self, FORMAT};
use super::positions::{self, Positions};

/// Pairs (and aliases) encoded at a time: the records of a large context are made as they are
/// sent, never all at once.
const SLICE: usize = 16 * 1024;

/// One consistent snapshot, ready to stream.
pub struct Cut {
    pub contexts: Vec<ContextChanges>,
    /// (key, value) of each registration record, as stored.
    pub registrations: Vec<(Vec<u8>, Vec<u8>)>,
    /// Where each source resumes on the reader (see the module doc).
    pub positions: Positions,
    /// The chain tuning the store's derived keys were made with, which the reader takes.
    pub tuning: ChainTuning,
}

impl Cut {
    pub async fn take(
        store: &dyn KvStore,
        contexts: &ContextDirectory,
        subscriptions: &SubscriptionDirectory,
    ) -> Result<Cut, StorageError> {
        Listing::take(contexts, subscriptions)
            .await
            .export(store)
            .await
    }

    /// The stream's chunks, each under `chunk_bytes` of records (or holding one record).
    pub fn into_chunks(self, replica_id: String, chunk_bytes: usize) -> Chunks {
        let pairs: usize = self.contexts.iter().map(|c| c.pairs.len()).sum();
        let contexts: VecDeque<ContextRecords> =
            self.contexts.into_iter().map(ContextRecords::new).collect();
        let records = contexts.iter().map(|c| c.total).sum::<usize>() + self.registrations.len();
        let begin = pb::SnapshotBegin {
            format: FORMAT,
            records: records as u64,
            pairs: pairs as u64,
            contexts: contexts.len() as u64,
            registrations: self.registrations.len() as u64,
            replica_id,
            sources: positions::to_wire(&self.positions),
            chain_tuning: tuning_to_wire(self.tuning),
        };
        Chunks {
            begin: Some(begin),
            contexts,
            registrations: self.registrations.into(),
            chunk_bytes: chunk_bytes.max(1),
            seq: 0,
            sent: 0,
            pairs: pairs as u64,
            done: false,
        }
    }
}

/// The cut's first half: the sources' positions, pushed to their contexts, then the contexts
/// listed (in that order: see the module doc).
pub struct Listing {
    positions: Positions,
    handles: Vec<crate::index::ContextHandle>,
    started: std::time::Instant,
    marks: std::time::Duration,
}

impl Listing {
    pub async fn take(
        contexts: &ContextDirectory,
        subscriptions: &SubscriptionDirectory,
    ) -> Listing {
        let started = std::time::Instant::now();
        let positions = subscriptions
            .push_marks()
            .await
            .into_iter()
            .filter_map(|(key, position)| Some((key, position.mark?)))
            .collect();
        let marks = started.elapsed();
        let mut handles = contexts.all();
        handles.sort_by_key(|h| context_id(h.key()));
        Listing {
            positions,
            handles,
            started,
            marks,
        }
    }

    /// Export every listed context, then read the registrations.
    pub async fn export(self, store: &dyn KvStore) -> Result<Cut, StorageError> {
        let mut exported = Vec::with_capacity(self.handles.len());
        for handle in self.handles {
            // A context stopped meanwhile (unregistered) is simply not in the cut.
            if let Ok(changes) = handle.send(ExportState).await {
                exported.push(changes);
            }
        }
        tracing::info!(
            marks = ?self.marks,
            exports = ?(self.started.elapsed() - self.marks),
            sources = self.positions.len(),
            "snapshot cut: positions pushed, contexts exported"
        );
        let mut registrations = Vec::new();
        store.scan_prefix(Cf::Registrations, b"", &mut |k, v| {
            registrations.push((k.to_vec(), v.to_vec()));
            Ok(())
        })?;
        Ok(Cut {
            contexts: exported,
            registrations,
            positions: self.positions,
            tuning: crate::storage::migrations::read_tuning(store)?,
        })
    }
}

/// A tuning as `SnapshotBegin.chain_tuning` carries it: shard bits << 8 | segment bits.
pub fn tuning_to_wire(tuning: ChainTuning) -> u32 {
    u32::from(tuning.to_bits())
}

/// The tuning `SnapshotBegin.chain_tuning` names: 0 (a peer that sends none, of schema 7 or
/// older) is [`ChainTuning::UNRECORDED`]; `None` for a value no tuning has.
pub fn tuning_from_wire(wire: u32) -> Option<ChainTuning> {
    match wire {
        0 => Some(ChainTuning::UNRECORDED),
        w => u16::try_from(w).ok().and_then(ChainTuning::from_bits),
    }
}

/// The chunks of one snapshot, made as they are taken.
pub struct Chunks {
    begin: Option<pb::SnapshotBegin>,
    contexts: VecDeque<ContextRecords>,
    registrations: VecDeque<(Vec<u8>, Vec<u8>)>,
    chunk_bytes: usize,
    seq: u64,
    sent: u64,
    pairs: u64,
    done: bool,
}

impl Chunks {
    fn next_record(&mut self) -> Option<pb::SnapshotRecord> {
        while let Some(context) = self.contexts.front_mut() {
            if let Some(r) = context.next() {
                return Some(r);
            }
            self.contexts.pop_front();
        }
        let (key, value) = self.registrations.pop_front()?;
        Some(pb::SnapshotRecord {
            cf: format::cf_code(Cf::Registrations)?,
            key,
            value,
        })
    }
}

impl Iterator for Chunks {
    type Item = pb::SnapshotChunk;

    fn next(&mut self) -> Option<pb::SnapshotChunk> {
        if self.done {
            return None;
        }
        let mut records = Vec::new();
        let mut bytes = 0;
        while bytes < self.chunk_bytes {
            let Some(r) = self.next_record() else {
                self.done = true;
                break;
            };
            bytes += format::record_bytes(&r);
            records.push(r);
        }
        self.sent += records.len() as u64;
        let chunk = pb::SnapshotChunk {
            seq: self.seq,
            begin: self.begin.take(),
            records,
            end: self.done.then_some(pb::SnapshotEnd {
                records: self.sent,
                pairs: self.pairs,
            }),
        };
        self.seq += 1;
        Some(chunk)
    }
}

/// The records of one exported context: its header, holders, listings and watermarks first,
/// then its pairs and aliases a slice at a time, all in the checkpoint's encoding.
struct ContextRecords {
    current: std::vec::IntoIter<crate::storage::KvOp>,
    /// The context with no content: each slice of pairs or aliases is encoded as its changes.
    empty: ContextChanges,
    pairs: Vec<crate::index::PairBits>,
    repeats: Vec<(u32, u64, u8, u32)>,
    aliases: Vec<(u64, Option<u64>)>,
    next_pair: usize,
    next_alias: usize,
    /// Records in all.
    total: usize,
}

impl ContextRecords {
    fn new(mut changes: ContextChanges) -> ContextRecords {
        let pairs = std::mem::take(&mut changes.pairs);
        let repeats = std::mem::take(&mut changes.repeats);
        let aliases = std::mem::take(&mut changes.aliases);
        let header: Vec<_> = context_ops(&changes)
            .into_iter()
            .filter(|op| matches!(op, crate::storage::KvOp::Put { .. }))
            .collect();
        let total = header.len() + pairs.len() + aliases.len();
        let empty = ContextChanges {
            full: false,
            fresh: false,
            holders: Vec::new(),
            holders_gone: Vec::new(),
            attachments: None,
            watermarks: Vec::new(),
            ..changes
        };
        ContextRecords {
            current: header.into_iter(),
            empty,
            pairs,
            repeats,
            aliases,
            next_pair: 0,
            next_alias: 0,
            total,
        }
    }

    /// The next slice's records, `false` when none is left.
    fn refill(&mut self) -> bool {
        let mut slice = self.empty.clone();
        if self.next_pair < self.pairs.len() {
            let end = (self.next_pair + SLICE).min(self.pairs.len());
            let part = &self.pairs[self.next_pair..end];
            // Repeats are sorted like the pairs: the slice's are those between its first and
            // last (holder, block).
            let (first, last) = (
                (part[0].holder, part[0].block),
                (part[part.len() - 1].holder, part[part.len() - 1].block),
            );
            let from = self.repeats.partition_point(|r| (r.0, r.1) < first);
            let to = self.repeats.partition_point(|r| (r.0, r.1) <= last);
            slice.pairs = part.to_vec();
            slice.repeats = self.repeats[from..to].to_vec();
            self.next_pair = end;
        } else if self.next_alias < self.aliases.len() {
            let end = (self.next_alias + SLICE).min(self.aliases.len());
            slice.aliases = self.aliases[self.next_alias..end].to_vec();
            self.next_alias = end;
        } else {
            return false;
        }
        self.current = context_ops(&slice).into_iter();
        true
    }

    fn next(&mut self) -> Option<pb::SnapshotRecord> {
        loop {
            if let Some(op) = self.current.next() {
                if let Some(r) = format::record(op) {
                    return Some(r);
                }
                continue;
            }
            if !self.refill() {
                return None;
            }
        }
    }
}
