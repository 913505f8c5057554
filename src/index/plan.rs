//! A context's metadata (its listed ranks and their holders, behind [`MetaLock`]) and the query
//! plan built from it: which cursor each holder's entries feed, and the answer's shape. A plan is
//! built once per change of the metadata (not once per query) and shared by every query until the
//! next change. The two live in one file because each names the other: the lock caches the plan,
//! and the plan is built from what the lock guards.
//!
//! Why cached: planning walks the instance → rank → holders maps and copies every instance id;
//! for 64 instances x 2 ranks that costs more than the walk itself. With a plan, a query's
//! answer is the plan's rows and ranks beside the walk's counts ([`AnswerView`]), which the
//! transports encode without building anything per row, or, through
//! [`crate::index::IndexReader::query_into`], counts written into the caller's previous answer.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};

use crate::model::SubscriptionKey;

use crate::index::answer::{
    AnswerView, Certainty, InstanceHits, QueryHits, Shape, TierCounts, max_tiers,
};
use crate::index::table::{read_lock, write_lock};

/// The metadata lock. Its only way to change [`Meta`] is [`MetaLock::write`], which drops the
/// cached query plan, so a plan never outlives the metadata it was built from.
#[derive(Default)]
pub(crate) struct MetaLock {
    /// Every query takes this lock word: on its own lines, away from what the writer updates
    /// (see [`crate::cache_line::CacheLine`]).
    lock: crate::cache_line::CacheLine<RwLock<Meta>>,
    /// Every plan built that may still be alive (the cached one, and those of running walks),
    /// for the reclaim of holder ids (see `holder::FreeIds`).
    built: Mutex<Vec<Weak<Plan>>>,
}

impl MetaLock {
    pub fn read(&self) -> RwLockReadGuard<'_, Meta> {
        read_lock(&self.lock)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, Meta> {
        let mut meta = write_lock(&self.lock);
        meta.plan = OnceLock::new();
        meta
    }

    /// The plan for the current metadata, built by the first query after a change.
    pub fn plan(&self) -> Arc<Plan> {
        let meta = self.read();
        Arc::clone(meta.plan.get_or_init(|| {
            let plan = Arc::new(Plan::build(&meta));
            // Under the read lock: a writer's change either precedes this plan or waits for it
            // to be listed.
            let mut built = self.built();
            built.retain(|p| p.strong_count() > 0);
            built.push(Arc::downgrade(&plan));
            plan
        }))
    }

    /// The plans built so far that are still alive.
    pub fn plans_alive(&self) -> Vec<Weak<Plan>> {
        let mut built = self.built();
        built.retain(|p| p.strong_count() > 0);
        built.clone()
    }

    fn built(&self) -> std::sync::MutexGuard<'_, Vec<Weak<Plan>>> {
        // A list of weak references cannot be left half-updated: a poisoned lock is safe.
        self.built.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[cfg(test)]
    pub fn is_unlocked(&self) -> bool {
        self.lock.try_write().is_ok()
    }
}

#[derive(Default)]
pub(crate) struct Meta {
    /// instance → rank → who listed it and which holders hold blocks for it.
    pub ranks: BTreeMap<String, BTreeMap<u32, RankEntry>>,
    /// Holder id → whether it is a shared (store backend) holder (false for a reclaimed id). An
    /// id is reused only once no plan that routed it can still be in a walk (`holder::FreeIds`),
    /// so a plan stays valid for the whole walk.
    pub shared: Vec<bool>,
    /// Holder id → the kind of its KV-cache group, for engine holders whose group is not full
    /// attention or not group 0 (see [`GroupLayout`]); absent: group 0, full attention.
    pub groups: BTreeMap<u32, GroupLayout>,
    /// Holders interned and not reclaimed.
    pub holders: usize,
    /// Every source that has a holder or a position (watermark) here, so a subscription that
    /// starts over recovered state knows which contexts it fed and keeps their positions current.
    pub sources: BTreeSet<SubscriptionKey>,
    /// The query plan for the fields above; reset by every [`MetaLock::write`].
    plan: OnceLock<Arc<Plan>>,
}

/// An engine holder's KV-cache group as the query needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupLayout {
    pub idx: u32,
    pub kind: crate::model::GroupKind,
}

#[derive(Default)]
pub(crate) struct RankEntry {
    /// Sources whose registration (or engine stores) list this rank; listed while non-empty.
    pub attached_by: BTreeSet<SubscriptionKey>,
    /// Engine holder ids naming this (instance, rank), one per source that stored for it.
    pub holders: Vec<u32>,
}

impl RankEntry {
    pub fn listed(&self) -> bool {
        !self.attached_by.is_empty()
    }
}

impl Meta {
    pub fn instances(&self) -> BTreeMap<String, BTreeSet<u32>> {
        self.ranks
            .iter()
            .filter_map(|(inst, ranks)| {
                let listed: BTreeSet<u32> = ranks
                    .iter()
                    .filter(|(_, e)| e.listed())
                    .map(|(r, _)| *r)
                    .collect();
                (!listed.is_empty()).then(|| (inst.clone(), listed))
            })
            .collect()
    }

