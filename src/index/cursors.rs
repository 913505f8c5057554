//! The walk's cursors: per selected (instance, rank), the phase it is in (device → cpu_local →
//! cpu_share → disk, never back) and the four cumulative counts it ended its phases at. The
//! walk tells them only where consecutive blocks' entries differ (see "The walk" in the module
//! doc of [`super`]); this module turns those differences into phase ends.
//!
//! Two ways of keeping them, chosen per plan:
//! - **Direct**, when no store backend is in the context and every cursor is fed by at most one
//!   holder (one source per rank, the usual fleet): a cursor's tiers on a block are its holder's
//!   entry bits, so a changed entry settles its cursor right there in the merge, and a walk
//!   pays only for the cursors whose holder appears in a changed entry.
//! - **Counted**, otherwise: per cursor and tier, how many of its holders hold the block, plus
//!   what the backends hold for every cursor; a cursor is settled once all of a block's
//!   changes are in, and only if one of its tiers (or a backend's) emptied.

use super::plan::{NOT_SELECTED, SHARED_HOLDER};
use super::table::{CPU_LOCAL, CPU_SHARE, DEVICE, DISK, entry_bits, entry_id};

/// Bits a phase accepts: its own tier and every earlier one (cumulative meaning of the counts).
pub(crate) const PHASE_MASK: [u8; 4] = [
    DEVICE,
    DEVICE | CPU_LOCAL,
    DEVICE | CPU_LOCAL | CPU_SHARE,
    DEVICE | CPU_LOCAL | CPU_SHARE | DISK,
];

/// Phase of a cursor whose phases all ended, or that is not selected.
const DONE: u8 = 4;
/// Phase of a selected cursor in a direct walk before block 0: it starts at phase 0 if block 0
/// lists its holder, else it ends there with zero counts (which `reset` wrote already).
const WAITING: u8 = 5;

/// What the current block holds for one cursor (or for all: the store backends).
#[derive(Clone, Copy, Default)]
struct Held {
    /// Per tier: how many of the cursor's holders hold the block in that tier.
    count: [u32; 4],
    /// The tiers whose count is not 0.
    mask: u8,
}

impl Held {
    /// One holder's tiers go from `old` to `new`; true when a tier's count dropped to 0.
    #[inline]
    fn change(&mut self, old: u8, new: u8) -> bool {
        let (mut lost, mut gained) = (old & !new, new & !old);
        while gained != 0 {
            let t = gained.trailing_zeros() as usize;
            self.count[t] += 1;
            self.mask |= 1 << t;
            gained &= gained - 1;
        }
        let mut emptied = false;
        while lost != 0 {
            let t = lost.trailing_zeros() as usize;
            self.count[t] -= 1;
            if self.count[t] == 0 {
                self.mask &= !(1 << t);
                emptied = true;
            }
            lost &= lost - 1;
        }
        emptied
    }
}

/// The cursors of one walk. Kept per thread between walks, so their arrays are reused.
#[derive(Default)]
pub(super) struct Cursors {
    direct: bool,
    /// Per cursor: first phase not yet finished ([`DONE`]: all finished, or not selected).
    phase: Vec<u8>,
    counts: Vec<[u64; 4]>,
    /// Counted walks only: what the current block holds per cursor.
    held: Vec<Held>,
    /// Counted walks only: what the store backends hold, which counts for every cursor.
    shared: Held,
    shared_lost: bool,
    /// Counted walks only: cursors that lost a tier on the current block, the only ones whose
    /// phase may end there.
    check: Vec<u32>,
    /// Cursors that may be live (counted: the selected ones, finished ones dropped from time to
    /// time; direct: those block 0 started).
    alive: Vec<u32>,
    live: usize,
}

impl Cursors {
    /// Reset for a walk over `n` cursors of which `selected` are walked, `direct` or counted
    /// (see the module doc; the plan says which).
    pub fn reset(&mut self, n: usize, selected: std::ops::Range<u32>, direct: bool) {
        self.direct = direct;
        let start = if direct { WAITING } else { 0 };
        self.phase.clear();
        self.phase.resize(n, DONE);
        if let Some(sel) = self
            .phase
            .get_mut(selected.start as usize..selected.end as usize)
        {
            sel.fill(start);
        }
        self.counts.clear();
        self.counts.resize(n, [0; 4]);
        self.alive.clear();
        self.live = selected.len();
        if direct {
            return;
        }
        self.held.clear();
        self.held.resize(n, Held::default());
        self.shared = Held::default();
        self.shared_lost = false;
        self.check.clear();
        self.alive.extend(selected);
    }

    /// Whether some cursor may still accept blocks.
    #[inline]
    pub fn any_live(&self) -> bool {
        self.live > 0
    }

    /// The counts, indexed by cursor.
    pub fn counts(&self) -> &[[u64; 4]] {
        &self.counts
    }

