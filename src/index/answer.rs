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
    /// The four counts from `device` to `disk`.
    pub fn to_array(&self) -> [u64; 4] {
        [self.device, self.cpu_local, self.cpu_share, self.disk]
    }

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

/// A query's answer as the walk leaves it, borrowed from the plan that shaped it and the walk's
/// counts: the selected rows (instance ids in answer order), each row's listed ranks and one
/// count array per rank. Nothing is copied or allocated to read it, so the transports encode
/// an answer straight from the walk (see "Answers" in `src/index/README.md`).
#[derive(Clone, Copy)]
pub struct AnswerView<'a> {
    /// The selected rows: instance id and its first cursor.
    rows: &'a [(String, u32)],
    /// Cursor → its rank, for every cursor of the plan.
    ranks: &'a [u32],
    /// Cursor → its cumulative counts by tier, for every cursor of the plan.
    counts: &'a [[u64; 4]],
    /// One past the last selected row's last cursor.
    end: u32,
}

impl<'a> AnswerView<'a> {
    pub(crate) fn new(
        rows: &'a [(String, u32)],
        ranks: &'a [u32],
        counts: &'a [[u64; 4]],
        end: u32,
    ) -> Self {
        AnswerView {
            rows,
            ranks,
            counts,
            end,
        }
    }

    /// The answer of an unknown context or instance: no rows.
    pub fn empty() -> AnswerView<'static> {
        AnswerView {
            rows: &[],
            ranks: &[],
            counts: &[],
            end: 0,
        }
    }

    /// Ranks over all rows of the answer.
    pub fn rank_total(&self) -> usize {
        let first = self.rows.first().map_or(self.end, |(_, c)| *c);
        self.end.saturating_sub(first) as usize
    }

    /// Rows (instances) in the answer.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The rows in answer order (instances sorted by id).
    pub fn rows(&self) -> impl ExactSizeIterator<Item = RowView<'a>> + 'a {
        let (rows, ranks, counts, end) = (self.rows, self.ranks, self.counts, self.end);
        rows.iter().enumerate().map(move |(i, (id, first))| {
            let last = rows.get(i + 1).map_or(end, |(_, next)| *next);
            let cursors = *first as usize..last as usize;
            RowView {
                id,
                ranks: ranks.get(cursors.clone()).unwrap_or(&[]),
                counts: counts.get(cursors).unwrap_or(&[]),
            }
        })
    }

    /// The answer as owned maps.
    pub fn to_hits(&self) -> QueryHits {
        QueryHits::new(self.rows().map(|r| (r.id.to_owned(), r.hits())).collect())
    }
}

/// The per-tier maxima of some ranks' counts: a row's own counts.
#[inline]
pub(crate) fn max_tiers(counts: &[[u64; 4]]) -> [u64; 4] {
    let mut best = [0u64; 4];
    for c in counts {
        for (b, &v) in best.iter_mut().zip(c) {
            *b = (*b).max(v);
        }
    }
    best
}

/// One instance's row of an [`AnswerView`].
#[derive(Clone, Copy)]
pub struct RowView<'a> {
    pub id: &'a str,
    /// Listed ranks in ascending order.
    ranks: &'a [u32],
    /// Per rank, its counts by tier.
    counts: &'a [[u64; 4]],
}

impl<'a> RowView<'a> {
    /// Listed ranks with their counts, in rank order (zero-hit ranks included).
    pub fn ranks(&self) -> impl ExactSizeIterator<Item = (u32, TierCounts)> + 'a {
        let counts = self.counts;
        (self.ranks.iter().zip(counts)).map(|(&r, c)| (r, TierCounts::from_array(*c)))
    }

    /// Whether `other` has the same ranks with the same counts: then the two rows differ in
    /// their instance id only, and encode to the same row value.
    #[inline]
    pub fn same_values(&self, other: &RowView<'_>) -> bool {
        // Compared in place: a row has a handful of ranks, below what a `memcmp` call pays off.
        self.ranks.len() == other.ranks.len()
            && self.counts.len() == other.counts.len()
            && self.ranks.iter().zip(other.ranks).all(|(a, b)| a == b)
            && (self.counts.iter().zip(other.counts))
                .all(|(a, b)| a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3])
    }

    pub fn rank_count(&self) -> usize {
        self.ranks.len().min(self.counts.len())
    }

    /// The row's counts: the maximum over its ranks, per tier.
    pub fn tiers(&self) -> TierCounts {
        TierCounts::from_array(max_tiers(&self.counts[..self.rank_count()]))
    }

    /// The row as an owned [`InstanceHits`].
    pub fn hits(&self) -> InstanceHits {
        let t = self.tiers();
        InstanceHits {
            longest_matched: t.disk,
            dp: self.ranks().map(|(r, c)| (r, c.device)).collect(),
            rank_matches: self.ranks().collect(),
            device: t.device,
            cpu_local: t.cpu_local,
            cpu_share: t.cpu_share,
            disk: t.disk,
        }
    }
}

/// An owned answer in [`AnswerView`]'s layout, for answers that are not a walk's: an answer
/// built by hand (tests, tools) encodes through the same writers as the walk's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FlatAnswer {
    rows: Vec<(String, u32)>,
    ranks: Vec<u32>,
    counts: Vec<[u64; 4]>,
}

impl FlatAnswer {
    /// The rows of `hits` with their ranks' counts. A row's own maxima are not kept: a view
    /// derives them from its ranks, as every walk's answer has them.
    pub fn from_hits(hits: &QueryHits) -> Self {
        let mut flat = FlatAnswer::default();
        for (id, row) in &hits.hits {
            flat.rows.push((id.clone(), flat.ranks.len() as u32));
            for (&rank, t) in &row.rank_matches {
                flat.ranks.push(rank);
                flat.counts.push(t.to_array());
            }
        }
        flat
    }

    pub fn view(&self) -> AnswerView<'_> {
        AnswerView::new(
            &self.rows,
            &self.ranks,
            &self.counts,
            self.ranks.len() as u32,
        )
    }
}

/// How sure an answer for one rank is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Certainty {
    /// What the engine itself would reuse.
    Exact,
    /// At least what the engine would reuse; `reason` says why it may be more.
    UpperBound { reason: &'static str },
    /// At most what the engine would reuse; `reason` says why it may be less.
    LowerBound { reason: &'static str },
}

impl Certainty {
    /// The name an answer's status carries.
    pub const fn as_str(self) -> &'static str {
        match self {
            Certainty::Exact => "exact",
            Certainty::UpperBound { .. } => "upper_bound",
            Certainty::LowerBound { .. } => "lower_bound",
        }
    }

    pub const fn reason(self) -> &'static str {
        match self {
            Certainty::Exact => "",
            Certainty::UpperBound { reason } | Certainty::LowerBound { reason } => reason,
        }
    }
}