    pub fn has_listed_rank(&self) -> bool {
        self.ranks
            .values()
            .any(|ranks| ranks.values().any(RankEntry::listed))
    }
}

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
    /// Cursor → the rank it counts for.
    ranks: Vec<u32>,
    /// Holder id → the cursor its entries feed, [`SHARED_HOLDER`] or [`NOT_SELECTED`].
    pub(crate) route: Vec<u32>,
    pub(crate) cursors: usize,
    /// No store backend and at most one holder per cursor: the walk keeps its cursors the
    /// direct way (see `cursors`).
    pub(crate) direct: bool,
    /// The cursors of ranks with more than one KV-cache group, or whose group is not full
    /// attention: the walk routes none of their holders, and `read::hybrid` answers them with
    /// the engine's rule over all their groups.
    pub(crate) hybrid: Vec<HybridCursor>,
    /// Holder id → (index in `hybrid`, index of its group there), sorted by id: where a hybrid
    /// answer puts a block's entries (each holder is one group of one rank).
    pub(crate) hybrid_slots: Vec<(u32, u32, u32)>,
    /// The context has store backends (their tiers are not part of a hybrid rank's answer).
    pub(crate) has_shared: bool,
}

/// How sure the answer for one (instance, rank) is (`include_status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankStatus {
    pub instance_id: String,
    pub dp_rank: u32,
    pub certainty: Certainty,
    /// The rank's KV-cache groups in the order the engine checks them, when it has more than
    /// group 0 of full attention.
    pub groups: Vec<GroupLayout>,
}

/// One hybrid rank's cursor and its groups, full attention first, then by group index (the
/// order the engine checks them in); each group with the holder ids (one per source) that hold
/// its blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HybridCursor {
    pub cursor: u32,
    pub groups: Vec<(GroupLayout, Vec<u32>)>,
}

impl Plan {
    pub(crate) fn build(meta: &Meta) -> Self {
        let mut route: Vec<u32> = meta
            .shared
            .iter()
            .map(|&s| if s { SHARED_HOLDER } else { NOT_SELECTED })
            .collect();
        let (mut rows, mut ranks_of) = (Vec::new(), Vec::new());
        let mut cursor = 0u32;
        let has_shared = meta.shared.iter().any(|&s| s);
        let mut direct = !has_shared;
        let mut hybrid = Vec::new();
        for (instance, ranks) in &meta.ranks {
            let first = cursor;
            for (&rank, entry) in ranks.iter().filter(|(_, e)| e.listed()) {
                if let Some(h) = hybrid_cursor(meta, cursor, &entry.holders) {
                    hybrid.push(h);
                } else {
                    direct &= entry.holders.len() <= 1;
                    for &id in &entry.holders {
                        if let Some(r) = route.get_mut(id as usize) {
                            *r = cursor;
                        }
                    }
                }
                ranks_of.push(rank);
                cursor += 1;
            }
            if cursor > first {
                rows.push((instance.clone(), first));
            }
        }
        Plan {
            id: NEXT_PLAN.fetch_add(1, Ordering::Relaxed),
            // `meta.ranks` iterates in instance order, so the rows are sorted by id.
            rows,
            ranks: ranks_of,
            route,
            cursors: cursor as usize,
            direct,
            hybrid_slots: hybrid_slots(&hybrid),
            hybrid,
            has_shared,
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

    /// The answer for `counts` (indexed by cursor), for the instances `filter` selects,
    /// borrowed from this plan and `counts`.
    pub(crate) fn view<'a>(
        &'a self,
        filter: Option<&str>,
        counts: &'a [[u64; 4]],
    ) -> AnswerView<'a> {
        let sel = self.selected(filter);
        let rows = match filter {
            None => &self.rows[..],
            Some(f) => match self.rows.binary_search_by(|(i, _)| i.as_str().cmp(f)) {
                Ok(row) => &self.rows[row..=row],
                Err(_) => &[],
            },
        };
        AnswerView::new(rows, &self.ranks, counts, sel.end)
    }

    /// How sure the answer is for each (instance, rank) `filter` selects, in answer order,
    /// with the KV-cache groups of a hybrid rank (none for a single-group full-attention one).
    pub(crate) fn rank_statuses(&self, filter: Option<&str>) -> Vec<RankStatus> {
        let sel = self.selected(filter);
        let mut out = Vec::new();
        for (row, (instance, first)) in self.rows.iter().enumerate() {
            for cursor in *first..self.row_end(row) {
                if !sel.contains(&cursor) {
                    continue;
                }
                let hybrid = self.hybrid.iter().find(|h| h.cursor == cursor);
                out.push(RankStatus {
                    instance_id: instance.clone(),
                    dp_rank: self.ranks[cursor as usize],
                    certainty: hybrid.map_or(Certainty::Exact, |h| certainty(h, self.has_shared)),
                    groups: hybrid
                        .map(|h| h.groups.iter().map(|(g, _)| *g).collect())
                        .unwrap_or_default(),
                });
            }
        }
        out
    }

