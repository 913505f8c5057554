//! A holder's reverse list of block references, stored in chunks that never move.
//!
//! A growing `Vec` doubles its buffer: each reallocation copies the list and frees the old buffer,
//! and the holes and the unused half of the last buffer stay resident. Here the list is a series
//! of chunks whose sizes double from [`FIRST`] up to [`MAX`] references and then stay at [`MAX`]:
//! a push never copies, and the slack is at most one chunk per holder (a few KiB), however long
//! the list grows, while a holder with a handful of blocks still costs a handful of words.

use crate::index::table::BlockRef;

/// References in the first chunk.
const FIRST: usize = 16;
/// References in every chunk from the one that reaches this size on (4 KiB of references).
const MAX: usize = 1024;

/// An append-only list of block references (see the module doc); only [`RefList::compact`]
/// removes any.
#[derive(Default)]
pub(crate) struct RefList {
    /// Every chunk but the last is full; the last holds `len` minus the others' sizes.
    chunks: Vec<Box<[BlockRef]>>,
    len: usize,
    /// The chunks' total size.
    cap: usize,
}

/// The size of chunk `i`.
#[inline]
fn chunk_size(i: usize) -> usize {
    if i >= (MAX / FIRST).trailing_zeros() as usize {
        MAX
    } else {
        FIRST << i
    }
}

impl RefList {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Append `r`. Inlined into the store path, where it runs once per new (block, holder)
    /// pair; only a new chunk is a call (it was a call per push, about 3 % of apply's
    /// instructions on the side-by-side benchmark).
    #[inline]
    pub(crate) fn push(&mut self, r: BlockRef) {
        match self.chunks.last_mut() {
            Some(chunk) if self.len < self.cap => {
                let at = chunk.len() - (self.cap - self.len);
                if let Some(slot) = chunk.get_mut(at) {
                    *slot = r;
                }
                self.len += 1;
            }
            _ => self.push_chunk(r),
        }
    }

    /// Append `r` in a new chunk.
    #[cold]
    #[inline(never)]
    fn push_chunk(&mut self, r: BlockRef) {
        let mut chunk = vec![0; chunk_size(self.chunks.len())].into_boxed_slice();
        chunk[0] = r;
        self.cap += chunk.len();
        self.chunks.push(chunk);
        self.len += 1;
    }

    /// The references from position `from` on (none when `from >= len`), in push order.
    pub(crate) fn iter_from(&self, from: usize) -> impl Iterator<Item = BlockRef> + '_ {
        let mut start = 0;
        self.chunks.iter().flat_map(move |chunk| {
            let (lo, hi) = (start, (start + chunk.len()).min(self.len));
            start += chunk.len();
            let from = from.clamp(lo, hi);
            chunk[from - lo..hi - lo].iter().copied()
        })
    }

    /// Every reference, in push order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = BlockRef> + '_ {
        self.iter_from(0)
    }

    /// Drop one reference per element of `gone` (references whose pairs went, in any order;
    /// emptied), sorted, in chunks sized for what is left. A reference in `gone` that is not in
    /// the list is skipped. No table lookup: the multiset difference is exact as long as every
    /// pair that went put its reference in `gone` (a record reused by a later block of the same
    /// holder then appears twice in the list and once in `gone`).
    pub(crate) fn compact_without(&mut self, gone: &mut Vec<BlockRef>) {
        let mut refs: Vec<BlockRef> = self.iter().collect();
        refs.sort_unstable();
        gone.sort_unstable();
        let mut left = Vec::with_capacity(refs.len().saturating_sub(gone.len()));
        let mut g = gone.iter().peekable();
        for r in refs {
            while g.next_if(|&&x| x < r).is_some() {}
            if g.next_if(|&&x| x == r).is_none() {
                left.push(r);
            }
        }
        gone.clear();
        *self = RefList::default();
        left.into_iter().for_each(|r| self.push(r));
    }

    /// Keep only the references `keep` accepts, sorted and without duplicates, in chunks sized
    /// for what is left.
    pub(crate) fn compact(&mut self, keep: impl FnMut(&BlockRef) -> bool) {
        let mut refs: Vec<BlockRef> = self.iter().filter(keep).collect();
        refs.sort_unstable();
        refs.dedup();
        *self = RefList::default();
        refs.into_iter().for_each(|r| self.push(r));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_iterate_and_compact() {
        let mut list = RefList::default();
        assert_eq!(list.iter().count(), 0);
        let n = 5000u32;
        for r in 0..n {
            list.push(r);
        }
        assert_eq!(list.len(), n as usize);
        assert!(list.iter().eq(0..n));
        for from in [0, 1, 15, 16, 17, 48, 1008, 1009, 2032, 4999, 5000, 6000] {
            assert!(
                list.iter_from(from).eq(from.min(n as usize) as u32..n),
                "{from}"
            );
        }
        // The chunks never hold more than one chunk of slack.
        let cap: usize = list.chunks.iter().map(|c| c.len()).sum();
        assert_eq!(cap, list.cap);
        assert!(cap - list.len() < MAX);
        assert!(
            list.chunks
                .iter()
                .enumerate()
                .all(|(i, c)| c.len() == chunk_size(i))
        );
        for r in (0..n).rev() {
            list.push(r % 7);
        }
        list.compact(|&r| r % 2 == 0);
        assert!(list.iter().eq((0..n).filter(|r| r % 2 == 0)));
        assert_eq!(list.len(), n as usize / 2);
        list.compact(|_| false);
        assert_eq!((list.len(), list.chunks.len()), (0, 0));
    }

    #[test]
    fn compaction_without_gone_references_subtracts_each_once() {
        let mut list = RefList::default();
        // 7 joined twice: its record was reused by a later block of the same holder.
        [5, 7, 3, 7, 9, 11, 2]
            .into_iter()
            .for_each(|r| list.push(r));
        // 7 went once (the earlier block), 3 and 11 went, 40 was never listed.
        let mut gone = vec![11, 7, 40, 3];
        list.compact_without(&mut gone);
        assert!(gone.is_empty());
        assert_eq!(list.iter().collect::<Vec<_>>(), vec![2, 5, 7, 9]);
        let mut all = vec![2, 5, 7, 9, 9];
        list.compact_without(&mut all);
        assert_eq!(list.len(), 0);
    }
}
