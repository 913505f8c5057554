//! Content hash → set id, for interning holder sets: linear probing over `id + 1` slots (0 =
//! empty) with backward-shift deletion, so there are no tombstones. A set's 32-bit content hash
//! is kept beside it by the caller (`hashes[id]`); sets with equal hashes are told apart by the
//! caller comparing entries, so interning stays exact.
//!
//! Why not a `HashMap<u64, u32>`: its 16-byte buckets at 44–87 % load cost about 28 bytes per set;
//! these 4-byte slots at 58–88 % load plus the 4-byte hash cost about 10, which matters when
//! nearly every block has its own holder set.

#[derive(Default)]
pub(super) struct SetIndex {
    slots: Vec<u32>,
    len: usize,
}

const MIN_SLOTS: usize = 16;

impl SetIndex {
    #[inline]
    fn home(&self, h: u32) -> usize {
        ((u64::from(h) * self.slots.len() as u64) >> 32) as usize
    }

    #[inline]
    fn next(&self, pos: usize) -> usize {
        if pos + 1 == self.slots.len() {
            0
        } else {
            pos + 1
        }
    }

    /// The first id with hash `h` that `same` accepts.
    pub(super) fn find(
        &self,
        h: u32,
        hashes: &[u32],
        mut same: impl FnMut(u32) -> bool,
    ) -> Option<u32> {
        if self.slots.is_empty() {
            return None;
        }
        let mut pos = self.home(h);
        loop {
            let id = self.slots[pos].checked_sub(1)?;
            if hashes.get(id as usize) == Some(&h) && same(id) {
                return Some(id);
            }
            pos = self.next(pos);
        }
    }

    /// Add `id`, whose hash is `hashes[id]`.
    pub(super) fn insert(&mut self, id: u32, hashes: &[u32]) {
        if (self.len + 1) * 8 > self.slots.len() * 7 {
            self.grow(hashes);
        }
        self.place(id, hashes);
        self.len += 1;
    }

    fn place(&mut self, id: u32, hashes: &[u32]) {
        let mut pos = self.home(hashes.get(id as usize).copied().unwrap_or(0));
        while self.slots[pos] != 0 {
            pos = self.next(pos);
        }
        self.slots[pos] = id + 1;
    }

    fn grow(&mut self, hashes: &[u32]) {
        let old = std::mem::take(&mut self.slots);
        // Double while small, then by half, as the block index does: the load stays high.
        let cap = if old.len() < 4096 {
            (old.len() * 2).max(MIN_SLOTS)
        } else {
            old.len() + old.len() / 2
        };
        self.slots = vec![0; cap];
        for s in old.into_iter().filter(|&s| s != 0) {
            self.place(s - 1, hashes);
        }
    }

    /// Remove `id` (hash `hashes[id]`) if present.
    pub(super) fn remove(&mut self, id: u32, hashes: &[u32]) {
        if self.slots.is_empty() {
            return;
        }
        let mut hole = self.home(hashes.get(id as usize).copied().unwrap_or(0));
        loop {
            match self.slots[hole] {
                0 => return,
                s if s == id + 1 => break,
                _ => hole = self.next(hole),
            }
        }
        // Knuth's deletion for linear probing: move back each later entry of the cluster whose
        // home is not between the hole and its slot.
        let mut pos = hole;
        loop {
            pos = self.next(pos);
            let s = self.slots[pos];
            if s == 0 {
                break;
            }
            let home = self.home(hashes.get(s as usize - 1).copied().unwrap_or(0));
            let stays = if hole <= pos {
                hole < home && home <= pos
            } else {
                hole < home || home <= pos
            };
            if !stays {
                self.slots[hole] = s;
                hole = pos;
            }
        }
        self.slots[hole] = 0;
        self.len -= 1;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::super::mix64;
    use super::*;

    #[test]
    fn colliding_hashes_wrap_and_shift_back_on_removal() {
        // Few distinct hashes: long clusters, many entries per hash, wrapping past the end.
        let hashes: Vec<u32> = (0..3000u64)
            .map(|i| (mix64(i % 37) >> 32) as u32 | 0xF000_0000)
            .collect();
        let mut ix = SetIndex::default();
        let mut live = HashSet::new();
        let mut x = 7u64;
        for step in 0..20_000u32 {
            x = mix64(x);
            let id = (x % 3000) as u32;
            if live.contains(&id) {
                if x >> 63 == 0 {
                    ix.remove(id, &hashes);
                    live.remove(&id);
                }
            } else {
                ix.insert(id, &hashes);
                live.insert(id);
            }
            if step % 1000 == 0 {
                assert_eq!(ix.len, live.len());
                for id in 0..3000u32 {
                    let found = ix.find(hashes[id as usize], &hashes, |c| c == id);
                    assert_eq!(found.is_some(), live.contains(&id), "step {step} id {id}");
                }
            }
        }
        assert_eq!(
            ix.slots.iter().filter(|&&s| s != 0).count(),
            live.len(),
            "no tombstones"
        );
    }
}
