//! Hash profiles: byte-exact reproductions of each engine's block hash chain, so a query's
//! tokens produce the same 64-bit keys the engines publish in their KV events.
//!
//! Docs: `docs/python-api.md` (`hash_profile`), `docs/engine-events.md` ("Block hashing"),
//! `docs/reference-behaviour.md` ("Hash profile and chain").
//!
//! | strategy | algorithm | block digest | key |
//! |---|---|---|---|
//! | `vllm_v1` | `sha256_cbor` | `SHA256(cbor((parent, tuple(tokens), extras)))` | `low64_be` |
//! | `vllm_v1` | `sha256` | `SHA256(pickle.dumps(same, protocol=5))` | `low64_be` |
//! | `sglang` | `sha256_raw` | `SHA256([prior] \|\| u32_le tokens)` per page | `first64_be` |
//! | `sglang_bigram` | `sha256_raw` | the same over adjacent token pairs | `first64_be` |
//!
//! Choices the engines leave open, made here:
//! * Root digest of the SGLang strategies (their chains have no root): SHA-256 of
//!   `"mooncake-conductor-root-v1\0" + strategy name`. It identifies the profile only.
//! * SGLang LoRA namespace: SGLang seeds it from `extra_key`, which carries an adapter uuid the
//!   Conductor never sees; the seed here is SGLang's seed function applied to the LoRA name
//!   instead (see [`sglang::lora_event_seed`]). Keys of a LoRA request therefore never collide
//!   with the base model's or another adapter's. They do not match live SGLang LoRA events as
//!   published, which matters only for queries by hash and for blocks the index keeps under
//!   published hashes: engine blocks are keyed by [`derived`] keys, which need no namespace.
//! * SGLang negative token ids: widened to 64-bit two's complement, which makes the page wide
//!   with a word SGLang refuses to hash, so it can only miss (see [`sglang`]).
//!
//! Layout: [`profile`] validation and the resolved [`HashProfile`]; [`chain`] the per-request
//! [`BlockHasher`], the single-block [`BlockHasher::step`] and the lazy [`HashChain`];
//! [`cbor`], [`pickle`] the two vLLM encoders; [`vllm`] and [`sglang`] the block hashes;
//! `sha` a one-shot SHA-256 over a reused buffer.
//!
//! The index keys engine blocks by [`derived`] keys computed from their tokens; the profiles here
//! serve the runtime hash check (which also names the engine's recipe when it is not the
//! registered one), queries of blocks kept under published hashes, and queries by hash.
//!
//! Query side: `profile.hasher(lora, salt).chain(block_size, &tokens)` then
//! [`PrefixKeys::key`] per block. Ingestion side: `hasher.step(parent_digest, block_tokens, buf)`
//! with `None` as the parent of a chain's first block.

pub mod cbor;
pub mod chain;
pub mod derived;
pub mod pickle;
pub mod profile;
pub mod sglang;
mod sha;
pub mod vllm;

#[cfg(test)]
mod tests;

pub use chain::{BlockHasher, BlockStep, HashChain};
pub use profile::{Algorithm, HashProfile, ProfileError, Strategy, hex_lower};

/// The 64-bit index key of a block: the projection of the engine's full block digest
/// (`low64_be` for vLLM, `first64_be` for SGLang). Parents in a hash chain are always the full
/// digest; only the index is keyed by this projection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub u64);

impl std::fmt::Display for BlockHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

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
    /// A second key block `i` may be held under: the index keys engine blocks by derived keys
    /// and keeps blocks it could not derive under their published hashes, so a query from
    /// tokens also offers the registered profile's hash. Asked for only while the index holds
    /// any block by its published hash.
    fn alt_key(&mut self, _i: usize) -> Option<BlockHash> {
        None
    }
    /// Tokens (for `sglang_bigram`: logical positions) covered by the first `n` blocks.
    fn covered(&self, n: usize) -> u64;
    /// The keys computed so far, from block 0: a walk may read ahead through them without
    /// asking for any hashing (none by default).
    fn known(&self) -> &[BlockHash] {
        &[]
    }
}

/// A token id as the chains read it. Queries carry `i32`, engine events `i64`; both hash
/// through their `i64` value, so a chain borrows either slice without copying it.
pub trait Token: Copy + private::Sealed {
    /// Whether the type holds values whose CBOR argument exceeds `u32::MAX` (a 9-byte int);
    /// false lets the encoder drop that case for 32-bit tokens.
    const WIDE: bool;
    fn to_i64(self) -> i64;
}

impl Token for i32 {
    const WIDE: bool = false;
    #[inline(always)]
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
}

impl Token for i64 {
    const WIDE: bool = true;
    #[inline(always)]
    fn to_i64(self) -> i64 {
        self
    }
}

impl Token for u32 {
    const WIDE: bool = false;
    #[inline(always)]
    fn to_i64(self) -> i64 {
        i64::from(self)
    }
}

mod private {
    /// Only the integer types above are tokens: the encoders depend on their value range.
    pub trait Sealed {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
    impl Sealed for u32 {}
}
