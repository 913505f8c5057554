//! Entry lists of the interned holder sets, packed into one `Vec<u32>` per context instead of one
//! heap allocation per set (a `Vec` header alone would cost 24 bytes). A list lives in a chunk: a
//! header word (`len << 6 | class`) and its entries. Sets never change in place, so small chunks
//! have the exact size of their list (class = words, up to [`EXACT_WORDS`]), and larger ones
//! `2^(class - SHIFT)` words, at most twice the list. Freed chunks are kept per class for reuse.

#[derive(Default)]
pub(super) struct Arena {
    pub(super) words: Vec<u32>,
    pub(super) free: Vec<Vec<u32>>,
}

/// Chunks of up to this many words (header included) have their exact size.
const EXACT_WORDS: u32 = 16;
/// A class above [`EXACT_WORDS`] is `log2(words) + SHIFT`: 32 words are class 17.
const SHIFT: u32 = EXACT_WORDS + 1 - 5;
/// Classes fit the header's 6 low bits.
const MAX_CLASS: u32 = 63;

/// Chunk offsets stay below this many words (1 GiB of set entries per context), so that they fit
/// a `u32` with room to spare.
pub(super) const MAX_WORDS: usize = (1 << 28) - 1;

/// The class and size in words of the chunk for a list of `len` entries.
fn class_for(len: usize) -> Option<(u32, usize)> {
    let words = len.checked_add(1)?;
    if words <= EXACT_WORDS as usize {
        return Some((words as u32, words));
    }
    let log = words.next_power_of_two().trailing_zeros();
    let class = log + SHIFT;
    // The header keeps `len` in 26 bits.
    (class <= MAX_CLASS && words <= 1 << 26).then_some((class, 1 << log))
}

impl Arena {
    fn header(&self, off: u32) -> (usize, u32) {
        let h = self.words.get(off as usize).copied().unwrap_or(0);
        ((h >> 6) as usize, h & 63)
    }

    pub(super) fn list(&self, off: u32) -> &[u32] {
        let (len, _) = self.header(off);
        let start = off as usize + 1;
        self.words.get(start..start + len).unwrap_or(&[])
    }

    /// A chunk holding `items`; `None` only when offsets would pass [`MAX_WORDS`].
    pub(super) fn alloc(&mut self, items: &[u32]) -> Option<u32> {
        let (class, size) = class_for(items.len())?;
        let off = match self.free.get_mut(class as usize).and_then(Vec::pop) {
            Some(off) => off,
            None => {
                let off = u32::try_from(self.words.len()).ok()?;
                let end = self
                    .words
                    .len()
                    .checked_add(size)
                    .filter(|&e| e <= MAX_WORDS)?;
                self.words.resize(end, 0);
                off
            }
        };
        let o = off as usize;
        self.words[o] = (items.len() as u32) << 6 | class;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_fit_their_lists_and_are_reused_by_class() {
        assert_eq!(class_for(2), Some((3, 3)));
        assert_eq!(class_for(15), Some((16, 16)));
        assert_eq!(class_for(16), Some((17, 32)));
        assert_eq!(class_for(31), Some((17, 32)));
        assert_eq!(class_for(32), Some((18, 64)));
        let mut a = Arena::default();
        let big: Vec<u32> = (1..=40).collect();
        let (x, y) = (
            a.alloc(&[1, 2]).expect("room"),
            a.alloc(&big).expect("room"),
        );
        assert_eq!((a.list(x), a.list(y)), (&[1, 2][..], &big[..]));
        assert_eq!(a.words.len(), 3 + 64);
        a.release(x);
        a.release(y);
        assert_eq!(
            a.alloc(&[7, 8]),
            Some(x),
            "a freed chunk of the class is reused"
        );
        assert_eq!(a.alloc(&big[..33]), Some(y));
        assert_eq!(a.list(y), &big[..33]);
        assert_eq!(a.words.len(), 3 + 64, "nothing new allocated");
    }
}
