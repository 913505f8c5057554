//! Never panic, never over-allocate: random bytes, every truncation and byte mutations of every
//! fixture, under all three decoders.

use super::fixtures::all_payloads;
use crate::hashing::IndexProjection;
use crate::model::PublisherType;
use crate::wire::{EnvelopeError, decode};

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn decode_all(bytes: &[u8]) {
    for kind in PublisherType::ALL {
        for projection in [IndexProjection::Low64Be, IndexProjection::First64Be] {
            let _ = decode(kind, bytes, projection);
        }
    }
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..20_000 {
        let len = rng.below(64);
        // Bias the first byte toward containers so the decoders get past the envelope.
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        if let Some(first) = bytes.first_mut() {
            *first = [0x92, 0x93, 0x83, *first][rng.below(4)];
        }
        decode_all(&bytes);
    }
}

#[test]
fn every_truncation_of_every_fixture_is_an_error() {
    for (name, kind, projection, bytes) in all_payloads() {
        // The benchmark payload is large; its prefixes are sampled.
        let step = (bytes.len() / 2000).max(1);
        for cut in (0..bytes.len()).step_by(step) {
            let result = decode(kind, &bytes[..cut], projection);
            assert!(
                result.is_err(),
                "{name}: prefix of {cut} bytes decoded: {result:?}"
            );
        }
    }
}

#[test]
fn mutated_fixtures_never_panic() {
    let mut rng = Rng(42);
    for (_, _, _, bytes) in all_payloads() {
        if bytes.len() > 4096 {
            continue;
        }
        for pos in 0..bytes.len() {
            let mut m = bytes.clone();
            m[pos] = rng.next() as u8;
            decode_all(&m);
            m[pos] = [0x00, 0xc0, 0xc1, 0xdd, 0xdf, 0xff][rng.below(6)];
            decode_all(&m);
        }
        for _ in 0..200 {
            let mut m = bytes.clone();
            let at = rng.below(m.len());
            let junk: Vec<u8> = (0..rng.below(9)).map(|_| rng.next() as u8).collect();
            m.splice(at..(at + rng.below(4)).min(m.len()), junk);
            decode_all(&m);
        }
    }
}

#[test]
fn huge_declared_lengths_fail_without_allocating() {
    // [1.0, array32(u32::MAX)] with nothing behind it, and a map32 event claiming 4 G entries.
    let events = [
        0x92, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff,
    ];
    assert!(matches!(
        decode(PublisherType::Vllm, &events, IndexProjection::Low64Be),
        Err(EnvelopeError::Malformed { .. })
    ));
    let event = [
        0x92, 0xcb, 0x3f, 0xf0, 0, 0, 0, 0, 0, 0, 0x91, 0xdf, 0xff, 0xff, 0xff, 0xff,
    ];
    assert!(matches!(
        decode(PublisherType::Mooncake, &event, IndexProjection::Low64Be),
        Err(EnvelopeError::Malformed { .. })
    ));
    // Deep nesting inside an unknown key is skipped iteratively.
    let mut deep = vec![0x92, 0x01, 0x91, 0x81, 0xa1, b'z'];
    deep.extend(std::iter::repeat_n(0x91, 100_000));
    deep.push(0xc0);
    let b = decode(PublisherType::Vllm, &deep, IndexProjection::Low64Be).unwrap();
    assert_eq!(b.invalid.len(), 1, "the event lacks its type: {b:?}");
}
