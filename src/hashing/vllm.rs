//! vLLM v1 block hashing (`hash_block_tokens`; `docs/engine-events.md`, "vLLM (`vllm_v1`)"):
//! each complete block is `SHA256(encode((parent_digest, tuple(tokens), extra_keys)))`, with the
//! encoding picked by the algorithm (canonical CBOR or pickle protocol 5).
//!
//! `extra_keys` is `(lora_name,)` on every block when a LoRA is set, with `cache_salt` appended
//! on block 0 only, and `None` when both are empty. The parent is always the previous block's full
//! 32-byte digest (the root for block 0); only the index key is projected to 64 bits.

use super::{Algorithm, Token, cbor, pickle, sha};

/// The per-request part of a vLLM block, prepared once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VllmExtras {
    algorithm: Algorithm,
    lora_name: Box<str>,
    cache_salt: Box<str>,
    /// Encoded CBOR `extra_keys` of block 0 and of every later block.
    cbor_first: Box<[u8]>,
    cbor_rest: Box<[u8]>,
}

impl VllmExtras {
    pub fn new(algorithm: Algorithm, lora_name: &str, cache_salt: &str) -> Self {
        let (cbor_first, cbor_rest) = if algorithm == Algorithm::Sha256Cbor {
            (
                cbor::extras(lora_name, cache_salt).into(),
                cbor::extras(lora_name, "").into(),
            )
        } else {
            (Box::default(), Box::default())
        };
        VllmExtras {
            algorithm,
            lora_name: lora_name.into(),
            cache_salt: cache_salt.into(),
            cbor_first,
            cbor_rest,
        }
    }

    /// Serialize block `(parent, tokens)` into `buf`; `first` selects block 0's extras (salt).
    pub fn encode<T: Token>(
        &self,
        buf: &mut Vec<u8>,
        parent: &[u8; 32],
        tokens: &[T],
        first: bool,
    ) {
        match self.algorithm {
            Algorithm::Sha256Cbor => {
                let extras = if first {
                    &self.cbor_first
                } else {
                    &self.cbor_rest
                };
                cbor::encode_block(buf, parent, tokens, extras);
            }
            // `Sha256Raw` never reaches here: profiles pair it with the SGLang strategies only.
            Algorithm::Sha256 | Algorithm::Sha256Raw => {
                let salt = if first { &*self.cache_salt } else { "" };
                pickle::encode_block(buf, parent, tokens, &self.lora_name, salt);
            }
        }
    }

    /// The full digest of one block, using `buf` as scratch.
    #[inline]
    pub fn digest<T: Token>(
        &self,
        buf: &mut Vec<u8>,
        parent: &[u8; 32],
        tokens: &[T],
        first: bool,
    ) -> [u8; 32] {
        if self.algorithm == Algorithm::Sha256Cbor {
            let extras = if first {
                &self.cbor_first
            } else {
                &self.cbor_rest
            };
            return cbor::digest_block(buf, parent, tokens, extras);
        }
        self.encode(buf, parent, tokens, first);
        sha::digest_in_place(buf)
    }
}
