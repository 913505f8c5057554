//! Bringing a block's cache lines in before the walk gets to it.
//!
//! A walk step costs two dependent cache misses (the block's slot, then its record). The walk
//! asks for the lines of the blocks a few steps ahead (`lookahead::PREFETCH_AHEAD`), so the misses of
//! consecutive blocks overlap instead of adding up: the slot line first, then, once that is in,
//! the record line its slot names.

pub(crate) use crate::prefetch::prefetch;
