//! The splitmix64 finalizer, the one bit mixer of the project: the index mixes its keys with it,
//! and the seeded test generator ([`crate::test_rng`]) is splitmix64 built on it. A leaf: it
//! imports nothing.

/// A bijective mix, so distinct keys never collide after mixing, and sequential or
/// adversarially structured keys still spread over shards and slots.
#[inline]
pub const fn mix64(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
