//! SGLang's page hash (`mem_cache/utils.py`, `cpp_utils/hash_binding.cpp`;
//! `docs/engine-events.md`, "SGLang") and the namespaces it applies to published hashes.
//!
//! A page is `SHA256([prior 32 bytes] || u32_le(word)...)`, where the words are the page's tokens
//! (or, for bigram keys, both tokens of each adjacent pair). If any raw token the page reads is
//! above `u32::MAX`, the page is `SHA256([prior] || 0xff || u64_le(word)...)` instead.
//!
//! Token values: SGLang keeps token ids as int64 and its native hash reads them as `uint64`,
//! refusing anything above `i64::MAX`, i.e. every negative id. Here a token is widened to its
//! 64-bit two's complement (`t as i64 as u64`), so a negative token makes its page "wide" with a
//! word above `i64::MAX`. SGLang never publishes such a page, so the page and every later one
//! are guaranteed misses rather than collisions with a real page: a false miss, never a false hit.

use super::{BlockHash, Token, sha};

/// `compute_node_event_hash_values`: the chain of a salted request starts from
/// `SHA256(b"sglang-cache-salt-v1\0" + salt)` instead of no prior.
const CACHE_SALT_DOMAIN: &[u8] = b"sglang-cache-salt-v1\0";

/// `kv_event_namespace_seed`: the seed of the published-hash namespace.
const EVENT_NAMESPACE_DOMAIN: &[u8] = b"sglang-kv-event-namespace-v1";

/// The prior of the first page of a salted chain; `None` for no salt (`""` is no salt, as in
/// SGLang, which normalizes an empty salt to `None`).
pub fn salt_prior(cache_salt: &str) -> Option<[u8; 32]> {
    if cache_salt.is_empty() {
        return None;
    }
    let mut buf = Vec::with_capacity(CACHE_SALT_DOMAIN.len() + cache_salt.len() + 72);
    buf.extend_from_slice(CACHE_SALT_DOMAIN);
    buf.extend_from_slice(cache_salt.as_bytes());
    Some(sha::digest_in_place(&mut buf))
}

/// SGLang's namespace seed `SHA256(domain || part(extra_key) || part(cache_salt))` with
/// `part(None) = 00` and `part(s) = 01 || u64_le(len) || utf8`.
pub fn event_namespace_seed(extra_key: Option<&str>, cache_salt: Option<&str>) -> [u8; 32] {
    let mut buf = Vec::with_capacity(EVENT_NAMESPACE_DOMAIN.len() + 100);
    buf.extend_from_slice(EVENT_NAMESPACE_DOMAIN);
    for part in [extra_key, cache_salt] {
        match part {
            None => buf.push(0),
            Some(s) => {
                buf.push(1);
                buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
                buf.extend_from_slice(s.as_bytes());
            }
        }
    }
    sha::digest_in_place(&mut buf)
}

/// The namespace seed of a LoRA request's published hashes, or `None` for the base model.
///
/// SGLang (default event format) seeds with `extra_key` and no salt, where `extra_key` ends with
/// the adapter's 32-hex uuid that is never published; the Conductor cannot know it. The closest
/// reproducible rule is SGLang's own seed function with the LoRA name in place of `extra_key`:
/// keys of different adapters, and of an adapter and the base model, stay apart (no false hit),
/// and they do not equal what a live SGLang publishes for LoRA blocks (a false miss) unless the
/// ingestion side re-keys LoRA blocks with this same rule.
pub fn lora_event_seed(lora_name: &str) -> Option<[u8; 32]> {
    if lora_name.is_empty() {
        None
    } else {
        Some(event_namespace_seed(Some(lora_name), None))
    }
}

/// `namespaced_block_hash`: the published hash of a page in a namespace is the first 8 bytes of
/// `SHA256(seed || i64_be(h))`, where `h` is the page's own `first64_be` value. Those 8 bytes
/// are exactly the digest's first 8 bytes, so no integer round trip is needed.
pub fn namespaced_key(seed: &[u8; 32], digest: &[u8; 32]) -> BlockHash {
    let mut buf = Vec::with_capacity(64);
    buf.extend_from_slice(seed);
    buf.extend_from_slice(&digest[..8]);
    let d = sha::digest_in_place(&mut buf);
    BlockHash(u64::from_be_bytes([
        d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7],
    ]))
}

#[inline(always)]
fn word<T: Token>(t: T) -> u64 {
    t.to_i64() as u64
}

fn start_page(buf: &mut Vec<u8>, prior: Option<&[u8; 32]>) {
    buf.clear();
    if let Some(p) = prior {
        buf.extend_from_slice(p);
    }
}

/// One page of single-token units.
pub fn hash_page<T: Token>(buf: &mut Vec<u8>, prior: Option<&[u8; 32]>, tokens: &[T]) -> [u8; 32] {
    start_page(buf, prior);
    if tokens.iter().any(|&t| word(t) > u64::from(u32::MAX)) {
        buf.push(0xff);
        for &t in tokens {
            buf.extend_from_slice(&word(t).to_le_bytes());
        }
    } else {
        for &t in tokens {
            buf.extend_from_slice(&(word(t) as u32).to_le_bytes());
        }
    }
    sha::digest_in_place(buf)
}

/// One page of bigram units: `raw` holds the page's `units + 1` raw tokens, and unit `j` is the
/// pair `(raw[j], raw[j + 1])`. Fewer than two raw tokens make an empty page.
pub fn hash_bigram_page<T: Token>(
    buf: &mut Vec<u8>,
    prior: Option<&[u8; 32]>,
    raw: &[T],
) -> [u8; 32] {
    start_page(buf, prior);
    // Like SGLang, the width test covers every raw token the page reads, including the last
    // one, which it shares with the next page.
    let wide = raw.iter().any(|&t| word(t) > u64::from(u32::MAX));
    if wide {
        buf.push(0xff);
    }
    for pair in raw.windows(2) {
        if wide {
            buf.extend_from_slice(&word(pair[0]).to_le_bytes());
            buf.extend_from_slice(&word(pair[1]).to_le_bytes());
        } else {
            buf.extend_from_slice(&(word(pair[0]) as u32).to_le_bytes());
            buf.extend_from_slice(&(word(pair[1]) as u32).to_le_bytes());
        }
    }
    sha::digest_in_place(buf)
}
