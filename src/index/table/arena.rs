//! Entry lists of the interned holder sets, packed into one `Vec<u32>` per context instead of one
//! heap allocation per set (a `Vec` header alone would cost 24 bytes). A list lives in a chunk of
//! `2^class` words: a header word (`len << 5 | class`) and its entries. Freed chunks are kept per
//! class for reuse.

#[derive(Default)]
pub(super) struct Arena {
    pub(super) words: Vec<u32>,
    pub(super) free: Vec<Vec<u32>>,
}

pub(super) const MIN_CLASS: u32 = 2;

/// Chunk offsets stay below this many words (1 GiB of set entries per context), so that they fit
/// a `u32` with room to spare.
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
}
