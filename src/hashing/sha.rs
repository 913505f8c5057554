//! One-shot SHA-256 over a buffer the caller owns, padded in place and compressed in a single
//! call. The per-block messages are short (about 100 bytes for a 16-token CBOR block), so the
//! streaming `Digest` API's block buffering is a visible share of the cost; this skips it. The
//! compression itself is `sha2`'s, which picks the SHA-NI backend at run time when available.

use sha2::block_api::compress256;

/// FIPS 180-4 initial hash value of SHA-256.
const IV: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// Bytes a message of `len` bytes occupies once padded: the next multiple of 64 that leaves room
/// for the `0x80` marker and the 8-byte length.
pub const fn padded_len(len: usize) -> usize {
    (len + 9).div_ceil(64) * 64
}

/// SHA-256 of `buf`'s contents. Appends the padding to `buf`, so its contents are no longer the
/// message afterwards; callers clear it before the next message.
#[inline]
pub fn digest_in_place(buf: &mut Vec<u8>) -> [u8; 32] {
    let len = buf.len();
    digest_prefix(buf, len)
}

/// SHA-256 of `buf[..len]`, padding in place over whatever follows (growing `buf` if needed).
/// The fast encoders write into a buffer longer than the message, so the message is a prefix.
#[inline]
pub fn digest_prefix(buf: &mut Vec<u8>, len: usize) -> [u8; 32] {
    let total = padded_len(len);
    if buf.len() < total {
        buf.resize(total, 0);
    }
    let Some(tail) = buf.get_mut(len..total) else {
        return [0; 32];
    };
    tail.fill(0);
    tail[0] = 0x80;
    let end = tail.len() - 8;
    tail[end..].copy_from_slice(&((len as u64).wrapping_mul(8)).to_be_bytes());
    let (blocks, _rest) = buf[..total].as_chunks::<64>();
    let mut state = IV;
    compress256(&mut state, blocks);
    let mut out = [0u8; 32];
    for (chunk, word) in out.chunks_exact_mut(4).zip(state) {
        chunk.copy_from_slice(&word.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn matches_streaming_sha256_at_every_padding_length() {
        // Lengths around the 55/56 and 64 byte padding edges, and multi-block messages.
        for len in 0..300usize {
            let msg: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let mut buf = msg.clone();
            let expected: [u8; 32] = Sha256::digest(&msg).into();
            assert_eq!(digest_in_place(&mut buf), expected, "length {len}");
            assert_eq!(buf.len() % 64, 0);
            // As a prefix of a longer buffer with stale bytes after it.
            let mut long = msg.clone();
            long.extend_from_slice(&[0xa5; 200]);
            assert_eq!(
                digest_prefix(&mut long, len),
                expected,
                "prefix of length {len}"
            );
        }
    }
}
