//! The query walk: per registered (instance, rank), one cursor over the prompt's blocks moving
//! device → cpu_local → cpu_share → disk and never back. See the module doc of [`super`] for the
//! exact semantics and why hashing never runs under a lock.

use std::collections::BTreeMap;

use crate::hashing::PrefixKeys;
use crate::model::BlockHash;

use super::handle::Shared;
use super::plan::{NOT_SELECTED, Plan, SHARED_HOLDER};
use super::table::{
    ALL_TIERS, CPU_LOCAL, CPU_SHARE, DEVICE, DISK, entry_bits, entry_id, is_inline,
};

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

    pub(crate) fn max(self, o: TierCounts) -> Self {
        TierCounts {
            device: self.device.max(o.device),
            cpu_local: self.cpu_local.max(o.cpu_local),
            cpu_share: self.cpu_share.max(o.cpu_share),
            disk: self.disk.max(o.disk),
        }
    }
}

/// One instance's row of a query answer (`spec/python-api.md`, query()). Rank keys are `u32`
/// here; the transports render them as decimal strings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceHits {
    /// Equals `disk`.
    pub longest_matched: u64,
    /// Rank → that rank's `device` count.
    pub dp: BTreeMap<u32, u64>,
    /// Rank → its four cumulative counts. Same keys as `dp`, zero-hit ranks included.
    pub rank_matches: BTreeMap<u32, TierCounts>,
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryHits {
    pub hits: BTreeMap<String, InstanceHits>,
}

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
}

/// Bits a phase accepts: its own tier and every earlier one (cumulative meaning of the counts).
pub(crate) const PHASE_MASK: [u8; 4] = [
    DEVICE,
    DEVICE | CPU_LOCAL,
    DEVICE | CPU_LOCAL | CPU_SHARE,
    DEVICE | CPU_LOCAL | CPU_SHARE | DISK,
];

/// Run the walk for the cursors `filter` selects and hand each cursor's counts to `answer`.
/// Locks: the meta lock once to fetch the plan, then one shard read lock per block lookup;
/// `keys.key(i)` is always called with no lock held.
///
/// Per block the walk reads the block's value (see `table`): when it equals the previous
/// block's value (and no set value was reused meanwhile), every holder holds this block in the
/// same tiers as the previous one, so every live cursor, which accepted the previous block in its
/// current phase, accepts this one too: nothing to do. Only when the value changes does the walk
/// look at the holders and move each live cursor on, which costs O(holders + live cursors).
fn walk_counts<K: PrefixKeys + ?Sized, R>(
    shared: &Shared,
    keys: &mut K,
    filter: Option<&str>,
    answer: impl FnOnce(&Plan, &[[u64; 4]]) -> R,
) -> R {
    let plan = shared.meta.plan();
    let selected = plan.selected(filter);
    let route = &plan.route;
    let mut counts = vec![[0u64; 4]; plan.cursors];
    // Per cursor: first phase not yet finished (4 = all finished), and tier bits seen on the
    // current block.
    let mut phase = vec![0u8; plan.cursors];
    let mut held = vec![0u8; plan.cursors];
    let mut alive: Vec<u32> = selected.collect();

    let n = keys.num_blocks();
    let mut c = 0usize;
    // The previous block's value and the sets' reuse count read with it (0: none yet).
    let (mut last_val, mut last_reused) = (0u32, 0u64);
    while c < n && !alive.is_empty() {
        // Hash outside any lock: this is where the lazy chain pays for block c.
        let key = keys.key(c).0;
        let mut shared_bits = 0u8;
        {
            let shard = shared.table.read(key);
            let val = shard.value(key);
            let reused = shard.sets_reused();
            if val != 0 && val == last_val && (is_inline(val) || reused == last_reused) {
                c += 1;
                continue;
            }
            (last_val, last_reused) = (val, reused);
            shard.visit_value(val, |e| match route.get(entry_id(e) as usize) {
                Some(&SHARED_HOLDER) => shared_bits |= entry_bits(e),
                Some(&j) if j != NOT_SELECTED => {
                    if let Some(h) = held.get_mut(j as usize) {
                        *h |= entry_bits(e);
                    }
                }
                _ => {}
            });
        }
        let mut covered_c = None;
        alive.retain(|&j| {
            let j = j as usize;
            let bits = (held[j] | shared_bits) & ALL_TIERS;
            held[j] = 0;
            let p = &mut phase[j];
            while *p < 4 && bits & PHASE_MASK[*p as usize] == 0 {
                counts[j][*p as usize] = *covered_c.get_or_insert_with(|| keys.covered(c));
                *p += 1;
            }
            *p < 4
        });
        c += 1;
    }
    if !alive.is_empty() {
        // Every remaining cursor accepted all blocks of its current phase to the end.
        let all = keys.covered(c);
        for &j in &alive {
            let j = j as usize;
            counts[j][phase[j] as usize..]
                .iter_mut()
                .for_each(|x| *x = all);
        }
    }
    answer(&plan, &counts)
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