    /// The walk moved from a block with entries `old` to one with entries `new` (both sorted by
    /// holder; `old` empty at block 0, which is `first`), `covered` tokens before the new
    /// block: every cursor that no longer accepts it in its phase moves on.
    pub fn block(&mut self, route: &[u32], old: &[u32], new: &[u32], first: bool, covered: u64) {
        if self.direct {
            if first {
                // Only block 0 starts cursors: one whose holder it does not list never does.
                self.live = 0;
            }
            merge(old, new, |id, _, bits| {
                if let Some(&j) = route.get(id as usize) {
                    self.direct_change(j, bits, first, covered);
                }
            });
        } else {
            merge(old, new, |id, was, bits| self.change(route, id, was, bits));
            self.step(first, covered);
        }
    }

    /// Direct walks: cursor `j`'s only holder holds the new block in tiers `bits`.
    #[inline]
    fn direct_change(&mut self, j: u32, bits: u8, first: bool, covered: u64) {
        let Some(p) = self.phase.get_mut(j as usize) else {
            return;
        };
        if first && *p == WAITING {
            *p = 0;
            self.alive.push(j);
            self.live += 1;
        }
        let was = *p;
        if was >= DONE || bits & PHASE_MASK[was as usize] != 0 {
            return;
        }
        let counts = &mut self.counts[j as usize];
        while *p < DONE && bits & PHASE_MASK[*p as usize] == 0 {
            counts[*p as usize] = covered;
            *p += 1;
        }
        if *p == DONE {
            self.live -= 1;
        }
    }

    /// Counted walks: holder `id`'s tiers go from `old` to `new` between two blocks.
    #[inline]
    fn change(&mut self, route: &[u32], id: u32, old: u8, new: u8) {
        match route.get(id as usize) {
            Some(&SHARED_HOLDER) => self.shared_lost |= self.shared.change(old, new),
            Some(&j) if j != NOT_SELECTED => {
                let emptied = self
                    .held
                    .get_mut(j as usize)
                    .is_some_and(|h| h.change(old, new));
                if emptied && self.phase[j as usize] < DONE {
                    self.check.push(j);
                }
            }
            _ => {}
        }
    }

    /// Counted walks: move cursor `j` on to the first phase that accepts the current block
    /// (`covered` tokens before it); true when it finished.
    fn settle(&mut self, j: usize, covered: u64) -> bool {
        let bits = self.held[j].mask | self.shared.mask;
        let p = &mut self.phase[j];
        let was = *p;
        if bits == 0 {
            // Nothing holds the block for this cursor (a holder that stopped matching): every
            // phase left ends here, without testing them one by one.
            if let Some(rest) = self.counts[j].get_mut(was as usize..) {
                rest.fill(covered);
            }
            *p = DONE;
            return was < DONE;
        }
        while *p < DONE && bits & PHASE_MASK[*p as usize] == 0 {
            self.counts[j][*p as usize] = covered;
            *p += 1;
        }
        *p == DONE && was < DONE
    }

    /// Counted walks, after the holders' changes for a block: settle the cursors whose tiers
    /// shrank (all of them on the first block or when a backend's tiers shrank).
    fn step(&mut self, all: bool, covered: u64) {
        let mut finished = 0;
        if all || self.shared_lost {
            for i in 0..self.alive.len() {
                let j = self.alive[i] as usize;
                finished += usize::from(self.settle(j, covered));
            }
            let phase = &self.phase;
            self.alive.retain(|&j| phase[j as usize] < DONE);
        } else {
            for i in 0..self.check.len() {
                let j = self.check[i] as usize;
                finished += usize::from(self.settle(j, covered));
            }
        }
        self.check.clear();
        self.shared_lost = false;
        self.live -= finished;
    }

    /// Every live cursor ends all its phases from the current one at `covered`.
    pub fn finish(&mut self, covered: u64) {
        for &j in &self.alive {
            let j = j as usize;
            if let Some(p) = self.phase.get(j).map(|&p| p as usize)
                && p < DONE as usize
            {
                self.counts[j][p..].iter_mut().for_each(|x| *x = covered);
            }
        }
        self.live = 0;
    }
}

/// Call `f(holder, old bits, new bits)` for every holder whose tiers differ between the sorted
/// entry lists `old` and `new`.
#[inline]
fn merge(old: &[u32], new: &[u32], mut f: impl FnMut(u32, u8, u8)) {
    let (mut i, mut k) = (0, 0);
    loop {
        match (old.get(i), new.get(k)) {
            (Some(&a), Some(&b)) if entry_id(a) == entry_id(b) => {
                if a != b {
                    f(entry_id(a), entry_bits(a), entry_bits(b));
                }
                i += 1;
                k += 1;
            }
            (Some(&a), Some(&b)) if entry_id(a) < entry_id(b) => {
                f(entry_id(a), entry_bits(a), 0);
                i += 1;
            }
            (Some(&a), None) => {
                f(entry_id(a), entry_bits(a), 0);
                i += 1;
            }
            (_, Some(&b)) => {
                f(entry_id(b), 0, entry_bits(b));
                k += 1;
            }
            (None, None) => return,
        }
    }
}
