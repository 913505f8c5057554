//! The walk's cursors: per selected (instance, rank), the phase it is in (device → cpu_local →
//! cpu_share → disk, never back) and the four cumulative counts it ended its phases at. The
//! walk tells them only where consecutive blocks' entries differ (see "The walk" in the module
//! doc of [`super`]); this module turns those differences into phase ends.
//!
//! Two ways of keeping them, chosen per plan:
//! - **Direct**, when no store backend is in the context and every cursor is fed by at most one
//!   holder (one source per rank, the usual fleet): a cursor's tiers on a block are its holder's
//!   entry bits, so the new block's entries alone say which cursors stay in their phase. They
//!   are kept as bit sets, one per phase: a changed block costs its own entries plus a few word
//!   operations per 64 cursors, and a write per cursor whose phase ends there, with no merge
//!   against the previous block's entries.
//! - **Counted**, otherwise: per cursor and tier, how many of its holders hold the block, plus
//!   what the backends hold for every cursor; a cursor is settled once all of a block's
//!   changes are in, and only if one of its tiers (or a backend's) emptied.

use crate::index::plan::{NOT_SELECTED, SHARED_HOLDER};
use crate::index::table::{CPU_LOCAL, CPU_SHARE, DEVICE, DISK, entry_bits, entry_id};

/// Bits a phase accepts: its own tier and every earlier one (cumulative meaning of the counts).
pub(crate) const PHASE_MASK: [u8; 4] = [
    DEVICE,
    DEVICE | CPU_LOCAL,
    DEVICE | CPU_LOCAL | CPU_SHARE,
    DEVICE | CPU_LOCAL | CPU_SHARE | DISK,
];
// Phase `q` accepts exactly the tiers `0..=q`: what `PhaseSets::accept` computes with.
const _: () = {
    let mut q = 0;
    while q < 4 {
        assert!(PHASE_MASK[q] == (2u8 << q) - 1);
        q += 1;
    }
};

/// Phase of a cursor whose phases all ended, or that is not selected.
const DONE: u8 = 4;
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
pub(in crate::index) struct Cursors {
    direct: bool,
    counts: Vec<[u64; 4]>,
    live: usize,
    /// Direct walks: the cursors in each phase.
    sets: PhaseSets,
    /// Counted walks: per cursor, first phase not yet finished ([`DONE`]: all finished, or not
    /// selected).
    phase: Vec<u8>,
    /// Counted walks: what the current block holds per cursor.
    held: Vec<Held>,
    /// Counted walks: what the store backends hold, which counts for every cursor.
    shared: Held,
    shared_lost: bool,
    /// Counted walks: cursors that lost a tier on the current block, the only ones whose phase
    /// may end there.
    check: Vec<u32>,
    /// Counted walks: the selected cursors, finished ones dropped from time to time.
    alive: Vec<u32>,
}

