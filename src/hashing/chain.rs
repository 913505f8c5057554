//! The per-request hasher and the lazy chain over a prompt's blocks.
//!
//! [`BlockHasher`] binds a resolved profile to one request's LoRA name and cache salt, with
//! everything that does not depend on the tokens prepared once (encoded extras, salt prior,
//! LoRA namespace seed). [`HashChain`] walks a prompt with it, hashing block `i` only when a
//! caller first asks for a key at or past `i`.

use super::vllm::VllmExtras;
use super::{BlockHash, HashProfile, IndexProjection, PrefixKeys, Strategy, Token, sglang};

/// One hashed block: the full digest (the parent of the next block) and its index key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockStep {
    /// The engine's full block digest; chains continue from this, never from `key`.
    pub digest: [u8; 32],
    /// The index key: the profile's projection of `digest`, namespaced for SGLang LoRA requests.
    pub key: BlockHash,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Prepared {
    Vllm {
        root: [u8; 32],
        extras: VllmExtras,
    },
    Sglang {
        bigram: bool,
        salt_prior: Option<[u8; 32]>,
        lora_seed: Option<[u8; 32]>,
    },
}

/// A profile bound to one request's `lora_name` and `cache_salt` (`""` means none for both).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockHasher {
    projection: IndexProjection,
    prepared: Prepared,
}

impl HashProfile {
    /// Prepare hashing for requests with this LoRA name and cache salt.
    pub fn hasher(&self, lora_name: &str, cache_salt: &str) -> BlockHasher {
        let prepared = match self.strategy() {
            Strategy::VllmV1 => Prepared::Vllm {
                root: *self.root_digest(),
                extras: VllmExtras::new(self.algorithm(), lora_name, cache_salt),
            },
            Strategy::Sglang | Strategy::SglangBigram => Prepared::Sglang {
                bigram: self.strategy() == Strategy::SglangBigram,
                salt_prior: sglang::salt_prior(cache_salt),
                lora_seed: sglang::lora_event_seed(lora_name),
            },
        };
        BlockHasher {
            projection: self.index_projection(),
            prepared,
        }
    }

    /// Hash one block outside a chain (the ingestion-side hash check); see [`BlockHasher::step`].
    /// Prepares the request state on every call; keep a [`BlockHasher`] to hash many blocks.
    pub fn hash_block<T: Token>(
        &self,
        parent: Option<&[u8; 32]>,
        tokens: &[T],
        lora_name: &str,
        cache_salt: &str,
    ) -> BlockStep {
        self.hasher(lora_name, cache_salt)
            .step(parent, tokens, &mut Vec::new())
    }
}

impl BlockHasher {
    /// Hash one block given its parent's full digest, `None` at the start of a chain.
    ///
    /// The cache salt enters at the chain start only, which is how both engines scope it:
    /// vLLM adds it to the extra keys of block 0 (whose parent is the root), SGLang seeds the
    /// first page's prior with it. `tokens` are the block's tokens; for `sglang_bigram` they are
    /// the page's raw tokens, one more than its units (a page of `k` pairs spans `k + 1` tokens).
    /// `scratch` is a reusable encode buffer.
    pub fn step<T: Token>(
        &self,
        parent: Option<&[u8; 32]>,
        tokens: &[T],
        scratch: &mut Vec<u8>,
    ) -> BlockStep {
        let digest = match &self.prepared {
            Prepared::Vllm { root, extras } => {
                extras.digest(scratch, parent.unwrap_or(root), tokens, parent.is_none())
            }
            Prepared::Sglang {
                bigram, salt_prior, ..
            } => {
                let prior = if parent.is_some() {
                    parent
                } else {
                    salt_prior.as_ref()
                };
                if *bigram {
                    sglang::hash_bigram_page(scratch, prior, tokens)
                } else {
                    sglang::hash_page(scratch, prior, tokens)
                }
            }
        };
        BlockStep {
            digest,
            key: self.key_of(&digest),
        }
    }