    /// The groups of this plan's hybrid ranks, counted by kind (`GroupKind::KINDS` order).
    pub(crate) fn groups_by_kind(&self) -> [u64; 5] {
        let mut out = [0; 5];
        for (group, _) in self.hybrid.iter().flat_map(|h| &h.groups) {
            out[group.kind.kind_index()] += 1;
        }
        out
    }

    /// The answer for `counts` as owned maps.
    pub(crate) fn answer(&self, filter: Option<&str>, counts: &[[u64; 4]]) -> QueryHits {
        let mut out = self.view(filter, counts).to_hits();
        out.shape = self.shape(filter);
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
        if out.shape != self.shape(filter) || !self.fill_checked(filter, counts, out) {
            *out = self.answer(filter, counts);
        }
    }

    /// Rows this plan gives an answer for `filter`.
    fn rows_for(&self, filter: Option<&str>, sel: &std::ops::Range<u32>) -> usize {
        if filter.is_some() {
            usize::from(!sel.is_empty())
        } else {
            self.rows.len()
        }
    }

    /// Write the counts into `out`, which this plan shaped: false, with `out` partly written,
    /// when a caller changed its rows or ranks since (the stamp says the rest).
    fn fill_checked(&self, filter: Option<&str>, counts: &[[u64; 4]], out: &mut QueryHits) -> bool {
        let sel = self.selected(filter);
        if out.hits.len() != self.rows_for(filter, &sel) {
            return false;
        }
        let mut rest = counts
            .get(sel.start as usize..sel.end as usize)
            .unwrap_or(&[]);
        for row in out.hits.values_mut() {
            let ranks = row.rank_matches.len();
            if row.dp.len() != ranks || rest.len() < ranks {
                return false;
            }
            let (mine, after) = rest.split_at(ranks);
            rest = after;
            fill_row(row, mine);
        }
        rest.is_empty()
    }
}

/// Every hybrid cursor's holders as (holder id, cursor index, group index), sorted by id.
fn hybrid_slots(hybrid: &[HybridCursor]) -> Vec<(u32, u32, u32)> {
    let mut slots: Vec<(u32, u32, u32)> = hybrid
        .iter()
        .enumerate()
        .flat_map(|(c, h)| {
            h.groups
                .iter()
                .enumerate()
                .flat_map(move |(g, (_, ids))| ids.iter().map(move |&id| (id, c as u32, g as u32)))
        })
        .collect();
    slots.sort_unstable();
    slots
}

/// The hybrid cursor of a rank whose `holders` include a group other than group 0 of full
/// attention; `None` for a single-group full-attention rank (the walk's).
fn hybrid_cursor(meta: &Meta, cursor: u32, holders: &[u32]) -> Option<HybridCursor> {
    if !holders.iter().any(|id| meta.groups.contains_key(id)) {
        return None;
    }
    let mut groups: Vec<(GroupLayout, Vec<u32>)> = Vec::new();
    for &id in holders {
        let layout = meta.groups.get(&id).copied().unwrap_or(GroupLayout {
            idx: 0,
            kind: crate::model::GroupKind::Full,
        });
        match groups.iter_mut().find(|(g, _)| g.idx == layout.idx) {
            // Two sources of one rank (its engine, an offloading publisher) name the same
            // group: their blocks are one group's, of the kind the first one named.
            Some((_, ids)) => ids.push(id),
            None => groups.push((layout, vec![id])),
        }
    }
    groups.sort_by_key(|(g, _)| (g.kind != crate::model::GroupKind::Full, g.idx));
    Some(HybridCursor { cursor, groups })
}

/// One row's ranks from their cursors' counts (in rank order), and the row's maxima.
#[inline]
fn fill_row(row: &mut InstanceHits, counts: &[[u64; 4]]) {
    for ((dp, tiers), c) in row
        .dp
        .values_mut()
        .zip(row.rank_matches.values_mut())
        .zip(counts)
    {
        *tiers = TierCounts::from_array(*c);
        *dp = c[0];
    }
    let best = max_tiers(&counts[..counts.len().min(row.rank_matches.len())]);
    row.device = best[0];
    row.cpu_local = best[1];
    row.cpu_share = best[2];
    row.disk = best[3];
    row.longest_matched = best[3];
}

/// How sure the answer for a hybrid rank is, from its groups' kinds and whether the context
/// has store backends (whose tiers a hybrid rank's answer leaves out).
fn certainty(cursor: &HybridCursor, has_shared: bool) -> Certainty {
    if let Some((g, _)) = cursor.groups.iter().find(|(g, _)| !g.kind.exact()) {
        return Certainty::UpperBound {
            reason: match g.kind {
                crate::model::GroupKind::ChunkedLocal => {
                    "chunked local attention: its chunk size is not in the events"
                }
                _ => "a KV-cache group of a kind this service does not know",
            },
        };
    }
    if has_shared {
        return Certainty::LowerBound {
            reason: "store tiers are not evaluated for a hybrid model",
        };
    }
    Certainty::Exact
}
