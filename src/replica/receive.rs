//! Receiving one snapshot stream: each chunk checked against what the peer announced and
//! against this replica's own bounds ([`Limits`]), its records handed on as they arrive.
//!
//! The peer's begin mark is a claim, never a budget: nothing is allocated from its counts, and
//! counts beyond what this replica could hold from its own ingest are refused at the begin mark
//! (registrations past `max_subscriptions`, contexts past `max_subscriptions` ×
//! `max_contexts_per_source`, pairs past `bootstrap_max_bytes`), and so is a stream that sends
//! more than announced, more bytes than `bootstrap_max_bytes`, a key longer than any record of
//! this store has, or a registration with a name longer than `max_name_bytes`. Registrations
//! are checked and handed on like every other record; only each one's source and incarnation
//! is kept (for the source records written at the end). See docs/replicas.md, "Bounds of a
//! bootstrap".

use std::time::Duration;

use crate::config::Config;
use crate::gateway::pb;
use crate::model::{FieldNames, PYTHON_NAMES, SubscriptionKey};
use crate::registry::policy::RegistrationPolicy;
use crate::storage::{Cf, KvOp};

use super::failure::PullError;
use super::format::{self, FORMAT};
use super::positions::{self, Positions};
use super::progress::Progress;

/// A peer that sends nothing for this long is given up on.
pub const STALL_TIMEOUT: Duration = Duration::from_secs(10);

/// The smallest a pair record takes: its 20-byte key (context, holder, block).
const PAIR_KEY_BYTES: u64 = 20;

/// A registration's fields are named as the store's records name them.
const SNAPSHOT_NAMES: FieldNames = PYTHON_NAMES;

/// Why a record is refused: the stream is malformed, or beyond this replica's bounds.
enum Refused {
    Bad(String),
    OverLimit(String),
}

/// This replica's bounds on one pull.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// From the connection to the end mark.
    pub deadline: Duration,
    pub max_registrations: u64,
    pub max_contexts: u64,
    pub max_name_bytes: usize,
    /// Bytes of records (keys and values).
    pub max_bytes: u64,
}

impl Limits {
    pub fn of(config: &Config) -> Limits {
        Limits {
            deadline: Duration::from_millis(config.replica.bootstrap_deadline_ms),
            max_registrations: config.max_subscriptions,
            max_contexts: config
                .max_subscriptions
                .saturating_mul(config.max_contexts_per_source),
            max_name_bytes: config.max_name_bytes as usize,
            max_bytes: config.replica.bootstrap_max_bytes,
        }
    }

    /// The longest key a record of this store has: a context id with a holder and a block, or
    /// with a service key (instance, tenant and rank, each name within `max_name_bytes`).
    fn max_key_bytes(&self) -> usize {
        64 + 3 * self.max_name_bytes
    }

    /// The announced counts this replica could hold, else why not.
    fn check_announced(&self, begin: &pb::SnapshotBegin) -> Result<(), String> {
        let over = [
            (
                "registrations",
                begin.registrations,
                self.max_registrations,
                "max_subscriptions",
            ),
            (
                "sources",
                begin.sources.len() as u64,
                self.max_registrations,
                "max_subscriptions",
            ),
            (
                "contexts",
                begin.contexts,
                self.max_contexts,
                "max_subscriptions × max_contexts_per_source",
            ),
            (
                "pairs",
                begin.pairs,
                self.max_bytes / PAIR_KEY_BYTES,
                "bootstrap_max_bytes",
            ),
        ];
        for (what, announced, max, key) in over {
            if announced > max {
                return Err(format!(
                    "it announces {announced} {what}, more than this replica holds ({max}, {key})"
                ));
            }
        }
        for (i, s) in begin.sources.iter().enumerate() {
            if s.instance_id.len().max(s.tenant_id.len()) > self.max_name_bytes {
                return Err(format!(
                    "SnapshotBegin.sources[{i}] names a source longer than max_name_bytes ({})",
                    self.max_name_bytes
                ));
            }
        }
        Ok(())
    }
}