    /// The index key of a full digest.
    pub fn key_of(&self, digest: &[u8; 32]) -> BlockHash {
        if let Prepared::Sglang {
            lora_seed: Some(seed),
            ..
        } = &self.prepared
        {
            return sglang::namespaced_key(seed, digest);
        }
        // Digests are 32 bytes, so the projection always has its 8 bytes.
        self.projection.project(digest).unwrap_or(BlockHash(0))
    }

    /// Units a prompt of `n_tokens` tokens has: tokens, or adjacent pairs for `sglang_bigram`.
    pub fn units(&self, n_tokens: usize) -> usize {
        match self.prepared {
            Prepared::Sglang { bigram: true, .. } => n_tokens.saturating_sub(1),
            _ => n_tokens,
        }
    }

    /// Blocks that can match for a prompt of `n_tokens`: complete blocks for vLLM; for SGLang
    /// also a final partial page. Zero when `block_size` is zero.
    pub fn num_blocks(&self, block_size: u32, n_tokens: usize) -> usize {
        let bs = block_size as usize;
        if bs == 0 {
            return 0;
        }
        let units = self.units(n_tokens);
        match self.prepared {
            Prepared::Vllm { .. } => units / bs,
            Prepared::Sglang { .. } => units.div_ceil(bs),
        }
    }

    /// A lazy chain over `tokens` (query tokens are `i32`, event tokens `i64`); borrows both.
    pub fn chain<'a, T: Token>(&'a self, block_size: u32, tokens: &'a [T]) -> HashChain<'a, T> {
        let num_blocks = self.num_blocks(block_size, tokens.len());
        HashChain {
            hasher: self,
            tokens,
            block_size: block_size as usize,
            num_blocks,
            keys: Vec::new(),
            parent: None,
            scratch: Vec::new(),
        }
    }

    /// The token range block `i` reads (for bigram: its raw tokens, one past its last unit).
    fn block_range(&self, block_size: usize, n_tokens: usize, i: usize) -> (usize, usize) {
        let start = i * block_size;
        let units = self.units(n_tokens);
        let end = (start + block_size).min(units);
        match self.prepared {
            Prepared::Sglang { bigram: true, .. } => (start, end + 1),
            _ => (start, end),
        }
    }
}

/// The keys of one prompt under one [`BlockHasher`], hashed on demand and cached.
pub struct HashChain<'a, T> {
    hasher: &'a BlockHasher,
    tokens: &'a [T],
    block_size: usize,
    num_blocks: usize,
    /// Keys of blocks `0..keys.len()`, the prefix hashed so far.
    keys: Vec<BlockHash>,
    /// Digest of block `keys.len() - 1`; `None` before block 0.
    parent: Option<[u8; 32]>,
    /// The encode buffer every block of this chain reuses.
    scratch: Vec<u8>,
}

impl<T: Token> HashChain<'_, T> {
    /// The key of block `i`, or `None` when `i >= num_blocks()`. Hashes blocks up to `i` that
    /// have not been hashed yet.
    pub fn try_key(&mut self, i: usize) -> Option<BlockHash> {
        if i >= self.num_blocks {
            return None;
        }
        if self.keys.is_empty() {
            // One allocation per chain, sized for the blocks asked for so far.
            self.keys.reserve(i + 1);
        }
        while self.keys.len() <= i {
            let (start, end) =
                self.hasher
                    .block_range(self.block_size, self.tokens.len(), self.keys.len());
            let block = self.tokens.get(start..end)?;
            let step = self
                .hasher
                .step(self.parent.as_ref(), block, &mut self.scratch);
            self.parent = Some(step.digest);
            self.keys.push(step.key);
        }
        self.keys.get(i).copied()
    }

    /// Blocks hashed so far.
    pub fn hashed(&self) -> usize {
        self.keys.len()
    }
}

impl<T: Token> PrefixKeys for HashChain<'_, T> {
    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Out-of-range indexes (a caller bug) return `BlockHash(0)` rather than panic.
    fn key(&mut self, i: usize) -> BlockHash {
        self.try_key(i).unwrap_or(BlockHash(0))
    }

    fn covered(&self, n: usize) -> u64 {
        let blocks = n.min(self.num_blocks);
        let units = self.hasher.units(self.tokens.len());
        (blocks.saturating_mul(self.block_size)).min(units) as u64
    }
}
