//! A byte-exact CPython `pickle.dumps(value, protocol=5)` for the values vLLM's `sha256` hashes:
//! `str`, `bytes`, `int`, `None` and tuples of them (`docs/reference-behaviour.md`, "Hash profile
//! and chain").
//!
//! What has to match CPython's C pickler (`Modules/_pickle.c`) exactly:
//! * `PROTO 5` is written before framing starts, so it sits outside every frame.
//! * A frame opens with the first write after framing starts (or after a commit) and is committed
//!   at the start of an object save once it holds at least 64 KiB (`_Pickler_OpcodeBoundary`),
//!   and at the end after `STOP`. A committed frame of fewer than 4 bytes loses its header.
//! * A `bytes`/`str` payload of at least 64 KiB commits the open frame and is written, header
//!   and payload, outside any frame (`_Pickler_write_bytes`); the next write opens a new frame.
//! * `MEMOIZE` follows every `bytes`, `str` and non-empty tuple; ints and `None` are not memoized,
//!   nor is the empty tuple. Equal values are separate objects here, so no `BINGET` is emitted.
//! * Ints: `BININT1` for 0..=255, `BININT2` for 256..=65535, `BININT` for the rest of the int32
//!   range (all negatives), `LONG1` with minimal two's-complement bytes beyond it.
//! * Tuples of 1..=3 items use `TUPLE1/2/3`; longer ones `MARK` .. `TUPLE`; empty is `EMPTY_TUPLE`.

const PROTO: u8 = 0x80;
const FRAME: u8 = 0x95;
const STOP: u8 = b'.';
const MEMOIZE: u8 = 0x94;
const NONE: u8 = b'N';
const MARK: u8 = b'(';
const TUPLE: u8 = b't';
const EMPTY_TUPLE: u8 = b')';
const TUPLE1: u8 = 0x85;
const TUPLE2: u8 = 0x86;
const TUPLE3: u8 = 0x87;
const BININT: u8 = b'J';
const BININT1: u8 = b'K';
const BININT2: u8 = b'M';
const LONG1: u8 = 0x8a;
const SHORT_BINBYTES: u8 = b'C';
const BINBYTES: u8 = b'B';
const BINBYTES8: u8 = 0x8e;
const SHORT_BINUNICODE: u8 = 0x8c;
const BINUNICODE: u8 = b'X';
const BINUNICODE8: u8 = 0x8d;

/// `_FRAME_SIZE_TARGET`: frames are committed once they reach this size.
pub const FRAME_SIZE_TARGET: usize = 64 * 1024;
/// `_FRAME_SIZE_MIN`: smaller frames are written without a header.
const FRAME_SIZE_MIN: usize = 4;
/// `FRAME` opcode + u64 length.
const FRAME_HEADER_SIZE: usize = 9;

/// A protocol-5 pickler writing into a reusable buffer.
pub struct Pickler<'b> {
    out: &'b mut Vec<u8>,
    /// Offset of the open frame's reserved header, if a frame is open.
    frame_start: Option<usize>,
    /// False until `PROTO` is written, and while a large payload bypasses framing.
    framing: bool,
}

impl<'b> Pickler<'b> {
    /// Start a pickle in `out` (cleared first) with `PROTO 5`.
    pub fn new(out: &'b mut Vec<u8>) -> Self {
        out.clear();
        out.extend_from_slice(&[PROTO, 5]);
        Pickler {
            out,
            frame_start: None,
            framing: true,
        }
    }

    /// `_Pickler_Write`: open a frame first when framing is on and none is open.
    #[inline(always)]
    fn write(&mut self, data: &[u8]) {
        if self.framing && self.frame_start.is_none() {
            self.frame_start = Some(self.out.len());
            self.out.extend_from_slice(&[0u8; FRAME_HEADER_SIZE]);
        }
        self.out.extend_from_slice(data);
    }

    /// `_Pickler_CommitFrame`: fill in the open frame's header, or drop it for a tiny frame.
    fn commit_frame(&mut self) {
        let Some(start) = self.frame_start.take() else {
            return;
        };
        let frame_len = self.out.len() - start - FRAME_HEADER_SIZE;
        if frame_len >= FRAME_SIZE_MIN {
            self.out[start] = FRAME;
            self.out[start + 1..start + FRAME_HEADER_SIZE]
                .copy_from_slice(&(frame_len as u64).to_le_bytes());
        } else {
            self.out.drain(start..start + FRAME_HEADER_SIZE);
        }
    }

    /// `_Pickler_OpcodeBoundary`, called at the start of every object save.
    #[inline(always)]
    pub fn boundary(&mut self) {
        if let Some(start) = self.frame_start
            && self.out.len() - start - FRAME_HEADER_SIZE >= FRAME_SIZE_TARGET
        {
            self.commit_frame();
        }
    }

    /// `_Pickler_write_bytes`: a payload of 64 KiB or more goes outside frames.
    fn write_payload(&mut self, header: &[u8], data: &[u8]) {
        if data.len() >= FRAME_SIZE_TARGET {
            self.commit_frame();
            self.framing = false;
            self.write(header);
            self.write(data);
            self.framing = true;
        } else {
            self.write(header);
            self.write(data);
        }
    }

