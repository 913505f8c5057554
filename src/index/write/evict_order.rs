//! The order in which the memory budget evicts a context's blocks (see "Memory budget" in
//! `docs/durability.md`): oldest chain first, each chain from its deepest block up, so that
//! what stays is closed under prefixes.
//!
//! Blocks are kept in runs: the blocks one store op made new to the context, in chain order
//! (parent first). A run that continues a chain (a chained store whose published parent is the
//! last block of a live run) links to that run as its parent, and a run with live children is
//! never evicted before them: the hand that walks the runs oldest first passes over it (it goes
//! to the back of the queue, younger than its children) and it goes once its last child went.
//! Within a run, the deepest blocks go first, and a partly evicted run keeps its prefix. So a
//! block goes before its prefix whenever the chain's runs are linked, and answers shrink to a
//! shorter true prefix. A run whose parent the order does not know (a store backend's objects,
//! a chain that branches inside a run, blocks restored after a restart) is a chain of its own:
//! evicting its parent first leaves it unreachable (a walk stops at the first missing block,
//! never showing a hole or a false hit) until the hand reaches it too.
//!
//! Cost: 8 bytes a block (its key in its run) plus about 80 bytes a run (the run, its queue
//! entry and the map entry that finds it by its last published hash). Removed blocks stay in
//! their runs until [`EvictOrder::compact`] drops them, which the owner calls once the keys
//! outnumber the blocks twice.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

/// No parent, or a freed run.
const NONE: u32 = u32::MAX;

#[derive(Default)]
struct Run {
    /// Block keys, parent first; evicted from the end.
    keys: Vec<u64>,
    /// The published hash of the op's last block, which a continuing op names as its parent.
    last_hash: Option<u64>,
    parent: u32,
    parent_epoch: u32,
    /// Live runs naming this one as their parent.
    children: u32,
    /// Bumped when the slot is freed, so stale links and queue entries are told apart.
    epoch: u32,
    live: bool,
}

/// Published hashes are already uniformly distributed: one multiply spreads them enough.
#[derive(Default)]
struct HashHasher(u64);

impl Hasher for HashHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

/// A context's eviction order (see the module doc).
#[derive(Default)]
pub(in crate::index) struct EvictOrder {
    runs: Vec<Run>,
    free: Vec<u32>,
    /// Run ids with their generation, oldest first.
    queue: VecDeque<(u32, u32)>,
    by_last: HashMap<u64, u32, BuildHasherDefault<HashHasher>>,
    /// A run whose last child just went: its blocks go next (the chain's turn continues).
    cascade: Option<u32>,
    /// Keys held in runs, removed blocks included.
    keys: usize,
}

impl EvictOrder {
    /// Keys held (live and removed blocks).
    pub(in crate::index) fn len(&self) -> usize {
        self.keys
    }

