//! Property tests of the two vLLM encoders at every integer and length boundary.
//!
//! CBOR is checked against ciborium's encoding of the same value (ciborium writes every head in
//! its shortest form, which is what canonical CBOR needs for these types). Pickle has no Rust
//! reference, so it is checked structurally: a small unpickler for the opcodes the encoder emits
//! reads the value back, checks each opcode is the one CPython picks for that value, and checks
//! the framing rules; the exact bytes are pinned by the fixtures.

use ciborium::Value;
use proptest::prelude::*;

use crate::hashing::{cbor, pickle};

/// Integers at every CBOR and pickle threshold, and their neighbours.
fn boundary_ints() -> Vec<i64> {
    let mut out = Vec::new();
    let edges: [i64; 14] = [
        0,
        23,
        24,
        255,
        256,
        65535,
        65536,
        i64::from(i32::MAX),
        i64::from(u32::MAX),
        1 << 39,
        1 << 40,
        1 << 55,
        1 << 56,
        i64::MAX,
    ];
    for e in edges {
        for d in -2i64..=2 {
            for v in [
                e.saturating_add(d),
                (-e).saturating_add(d),
                (-e - 1).saturating_add(d),
            ] {
                out.push(v);
            }
        }
    }
    out.extend([
        i64::MIN,
        i64::MIN + 1,
        i64::from(i32::MIN),
        i64::from(i32::MIN) - 1,
        -24,
        -25,
        -256,
        -257,
    ]);
    out.sort_unstable();
    out.dedup();
    out
}

fn any_int() -> impl Strategy<Value = i64> {
    prop_oneof![
        proptest::sample::select(boundary_ints()),
        any::<i32>().prop_map(i64::from),
        any::<i64>()
    ]
}

/// Lengths at every string/array head threshold.
fn boundary_len() -> impl Strategy<Value = usize> {
    proptest::sample::select(vec![
        0usize, 1, 2, 3, 4, 5, 22, 23, 24, 25, 254, 255, 256, 257, 65534, 65535, 65536, 65537,
    ])
}

fn ciborium_bytes(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::into_writer(value, &mut out).expect("ciborium encodes");
    out
}

#[test]
fn cbor_ints_match_ciborium_at_every_boundary() {
    for v in boundary_ints() {
        let mut ours = Vec::new();
        cbor::write_int(&mut ours, v);
        assert_eq!(ours, ciborium_bytes(&Value::Integer(v.into())), "int {v}");
    }
    // The spec's examples.
    let enc = |v: i64| {
        let mut b = Vec::new();
        cbor::write_int(&mut b, v);
        crate::hashing::hex_lower(&b)
    };
    assert_eq!(enc(-1), "20");
    assert_eq!(enc(-25), "3818");
    assert_eq!(enc(-2147483648), "3a7fffffff");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn cbor_int_matches_ciborium(v in any_int()) {
        let mut ours = Vec::new();
        cbor::write_int(&mut ours, v);
        prop_assert_eq!(ours, ciborium_bytes(&Value::Integer(v.into())));
    }

    #[test]
    fn cbor_text_matches_ciborium(len in boundary_len(), c in proptest::sample::select(vec!['a', 'é', '模', '🚀'])) {
        // Byte length is what the head counts; multibyte characters shift it.
        let text: String = std::iter::repeat_n(c, len / c.len_utf8().max(1)).collect();
        let mut ours = Vec::new();
        cbor::write_text(&mut ours, &text);
        prop_assert_eq!(ours, ciborium_bytes(&Value::Text(text)));
    }

    #[test]
    fn cbor_block_matches_ciborium(
        parent in any::<[u8; 32]>(),
        tokens in proptest::sample::select(vec![0usize, 1, 2, 3, 4, 23, 24, 25, 255, 256, 257])
            .prop_flat_map(|n| proptest::collection::vec(any_int(), n)),
        lora in prop_oneof![Just(String::new()), "[a-z]{1,30}", Just("l".repeat(256))],
        salt in prop_oneof![Just(String::new()), "[a-z0-9]{1,30}"],
        first in any::<bool>(),
    ) {
        let extras = cbor::extras(&lora, if first { &salt } else { "" });
        let mut ours = Vec::new();
        cbor::encode_block(&mut ours, &parent, &tokens, &extras);
        let mut parts: Vec<Value> = Vec::new();
        if !lora.is_empty() { parts.push(Value::Text(lora.clone())); }
        if first && !salt.is_empty() { parts.push(Value::Text(salt.clone())); }
        let value = Value::Array(vec![
            Value::Bytes(parent.to_vec()),
            Value::Array(tokens.iter().map(|&t| Value::Integer(t.into())).collect()),
            if parts.is_empty() { Value::Null } else { Value::Array(parts) },
        ]);
        prop_assert_eq!(ours, ciborium_bytes(&value));
    }
}

