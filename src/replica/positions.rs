//! Where each source resumes on a bootstrapped replica: the position its subscription had handed
//! to its contexts when the peer's cut began (see [`super::cut`]), carried in the snapshot's
//! begin mark. The loaded registrations resume from these positions, not from the lowest
//! watermark of the contexts the snapshot holds: a context the source created while the peer
//! was exporting is missing from the snapshot, and only a replay from before its creating batch
//! brings it back (contexts skip the batches at or below their own watermarks).
//!
//! Kept apart from the stream's handling so that the same positions can also be stored as the
//! replica's own per-source records.

use std::collections::BTreeMap;

use crate::gateway::pb;
use crate::index::Watermark;
use crate::model::{PublisherConfig, SubscriptionKey};

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

/// Each registration resumes from its source's position; one without a position replays what
/// its publisher still buffers from the start.
pub fn resume_from(
    registrations: &mut [(PublisherConfig, Option<Watermark>)],
    positions: &Positions,
) {
    for (config, resume) in registrations {
        *resume = positions.get(&config.subscription_key()).copied();
    }
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

    #[test]
    fn registrations_resume_from_their_position_not_their_contexts_lowest_mark() {
        let mut registrations = vec![
            (registration(0), Some(mark(7))),
            (registration(1), Some(mark(4))),
        ];
        let positions: Positions = [(registration(0).subscription_key(), mark(2))].into();
        resume_from(&mut registrations, &positions);
        assert_eq!(registrations[0].1, Some(mark(2)));
        assert_eq!(
            registrations[1].1, None,
            "no position: a replay from the start"
        );
    }
}
