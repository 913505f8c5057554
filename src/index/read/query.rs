//! The query walk: per registered (instance, rank), one cursor over the prompt's blocks moving
//! device → cpu_local → cpu_share → disk and never back. See "Query semantics" and "The walk"
//! in `src/index/README.md` for the exact semantics and why hashing never runs under a lock.

use std::sync::atomic::Ordering;

use crate::hashing::PrefixKeys;
use crate::model::BlockHash;

use super::cursors::Cursors;
use super::lookahead::Lookahead;
use crate::index::answer::{AnswerView, QueryHits};
use crate::index::plan::Plan;
use crate::index::shared::Shared;
use crate::index::table::{entry_id, is_inline};

/// Query by hash: the already-projected keys of a prompt's blocks. Every block is complete, so
/// `covered(n) = n * block_size`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashList {
    pub hashes: Vec<BlockHash>,
    pub block_size: u32,
}

impl PrefixKeys for HashList {
    fn num_blocks(&self) -> usize {
        self.hashes.len()
    }
    fn key(&mut self, i: usize) -> BlockHash {
        // The walk only asks for i < num_blocks(); a miss key keeps a bad caller harmless.
        self.hashes.get(i).copied().unwrap_or(BlockHash(0))
    }
    fn covered(&self, n: usize) -> u64 {
        (n.min(self.hashes.len()) as u64).saturating_mul(u64::from(self.block_size))
    }
    fn known(&self) -> &[BlockHash] {
        &self.hashes
    }
}

/// A walk's buffers, kept per thread between queries: a query over 64 x 2 ranks would
/// otherwise allocate and zero its cursors' arrays (about 7 KiB) and entry lists every time.
#[derive(Default)]
struct Scratch {
    cursors: Cursors,
    prev: Vec<u32>,
    next: Vec<u32>,
    alt_entries: Vec<u32>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> = std::cell::RefCell::default();
}

/// At most this many blocks are followed record by record in one read of a shard (see
/// `Table::follow`), so a writer's section waits at most that long to be noticed.
const FOLLOW_MAX: usize = 64;
/// How many blocks (from block 0, in order) a walk over `n` blocks that looked up its first
/// `looked_up` blocks asked the keys of: the lookahead window of its last step.
#[cfg(test)]
pub(crate) fn keys_hashed(looked_up: usize, n: usize) -> usize {
    match looked_up.checked_sub(1) {
        None => 0,
        Some(last) => super::lookahead::prefetch_window(last, n),
    }
}

/// Run the walk for the cursors `filter` selects and hand each cursor's counts to `answer`.
/// Locks: the meta lock once to fetch the plan; block lookups take none (`table::view`), and
/// `keys.key(i)` is always called with no lock held.
///
/// Per block the walk reads the block's value (see `table`): when it equals the previous
/// block's value (and no set value was reused meanwhile), every holder holds this block in the
/// same tiers as the previous one, so every live cursor, which accepted the previous block in its
/// current phase, accepts this one too: nothing to do. When the value changes, the new block's
/// entries go to the cursors (`cursors`: bit sets per phase in direct walks, a merge with the
/// previous block's entries in counted ones), so the cost is the entries' length plus the
/// cursors whose phase ends, not every live cursor.
pub(crate) fn walk_counts<K: PrefixKeys + ?Sized, R>(
    shared: &Shared,
    keys: &mut K,
    filter: Option<&str>,
    answer: impl FnOnce(&Plan, &[[u64; 4]]) -> R,
) -> R {
    let plan = shared.meta.plan();
    SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
        Ok(mut scratch) => walk_with(shared, keys, &plan, filter, &mut scratch, answer),
        // Only reachable if `answer` walked again on this thread: fresh buffers then.
        Err(_) => walk_with(shared, keys, &plan, filter, &mut Scratch::default(), answer),
    })
}

