//! Rows of one answer that repeat an earlier row's values. Instances holding the same prefix on
//! the same ranks (every instance caching only the system prompt, every instance without a hit)
//! differ in their id alone, so both answer encoders write each distinct row value once and copy
//! it, from the reply itself, for the rows that repeat it.

use crate::index::RowView;

/// The last few distinct row values written, by where they lie in the reply.
#[derive(Default)]
pub(super) struct Recent<'a> {
    rows: [Option<(RowView<'a>, usize, usize)>; 4],
    next: usize,
}

impl<'a> Recent<'a> {
    /// Where a row value equal to `row`'s was written: its start and length.
    pub(super) fn find(&self, row: &RowView<'a>) -> Option<(usize, usize)> {
        (self.rows.iter().flatten())
            .find(|(seen, _, _)| seen.same_values(row))
            .map(|&(_, at, len)| (at, len))
    }

    pub(super) fn remember(&mut self, row: RowView<'a>, at: usize, len: usize) {
        self.rows[self.next] = Some((row, at, len));
        self.next = (self.next + 1) % self.rows.len();
    }
}