/// A value the test unpickler reads back.
#[derive(Debug, Clone, PartialEq)]
enum Py {
    Int(i64),
    Bytes(Vec<u8>),
    Str(String),
    None,
    Tuple(Vec<Py>),
}

/// CPython's choice of int opcode.
fn expected_int_opcode(v: i64) -> u8 {
    match v {
        0..=0xff => b'K',
        0x100..=0xffff => b'M',
        _ if i32::try_from(v).is_ok() => b'J',
        _ => 0x8a,
    }
}

/// CPython's `encode_long` (pickle.py), computed independently with i128.
fn python_long1(x: i64) -> Vec<u8> {
    let x = i128::from(x);
    let bits = 128 - x.unsigned_abs().leading_zeros() as usize;
    let mut n = (bits >> 3) + 1;
    let mut bytes = x.to_le_bytes()[..n].to_vec();
    if x < 0 && n > 1 && bytes[n - 1] == 0xff && bytes[n - 2] & 0x80 != 0 {
        n -= 1;
        bytes.truncate(n);
    }
    bytes
}

fn le(data: &[u8]) -> u64 {
    data.iter()
        .rev()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b))
}

/// The length of a headerless frame (1 to 3 bytes) at `pos`: it ends the pickle, or is followed
/// by a payload of at least 64 KiB written outside frames.
fn bare_frame_len(data: &[u8], pos: usize) -> Option<usize> {
    if matches!(data[pos], b'X' | b'B' | 0x8d | 0x8e) {
        return None;
    }
    (1..4).find(|&n| {
        let next = pos + n;
        next == data.len()
            || (matches!(data.get(next), Some(b'X' | b'B'))
                && data.len() >= next + 5
                && le(&data[next + 1..next + 5]) as usize >= pickle::FRAME_SIZE_TARGET)
    })
}

