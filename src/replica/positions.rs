//! Where each source resumes on a bootstrapped replica: the position its subscription had handed
//! to its contexts when the peer's cut began (see [`super::cut`]), carried in the snapshot's
//! begin mark. The loaded registrations resume from these positions, not from the lowest
//! watermark of the contexts the snapshot holds: a context the source created while the peer
//! was exporting is missing from the snapshot, and only a replay from before its creating batch
//! brings it back (contexts skip the batches at or below their own watermarks).
//!
//! The positions are stored as the replica's own source records (`durability::sources`) before
//! the loaded state is built, so that a restart resumes from them too.

use std::collections::{BTreeMap, HashMap};

use crate::durability::codec;
use crate::gateway::pb;
use crate::index::Watermark;
use crate::model::SubscriptionKey;
use crate::storage::{Cf, KvOp, StorageError};

/// Each source's resume position; a source that had consumed nothing has none.
pub type Positions = BTreeMap<SubscriptionKey, Watermark>;

/// The positions as the begin mark carries them.
pub fn to_wire(positions: &Positions) -> Vec<pb::SourcePosition> {
    positions
        .iter()
        .map(|(key, mark)| pb::SourcePosition {
            instance_id: key.instance_id.clone(),
            tenant_id: key.tenant_id.clone(),
            dp_rank: key.dp_rank,
            seq: mark.seq,
            digest: mark.digest,
        })
        .collect()
}

/// The positions a begin mark carries; an error names the entry that is not one.
pub fn from_wire(sources: &[pb::SourcePosition]) -> Result<Positions, String> {
    let mut positions = Positions::new();
    for (i, s) in sources.iter().enumerate() {
        if s.instance_id.is_empty() {
            return Err(format!("SnapshotBegin.sources[{i}].instance_id is empty"));
        }
        let key = SubscriptionKey::new(&s.instance_id, &s.tenant_id, s.dp_rank);
        let mark = Watermark {
            seq: s.seq,
            digest: s.digest,
        };
        if positions.insert(key.clone(), mark).is_some() {
            return Err(format!("SnapshotBegin.sources[{i}]: source {key} repeated"));
        }
    }
    Ok(positions)
}

/// The source records of the loaded registrations (`registered`: each one's source and the
/// incarnation its record carries): each registered source's position under that incarnation,
/// as the replica's own checkpoint would write them. A registered source without a position
/// has no record, and replays what its publisher still buffers from the start.
pub fn source_records(
    registered: &[(SubscriptionKey, u64)],
    positions: &Positions,
) -> HashMap<SubscriptionKey, (u64, Watermark)> {
    registered
        .iter()
        .filter_map(|(key, incarnation)| {
            let mark = positions.get(key)?;
            Some((key.clone(), (*incarnation, *mark)))
        })
        .collect()
}

/// The source and incarnation a registration record names.
pub fn registered(value: &[u8]) -> Result<(SubscriptionKey, u64), StorageError> {
    Ok((
        codec::decode_registration(value)?.subscription_key(),
        codec::decode_incarnation(value)?,
    ))
}

/// The writes of `records`.
pub fn record_ops(records: &HashMap<SubscriptionKey, (u64, Watermark)>) -> Vec<KvOp> {
    records
        .iter()
        .map(|(key, &(incarnation, mark))| KvOp::Put {
            cf: Cf::Sources,
            key: key.to_string().into_bytes(),
            value: codec::source_value(incarnation, mark),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::cut_tests::registration;

    fn mark(seq: u64) -> Watermark {
        Watermark { seq, digest: seq }
    }

    #[test]
    fn positions_cross_the_wire_unchanged_and_bad_entries_are_named() {
        let positions: Positions = [
            (SubscriptionKey::new("e0", "", 0), mark(3)),
            (SubscriptionKey::new("e|1", "t", 2), mark(9)),
        ]
        .into();
        assert_eq!(from_wire(&to_wire(&positions)), Ok(positions.clone()));
        let mut repeated = to_wire(&positions);
        repeated.push(repeated[0].clone());
        let e = from_wire(&repeated).unwrap_err();
        assert!(e.contains("sources[2]") && e.contains("repeated"), "{e}");
        let mut nameless = to_wire(&positions);
        nameless[1].instance_id.clear();
        let e = from_wire(&nameless).unwrap_err();
        assert!(e.contains("sources[1].instance_id"), "{e}");
    }

    use crate::storage::KvStore;

    #[test]
    fn registrations_resume_from_their_position_not_their_contexts_lowest_mark() {
        let put = |i: u32, incarnation: u64| {
            registered(&codec::local_registration_value(
                &registration(i),
                incarnation,
            ))
            .unwrap()
        };
        let positions: Positions = [(registration(0).subscription_key(), mark(2))].into();
        let records = source_records(&[put(0, 11), put(1, 12)], &positions);
        assert_eq!(
            records,
            HashMap::from([(registration(0).subscription_key(), (11, mark(2)))]),
            "no position, no record: a replay from the start"
        );
        let store = crate::storage::memory::MemoryStore::new();
        store.write(record_ops(&records)).unwrap();
        let read = crate::durability::sources::read_sources(&store).unwrap();
        assert_eq!(read, records);
    }
}