impl Cursors {
    /// Reset for a walk over `n` cursors of which `selected` are walked, `direct` or counted
    /// (see the module doc; the plan says which).
    pub fn reset(&mut self, n: usize, selected: std::ops::Range<u32>, direct: bool) {
        self.direct = direct;
        // Every selected cursor's four counts are written before the walk ends; the others stay
        // 0.
        self.counts.clear();
        self.counts.resize(n, [0; 4]);
        self.live = selected.len();
        if direct {
            self.sets.reset(n, selected);
            return;
        }
        self.phase.clear();
        self.phase.resize(n, DONE);
        if let Some(sel) = self
            .phase
            .get_mut(selected.start as usize..selected.end as usize)
        {
            sel.fill(0);
        }
        self.held.clear();
        self.held.resize(n, Held::default());
        self.shared = Held::default();
        self.shared_lost = false;
        self.check.clear();
        self.alive.clear();
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

    /// The counts, for the cursors the walk does not count itself (`read::hybrid`).
    pub fn counts_mut(&mut self) -> &mut [[u64; 4]] {
        &mut self.counts
    }

    /// The walk moved from a block with entries `old` to one with entries `new` (both sorted by
    /// holder; `old` empty at block 0, which is `first`), `covered` tokens before the new
    /// block: every cursor that no longer accepts it in its phase moves on.
    pub fn block(&mut self, route: &[u32], old: &[u32], new: &[u32], first: bool, covered: u64) {
        if self.direct {
            self.sets.accept(route, new);
            if first {
                self.live = self.sets.start();
            } else {
                self.live -= self.sets.step(covered, &mut self.counts);
            }
        } else {
            merge(old, new, |id, was, bits| self.change(route, id, was, bits));
            self.step(first, covered);
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
        if self.direct {
            self.sets.finish(covered, &mut self.counts);
        } else {
            for &j in &self.alive {
                let j = j as usize;
                if let Some(p) = self.phase.get(j).map(|&p| p as usize)
                    && p < DONE as usize
                {
                    self.counts[j][p..].iter_mut().for_each(|x| *x = covered);
                }
            }
        }
        self.live = 0;
    }
}

/// A direct walk's cursors as bit sets: cursor `j` is bit `j % 64` of word `j / 64`.
#[derive(Default)]
struct PhaseSets {
    words: Vec<SetWord>,
}

/// 64 cursors' sets.
#[derive(Clone, Copy, Default)]
struct SetWord {
    /// The selected cursors (block 0 starts those its entries list).
    selected: u64,
    /// Per phase, the live cursors in it.
    in_phase: [u64; 4],
    /// Per phase, the cursors the current block's entries keep in it: those whose holder holds
    /// the block in that phase's tier or an earlier one.
    accepts: [u64; 4],
}

/// `counts` with every count from phase `q` on set to `covered` (the earlier ones kept).
#[inline]
fn ended_from(counts: &mut [u64; 4], q: usize, covered: u64) {
    for (i, c) in counts.iter_mut().enumerate() {
        *c = if i >= q { covered } else { *c };
    }
}

/// Call `f` on the counts of every cursor in `set`, the word of cursors from `base`.
#[inline]
fn each_cursor(
    mut set: u64,
    base: usize,
    counts: &mut [[u64; 4]],
    mut f: impl FnMut(&mut [u64; 4]),
) {
    while set != 0 {
        if let Some(c) = counts.get_mut(base + set.trailing_zeros() as usize) {
            f(c);
        }
        set &= set - 1;
    }
}

impl PhaseSets {
    fn reset(&mut self, n: usize, selected: std::ops::Range<u32>) {
        self.words.clear();
        self.words.resize(n.div_ceil(64), SetWord::default());
        let (start, end) = (selected.start as usize, (selected.end as usize).min(n));
        for (w, word) in self.words.iter_mut().enumerate() {
            // The bits of `start..end` within word `w`.
            let (lo, hi) = (
                start.clamp(w * 64, w * 64 + 64),
                end.clamp(w * 64, w * 64 + 64),
            );
            if lo < hi {
                let width = hi - lo;
                let ones = if width == 64 { !0 } else { (1u64 << width) - 1 };
                word.selected = ones << (lo - w * 64);
            }
        }
    }

    /// Fill `accepts` from a block's entries.
    fn accept(&mut self, route: &[u32], entries: &[u32]) {
        for word in &mut self.words {
            word.accepts = [0; 4];
        }
        for &e in entries {
            let Some(&j) = route.get(entry_id(e) as usize) else {
                continue;
            };
            let tier = entry_bits(e).trailing_zeros() as usize;
            // Not a cursor (not selected, or not listed), or no tier at all.
            if let Some(word) = self.words.get_mut(j as usize / 64)
                && tier < 4
            {
                word.accepts[tier] |= 1 << (j % 64);
            }
        }
        // Phase `q` accepts tiers `0..=q` (see `PHASE_MASK`).
        for word in &mut self.words {
            let a = &mut word.accepts;
            a[1] |= a[0];
            a[2] |= a[1];
            a[3] |= a[2];
        }
    }

    /// Block 0, its entries accepted: each selected cursor it lists starts in the first phase
    /// that accepts it (the phases before end at 0 tokens, as the counts already say), every
    /// other cursor ends there. Returns how many started.
    fn start(&mut self) -> usize {
        let mut live = 0;
        for word in &mut self.words {
            let mut earlier = 0u64;
            for q in 0..4 {
                let starts = word.selected & word.accepts[q] & !earlier;
                word.in_phase[q] = starts;
                earlier |= starts;
            }
            live += earlier.count_ones() as usize;
        }
        live
    }

    /// A later block whose value changed, its entries accepted: every cursor its phase no
    /// longer accepts ends that phase at `covered` and moves on. Returns how many ended their
    /// last phase.
    fn step(&mut self, covered: u64, counts: &mut [[u64; 4]]) -> usize {
        let mut finished = 0;
        for (w, word) in self.words.iter_mut().enumerate() {
            let base = w * 64;
            // Cursors whose holder does not hold the block at all end every phase left here,
            // in one write each (a prompt leaving a shared system prompt ends most cursors).
            let held = word.accepts[3];
            let mut moving = 0u64;
            for q in 0..4 {
                let here = word.in_phase[q] | moving;
                let ending = here & !word.accepts[q];
                word.in_phase[q] = here & word.accepts[q];
                moving = ending & held;
                let gone = ending & !held;
                finished += gone.count_ones() as usize;
                each_cursor(gone, base, counts, |c| ended_from(c, q, covered));
                each_cursor(moving, base, counts, |c| c[q] = covered);
            }
        }
        finished
    }

    /// Every live cursor ends its phase and the later ones at `covered`.
    fn finish(&mut self, covered: u64, counts: &mut [[u64; 4]]) {
        for (w, word) in self.words.iter_mut().enumerate() {
            for q in 0..4 {
                let live = std::mem::take(&mut word.in_phase[q]);
                each_cursor(live, w * 64, counts, |c| ended_from(c, q, covered));
            }
        }
    }
}

/// Call `f(holder, old bits, new bits)` for every holder whose tiers differ between the sorted
/// entry lists `old` and `new`.
#[inline]
fn merge(old: &[u32], new: &[u32], mut f: impl FnMut(u32, u8, u8)) {
    let (mut i, mut k) = (0, 0);
    while let (Some(&a), Some(&b)) = (old.get(i), new.get(k)) {
        let (ia, ib) = (entry_id(a), entry_id(b));
        if ia == ib {
            if a != b {
                f(ia, entry_bits(a), entry_bits(b));
            }
            i += 1;
            k += 1;
        } else if ia < ib {
            f(ia, entry_bits(a), 0);
            i += 1;
        } else {
            f(ib, 0, entry_bits(b));
            k += 1;
        }
    }
    for &a in old.get(i..).unwrap_or(&[]) {
        f(entry_id(a), entry_bits(a), 0);
    }
    for &b in new.get(k..).unwrap_or(&[]) {
        f(entry_id(b), 0, entry_bits(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64, so a failure names a reproducible case.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A block's sorted entries: each holder present with probability 3/4, with random tiers
    /// (sometimes none, which a walk must read as not held).
    fn entries(rng: &mut Rng, holders: u32) -> Vec<u32> {
        let mut out = Vec::new();
        for id in 0..holders {
            if rng.below(4) != 0 {
                out.push(id << 4 | rng.below(16) as u32);
            }
        }
        out
    }

    fn walk(
        direct: bool,
        n: usize,
        selected: std::ops::Range<u32>,
        blocks: &[Vec<u32>],
    ) -> Vec<[u64; 4]> {
        // Holder i feeds cursor i; a few holders past the cursors feed none.
        let route: Vec<u32> = (0..n as u32 + 3)
            .map(|i| if (i as usize) < n { i } else { NOT_SELECTED })
            .collect();
        let mut cur = Cursors::default();
        cur.reset(n, selected, direct);
        let mut prev: &[u32] = &[];
        for (c, block) in blocks.iter().enumerate() {
            if !cur.any_live() {
                break;
            }
            cur.block(&route, prev, block, c == 0, 16 * c as u64);
            prev = block;
        }
        if cur.any_live() {
            cur.finish(16 * blocks.len() as u64);
        }
        cur.counts().to_vec()
    }

    /// The direct way (bit sets) against the counted way, which makes no assumption about
    /// holders per cursor, over cursor counts and selections that cross 64-bit words.
    #[test]
    fn direct_walks_count_as_counted_walks_do() {
        let mut rng = Rng(0x00c0_ffee);
        // Counts that moved past 0 in some tier, so a run of empty walks cannot pass.
        let mut moved = 0;
        for case in 0..400 {
            let n = 1 + rng.below(200) as usize;
            let a = rng.below(n as u64 + 1) as u32;
            let b = rng.below(n as u64 + 1) as u32;
            let selected = a.min(b)..a.max(b);
            let holders = n as u32 + 3;
            // Blocks repeat their predecessor's entries now and then, as a walk sees them
            // only where the value changed.
            let mut blocks: Vec<Vec<u32>> = Vec::new();
            for _ in 0..rng.below(12) {
                let next = match blocks.last() {
                    Some(last) if rng.below(3) == 0 => last.clone(),
                    _ => entries(&mut rng, holders),
                };
                blocks.push(next);
            }
            let counted = walk(false, n, selected.clone(), &blocks);
            let direct = walk(true, n, selected.clone(), &blocks);
            assert_eq!(direct, counted, "case {case}: n {n}, selected {selected:?}");
            assert!(
                counted
                    .iter()
                    .all(|c| c[0] <= c[1] && c[1] <= c[2] && c[2] <= c[3])
            );
            moved += counted.iter().filter(|c| c[3] > 0).count();
        }
        assert!(moved > 1000, "only {moved} cursors matched anything");
    }
}