/// Read a pickle back, asserting framing, opcode choice and memo placement on the way.
fn unpickle(data: &[u8]) -> Py {
    assert_eq!(&data[..2], &[0x80, 5], "PROTO 5 first, outside any frame");
    // Pass 1: strip frames, checking their sizes.
    let mut stream = Vec::new();
    let mut pos = 2;
    let mut frames = Vec::new();
    while pos < data.len() {
        if data[pos] == 0x95 {
            let len = le(&data[pos + 1..pos + 9]) as usize;
            assert!(len >= 4, "frames under 4 bytes are written bare");
            frames.push((stream.len(), len));
            stream.extend_from_slice(&data[pos + 9..pos + 9 + len]);
            pos += 9 + len;
        } else if let Some(n) = bare_frame_len(data, pos) {
            // A frame of under 4 bytes is written without its header: the last one, or one
            // closed early because a large payload follows outside frames.
            stream.extend_from_slice(&data[pos..pos + n]);
            pos += n;
        } else {
            // Only a large payload (BINUNICODE/BINBYTES of >= 64 KiB) sits outside frames.
            let op = data[pos];
            assert!(
                matches!(op, b'X' | b'B' | 0x8d | 0x8e),
                "unframed opcode {op:#x} at {pos}"
            );
            let len = le(&data[pos + 1..pos + 5]) as usize;
            assert!(
                len >= pickle::FRAME_SIZE_TARGET,
                "small payloads stay in frames"
            );
            stream.extend_from_slice(&data[pos..pos + 5 + len]);
            pos += 5 + len;
        }
    }
    assert_eq!(stream.last(), Some(&b'.'), "STOP last");
    // Pass 2: a stack machine over the opcodes the encoder emits.
    let mut stack: Vec<Py> = Vec::new();
    let mut marks: Vec<usize> = Vec::new();
    let mut memo_next_expected = false;
    let mut i = 0;
    while i < stream.len() {
        let op = stream[i];
        if memo_next_expected {
            assert_eq!(
                op, 0x94,
                "MEMOIZE follows every str, bytes and non-empty tuple"
            );
            memo_next_expected = false;
            i += 1;
            continue;
        }
        i += 1;
        match op {
            b'K' | b'M' | b'J' | 0x8a => {
                let (v, used) = match op {
                    b'K' => (i64::from(stream[i]), 1),
                    b'M' => (le(&stream[i..i + 2]) as i64, 2),
                    b'J' => (i64::from(le(&stream[i..i + 4]) as u32 as i32), 4),
                    _ => {
                        let n = usize::from(stream[i]);
                        let body = &stream[i + 1..i + 1 + n];
                        let fill = if body.last().is_some_and(|b| b & 0x80 != 0) {
                            0xff
                        } else {
                            0
                        };
                        let mut full = [fill; 8];
                        full[..n].copy_from_slice(body);
                        let v = i64::from_le_bytes(full);
                        assert_eq!(body, python_long1(v).as_slice(), "minimal LONG1 bytes");
                        (v, 1 + n)
                    }
                };
                assert_eq!(op, expected_int_opcode(v), "opcode of {v}");
                stack.push(Py::Int(v));
                i += used;
            }
            b'C' | 0x8c => {
                let n = usize::from(stream[i]);
                let body = stream[i + 1..i + 1 + n].to_vec();
                stack.push(if op == b'C' {
                    Py::Bytes(body)
                } else {
                    Py::Str(String::from_utf8(body).unwrap())
                });
                i += 1 + n;
                memo_next_expected = true;
            }
            b'X' | b'B' => {
                let n = le(&stream[i..i + 4]) as usize;
                assert!(n > 0xff, "short forms are used up to 255 bytes");
                let body = stream[i + 4..i + 4 + n].to_vec();
                stack.push(if op == b'B' {
                    Py::Bytes(body)
                } else {
                    Py::Str(String::from_utf8(body).unwrap())
                });
                i += 4 + n;
                memo_next_expected = true;
            }
            b'N' => stack.push(Py::None),
            b')' => stack.push(Py::Tuple(Vec::new())),
            b'(' => marks.push(stack.len()),
            b't' => {
                let at = marks.pop().expect("MARK before TUPLE");
                let items = stack.split_off(at);
                assert!(items.len() > 3, "TUPLE1/2/3 are used for up to three items");
                stack.push(Py::Tuple(items));
                memo_next_expected = true;
            }
            0x85..=0x87 => {
                let n = usize::from(op - 0x84);
                let items = stack.split_off(stack.len() - n);
                stack.push(Py::Tuple(items));
                memo_next_expected = true;
            }
            b'.' => break,
            other => panic!("unexpected opcode {other:#x}"),
        }
    }
    assert!(marks.is_empty());
    assert_eq!(stack.len(), 1);
    // Framing: a frame is closed early only right before a large out-of-frame payload or at the
    // end; otherwise it ran to at least 64 KiB, and never much beyond (one object past it).
    for (k, &(start, len)) in frames.iter().enumerate() {
        let last = k + 1 == frames.len();
        let next = start + len;
        let before_large = next < stream.len() && matches!(stream[next], b'X' | b'B');
        assert!(
            last || before_large || len >= pickle::FRAME_SIZE_TARGET,
            "frame {k} of {len} bytes closed early"
        );
    }
    stack.pop().unwrap()
}

fn encode_pickle(parent: &[u8; 32], tokens: &[i64], lora: &str, salt: &str) -> Vec<u8> {
    let mut buf = Vec::new();
    pickle::encode_block(&mut buf, parent, tokens, lora, salt);
    buf
}

fn expected_value(parent: &[u8; 32], tokens: &[i64], lora: &str, salt: &str) -> Py {
    let parts: Vec<Py> = [lora, salt]
        .iter()
        .filter(|s| !s.is_empty())
        .map(|s| Py::Str((*s).to_owned()))
        .collect();
    Py::Tuple(vec![
        Py::Bytes(parent.to_vec()),
        Py::Tuple(tokens.iter().map(|&t| Py::Int(t)).collect()),
        if parts.is_empty() {
            Py::None
        } else {
            Py::Tuple(parts)
        },
    ])
}

#[test]
fn pickle_ints_at_every_boundary() {
    let tokens = boundary_ints();
    let parent = [7u8; 32];
    let data = encode_pickle(&parent, &tokens, "", "");
    assert_eq!(unpickle(&data), expected_value(&parent, &tokens, "", ""));
    // The spec's layout example: (bytes(range(32)), (1, 300, 70000), None).
    let parent: [u8; 32] = std::array::from_fn(|i| i as u8);
    let data = encode_pickle(&parent, &[1, 300, 70000], "", "");
    let want = format!(
        "80059533000000000000004320{}944b014d2c014a70110100879 44e87942e",
        crate::hashing::hex_lower(&parent)
    )
    .replace(' ', "");
    assert_eq!(crate::hashing::hex_lower(&data), want);
}