fn walk_with<K: PrefixKeys + ?Sized, R>(
    shared: &Shared,
    keys: &mut K,
    plan: &Plan,
    filter: Option<&str>,
    scratch: &mut Scratch,
    answer: impl FnOnce(&Plan, &[[u64; 4]]) -> R,
) -> R {
    let route = plan.route.as_slice();
    let Scratch {
        cursors: cur,
        prev,
        next,
        alt_entries,
    } = scratch;
    cur.reset(plan.cursors, plan.selected(filter), plan.direct);
    // Entries of the previous and the current block.
    prev.clear();
    next.clear();
    let n = keys.num_blocks();
    let mut c = 0usize;
    // The previous block's value and the sets' reuse count read with it (0: none yet).
    let (mut last_val, mut last_reused) = (0u32, 0u64);
    // While the index keeps blocks under published hashes, a block may also be held under its
    // second key (see "Keys" in `src/index/README.md`).
    let with_raw = shared.raw_pairs.load(Ordering::Relaxed) > 0;
    let mut ahead = Lookahead::new();
    // Registered for the whole walk: table reads take no lock (see `table::seqlock`).
    let reading = shared.table.reading();
    while c < n && cur.any_live() {
        // Hash outside any lock: this is where the lazy chain pays for the blocks up to
        // `c + PREFETCH_AHEAD` (see `lookahead` for the waste past a miss).
        ahead.prepare(&shared.table, &reading, keys, c, n);
        let mut at = ahead.at(c);
        let key = at.key;
        let alt = if with_raw {
            keys.alt_key(c).map(|k| k.0).filter(|&k| k != key)
        } else {
            None
        };
        let alt_val = alt.map_or(0, |alt| {
            let mut alt = shared.table.locate(alt);
            shared
                .table
                .lookup(&reading, &mut alt, |_, _| true, alt_entries)
                .0
        });
        // Same value as the previous block (and no set value reused meanwhile): every holder
        // holds this block as it held that one.
        let unchanged = |val: u32, reused: u64| {
            alt_val == 0 && val == last_val && (is_inline(val) || reused == last_reused)
        };
        let (val, reused) = shared.table.lookup(
            &reading,
            &mut at,
            |val, reused| val != 0 && !unchanged(val, reused),
            next,
        );
        ahead.found(c, at);
        if val == 0 && alt_val == 0 {
            break;
        }
        if unchanged(val, reused) {
            c += 1;
            if !with_raw {
                // Along a segment stored in one run, the next blocks are the next records:
                // read them in one pass, as a tree reads an edge (see "Segments" in the index
                // README).
                let known = keys.known();
                let upto = known.len().min(n).min(c + FOLLOW_MAX);
                let run = known.get(c..upto).map_or(0, |next| {
                    shared.table.follow(&reading, &at, (val, reused), next)
                });
                if run > 0 {
                    c += run;
                    ahead.followed(c, &at, run, known[c - 1].0);
                }
            }
            continue;
        }
        if val == 0 {
            next.clear();
        }
        if alt_val == 0 {
            (last_val, last_reused) = (val, reused);
        } else {
            // A union of two blocks is no one value: the next block takes the slow path.
            last_val = 0;
            union_into(next, alt_entries);
        }
        cur.block(route, prev, next, c == 0, keys.covered(c));
        std::mem::swap(prev, next);
        c += 1;
    }
    if cur.any_live() {
        // A miss at c, or the end: every live cursor accepted all blocks of its current phase
        // before c.
        cur.finish(keys.covered(c));
    }
    drop(reading);
    if !plan.hybrid.is_empty() {
        super::hybrid::answer(shared, keys, plan, plan.selected(filter), cur.counts_mut());
    }
    answer(plan, cur.counts())
}

/// `entries` (sorted by holder) with `more` (sorted by holder) merged in, tier bits of a holder
/// in both joined.
fn union_into(entries: &mut Vec<u32>, more: &[u32]) {
    if entries.is_empty() {
        entries.extend_from_slice(more);
        return;
    }
    let mine = std::mem::take(entries);
    let (mut i, mut k) = (0, 0);
    loop {
        match (mine.get(i), more.get(k)) {
            (Some(&a), Some(&b)) if entry_id(a) == entry_id(b) => {
                entries.push(a | b);
                i += 1;
                k += 1;
            }
            (Some(&a), Some(&b)) if entry_id(a) < entry_id(b) => {
                entries.push(a);
                i += 1;
            }
            (Some(&a), None) => {
                entries.push(a);
                i += 1;
            }
            (_, Some(&b)) => {
                entries.push(b);
                k += 1;
            }
            (None, None) => return,
        }
    }
}

/// The walk's answer as a new [`QueryHits`].
pub(crate) fn walk<K: PrefixKeys + ?Sized>(
    shared: &Shared,
    keys: &mut K,
    filter: Option<&str>,
) -> QueryHits {
    let filter = filter.filter(|f| !f.is_empty());
    walk_counts(shared, keys, filter, |plan, counts| {
        plan.answer(filter, counts)
    })
}

/// The walk's answer handed to `answer` as borrowed from the plan and the walk's counts, with
/// nothing built for it (see [`AnswerView`]).
pub(crate) fn walk_view<K: PrefixKeys + ?Sized, R>(
    shared: &Shared,
    keys: &mut K,
    filter: Option<&str>,
    answer: impl FnOnce(AnswerView<'_>) -> R,
) -> R {
    let filter = filter.filter(|f| !f.is_empty());
    walk_counts(shared, keys, filter, |plan, counts| {
        answer(plan.view(filter, counts))
    })
}

/// The walk's answer written into `out` (see [`Plan::answer_into`]).
pub(crate) fn walk_into<K: PrefixKeys + ?Sized>(
    shared: &Shared,
    keys: &mut K,
    filter: Option<&str>,
    out: &mut QueryHits,
) {
    let filter = filter.filter(|f| !f.is_empty());
    walk_counts(shared, keys, filter, |plan, counts| {
        plan.answer_into(filter, counts, out)
    });
}
