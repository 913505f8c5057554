//! Hash profiles: byte-exact reproductions of each engine's block hash chain.
//!
//! (Skeleton: the full module is being built; the types below are the agreed interface.)

use crate::model::BlockHash;

/// How a full block digest becomes the 64-bit index key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IndexProjection {
    /// vLLM: the last 8 bytes of the digest, big-endian, unsigned.
    Low64Be,
    /// SGLang: the first 8 bytes of the digest, big-endian (SGLang sends them as a signed int64).
    First64Be,
}

impl IndexProjection {
    pub const fn as_str(self) -> &'static str {
        match self {
            IndexProjection::Low64Be => "low64_be",
            IndexProjection::First64Be => "first64_be",
        }
    }

    /// Project a digest (or a raw hash an engine sent as bytes). `None` when shorter than 8 bytes.
    pub fn project(self, digest: &[u8]) -> Option<BlockHash> {
        if digest.len() < 8 {
            return None;
        }
        let bytes: [u8; 8] = match self {
            IndexProjection::Low64Be => digest[digest.len() - 8..].try_into().ok()?,
            IndexProjection::First64Be => digest[..8].try_into().ok()?,
        };
        Some(BlockHash(u64::from_be_bytes(bytes)))
    }
}

/// The keys of a prompt's blocks, produced lazily: block `i` is hashed only when asked for, so a
/// walk that stops early never pays for the tail. Implemented by the engine hash chains and by a
/// plain list of already-projected hashes (query by hash).
pub trait PrefixKeys {
    /// Blocks the prompt spans that can match: complete blocks for `vllm_v1`; for the SGLang
    /// strategies also a final partial block.
    fn num_blocks(&self) -> usize;
    /// The index key of block `i` (`i < num_blocks()`).
    fn key(&mut self, i: usize) -> BlockHash;
    /// Tokens (for `sglang_bigram`: logical positions) covered by the first `n` blocks.
    fn covered(&self, n: usize) -> u64;
}

/// Placeholder until the resolved profile lands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HashProfile;
