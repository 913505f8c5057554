//! Block keys the Conductor derives itself from token ids, whatever recipe the engine hashes with.
//!
//! An engine's published hash is only reproducible when its recipe is one a `hash_profile` can
//! name. vLLM 0.33 with `PYTHONHASHSEED` unset seeds its chain with the text "vllm-none-hash";
//! its LoRA extra key is the tagged `("lora", name, path)` whose path never reaches us; SGLang
//! namespaces LoRA pages by an adapter uuid we never see. The events carry what identifies a
//! block anyway (its tokens, its parent, the salt and the extras), so the index keys blocks by
//!
//! ```text
//! key(block) = link(key(parent), content(block))      key(parent of block 0) = root(salt)
//! content    = digest of the block's token ids (or bigram units), their count, and the extras
//! ```
//!
//! and keeps the engine's hashes as aliases for what names blocks by hash (removals, parents,
//! query by hash, store objects). The split into `content` and `link` lets ingestion compute the
//! contents outside the context's single writer, which only links them to the parent's key.
//!
//! The block rules (how a prompt splits into blocks) are the registered profile's: `vllm_v1`
//! counts complete blocks, `sglang` also a final partial page, `sglang_bigram` adjacent token
//! pairs. The LoRA adapter is not part of the key: it is part of the context.
//!
//! # The hash
//!
//! Not SHA-256: nothing outside the Conductor reproduces these keys, so they need to be fast and
//! well spread, not a cryptographic commitment. Each step is a 64x64→128-bit multiply folded to 64
//! bits, over two independent lanes so consecutive multiplies overlap; 32-bit token ids go two to
//! an operand, so 16 tokens cost 4 multiplies in the lanes, 1 to finish the digest and 1 to link it
//! (5.5-5.7 ns a block in a tight loop, against 9-10 ns for the schema-4 keys, which took one token
//! per operand and finished the link with another multiply). Keys are 64 bits like the engines'
//! projections, so the collision odds are theirs (about 1 in 10^7 for a context of 10^6 blocks);
//! the shard bits a key inherits (see [`link`]) are the same for every block of a segment, which
//! only makes two blocks of one segment meet in a shard, where the key's other 58 bits still tell
//! them apart. A publisher that crafts colliding blocks only adds its own holder to blocks it could
//! claim anyway; the block table's slot index is seeded per process, so crafted keys cannot aim at
//! one probe cluster.

use super::BlockHash;
use super::Token;
use crate::prefetch::prefetch;

/// Keys a query chain makes room for up front (2 KiB).
const KEYS_RESERVED: usize = 256;

/// How many blocks ahead of the one it hashes a chain asks for its tokens' cache line.
///
/// Why 16 (a whole first burst, 1 KiB of 32-bit tokens at block size 16): a query's tokens come
/// from memory, and a line asked for 4 blocks ahead (about 25 ns of hashing) had not arrived
/// when the loop got there. On the side-by-side benchmark's 2,048-token queries from tokens,
/// means of 5-6 alternated full runs, ours / Dynamo: 4 ahead p99 0.82-0.87, 8 ahead 0.80,
/// 16 ahead 0.74-0.82 (the queries matching 96+ blocks 0.97-1.03 -> 0.93-0.98), 32 ahead 0.85.
const TOKENS_AHEAD: usize = 16;

const K0: u64 = 0xa076_1d64_78bd_642f;
const K1: u64 = 0xe703_7ed1_a0b4_28db;
const K2: u64 = 0x8ebc_6af0_9c88_c6e3;
const K3: u64 = 0x5899_65cc_7537_4cc3;

/// The parent key of an unsalted chain's first block. Roots are even and derived keys odd, so
/// [`link`] knows a chain's first block by its parent.
pub const ROOT: u64 = 0x6d6f_6f6e_6361_6b64;

