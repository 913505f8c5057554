//! The canonical CBOR subset vLLM's `sha256_cbor` hashes (`cbor2.dumps(value, canonical=True)`):
//! unsigned and negative integers, byte and text strings, definite arrays and `null`, every head
//! in its shortest form (RFC 8949 §4.2.1). Written by hand into a caller's buffer because this is
//! the per-block hot path; the tests cross-check it against ciborium.

/// CBOR major types used here.
const MAJOR_UNSIGNED: u8 = 0;
const MAJOR_NEGATIVE: u8 = 1;
const MAJOR_BYTES: u8 = 2;
const MAJOR_TEXT: u8 = 3;
const MAJOR_ARRAY: u8 = 4;

/// `null`, which is how `None` (no extra keys) encodes.
pub const NULL: u8 = 0xf6;

/// A head (major type + argument) in its shortest form, and how many of the 9 bytes it uses.
#[inline(always)]
fn head_bytes(major: u8, arg: u64) -> ([u8; 9], usize) {
    let m = major << 5;
    let mut out = [0u8; 9];
    let len = if arg < 24 {
        out[0] = m | arg as u8;
        1
    } else if arg <= u64::from(u8::MAX) {
        out[..2].copy_from_slice(&[m | 24, arg as u8]);
        2
    } else if arg <= u64::from(u16::MAX) {
        out[0] = m | 25;
        out[1..3].copy_from_slice(&(arg as u16).to_be_bytes());
        3
    } else if arg <= u64::from(u32::MAX) {
        out[0] = m | 26;
        out[1..5].copy_from_slice(&(arg as u32).to_be_bytes());
        5
    } else {
        out[0] = m | 27;
        out[1..].copy_from_slice(&arg.to_be_bytes());
        9
    };
    (out, len)
}

/// Write a head (major type + argument) in its shortest form.
#[inline(always)]
pub fn write_head(buf: &mut Vec<u8>, major: u8, arg: u64) {
    let (bytes, len) = head_bytes(major, arg);
    buf.extend_from_slice(&bytes[..len]);
}

/// A signed integer: major 0 for `v >= 0`, major 1 carrying `-1 - v` otherwise.
#[inline(always)]
pub fn write_int(buf: &mut Vec<u8>, v: i64) {
    if v >= 0 {
        write_head(buf, MAJOR_UNSIGNED, v as u64);
    } else {
        // `-1 - v` never overflows for negative `v`; as bits it is `!v`.
        write_head(buf, MAJOR_NEGATIVE, !v as u64);
    }
}

pub fn write_bytes(buf: &mut Vec<u8>, data: &[u8]) {
    write_head(buf, MAJOR_BYTES, data.len() as u64);
    buf.extend_from_slice(data);
}

pub fn write_text(buf: &mut Vec<u8>, text: &str) {
    write_head(buf, MAJOR_TEXT, text.len() as u64);
    buf.extend_from_slice(text.as_bytes());
}

#[inline(always)]
pub fn write_array_head(buf: &mut Vec<u8>, len: usize) {
    write_head(buf, MAJOR_ARRAY, len as u64);
}

/// The encoded `extra_keys` of a vLLM block: `null`, or an array of the LoRA name (every block)
/// followed by the cache salt (block 0 only). Computed once per request, appended per block.
pub fn extras(lora_name: &str, cache_salt: &str) -> Vec<u8> {
    let parts: Vec<&str> = [lora_name, cache_salt]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect();
    let mut buf = Vec::new();
    if parts.is_empty() {
        buf.push(NULL);
    } else {
        write_array_head(&mut buf, parts.len());
        for part in parts {
            write_text(&mut buf, part);
        }
    }
    buf
}

/// Upper bound of an encoded block plus the 8 bytes of slack the branch-free token writes need.
fn block_capacity(n_tokens: usize, extras_len: usize) -> usize {
    // 3 head bytes + parent + array head (at most 9) + at most 9 per token + extras + slack.
    (3 + 32 + 9 + 8 + extras_len).saturating_add(n_tokens.saturating_mul(9))
}

/// `(parent, tuple(tokens), extras)` as a canonical CBOR array into `buf` (cleared first).
/// `extras` is the output of [`extras`].
pub fn encode_block<T: super::Token>(
    buf: &mut Vec<u8>,
    parent: &[u8; 32],
    tokens: &[T],
    extras: &[u8],
) {
    let len = encode_block_prefix(buf, parent, tokens, extras);
    buf.truncate(len);
}

/// SHA-256 of the encoded block, reusing `buf` without clearing or shrinking it between blocks.
#[inline]
pub fn digest_block<T: super::Token>(
    buf: &mut Vec<u8>,
    parent: &[u8; 32],
    tokens: &[T],
    extras: &[u8],
) -> [u8; 32] {
    let len = encode_block_prefix(buf, parent, tokens, extras);
    super::sha::digest_prefix(buf, len)
}

/// Encode the block as a prefix of `buf` (grown as needed, never shrunk) and return its length.
///
/// The hot path: tokens are written without data-dependent branches, because token ids mix
/// 1-, 2-, 3- and 5-byte encodings at random and a mispredicted branch per token would cost
/// more than the encoding. Each token stores its head byte, then an 8-byte word whose leading
/// bytes are the big-endian argument, and advances by the encoded length only.
#[inline]
fn encode_block_prefix<T: super::Token>(
    buf: &mut Vec<u8>,
    parent: &[u8; 32],
    tokens: &[T],
    extras: &[u8],
) -> usize {
    let needed = block_capacity(tokens.len(), extras.len());
    if buf.len() < needed {
        buf.resize(needed, 0);
    }
    let out = &mut buf[..needed];
    out[..3].copy_from_slice(&[0x83, 0x58, 0x20]);
    out[3..35].copy_from_slice(parent);
    let (head, head_len) = head_bytes(MAJOR_ARRAY, tokens.len() as u64);
    out[35..35 + head_len].copy_from_slice(&head[..head_len]);
    let mut pos = 35 + head_len;
    for t in tokens {
        let v = t.to_i64();
        // Negative values encode `-1 - v` (= `!v`) under major type 1.
        let sign = v >> 63;
        let arg = (v ^ sign) as u64;
        let major = (sign as u64) & u64::from(MAJOR_NEGATIVE << 5);
        let class = usize::from(arg >= 24) + usize::from(arg >= 256) + usize::from(arg >= 65536);
        if T::WIDE && arg > u64::from(u32::MAX) {
            // 9 bytes; only i64 event tokens get here, so the branch is predictable.
            out[pos] = (major as u8) | 27;
            out[pos + 1..pos + 9].copy_from_slice(&arg.to_be_bytes());
            pos += 9;
            continue;
        }
        const WIDTH: [u32; 4] = [0, 1, 2, 4];
        const INFO: [u64; 4] = [0, 24, 25, 26];
        let width = WIDTH[class & 3];
        // Below 24 the argument is the head's low bits; otherwise the head names the width.
        let small_mask = u64::from(class == 0).wrapping_neg();
        let head = major | INFO[class & 3] | (arg & small_mask);
        // The argument's big-endian bytes follow the head. For width 0 the shift is masked to
        // 0 and the word carries junk past the head, which the next write overwrites.
        let payload = arg.swap_bytes() >> ((64 - 8 * width) & 63);
        let word = head | (payload << 8);
        out[pos..pos + 8].copy_from_slice(&word.to_le_bytes());
        pos += 1 + width as usize;
    }
    out[pos..pos + extras.len()].copy_from_slice(extras);
    pos + extras.len()
}