/// What the stream carried beside the records handed on.
pub struct Received {
    pub peer_id: String,
    /// Each registration's source and incarnation.
    pub registered: Vec<(SubscriptionKey, u64)>,
    pub positions: Positions,
}

/// The counts of a stream so far, checked as each record arrives.
struct Tally<'a> {
    limits: &'a Limits,
    policy: RegistrationPolicy,
    records: u64,
    pairs: u64,
    contexts: u64,
    bytes: u64,
    registered: Vec<(SubscriptionKey, u64)>,
}

impl<'a> Tally<'a> {
    fn new(limits: &'a Limits) -> Tally<'a> {
        Tally {
            limits,
            policy: RegistrationPolicy {
                allowed_hosts: None,
                max_subscriptions: limits.max_registrations as usize,
                max_name_bytes: limits.max_name_bytes,
            },
            records: 0,
            pairs: 0,
            contexts: 0,
            bytes: 0,
            registered: Vec::new(),
        }
    }

    /// One record: counted and checked against `begin` and the limits.
    fn record(&mut self, begin: &pb::SnapshotBegin, r: &pb::SnapshotRecord) -> Result<Cf, Refused> {
        let n = self.records;
        let bad = |reason: String| Refused::Bad(format!("record {n}: {reason}"));
        let cf =
            format::cf_of(r.cf).ok_or_else(|| bad(format!("unknown column family {}", r.cf)))?;
        self.records += 1;
        let max_key = self.limits.max_key_bytes();
        if r.key.len() > max_key {
            return Err(Refused::OverLimit(format!(
                "record {n}: a {cf:?} key of {} bytes, longer than any this store has \
                 ({max_key}: 64 + 3 × max_name_bytes)",
                r.key.len()
            )));
        }
        // A failed attempt's clearing deletes keys below 64 bytes of 0xff (`pull::clear`).
        if r.key.as_slice() >= [0xffu8; 64].as_slice() {
            return Err(bad(format!("a {cf:?} key no record of this store has")));
        }
        self.bytes += (r.key.len() + r.value.len()) as u64;
        if self.bytes > self.limits.max_bytes {
            return Err(Refused::OverLimit(format!(
                "more than {} bytes of records (bootstrap_max_bytes)",
                self.limits.max_bytes
            )));
        }
        match cf {
            Cf::Pairs => self.pairs += 1,
            Cf::Contexts => {
                self.contexts += 1;
                if self.contexts > begin.contexts {
                    return Err(Refused::Bad(format!(
                        "more contexts than the {} announced",
                        begin.contexts
                    )));
                }
            }
            Cf::Registrations => {
                if self.registered.len() as u64 >= begin.registrations {
                    return Err(Refused::Bad(format!(
                        "more registrations than the {} announced",
                        begin.registrations
                    )));
                }
                let config = crate::durability::codec::decode_registration(&r.value)
                    .map_err(|e| bad(e.to_string()))?;
                self.policy
                    .check(&config, SNAPSHOT_NAMES)
                    .map_err(|refusal| {
                        Refused::OverLimit(format!("record {n}: {}", refusal.error.message))
                    })?;
                let registered = positions::registered(&r.value).map_err(|e| bad(e.to_string()))?;
                self.registered.push(registered);
            }
            _ => {}
        }
        Ok(cf)
    }
}

/// The chunks, checked and handed to `tx` as they arrive.
pub async fn receive(
    stream: &mut tonic::Streaming<pb::SnapshotChunk>,
    tx: &tokio::sync::mpsc::Sender<Vec<KvOp>>,
    progress: &Progress,
    peer: &str,
    limits: &Limits,
) -> Result<Received, PullError> {
    let truncated = |reason: String| PullError::Truncated {
        peer: peer.to_owned(),
        reason,
    };
    let bad = |reason: String| PullError::Bad {
        peer: peer.to_owned(),
        reason,
    };
    let mut announced: Option<pb::SnapshotBegin> = None;
    let mut positions = Positions::new();
    let mut tally = Tally::new(limits);
    let mut seq = 0u64;
    loop {
        let message = tokio::time::timeout(STALL_TIMEOUT, stream.message())
            .await
            .map_err(|_| truncated(format!("nothing received for {STALL_TIMEOUT:?}")))?
            .map_err(|s| truncated(format!("{:?}: {}", s.code(), s.message())))?;
        let Some(chunk) = message else {
            return Err(truncated(format!(
                "the stream ended after {} records without its end mark",
                tally.records
            )));
        };
        let bytes = prost::Message::encoded_len(&chunk) as u64;
        if chunk.seq != seq {
            return Err(bad(format!("chunk {} where {seq} was due", chunk.seq)));
        }
        seq += 1;
        match (&announced, chunk.begin) {
            (None, Some(begin)) => {
                if begin.format > FORMAT {
                    return Err(PullError::TooNew {
                        peer: peer.to_owned(),
                        found: begin.format,
                        supported: FORMAT,
                    });
                }
                if begin.format < FORMAT {
                    return Err(PullError::TooOld {
                        peer: peer.to_owned(),
                        found: begin.format,
                        supported: FORMAT,
                    });
                }
                limits
                    .check_announced(&begin)
                    .map_err(|reason| PullError::OverLimit {
                        peer: peer.to_owned(),
                        reason,
                    })?;
                positions = positions::from_wire(&begin.sources).map_err(bad)?;
                progress.pulling(begin.pairs);
                announced = Some(begin);
            }
            (None, None) => return Err(bad("the first chunk has no begin mark".into())),
            (Some(_), Some(_)) => {
                return Err(bad(format!("chunk {} repeats the begin mark", chunk.seq)));
            }
            (Some(_), None) => {}
        }
        let Some(begin) = &announced else {
            return Err(bad("no begin mark".into()));
        };
        let pairs_before = tally.pairs;
        let mut ops = Vec::with_capacity(chunk.records.len() + 1);
        if chunk.seq == 0 {
            // The peer's keys were made with its tuning: this store records it, so that its
            // contexts make theirs the same way (see migration 8).
            let tuning = super::cut::tuning_from_wire(begin.chain_tuning).ok_or_else(|| {
                bad(format!(
                    "SnapshotBegin.chain_tuning {:#x} is not a chain tuning",
                    begin.chain_tuning
                ))
            })?;
            ops.push(crate::storage::migrations::tuning_op(tuning));
        }
        for r in chunk.records {
            let cf = tally.record(begin, &r).map_err(|refused| match refused {
                Refused::Bad(reason) => bad(reason),
                Refused::OverLimit(reason) => PullError::OverLimit {
                    peer: peer.to_owned(),
                    reason,
                },
            })?;
            ops.push(KvOp::Put {
                cf,
                key: r.key,
                value: r.value,
            });
        }
        let (records, pairs) = (tally.records, tally.pairs);
        // Never more than announced: the disk a peer can fill is what it said it would send,
        // itself within this replica's bounds.
        if records > begin.records || pairs > begin.pairs {
            return Err(bad(format!(
                "{records} records ({pairs} pairs) received, {} ({} pairs) announced",
                begin.records, begin.pairs
            )));
        }
        progress.received(pairs - pairs_before, bytes);
        if !ops.is_empty() && tx.send(ops).await.is_err() {
            // The writer stopped on a store error, which the caller reports.
            return Ok(Received {
                peer_id: begin.replica_id.clone(),
                registered: Vec::new(),
                positions,
            });
        }
        if let Some(end) = chunk.end {
            if (end.records, end.pairs) != (records, pairs)
                || (records, pairs) != (begin.records, begin.pairs)
            {
                return Err(truncated(format!(
                    "{records} records ({pairs} pairs) received, {} ({} pairs) announced",
                    begin.records, begin.pairs
                )));
            }
            return Ok(Received {
                peer_id: begin.replica_id.clone(),
                registered: tally.registered,
                positions,
            });
        }
    }
}

#[cfg(test)]
#[path = "receive_tests.rs"]
mod tests;