#[test]
fn pickle_tuple_lengths_and_frames() {
    let parent = [1u8; 32];
    // Token counts at the tuple-opcode edges, and streams of 3-byte and 5-byte ints long enough
    // to cross one or more 64 KiB frame boundaries, with and without large strings after them.
    for n in [
        0usize, 1, 2, 3, 4, 23, 24, 255, 256, 21_833, 21_834, 21_835, 40_000,
    ] {
        for (value, lora, salt) in [
            (256i64, "", ""),
            (70_000, "a", "s"),
            (-1, &"L".repeat(65_536)[..], ""),
        ] {
            let tokens = vec![value; n];
            let data = encode_pickle(&parent, &tokens, lora, salt);
            assert_eq!(
                unpickle(&data),
                expected_value(&parent, &tokens, lora, salt),
                "n={n} value={value}"
            );
        }
    }
}

#[test]
fn pickle_root_strings() {
    assert_eq!(
        crate::hashing::hex_lower(&pickle::dumps_str("0")),
        "80059505000000000000008c0130942e"
    );
    // After a large payload the tail `MEMOIZE STOP` is a 2-byte frame, written bare (checked
    // against CPython: 65545 bytes ending in 94 2e).
    let large = pickle::dumps_str(&"r".repeat(65_536));
    assert_eq!(large.len(), 65_545);
    assert_eq!(&large[..7], &[0x80, 0x05, b'X', 0x00, 0x00, 0x01, 0x00]);
    assert_eq!(&large[large.len() - 2..], &[0x94, b'.']);
    for len in [0usize, 1, 2, 3, 255, 256, 65_535, 65_536, 70_000] {
        let text = "r".repeat(len);
        let data = pickle::dumps_str(&text);
        assert_eq!(unpickle(&data), Py::Str(text), "len {len}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn pickle_round_trips_with_cpython_opcodes(
        parent in any::<[u8; 32]>(),
        tokens in proptest::sample::select(vec![0usize, 1, 2, 3, 4, 5, 23, 24, 255, 256])
            .prop_flat_map(|n| proptest::collection::vec(any_int(), n)),
        lora in prop_oneof![Just(String::new()), "[a-zé模]{1,20}", boundary_len().prop_map(|n| "l".repeat(n))],
        salt in prop_oneof![Just(String::new()), "[a-z🚀]{1,20}", boundary_len().prop_map(|n| "s".repeat(n))],
    ) {
        let data = encode_pickle(&parent, &tokens, &lora, &salt);
        prop_assert_eq!(unpickle(&data), expected_value(&parent, &tokens, &lora, &salt));
    }

    #[test]
    fn pickle_long1_is_cpythons_encode_long(v in any::<i64>().prop_filter("beyond int32", |v| i32::try_from(*v).is_err())) {
        let mut buf = Vec::new();
        let mut p = pickle::Pickler::new(&mut buf);
        p.int(v);
        p.finish();
        let body = python_long1(v);
        // PROTO, FRAME header, LONG1 n body, STOP.
        prop_assert_eq!(&buf[11..], &[&[0x8a, body.len() as u8][..], &body, b"."].concat()[..]);
    }
}

/// Two payloads of 64 KiB in a row: the one-byte frame between them (the first string's MEMOIZE)
/// is written without a header, exactly as CPython 3.11's `pickle.dumps` does:
/// `pickle.dumps((b"\0" * 32, (), ("l" * 65536, "s" * 65536)), protocol=5)`.
#[test]
fn a_tiny_frame_between_two_large_payloads_has_no_header() {
    let (lora, salt) = ("l".repeat(65536), "s".repeat(65536));
    let mut buf = Vec::new();
    pickle::encode_block::<i32>(&mut buf, &[0; 32], &[], &lora, &salt);
    let after_lora = 2 + 9 + 36 + 5 + 65536;
    assert_eq!(
        &buf[after_lora..after_lora + 6],
        &[0x94, 0x58, 0x00, 0x00, 0x01, 0x00]
    );
    let after_salt = after_lora + 1 + 5 + 65536;
    // MEMOIZE, TUPLE2, MEMOIZE, TUPLE3, MEMOIZE, STOP in one last framed run.
    assert_eq!(
        &buf[after_salt..],
        &[
            0x95, 6, 0, 0, 0, 0, 0, 0, 0, 0x94, 0x86, 0x94, 0x87, 0x94, 0x2e
        ]
    );
    assert_eq!(buf.len(), 131_145, "the length CPython gives");
}