    /// Append a run of blocks new to the context, in chain order; `last_hash` is the published
    /// hash of the op's last block and `parent_hash` the published parent the op named.
    pub(in crate::index) fn push_run(
        &mut self,
        keys: impl IntoIterator<Item = u64>,
        last_hash: Option<u64>,
        parent_hash: Option<u64>,
    ) {
        let keys: Vec<u64> = keys.into_iter().collect();
        if keys.is_empty() {
            return;
        }
        let (parent, parent_epoch) = match parent_hash.and_then(|h| self.by_last.get(&h)) {
            Some(&p) if self.runs[p as usize].live => {
                let run = &mut self.runs[p as usize];
                run.children += 1;
                (p, run.epoch)
            }
            _ => (NONE, 0),
        };
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                self.runs.push(Run::default());
                (self.runs.len() - 1) as u32
            }
        };
        self.keys += keys.len();
        let run = &mut self.runs[id as usize];
        *run = Run {
            keys,
            last_hash,
            parent,
            parent_epoch,
            children: 0,
            epoch: run.epoch,
            live: true,
        };
        self.queue.push_back((id, run.epoch));
        if let Some(h) = last_hash {
            self.by_last.insert(h, id);
        }
    }

    /// Put up to `n` keys to evict into `out`, deepest first (see the module doc). The caller
    /// checks each against the table: a key may name a block already removed.
    pub(in crate::index) fn next_victims(&mut self, n: usize, out: &mut Vec<u64>) {
        out.clear();
        // Runs passed over for their children since the last one taken: once every queued run
        // was passed over (links form no cycle, so only a bug could do that), the next is
        // taken anyway rather than spinning.
        let mut passed = 0usize;
        while out.len() < n {
            let id = match self.cascade.take() {
                // Unless a run stored since names it as its parent again.
                Some(id) if self.runs[id as usize].live && self.runs[id as usize].children == 0 => {
                    id
                }
                _ => {
                    let Some((id, epoch)) = self.queue.pop_front() else {
                        return;
                    };
                    let run = &self.runs[id as usize];
                    if !run.live || run.epoch != epoch {
                        continue;
                    }
                    if run.children > 0 && passed <= self.queue.len() {
                        passed += 1;
                        self.queue.push_back((id, epoch));
                        continue;
                    }
                    // Taken now; put back in front in case it is only partly evicted.
                    self.queue.push_front((id, epoch));
                    id
                }
            };
            passed = 0;
            let run = &mut self.runs[id as usize];
            let take = (n - out.len()).min(run.keys.len());
            let from = run.keys.len() - take;
            out.extend(run.keys.drain(from..).rev());
            self.keys -= take;
            if run.keys.is_empty() {
                self.free_run(id);
            }
        }
    }

    /// Drop keys `keep` refuses (blocks no longer in the table) and the runs left empty.
    pub(in crate::index) fn compact(&mut self, mut keep: impl FnMut(u64) -> bool) {
        let mut emptied = Vec::new();
        let mut total = 0;
        for (id, run) in self.runs.iter_mut().enumerate() {
            if !run.live {
                continue;
            }
            run.keys.retain(|&k| keep(k));
            total += run.keys.len();
            if run.keys.is_empty() && run.children == 0 {
                emptied.push(id as u32);
            } else {
                run.keys.shrink_to_fit();
            }
        }
        self.keys = total;
        for id in emptied {
            self.free_run(id);
        }
        self.queue.retain(|&(id, epoch)| {
            self.runs[id as usize].live && self.runs[id as usize].epoch == epoch
        });
        // The runs compaction freed may have set it; their chains keep their turn in the queue.
        self.cascade = None;
    }

    fn free_run(&mut self, id: u32) {
        let run = &mut self.runs[id as usize];
        let (parent, parent_epoch, last) = (run.parent, run.parent_epoch, run.last_hash);
        self.keys -= run.keys.len();
        *run = Run {
            epoch: run.epoch.wrapping_add(1),
            ..Run::default()
        };
        self.free.push(id);
        if let Some(h) = last
            && self.by_last.get(&h) == Some(&id)
        {
            self.by_last.remove(&h);
        }
        if parent != NONE {
            let p = &mut self.runs[parent as usize];
            if p.live && p.epoch == parent_epoch {
                p.children -= 1;
                if p.children == 0 {
                    self.cascade = Some(parent);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    /// Every key's parent key in a forest built from runs; `None` for roots.
    fn closed(kept: &std::collections::HashSet<u64>, parent: &HashMap<u64, u64>) -> bool {
        kept.iter()
            .all(|k| parent.get(k).is_none_or(|p| kept.contains(p)))
    }

    #[test]
    fn a_chain_goes_from_its_deepest_block_up() {
        let mut order = EvictOrder::default();
        order.push_run([1, 2, 3], Some(103), None);
        order.push_run([4, 5], Some(105), Some(103));
        order.push_run([6], Some(106), Some(105));
        let mut out = Vec::new();
        order.next_victims(2, &mut out);
        assert_eq!(out, [6, 5]);
        order.next_victims(10, &mut out);
        assert_eq!(out, [4, 3, 2, 1]);
        assert_eq!(order.len(), 0);
    }

    #[test]
    fn an_older_chain_goes_first_and_a_shared_prefix_stays_while_it_has_children() {
        let mut order = EvictOrder::default();
        order.push_run([1, 2], Some(102), None); // a shared system prompt
        order.push_run([3], Some(103), Some(102)); // conversation a
        order.push_run([10], Some(110), None); // an unrelated chain
        order.push_run([4], Some(104), Some(102)); // conversation b
        let mut out = Vec::new();
        order.next_victims(1, &mut out);
        assert_eq!(
            out,
            [3],
            "the prompt has children: conversation a goes first"
        );
        order.next_victims(1, &mut out);
        assert_eq!(out, [10]);
        order.next_victims(3, &mut out);
        assert_eq!(out, [4, 2, 1], "the prompt goes right after its last child");
    }

    #[test]
    fn compaction_drops_removed_keys_and_empty_runs() {
        let mut order = EvictOrder::default();
        order.push_run([1, 2], Some(102), None);
        order.push_run([3, 4], Some(104), None);
        order.compact(|k| k != 3 && k != 4 && k != 1);
        assert_eq!(order.len(), 1);
        let mut out = Vec::new();
        order.next_victims(5, &mut out);
        assert_eq!(out, [2]);
    }

    /// Random forests of chains, stored run by run, evicted in random amounts: the keys not
    /// yet evicted are always closed under prefixes (every kept block's parent is kept).
    #[test]
    fn what_stays_is_closed_under_prefixes() {
        let mut rng = Rng(0xB0D6E7);
        for _ in 0..200 {
            let mut order = EvictOrder::default();
            let mut parent = HashMap::new();
            let mut kept = std::collections::HashSet::new();
            // Runs end at a key; a continuation names the last key as its published parent.
            let mut ends: Vec<u64> = Vec::new();
            let mut next_key = 1u64;
            for _ in 0..rng.below(40) + 1 {
                let continues = !ends.is_empty() && rng.below(3) > 0;
                let mut prev = if continues {
                    Some(*rng.pick(&ends))
                } else {
                    None
                };
                let start_parent = prev;
                // A child of a block already evicted (the engine still holds it and continues
                // the chain) starts a chain of its own: no walk reaches it anyway.
                if prev.is_some_and(|p| !kept.contains(&p)) {
                    prev = None;
                }
                let len = rng.below(5) as u64 + 1;
                let keys: Vec<u64> = (0..len)
                    .map(|_| {
                        let k = next_key;
                        next_key += 1;
                        if let Some(p) = prev {
                            parent.insert(k, p);
                        }
                        prev = Some(k);
                        kept.insert(k);
                        k
                    })
                    .collect();
                let last = *keys.last().unwrap();
                // The published hash is the key itself here.
                order.push_run(keys, Some(last), start_parent);
                ends.push(last);
                if rng.below(4) == 0 {
                    let mut out = Vec::new();
                    order.next_victims(rng.below(6) + 1, &mut out);
                    for k in out {
                        assert!(kept.remove(&k), "key {k} evicted twice");
                    }
                    assert!(closed(&kept, &parent), "kept set has a hole");
                }
            }
            let mut out = Vec::new();
            while !kept.is_empty() {
                order.next_victims(rng.below(6) + 1, &mut out);
                assert!(!out.is_empty(), "keys left but none offered");
                for &k in &out {
                    assert!(kept.remove(&k));
                }
                assert!(closed(&kept, &parent), "kept set has a hole");
            }
            assert_eq!(order.len(), 0);
        }
    }
}