/// The top bits a derived key inherits within a segment, by default (see [`ChainTuning`]).
pub const SHARD_BITS: u32 = 6;
#[cfg(test)]
const SHARD_MASK: u64 = !0 << (64 - SHARD_BITS);
/// A key whose bits 1..=SEGMENT_BITS are all 0 starts a new segment: about one block in
/// 2^SEGMENT_BITS, 64 (schema 6; it was 16 in schema 5, see `migrations/0006_*`). Why 64: a
/// walk that follows a segment's records reaches the next segment at once and waits there for a
/// slot line and then a record line; with segments four times longer, the p99 of the
/// side-by-side benchmark's 2,048-token queries from tokens went from 0.82 x Dynamo's to 0.68
/// (means of 6 alternated runs; single runs 0.76-0.86 -> 0.61-0.73, see `docs/performance.md`).
/// One in 256 measured the same. Shards stay even: segments still start at random, a few
/// hundred per shard in a context of a few million blocks.
const SEGMENT_BITS: u32 = 6;

/// How a chain's keys keep their blocks together: the top `shard_bits` a key inherits from its
/// parent within a segment, and the segment length (a key whose bits 1..=`segment_bits` are all
/// 0 starts one). Both change what every derived key is, so a store records the tuning its keys
/// were made with and keeps it (`durability::tuning`): a new default applies to new stores, and
/// a store written under another one restarts exactly, every block kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChainTuning {
    shard_bits: u8,
    segment_bits: u8,
}

impl ChainTuning {
    /// The tuning of new stores (see [`SHARD_BITS`], [`SEGMENT_BITS`]).
    pub const DEFAULT: ChainTuning = ChainTuning {
        shard_bits: SHARD_BITS as u8,
        segment_bits: SEGMENT_BITS as u8,
    };

    /// The tuning of every store written before stores recorded theirs (schema 7 and older):
    /// never changes, whatever [`Self::DEFAULT`] becomes.
    pub const UNRECORDED: ChainTuning = ChainTuning {
        shard_bits: 6,
        segment_bits: 6,
    };

    /// A tuning: `shard_bits` in 1..=16, `segment_bits` in 1..=16.
    pub const fn new(shard_bits: u8, segment_bits: u8) -> Option<ChainTuning> {
        if shard_bits >= 1 && shard_bits <= 16 && segment_bits >= 1 && segment_bits <= 16 {
            Some(ChainTuning {
                shard_bits,
                segment_bits,
            })
        } else {
            None
        }
    }

    pub const fn shard_bits(self) -> u8 {
        self.shard_bits
    }

    pub const fn segment_bits(self) -> u8 {
        self.segment_bits
    }

    /// Two bytes, as stores and snapshots carry it.
    pub const fn encode(self) -> [u8; 2] {
        [self.shard_bits, self.segment_bits]
    }

    /// The two bytes as one number, shard bits high: what an atomic or a snapshot's begin mark
    /// holds.
    pub const fn to_bits(self) -> u16 {
        u16::from_be_bytes(self.encode())
    }

    /// The tuning [`Self::to_bits`] made; `None` for anything [`Self::new`] refuses.
    pub fn from_bits(bits: u16) -> Option<ChainTuning> {
        ChainTuning::decode(&bits.to_be_bytes())
    }

    /// The tuning two bytes name; `None` for anything [`Self::new`] refuses.
    pub fn decode(bytes: &[u8]) -> Option<ChainTuning> {
        match bytes {
            [shard, segment] => ChainTuning::new(*shard, *segment),
            _ => None,
        }
    }

    #[inline(always)]
    const fn shard_mask(self) -> u64 {
        !0 << (64 - self.shard_bits as u32)
    }

    #[inline(always)]
    const fn segment_mask(self) -> u64 {
        (1 << self.segment_bits as u32) - 1
    }
}

#[inline(always)]
const fn fold(a: u64, b: u64) -> u64 {
    let p = (a as u128).wrapping_mul(b as u128);
    (p as u64) ^ ((p >> 64) as u64)
}

/// A derived key's own bits, before it takes its parent's shard (see [`link`]).
#[inline(always)]
const fn mixed(parent: u64, content: u64) -> u64 {
    fold(parent ^ K0, content ^ K1) ^ parent.rotate_left(23)
}

