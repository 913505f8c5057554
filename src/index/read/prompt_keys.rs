//! The keys a query walks: a prompt's derived keys (with the registered profile's hashes as the
//! second key while the index holds blocks by published hash), or a list of published hashes
//! translated through the context's aliases.

use crate::hashing::derived::{BlockRule, ChainTuning, DerivedChain};
use crate::hashing::{BlockHasher, HashChain, PrefixKeys, Strategy, Token};
use crate::model::BlockHash;

/// A query prompt's keys: derived keys first, the registered profile's hash chain as the
/// second key, hashed only when the walk asks (see [`PrefixKeys::alt_key`]).
pub(in crate::index) struct TokenKeys<'a, T> {
    derived: DerivedChain<'a, T>,
    registered: HashChain<'a, T>,
}

impl<'a, T: Token> TokenKeys<'a, T> {
    pub(in crate::index) fn new(
        hasher: &'a BlockHasher,
        (strategy, tuning): (Strategy, ChainTuning),
        block_size: u32,
        tokens: &'a [T],
        cache_salt: &str,
    ) -> Self {
        TokenKeys {
            derived: DerivedChain::tuned(
                BlockRule::of(strategy),
                block_size,
                tokens,
                cache_salt,
                tuning,
            ),
            registered: hasher.chain(block_size, tokens),
        }
    }
}

impl<T: Token> PrefixKeys for TokenKeys<'_, T> {
    fn num_blocks(&self) -> usize {
        self.derived.num_blocks()
    }
    fn key(&mut self, i: usize) -> BlockHash {
        self.derived.key(i)
    }
    fn alt_key(&mut self, i: usize) -> Option<BlockHash> {
        self.registered.try_key(i)
    }
    fn covered(&self, n: usize) -> u64 {
        self.derived.covered(n)
    }
}

/// Published hashes of a prompt's blocks (query by hash): each one's alias when the context has
/// one, with the hash itself as the second key; every block is complete.
pub(in crate::index) struct AliasedHashes {
    pub(in crate::index) hashes: Vec<BlockHash>,
    pub(in crate::index) aliases: Vec<Option<u64>>,
    pub(in crate::index) block_size: u32,
}

impl PrefixKeys for AliasedHashes {
    fn num_blocks(&self) -> usize {
        self.hashes.len()
    }
    fn key(&mut self, i: usize) -> BlockHash {
        match self.aliases.get(i).copied().flatten() {
            Some(key) => BlockHash(key),
            None => self.hashes.get(i).copied().unwrap_or(BlockHash(0)),
        }
    }
    fn alt_key(&mut self, i: usize) -> Option<BlockHash> {
        self.hashes.get(i).copied()
    }
    fn covered(&self, n: usize) -> u64 {
        (n.min(self.hashes.len()) as u64).saturating_mul(u64::from(self.block_size))
    }
}
