//! splitmix64: a tiny seedable generator shared by the randomized unit tests, the integration
//! tests and the benchmarks (fixed seeds, so a failure names a seed that replays it, and a
//! benchmark draws the same data on every machine). Not for anything an adversary can see.
//!
//! Its output step is [`mix64`], the finalizer the index also mixes its keys with.

pub use crate::mix::mix64;

/// splitmix64's increment (the golden ratio in 64 bits).
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// Advance `state` by one step and return the next value.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(GAMMA);
    mix64(*state)
}

/// A splitmix64 generator seeded with its field.
pub struct Rng(pub u64);

impl Rng {
    #[allow(clippy::should_implement_trait)] // an infinite stream, not an `Iterator`'s `Option`
    pub fn next(&mut self) -> u64 {
        splitmix64(&mut self.0)
    }

    /// Uniform-enough in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}
