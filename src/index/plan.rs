//! A query's plan: which cursor each holder's entries feed, and the answer's shape. Built from the
//! context's metadata once per change of it (not once per query) and shared by every query until
//! the next change; see [`super::handle::MetaLock`].
//!
//! Why cached: planning walks the instance → rank → holders maps and copies every instance id,
//! and building the answer inserts every instance and rank into fresh maps; for 64 instances x 2
//! ranks that cost more than the walk itself. With a plan, a query clones the prebuilt zero
//! answer (one pass, no searching or rebalancing) and writes the counts into it in order, or,
//! through [`super::IndexReader::query_into`], writes them into the caller's previous answer
//! without allocating at all.

use std::sync::atomic::{AtomicU64, Ordering};

use super::handle::Meta;
use super::query::{InstanceHits, QueryHits, Shape, TierCounts};

/// Plan ids, unique in the process, so an answer names the plan that shaped it.
static NEXT_PLAN: AtomicU64 = AtomicU64::new(1);

/// `route` value of a holder that feeds no cursor (not listed, or not selected).
pub(crate) const NOT_SELECTED: u32 = u32::MAX;
/// `route` value of a store backend: every cursor sees its tiers.
pub(crate) const SHARED_HOLDER: u32 = u32::MAX - 1;

pub(crate) struct Plan {
    id: u64,
    /// Listed instances in answer order (sorted by id) and, per instance, its first cursor;
    /// cursors of one instance are consecutive, one per listed rank in rank order.
    rows: Vec<(String, u32)>,
    /// Holder id → the cursor its entries feed, [`SHARED_HOLDER`] or [`NOT_SELECTED`].
    pub(crate) route: Vec<u32>,
    pub(crate) cursors: usize,
    /// The whole answer with zero counts, in the same order.
    template: QueryHits,
}

impl Plan {
    pub(crate) fn build(meta: &Meta) -> Self {
        let mut route: Vec<u32> = meta
            .shared
            .iter()
            .map(|&s| if s { SHARED_HOLDER } else { NOT_SELECTED })
            .collect();
        let (mut rows, mut template) = (Vec::new(), Vec::new());
        let mut cursor = 0u32;
        for (instance, ranks) in &meta.ranks {
            let first = cursor;
            let mut row = InstanceHits::default();
            for (&rank, entry) in ranks.iter().filter(|(_, e)| e.listed()) {
                for &id in &entry.holders {
                    if let Some(r) = route.get_mut(id as usize) {
                        *r = cursor;
                    }
                }
                row.dp.insert(rank, 0);
                row.rank_matches.insert(rank, TierCounts::default());
                cursor += 1;
            }
            if cursor > first {
                rows.push((instance.clone(), first));
                template.push((instance.clone(), row));
            }
        }
        Plan {
            id: NEXT_PLAN.fetch_add(1, Ordering::Relaxed),
            rows,
            route,
            cursors: cursor as usize,
            // `meta.ranks` iterates in instance order, so this is already sorted.
            template: QueryHits::new(template.into_iter().collect()),
        }
    }

    /// The cursors a query with `filter` walks (all without one; none for an unknown instance).
    pub(crate) fn selected(&self, filter: Option<&str>) -> std::ops::Range<u32> {
        let Some(f) = filter else {
            return 0..self.cursors as u32;
        };
        match self.rows.binary_search_by(|(i, _)| i.as_str().cmp(f)) {
            Ok(row) => self.rows[row].1..self.row_end(row),
            Err(_) => 0..0,
        }
    }

    fn row_end(&self, row: usize) -> u32 {
        self.rows
            .get(row + 1)
            .map_or(self.cursors as u32, |(_, first)| *first)
    }

    /// The answer for `counts` (indexed by cursor), for the instances `filter` selects.
    pub(crate) fn answer(&self, filter: Option<&str>, counts: &[[u64; 4]]) -> QueryHits {
        let mut out = match filter {
            None => self.template.clone(),
            Some(f) => QueryHits::new(
                self.template
                    .hits
                    .get_key_value(f)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .into_iter()
                    .collect(),
            ),
        };
        out.shape = self.shape(filter);
        self.fill(filter, counts, &mut out);
        out
    }

    fn shape(&self, filter: Option<&str>) -> Shape {
        let sel = self.selected(filter);
        Shape {
            plan: self.id,
            cursors: (sel.start, sel.end),
        }
    }

    /// [`Self::answer`] written into `out`, reusing its maps when this plan shaped it for the
    /// same selection (a previous answer of the same query shape): no allocation then. An
    /// answer whose rows or ranks a caller added or removed since is rebuilt.
    pub(crate) fn answer_into(
        &self,
        filter: Option<&str>,
        counts: &[[u64; 4]],
        out: &mut QueryHits,
    ) {
        if out.shape != self.shape(filter) || !self.same_lengths(filter, out) {
            *out = self.answer(filter, counts);
            return;
        }
        self.fill(filter, counts, out);
    }

    /// Rows and ranks per row as this plan would build them: the check that the caller did not
    /// change the answer's layout (the stamp says the rest).
    fn same_lengths(&self, filter: Option<&str>, out: &QueryHits) -> bool {
        let sel = self.selected(filter);
        let ranks: usize = out.hits.values().map(|r| r.rank_matches.len()).sum();
        ranks == sel.len()
            && out
                .hits
                .values()
                .all(|r| r.dp.len() == r.rank_matches.len())
            && out.hits.len()
                == if filter.is_some() {
                    usize::from(!sel.is_empty())
                } else {
                    self.rows.len()
                }
    }

    /// Write the counts into `out`, which has this answer's shape.
    fn fill(&self, filter: Option<&str>, counts: &[[u64; 4]], out: &mut QueryHits) {
        let first = self.selected(filter).start as usize;
        let mut next = counts.get(first..).unwrap_or(&[]).iter();
        for row in out.hits.values_mut() {
            let mut best = TierCounts::default();
            for (dp, tiers) in row.dp.values_mut().zip(row.rank_matches.values_mut()) {
                let c = next.next().copied().unwrap_or_default();
                *tiers = TierCounts::from_array(c);
                *dp = tiers.device;
                best = best.max(*tiers);
            }
            row.device = best.device;
            row.cpu_local = best.cpu_local;
            row.cpu_share = best.cpu_share;
            row.disk = best.disk;
            row.longest_matched = best.disk;
        }
    }
}