/// Chains the content of a block to its parent's key: the block's own key.
///
/// Derived keys are odd and roots even, so a key knows whether its parent is a root. (The
/// published hashes the index keeps where it cannot derive a key are stored as published, odd
/// or even; they meet a derived key only by a 2^-64 chance, see "Keys" in `src/index/README.md`.)
///
/// A key's top [`SHARD_BITS`] pick its shard in the block table, and a key takes them from its
/// parent unless it starts a segment: the first block of a chain (its parent is a root) and
/// about one block in 2^[`SEGMENT_BITS`] (chosen by the key's own bits, so by content, the same
/// for every chain through the block). So the blocks of a prompt come in runs of about 64 in one
/// shard, where a store run takes its records in order and a walk along the prompt reads them
/// side by side, and an engine message touches a few shards instead of one or two blocks in
/// each of ~50. The other 58 bits are the key's own, so two blocks of one shard collide no more
/// often than any two keys did before.
#[inline]
pub const fn link(parent: u64, content: u64) -> u64 {
    link_tuned(ChainTuning::DEFAULT, parent, content)
}

/// [`link`] under `tuning` (the context's, see [`ChainTuning`]).
#[inline(always)]
pub const fn link_tuned(tuning: ChainTuning, parent: u64, content: u64) -> u64 {
    let own = mixed(parent, content) | 1;
    let starts = parent & 1 == 0 || (own >> 1) & tuning.segment_mask() == 0;
    let inherited = tuning.shard_mask() & (starts as u64).wrapping_sub(1);
    (own & !inherited) | (parent & inherited)
}

/// Four words into a lane. When all four are 32-bit values (token ids are) they are packed two
/// to an operand, one multiply for four tokens; otherwise one to an operand, with other
/// constants, so a packed pair never stands for a wide word.
#[inline(always)]
const fn chunk(lane: u64, w: [u64; 4]) -> u64 {
    if (w[0] | w[1] | w[2] | w[3]) >> 32 == 0 {
        fold(lane ^ (w[0] | w[1] << 32), (w[2] | w[3] << 32) ^ K1)
    } else {
        fold(fold(lane ^ w[0], w[1] ^ K2) ^ w[2], w[3] ^ K3)
    }
}

/// The digest from the two lanes, the unit count and the extras. The count and the extras
/// enter after the lanes, never XORed into a lane beside a word (where `extra ^ w` would let
/// one stand in for the other).
#[inline(always)]
const fn digest(a: u64, b: u64, units: usize, extra: u64) -> u64 {
    fold(a ^ K0 ^ units as u64, b ^ K2 ^ extra.rotate_left(29)) ^ a
}

/// The digest of one block's units (token ids, or for bigram blocks the two ids of each pair in
/// order) plus `extra`, a digest of the block's extra keys (0 for none). `units` is the number
/// of units, so a short final page differs from a full one with the same leading ids.
///
/// Words go four at a time into the two lanes in turn (words 0..4 into the first, 4..8 into
/// the second, and so on), a final short group padded with zeros (the unit count tells the
/// padding from real zeros).
pub fn content(words: impl Iterator<Item = i64>, units: usize, extra: u64) -> u64 {
    let (mut a, mut b) = (K2, K3);
    let mut words = words.map(|w| w as u64);
    loop {
        let mut eight = [0u64; 8];
        let mut n = 0;
        for (slot, w) in eight.iter_mut().zip(&mut words) {
            *slot = w;
            n += 1;
        }
        if n == 0 {
            break;
        }
        a = chunk(a, [eight[0], eight[1], eight[2], eight[3]]);
        if n > 4 {
            b = chunk(b, [eight[4], eight[5], eight[6], eight[7]]);
        }
        if n < 8 {
            break;
        }
    }
    digest(a, b, units, extra)
}

/// [`content`] of a slice of tokens (the same digest, eight tokens at a time without the
/// iterator's per-word work; queries and flat event blocks go through here). Inlined so that a
/// chain's loop overlaps the multiplies of consecutive blocks (called, it cost as much as the
/// old, twice-as-long digest).
#[inline(always)]
pub fn content_of<T: Token>(tokens: &[T], extra: u64) -> u64 {
    let w = |t: &T| t.to_i64() as u64;
    let (mut a, mut b) = (K2, K3);
    let mut eights = tokens.chunks_exact(8);
    for q in &mut eights {
        a = chunk(a, [w(&q[0]), w(&q[1]), w(&q[2]), w(&q[3])]);
        b = chunk(b, [w(&q[4]), w(&q[5]), w(&q[6]), w(&q[7])]);
    }
    let rest = eights.remainder();
    if !rest.is_empty() {
        let at = |i: usize| rest.get(i).map_or(0, w);
        a = chunk(a, [at(0), at(1), at(2), at(3)]);
        if rest.len() > 4 {
            b = chunk(b, [at(4), at(5), at(6), at(7)]);
        }
    }
    digest(a, b, tokens.len(), extra)
}