    /// Save an int (`save_long`).
    #[inline(always)]
    pub fn int(&mut self, v: i64) {
        self.boundary();
        if (0..=0xff).contains(&v) {
            self.write(&[BININT1, v as u8]);
        } else if (0..=0xffff).contains(&v) {
            let b = (v as u16).to_le_bytes();
            self.write(&[BININT2, b[0], b[1]]);
        } else if let Ok(v32) = i32::try_from(v) {
            let b = v32.to_le_bytes();
            self.write(&[BININT, b[0], b[1], b[2], b[3]]);
        } else {
            // LONG1: little-endian two's complement, shortest that keeps the sign.
            let bytes = v.to_le_bytes();
            let mut n = 8;
            while n > 1 {
                let top = bytes[n - 1];
                let next_sign = bytes[n - 2] & 0x80;
                if (top == 0 && next_sign == 0) || (top == 0xff && next_sign != 0) {
                    n -= 1;
                } else {
                    break;
                }
            }
            let mut op = [0u8; 10];
            op[0] = LONG1;
            op[1] = n as u8;
            op[2..2 + n].copy_from_slice(&bytes[..n]);
            self.write(&op[..2 + n]);
        }
    }

    /// Save a `bytes` object, then memoize it.
    pub fn bytes(&mut self, data: &[u8]) {
        self.boundary();
        let len = data.len();
        if len <= 0xff {
            self.write_payload(&[SHORT_BINBYTES, len as u8], data);
        } else if let Ok(len32) = u32::try_from(len) {
            let b = len32.to_le_bytes();
            self.write_payload(&[BINBYTES, b[0], b[1], b[2], b[3]], data);
        } else {
            let mut header = [BINBYTES8; 9];
            header[1..].copy_from_slice(&(len as u64).to_le_bytes());
            self.write_payload(&header, data);
        }
        self.write(&[MEMOIZE]);
    }

    /// Save a `str` (UTF-8), then memoize it.
    pub fn str(&mut self, text: &str) {
        self.boundary();
        let data = text.as_bytes();
        let len = data.len();
        if len <= 0xff {
            self.write_payload(&[SHORT_BINUNICODE, len as u8], data);
        } else if let Ok(len32) = u32::try_from(len) {
            let b = len32.to_le_bytes();
            self.write_payload(&[BINUNICODE, b[0], b[1], b[2], b[3]], data);
        } else {
            let mut header = [BINUNICODE8; 9];
            header[1..].copy_from_slice(&(len as u64).to_le_bytes());
            self.write_payload(&header, data);
        }
        self.write(&[MEMOIZE]);
    }

    pub fn none(&mut self) {
        self.boundary();
        self.write(&[NONE]);
    }

    /// Open a tuple of `len` items (the tuple's own save); items follow, then [`Self::end_tuple`].
    #[inline]
    pub fn begin_tuple(&mut self, len: usize) {
        self.boundary();
        if len == 0 {
            self.write(&[EMPTY_TUPLE]);
        } else if len > 3 {
            self.write(&[MARK]);
        }
    }

    /// Close a tuple opened with the same `len`.
    #[inline]
    pub fn end_tuple(&mut self, len: usize) {
        match len {
            0 => {}
            1 => self.write(&[TUPLE1, MEMOIZE]),
            2 => self.write(&[TUPLE2, MEMOIZE]),
            3 => self.write(&[TUPLE3, MEMOIZE]),
            _ => self.write(&[TUPLE, MEMOIZE]),
        }
    }

    /// Write `STOP` and commit the last frame.
    pub fn finish(mut self) {
        self.write(&[STOP]);
        self.commit_frame();
    }
}

/// `pickle.dumps(text, protocol=5)` (the vLLM root input).
pub fn dumps_str(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + 24);
    let mut p = Pickler::new(&mut out);
    p.str(text);
    p.finish();
    out
}

/// `pickle.dumps((parent, tuple(tokens), extras), protocol=5)` into `out`, where `extras` is
/// `None` when both strings are empty, else the tuple of the non-empty ones (LoRA first).
pub fn encode_block<T: super::Token>(
    out: &mut Vec<u8>,
    parent: &[u8; 32],
    tokens: &[T],
    lora_name: &str,
    cache_salt: &str,
) {
    let mut p = Pickler::new(out);
    p.begin_tuple(3);
    p.bytes(parent);
    p.begin_tuple(tokens.len());
    for t in tokens {
        p.int(t.to_i64());
    }
    p.end_tuple(tokens.len());
    let parts = usize::from(!lora_name.is_empty()) + usize::from(!cache_salt.is_empty());
    if parts == 0 {
        p.none();
    } else {
        p.begin_tuple(parts);
        for part in [lora_name, cache_salt] {
            if !part.is_empty() {
                p.str(part);
            }
        }
        p.end_tuple(parts);
    }
    p.end_tuple(3);
    p.finish();
}
