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

/// Write a head (major type + argument) in its shortest form.
#[inline(always)]
pub fn write_head(buf: &mut Vec<u8>, major: u8, arg: u64) {
    let m = major << 5;
    if arg < 24 {
        buf.push(m | arg as u8);
    } else if arg <= u64::from(u8::MAX) {
        buf.extend_from_slice(&[m | 24, arg as u8]);
    } else if arg <= u64::from(u16::MAX) {
        let b = (arg as u16).to_be_bytes();
        buf.extend_from_slice(&[m | 25, b[0], b[1]]);
    } else if arg <= u64::from(u32::MAX) {
        let b = (arg as u32).to_be_bytes();
        buf.extend_from_slice(&[m | 26, b[0], b[1], b[2], b[3]]);
    } else {
        buf.push(m | 27);
        buf.extend_from_slice(&arg.to_be_bytes());
    }
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

/// `(parent, tuple(tokens), extras)` as a canonical CBOR array into `buf` (cleared first).
/// `extras` is the output of [`extras`].
#[inline]
pub fn encode_block<T: super::Token>(
    buf: &mut Vec<u8>,
    parent: &[u8; 32],
    tokens: &[T],
    extras: &[u8],
) {
    buf.clear();
    // Array of 3, then the 32-byte parent as a byte string (head 0x58 0x20).
    buf.extend_from_slice(&[0x83, 0x58, 0x20]);
    buf.extend_from_slice(parent);
    write_array_head(buf, tokens.len());
    for t in tokens {
        write_int(buf, t.to_i64());
    }
    buf.extend_from_slice(extras);
}
