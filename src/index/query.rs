//! The query walk: per registered (instance, rank), one cursor over the prompt's blocks moving
//! device → cpu_local → cpu_share → disk and never back. See the module doc of [`super`] for the
//! exact semantics and why hashing never runs under a lock.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use crate::hashing::PrefixKeys;
use crate::model::BlockHash;

use super::handle::Shared;
use super::table::{
    ALL_TIERS, CPU_LOCAL, CPU_SHARE, DEVICE, DISK, entry_bits, entry_id, read_lock,
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
    fn from_array(c: [u64; 4]) -> Self {
        TierCounts {
            device: c[0],
            cpu_local: c[1],
            cpu_share: c[2],
            disk: c[3],
        }
    }

    fn max(self, o: TierCounts) -> Self {
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

const NOT_SELECTED: u32 = u32::MAX;
const SHARED_HOLDER: u32 = u32::MAX - 1;

struct Cursor {
    /// First phase not yet finished (4 = all finished).
    phase: usize,
    counts: [u64; 4],
}

/// Run the walk. Locks: the meta lock once to plan, then one shard read lock per block lookup;
/// `keys.key(i)` is always called with no lock held.
pub(crate) fn walk<K: PrefixKeys + ?Sized>(
    shared: &Shared,
    keys: &mut K,
    filter: Option<&str>,
) -> QueryHits {
    let filter = filter.filter(|f| !f.is_empty());
    // Plan: one cursor per listed (instance, rank); `route[holder_id]` says whose cursor an entry
    // feeds (or that it is a shared holder every cursor sees).
    let mut rows: Vec<(String, Vec<u32>)> = Vec::new();
    let mut route: Vec<u32>;
    {
        let meta = read_lock(&shared.meta);
        route = meta
            .shared
            .iter()
            .map(|&s| if s { SHARED_HOLDER } else { NOT_SELECTED })
            .collect();
        let mut cursor = 0u32;
        let selected: Box<dyn Iterator<Item = _>> = match filter {
            Some(f) => Box::new(meta.ranks.get_key_value(f).into_iter()),
            None => Box::new(meta.ranks.iter()),
        };
        for (instance, ranks) in selected {
            let mut listed = Vec::new();
            for (&rank, entry) in ranks.iter().filter(|(_, e)| e.listed()) {
                for &id in &entry.holders {
                    if let Some(r) = route.get_mut(id as usize) {
                        *r = cursor;
                    }
                }
                listed.push(rank);
                cursor += 1;
            }
            if !listed.is_empty() {
                rows.push((instance.clone(), listed));
            }
        }
    }
    let n_cursors = rows.iter().map(|(_, r)| r.len()).sum::<usize>();
    let mut cursors: Vec<Cursor> = (0..n_cursors)
        .map(|_| Cursor {
            phase: 0,
            counts: [0; 4],
        })
        .collect();
    let mut held = vec![0u8; n_cursors];
    let mut alive: Vec<u32> = (0..n_cursors as u32).collect();

    let n = keys.num_blocks();
    let with_raw = shared.raw_pairs.load(Ordering::Relaxed) > 0;
    let mut c = 0usize;
    while c < n && !alive.is_empty() {
        // Hash outside any lock: this is where the lazy chain pays for block c.
        let key = keys.key(c).0;
        let alt = if with_raw {
            keys.alt_key(c).map(|k| k.0).filter(|&k| k != key)
        } else {
            None
        };
        let mut shared_bits = 0u8;
        for key in std::iter::once(key).chain(alt) {
            let shard = shared.table.read(key);
            shard.visit(key, |e| match route.get(entry_id(e) as usize) {
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
            let cur = &mut cursors[j];
            while cur.phase < 4 && bits & PHASE_MASK[cur.phase] == 0 {
                cur.counts[cur.phase] = *covered_c.get_or_insert_with(|| keys.covered(c));
                cur.phase += 1;
            }
            cur.phase < 4
        });
        c += 1;
    }
    if !alive.is_empty() {
        // Every remaining cursor accepted all blocks of its current phase to the end.
        let all = keys.covered(c);
        for &j in &alive {
            let cur = &mut cursors[j as usize];
            cur.counts[cur.phase..].iter_mut().for_each(|x| *x = all);
        }
    }

    let mut hits = BTreeMap::new();
    let mut next = cursors.into_iter();
    for (instance, ranks) in rows {
        let mut row = InstanceHits::default();
        let mut best = TierCounts::default();
        for rank in ranks {
            let counts = next
                .next()
                .map(|c| TierCounts::from_array(c.counts))
                .unwrap_or_default();
            row.dp.insert(rank, counts.device);
            row.rank_matches.insert(rank, counts);
            best = best.max(counts);
        }
        row.device = best.device;
        row.cpu_local = best.cpu_local;
        row.cpu_share = best.cpu_share;
        row.disk = best.disk;
        row.longest_matched = best.disk;
        hits.insert(instance, row);
    }
    QueryHits { hits }
}
