//! Holder lists of blocks with two or more holders, packed into one `Vec<u32>` per shard instead
//! of one heap allocation per block (a `Vec` header alone would cost 24 bytes). A list lives in a
//! chunk of `2^class` words: a header word (`len << 5 | class`) and its entries. Freed chunks are
//! kept per class for reuse.

#[derive(Default)]
pub(super) struct Arena {
    pub(super) words: Vec<u32>,
    pub(super) free: Vec<Vec<u32>>,
}

pub(super) const MIN_CLASS: u32 = 2;

/// Chunk offsets stay below this many words, so that a block's 32-bit value can name a chunk as
/// `(offset + 1) << 4` (see `super`). 2^28 words are 1 GiB of holder lists per shard.
pub(super) const MAX_WORDS: usize = (1 << 28) - 1;

impl Arena {
    fn header(&self, off: u32) -> (usize, u32) {
        let h = self.words.get(off as usize).copied().unwrap_or(0);
        ((h >> 5) as usize, h & 31)
    }

    pub(super) fn list(&self, off: u32) -> &[u32] {
        let (len, _) = self.header(off);
        let start = off as usize + 1;
        self.words.get(start..start + len).unwrap_or(&[])
    }

    pub(super) fn list_mut(&mut self, off: u32) -> &mut [u32] {
        let (len, _) = self.header(off);
        let start = off as usize + 1;
        self.words.get_mut(start..start + len).unwrap_or(&mut [])
    }

    /// A chunk holding `items`; `None` only when offsets would pass [`MAX_WORDS`].
    pub(super) fn alloc(&mut self, items: &[u32]) -> Option<u32> {
        let mut class = MIN_CLASS;
        while (1usize << class) <= items.len() {
            class += 1;
        }
        if class > 27 {
            return None;
        }
        let off = match self.free.get_mut(class as usize).and_then(Vec::pop) {
            Some(off) => off,
            None => {
                let off = u32::try_from(self.words.len()).ok()?;
                let end = self
                    .words
                    .len()
                    .checked_add(1 << class)
                    .filter(|&e| e <= MAX_WORDS)?;
                self.words.resize(end, 0);
                off
            }
        };
        let o = off as usize;
        self.words[o] = (items.len() as u32) << 5 | class;
        self.words[o + 1..o + 1 + items.len()].copy_from_slice(items);
        Some(off)
    }

    pub(super) fn release(&mut self, off: u32) {
        let (_, class) = self.header(off);
        if self.free.len() <= class as usize {
            self.free.resize_with(class as usize + 1, Vec::new);
        }
        self.free[class as usize].push(off);
    }

    /// Append `entry`; returns the list's (possibly moved) offset.
    pub(super) fn push(&mut self, off: u32, entry: u32) -> Option<u32> {
        let (len, class) = self.header(off);
        if len + 1 < 1 << class {
            let o = off as usize;
            self.words[o + 1 + len] = entry;
            self.words[o] = ((len + 1) as u32) << 5 | class;
            return Some(off);
        }
        let mut items = self.list(off).to_vec();
        items.push(entry);
        let new = self.alloc(&items)?;
        self.release(off);
        Some(new)
    }

    /// Remove the entry at `pos` (order is not kept); returns the new length.
    pub(super) fn swap_remove(&mut self, off: u32, pos: usize) -> usize {
        let (len, class) = self.header(off);
        let o = off as usize;
        if pos < len {
            self.words[o + 1 + pos] = self.words[o + len];
            self.words[o] = ((len - 1) as u32) << 5 | class;
            return len - 1;
        }
        len
    }
}