/// A digest of bytes (a cache salt, an extra key's encoding). Never 0, so 0 can mean "none".
pub fn bytes_digest(bytes: &[u8]) -> u64 {
    let words = bytes.chunks(8).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        i64::from_le_bytes(w)
    });
    content(words, bytes.len(), K0).max(1)
}

/// The parent key of block 0 of a chain salted with `cache_salt` ("" = unsalted).
pub fn root(cache_salt: &str) -> u64 {
    if cache_salt.is_empty() {
        ROOT
    } else {
        // A root's parent is a root, so the link starts a segment under any tuning.
        link(ROOT, bytes_digest(cache_salt.as_bytes())) & !1
    }
}

/// How a prompt splits into blocks, from the registered profile's strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockRule {
    /// Complete blocks of tokens only (`vllm_v1`).
    FullBlocks,
    /// Blocks of tokens, a final partial page included (`sglang`).
    PartialFinal,
    /// Blocks of adjacent token pairs, a final partial page included (`sglang_bigram`).
    Bigram,
}

impl BlockRule {
    /// The rule of a profile's strategy.
    pub const fn of(strategy: super::Strategy) -> Self {
        match strategy {
            super::Strategy::VllmV1 => BlockRule::FullBlocks,
            super::Strategy::Sglang => BlockRule::PartialFinal,
            super::Strategy::SglangBigram => BlockRule::Bigram,
        }
    }

    /// Units of a prompt of `n_tokens`: tokens, or adjacent pairs.
    pub const fn units(self, n_tokens: usize) -> usize {
        match self {
            BlockRule::Bigram => n_tokens.saturating_sub(1),
            _ => n_tokens,
        }
    }

    /// Blocks that can match; zero when `block_size` is zero.
    pub const fn num_blocks(self, block_size: u32, n_tokens: usize) -> usize {
        let bs = block_size as usize;
        if bs == 0 {
            return 0;
        }
        let units = self.units(n_tokens);
        match self {
            BlockRule::FullBlocks => units / bs,
            _ => units.div_ceil(bs),
        }
    }
}

/// Link the complete blocks of `n` tokens in `tokens` onto `parent`, pushing each key. Inlined
/// so that a constant `n` at the call makes the block length a constant in the loop.
#[inline(always)]
fn link_blocks<T: Token>(
    tuning: ChainTuning,
    mut parent: u64,
    tokens: &[T],
    n: usize,
    keys: &mut Vec<BlockHash>,
) {
    for block in tokens.chunks_exact(n.max(1)) {
        // A query's tokens are read once, so they come from memory: the walk's misses leave
        // the hardware prefetcher behind (the token loads were half of hashing's time in the
        // side-by-side benchmark).
        prefetch(block.as_ptr().wrapping_add(TOKENS_AHEAD * n));
        parent = link_tuned(tuning, parent, content_of(block, 0));
        keys.push(BlockHash(parent));
    }
}

/// The derived keys of a query prompt, computed on demand like the engine chains, in bursts: a
/// walk asking for block `i` beyond those linked gets the blocks up to `i`, and at least as
/// many again as were linked before (16 at the start), so a walk that stops at block `m` has
/// linked at most `max(2m, 16)` of the prompt's blocks.
///
/// Why bursts: a walk asks for one key per step, and a key computed there waits behind the
/// walk's cache misses, where a tight loop keeps the multiplies of consecutive blocks in flight
/// together (about 9 ns a block alone, 22 ns inside the walk). Measured on a 1M-token full hit
/// from tokens, best of 3 alternated runs: 3.97 -> 3.48 ms; 2,048-token queries unchanged.
pub struct DerivedChain<'a, T> {
    rule: BlockRule,
    tokens: &'a [T],
    block_size: usize,
    num_blocks: usize,
    root: u64,
    tuning: ChainTuning,
    keys: Vec<BlockHash>,
}

