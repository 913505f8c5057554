//! The answer of a query: per instance and per rank, cumulative prefix token counts by tier.

use super::sorted_map::SortedMap;

/// Cumulative prefix token counts of one rank (or instance): `device <= cpu_local <= cpu_share
/// <= disk`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TierCounts {
    pub device: u64,
    pub cpu_local: u64,
    pub cpu_share: u64,
    pub disk: u64,
}

impl TierCounts {
    pub(crate) fn from_array(c: [u64; 4]) -> Self {
        TierCounts {
            device: c[0],
            cpu_local: c[1],
            cpu_share: c[2],
            disk: c[3],
        }
    }
}

/// One instance's row of a query answer (`docs/python-api.md`, query()). Rank keys are `u32`
/// here; the transports render them as decimal strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceHits {
    /// Equals `disk`.
    pub longest_matched: u64,
    /// Rank → that rank's `device` count.
    pub dp: SortedMap<u32, u64>,
    /// Rank → its four cumulative counts. Same keys as `dp`, zero-hit ranks included.
    pub rank_matches: SortedMap<u32, TierCounts>,
    /// Max over ranks, per tier.
    pub device: u64,
    pub cpu_local: u64,
    pub cpu_share: u64,
    pub disk: u64,
}

impl InstanceHits {
    pub fn tiers(&self) -> TierCounts {
        TierCounts {
            device: self.device,
            cpu_local: self.cpu_local,
            cpu_share: self.cpu_share,
            disk: self.disk,
        }
    }
}

/// Query answer: instance id → its row. Empty for an unknown instance filter or a context with
/// no registered instance; registered instances without any match appear with zeros.
#[derive(Debug, Clone, Default)]
pub struct QueryHits {
    pub hits: SortedMap<String, InstanceHits>,
    /// Which plan and selection wrote this answer's shape (see [`crate::index::plan::Plan::answer_into`]);
    /// not part of the answer's value.
    pub(crate) shape: Shape,
}

/// The plan (by its process-unique id, 0 for none) and the cursor range an answer was built for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) plan: u64,
    pub(crate) cursors: (u32, u32),
}

impl QueryHits {
    pub fn new(hits: SortedMap<String, InstanceHits>) -> Self {
        QueryHits {
            hits,
            shape: Shape::default(),
        }
    }
}

impl PartialEq for QueryHits {
    fn eq(&self, other: &Self) -> bool {
        self.hits == other.hits
    }
}

impl Eq for QueryHits {}
