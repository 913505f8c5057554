//! The snapshot stream's format: the store's own records, numbered column families, chunk
//! bounds, and each source's resume position. A snapshot's format number names both the store
//! schema its records are encoded in (the newest schema that changed a record's encoding, not
//! how a store lays records out), so a reader knows every record it accepts exactly as its own
//! recovery would, and what the stream carries beside them. A reader accepts its own format
//! only (`docs/replicas.md` lists them).

use crate::gateway::pb;
use crate::storage::{Cf, KvOp, migrations};

/// The format a snapshot carries. 6: records of store schema 6, each source resuming from the
/// lowest watermark of its contexts. 7: the same records, and `SnapshotBegin.sources`, the
/// position each source resumes from (taken before the contexts were listed). 8: the same, with
/// records of store schema 9 (holders of KV-cache groups).
pub const FORMAT: u32 = 8;

/// The records schema [`FORMAT`] carries. A new records schema is a new snapshot format: bump
/// both (the assertion below fails the build until then).
const RECORDS: u32 = 9;
const _: () = assert!(
    RECORDS == migrations::RECORDS_VERSION,
    "the store's records schema changed: bump the snapshot FORMAT and its RECORDS"
);

/// A chunk's records stop growing past this many bytes (a chunk always carries at least one).
pub const CHUNK_BYTES: usize = 1 << 20;

/// The largest chunk a reader decodes: a peer whose chunks are larger is refused.
pub const MAX_CHUNK_BYTES: usize = 4 * CHUNK_BYTES;

/// The wire number of a column family; `Meta` is never sent (each store has its own).
pub fn cf_code(cf: Cf) -> Option<u32> {
    Some(match cf {
        Cf::Meta | Cf::Sources => return None,
        Cf::Registrations => 1,
        Cf::Contexts => 2,
        Cf::Holders => 3,
        Cf::Attachments => 4,
        Cf::Watermarks => 5,
        Cf::Pairs => 6,
        Cf::Aliases => 7,
    })
}

pub fn cf_of(code: u32) -> Option<Cf> {
    Some(match code {
        1 => Cf::Registrations,
        2 => Cf::Contexts,
        3 => Cf::Holders,
        4 => Cf::Attachments,
        5 => Cf::Watermarks,
        6 => Cf::Pairs,
        7 => Cf::Aliases,
        _ => return None,
    })
}

/// A put as a snapshot record; deletes have no record (the reader's store starts empty).
pub fn record(op: KvOp) -> Option<pb::SnapshotRecord> {
    match op {
        KvOp::Put { cf, key, value } => Some(pb::SnapshotRecord {
            cf: cf_code(cf)?,
            key,
            value,
        }),
        KvOp::Delete { .. } | KvOp::DeleteRange { .. } => None,
    }
}

/// The bytes a record adds to its chunk, framing included (an upper bound).
pub fn record_bytes(r: &pb::SnapshotRecord) -> usize {
    r.key.len() + r.value.len() + 16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_column_family_but_meta_has_a_number_that_maps_back() {
        for cf in Cf::ALL {
            match cf_code(cf) {
                // A snapshot's positions travel in its begin message, not as records.
                None => assert!(matches!(cf, Cf::Meta | Cf::Sources), "{cf:?}"),
                Some(code) => assert_eq!(cf_of(code), Some(cf)),
            }
        }
        assert_eq!(cf_of(0), None);
        assert_eq!(cf_of(8), None);
    }
}