impl<'a, T: Token> DerivedChain<'a, T> {
    pub fn new(rule: BlockRule, block_size: u32, tokens: &'a [T], cache_salt: &str) -> Self {
        Self::tuned(rule, block_size, tokens, cache_salt, ChainTuning::DEFAULT)
    }

    /// [`Self::new`] under `tuning` (the context's).
    pub fn tuned(
        rule: BlockRule,
        block_size: u32,
        tokens: &'a [T],
        cache_salt: &str,
        tuning: ChainTuning,
    ) -> Self {
        // The first burst's lines arrive while the walk sets up (see the burst loop).
        let first = tokens.len().min(TOKENS_AHEAD * block_size as usize);
        for i in (0..first).step_by((64 / std::mem::size_of::<T>()).max(1)) {
            prefetch(tokens.as_ptr().wrapping_add(i));
        }
        let num_blocks = rule.num_blocks(block_size, tokens.len());
        DerivedChain {
            rule,
            tokens,
            block_size: block_size as usize,
            num_blocks,
            root: root(cache_salt),
            tuning,
            // Room for the bursts of a usual prompt at once, rather than a reallocation per
            // burst (16, 32, 64, ...); a long prompt grows past it only if the walk gets there.
            keys: Vec::with_capacity(num_blocks.min(KEYS_RESERVED)),
        }
    }

    /// The content digest of block `i` (`i < num_blocks`).
    fn content_of(&self, i: usize) -> u64 {
        let units = self.rule.units(self.tokens.len());
        let start = i * self.block_size;
        let end = (start + self.block_size).min(units);
        match self.rule {
            BlockRule::Bigram => {
                let pairs = self.tokens[start..=end].windows(2);
                let words = pairs.flat_map(|p| [p[0].to_i64(), p[1].to_i64()]);
                content(words, end - start, 0)
            }
            _ => content_of(&self.tokens[start..end], 0),
        }
    }

    /// Blocks linked so far.
    pub fn hashed(&self) -> usize {
        self.keys.len()
    }
}

impl<T: Token> super::PrefixKeys for DerivedChain<'_, T> {
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Out-of-range indexes (a caller bug) return `BlockHash(0)` rather than panic.
    fn key(&mut self, i: usize) -> BlockHash {
        if i >= self.num_blocks {
            return BlockHash(0);
        }
        if i >= self.keys.len() {
            let upto = (i + 1)
                .max(2 * self.keys.len())
                .max(16)
                .min(self.num_blocks);
            self.keys.reserve(upto - self.keys.len());
            let mut parent = self.keys.last().map_or(self.root, |k| k.0);
            let from = self.keys.len();
            if self.rule == BlockRule::FullBlocks {
                // Complete blocks only: walk the token slice block by block, without the per-block
                // bounds and rule arithmetic of `content_of` (a 1M-token prompt's hashing took
                // about twice as long as the digests alone).
                let tokens = self
                    .tokens
                    .get(from * self.block_size..upto * self.block_size)
                    .unwrap_or(&[]);
                // The engines' usual block sizes get a loop whose block length is a constant,
                // so a block's digest unrolls into straight-line multiplies (the side-by-side
                // workload's query hashing: 7.8 -> 6.6 k instructions per query).
                let t = self.tuning;
                match self.block_size {
                    16 => link_blocks(t, parent, tokens, 16, &mut self.keys),
                    32 => link_blocks(t, parent, tokens, 32, &mut self.keys),
                    n => link_blocks(t, parent, tokens, n, &mut self.keys),
                };
            } else {
                for b in from..upto {
                    parent = link_tuned(self.tuning, parent, self.content_of(b));
                    self.keys.push(BlockHash(parent));
                }
            }
        }
        self.keys.get(i).copied().unwrap_or(BlockHash(0))
    }

    fn known(&self) -> &[BlockHash] {
        &self.keys
    }

    fn covered(&self, n: usize) -> u64 {
        let blocks = n.min(self.num_blocks);
        let units = self.rule.units(self.tokens.len());
        (blocks.saturating_mul(self.block_size)).min(units) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hashing::PrefixKeys;

    fn flat(tokens: &[i64], extra: u64) -> u64 {
        content(tokens.iter().copied(), tokens.len(), extra)
    }

    #[test]
    fn contents_differ_by_every_input() {
        let base = flat(&[1, 2, 3, 4, 5, 6, 7, 8], 0);
        let mut seen = std::collections::HashSet::new();
        seen.insert(base);
        // Any one token changed, in either lane, and every length.
        for i in 0..8 {
            let mut t = [1i64, 2, 3, 4, 5, 6, 7, 8];
            t[i] += 1;
            assert!(seen.insert(flat(&t, 0)), "token {i}");
        }
        for n in 0..8 {
            assert!(
                seen.insert(flat(&[1, 2, 3, 4, 5, 6, 7, 8][..n], 0)),
                "len {n}"
            );
        }
        assert!(seen.insert(flat(&[1, 2, 3, 4, 5, 6, 7, 8], 7)), "extra");
        // Swapped tokens and a trailing zero token are other blocks.
        assert!(seen.insert(flat(&[2, 1, 3, 4, 5, 6, 7, 8], 0)));
        assert!(seen.insert(flat(&[1, 2, 3, 4, 5, 6, 7, 8, 0], 0)));
        assert!(seen.insert(flat(&[-1], 0)) && seen.insert(flat(&[u32::MAX as i64], 0)));
    }

    #[test]
    fn the_slice_form_is_the_same_digest() {
        let tokens: Vec<i64> = (0..23).map(|t| t * 7919 - 50).collect();
        for n in 0..tokens.len() {
            let t = &tokens[..n];
            for extra in [0, 9] {
                assert_eq!(content_of(t, extra), flat(t, extra), "{n} tokens");
            }
            let small: Vec<i32> = t.iter().map(|&x| x as i32).collect();
            assert_eq!(content_of(&small, 0), flat(t, 0));
        }
    }

    #[test]
    fn keys_depend_on_the_parent_and_the_salt() {
        let c = flat(&[5; 16], 0);
        assert_ne!(link(ROOT, c), link(root("s"), c));
        assert_ne!(link(root("s"), c), link(root("t"), c));
        assert_eq!(root(""), ROOT);
        assert_eq!(link(ROOT, c) & 1, 1, "derived keys are odd");
        assert_ne!(link(link(ROOT, c), c), link(ROOT, c));
        assert_ne!(bytes_digest(b""), 0);
        assert_ne!(bytes_digest(b"ab"), bytes_digest(b"ab\0"));
    }

    #[test]
    fn a_chain_keeps_its_shard_for_a_segment_of_about_sixty_four_blocks() {
        let shard = |k: u64| k >> (64 - SHARD_BITS);
        let (mut starts, mut first_shards) = (0usize, std::collections::HashSet::new());
        let n = 20_000u64;
        for chain in 0..40u64 {
            let mut parent = if chain % 2 == 0 { ROOT } else { root("salt") };
            assert_eq!(parent & 1, 0, "roots are even");
            for b in 0..n / 40 {
                let c = flat(&[chain as i64, b as i64], 0);
                let key = link(parent, c);
                assert_eq!(key & 1, 1, "derived keys are odd");
                let own = mixed(parent, c) | 1;
                let start = b == 0 || (own >> 1) & ((1 << SEGMENT_BITS) - 1) == 0;
                if start {
                    starts += 1;
                    assert_eq!(key, own, "a segment's first block keeps its own bits");
                } else {
                    assert_eq!(shard(key), shard(parent), "block {b} of chain {chain}");
                    assert_eq!(key & !SHARD_MASK, own & !SHARD_MASK);
                }
                if b == 0 {
                    first_shards.insert(shard(key));
                }
                parent = key;
            }
        }
        // 40 chain starts plus about one block in 64: segments of about 57 blocks here.
        let mean = n as f64 / starts as f64;
        assert!((45.0..70.0).contains(&mean), "mean segment {mean}");
        assert!(first_shards.len() > 20, "{} shards", first_shards.len());
    }

    #[test]
    fn wide_words_never_stand_for_packed_pairs() {
        // The same four-word layout, once as 32-bit tokens packed in pairs and once as wide
        // words equal to those packed pairs.
        let narrow = flat(&[1, 2, 3, 4], 0);
        let wide = flat(&[1 | 2 << 32, 3 | 4 << 32, 0, 0], 0);
        assert_ne!(narrow, wide);
        assert_ne!(flat(&[0, 0, 0, 0], 0), flat(&[0, 0, 0, 1 << 32], 0));
        assert_ne!(flat(&[7; 8], 0), flat(&[7; 7], 0), "padding is not a token");
        assert_ne!(flat(&[0; 8], 0), flat(&[0; 7], 0));
    }

    #[test]
    fn bursts_give_every_block_the_key_its_definition_gives() {
        let tokens: Vec<i32> = (0..1000).map(|t| t * 31 - 7).collect();
        // 16 and 32 take the constant-size loop, the others the general one.
        let cases = [
            (BlockRule::FullBlocks, 16),
            (BlockRule::FullBlocks, 32),
            (BlockRule::FullBlocks, 5),
            (BlockRule::FullBlocks, 64),
            (BlockRule::PartialFinal, 16),
            (BlockRule::Bigram, 16),
        ];
        for (rule, size) in cases {
            let mut chain = DerivedChain::new(rule, size, &tokens, "");
            let n = chain.num_blocks();
            let mut want = Vec::new();
            let mut parent = ROOT;
            for b in 0..n {
                parent = link(parent, chain.content_of(b));
                want.push(parent);
            }
            // Asked out of order and across several bursts (16, 32, 64 blocks).
            for i in [
                n / 2,
                3,
                0,
                17.min(n - 1),
                n - 1,
                16.min(n - 1),
                15.min(n - 1),
            ] {
                assert_eq!(chain.key(i).0, want[i], "{rule:?} size {size} block {i}");
            }
            assert_eq!(chain.hashed(), n, "{rule:?} size {size}");
            assert_eq!(
                chain.key(n),
                BlockHash(0),
                "{rule:?} size {size}: out of range"
            );
        }
    }

    #[test]
    fn a_chain_links_block_contents_lazily_by_the_block_rule() {
        let tokens: Vec<i32> = (1..=10).collect();
        let mut full = DerivedChain::new(BlockRule::FullBlocks, 4, &tokens, "");
        assert_eq!(full.num_blocks(), 2);
        let k1 = full.key(1);
        assert_eq!(full.hashed(), 2);
        let c0 = flat(&[1, 2, 3, 4], 0);
        let c1 = flat(&[5, 6, 7, 8], 0);
        assert_eq!(full.key(0).0, link(ROOT, c0));
        assert_eq!(k1.0, link(link(ROOT, c0), c1));
        assert_eq!((full.covered(2), full.covered(9)), (8, 8));

        let mut partial = DerivedChain::new(BlockRule::PartialFinal, 4, &tokens, "");
        assert_eq!(partial.num_blocks(), 3);
        assert_eq!(partial.key(1), k1);
        let last = link(k1.0, flat(&[9, 10], 0));
        assert_eq!((partial.key(2).0, partial.covered(3)), (last, 10));

        // Bigram: 10 tokens are 9 pairs; block 0 holds pairs (1,2)..(4,5).
        let mut bigram = DerivedChain::new(BlockRule::Bigram, 4, &tokens, "");
        assert_eq!(bigram.num_blocks(), 3);
        // The unit count (4 pairs), not the word count (8 ids), enters the digest.
        let pairs0 = content([1, 2, 2, 3, 3, 4, 4, 5].into_iter(), 4, 0);
        assert_ne!(pairs0, flat(&[1, 2, 2, 3, 3, 4, 4, 5], 0));
        assert_eq!(bigram.key(0).0, link(ROOT, pairs0));
        assert_eq!(bigram.covered(3), 9);

        let mut salted = DerivedChain::new(BlockRule::FullBlocks, 4, &tokens, "s");
        assert_eq!(salted.key(0).0, link(root("s"), c0));
        assert_eq!(salted.key(5), BlockHash(0), "out of range");
    }
}
