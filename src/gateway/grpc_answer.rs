//! The `hits` entries of a `QueryResponse`, written from the walk's answer ([`AnswerView`]).
//!
//! An answer lists every registered instance with all its ranks (zero-hit ones included), so at
//! 64 instances x 2 ranks it is about 5 KB and some 2,500 fields: written field by field through
//! `BufMut` it cost five times the walk. Two things make it a few copies instead:
//! - Rows repeat. Instances that hold the same prefix on the same ranks (every instance that
//!   caches only the system prompt, every instance with no hit) have the same row value, byte
//!   for byte: only the instance id differs, and it sits outside the value. Each distinct value
//!   is written once and copied from the reply itself for the rows that repeat it ([`Recent`]).
//! - Every length inside a row value is known to fit one byte (a rank entry is at most 58 bytes:
//!   a 10-digit key and four 10-byte varints), so a value is written in one pass; only its own
//!   length, which comes before it, is learnt by writing it aside first.
//!
//! The bytes are prost's (fields in tag order, zero counts and default entries omitted; see
//! `grpc_wire`), which the unit tests there check against the generated message.

use std::cell::RefCell;

use super::repeated_rows::Recent;
use crate::index::{AnswerView, RowView, TierCounts};

/// Field keys (`tag << 3 | wire type`; 0 varint, 2 length-delimited) of `QueryResponse.hits`
/// (3), of a map entry's key (1) and value (2), and of `InstanceHits`' fields: `longest_matched`
/// (1), `dp` (2), `rank_matches` (3), then `device` to `disk` (4 to 7).
const HITS: u8 = 3 << 3 | 2;
const ENTRY_KEY: u8 = 1 << 3 | 2;
const ENTRY_VALUE: u8 = 2 << 3 | 2;
const ENTRY_COUNT: u8 = 2 << 3;
const LONGEST_MATCHED: u8 = 1 << 3;
const DP: u8 = 2 << 3 | 2;
const RANK_MATCHES: u8 = 3 << 3 | 2;
const ROW_TIERS: [u8; 4] = [4 << 3, 5 << 3, 6 << 3, 7 << 3];
/// `TierCounts`' fields `device` to `disk` (1 to 4).
const TIERS: [u8; 4] = [1 << 3, 2 << 3, 3 << 3, 4 << 3];

thread_local! {
    /// A distinct row value being written, before its length is known.
    static VALUE: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Append the `hits` entries of `answer` to `out`, in the answer's order.
pub(super) fn encode_hits(answer: AnswerView<'_>, out: &mut Vec<u8>) {
    VALUE.with(|value| match value.try_borrow_mut() {
        Ok(mut value) => write_rows(answer, out, &mut value),
        Err(_) => write_rows(answer, out, &mut Vec::new()),
    })
}

fn write_rows<'a>(answer: AnswerView<'a>, out: &mut Vec<u8>, value: &mut Vec<u8>) {
    let mut recent = Recent::default();
    for row in answer.rows() {
        let id = row.id.as_bytes();
        let copy = recent.find(&row);
        let len = match copy {
            Some((_, len)) => len,
            None => {
                value.clear();
                write_value(&row, value);
                value.len()
            }
        };
        let id_field = if id.is_empty() {
            0
        } else {
            field_len(id.len())
        };
        // A default (empty) row value is omitted, as prost omits it.
        let value_field = if len == 0 { 0 } else { field_len(len) };
        out.push(HITS);
        varint(out, (id_field + value_field) as u64);
        if !id.is_empty() {
            out.push(ENTRY_KEY);
            varint(out, id.len() as u64);
            out.extend_from_slice(id);
        }
        if len == 0 {
            continue;
        }
        out.push(ENTRY_VALUE);
        varint(out, len as u64);
        let at = out.len();
        match copy {
            Some((from, len)) => out.extend_from_within(from..from + len),
            None => {
                out.extend_from_slice(value);
                recent.remember(row, at, len);
            }
        }
    }
}

/// One `InstanceHits` message: `longest_matched` (the row's `disk`), the `dp` and
/// `rank_matches` entries in rank order, then the row's counts (maxima over its ranks).
fn write_value(row: &RowView<'_>, out: &mut Vec<u8>) {
    let tiers = row.tiers();
    count(out, LONGEST_MATCHED, tiers.disk);
    let mut digits = [0; 10];
    for (rank, t) in row.ranks() {
        let key = super::rank_key(rank, &mut digits);
        let value = if t.device == 0 {
            0
        } else {
            1 + varint_len(t.device)
        };
        out.extend_from_slice(&[
            DP,
            (2 + key.len() + value) as u8,
            ENTRY_KEY,
            key.len() as u8,
        ]);
        out.extend_from_slice(key);
        count(out, ENTRY_COUNT, t.device);
    }
    for (rank, t) in row.ranks() {
        let key = super::rank_key(rank, &mut digits);
        let counts = tiers_len(&t);
        let value = if counts == 0 { 0 } else { 2 + counts };
        let entry = [
            RANK_MATCHES,
            (2 + key.len() + value) as u8,
            ENTRY_KEY,
            key.len() as u8,
        ];
        out.extend_from_slice(&entry);
        out.extend_from_slice(key);
        if counts != 0 {
            out.extend_from_slice(&[ENTRY_VALUE, counts as u8]);
            for (tag, v) in TIERS.into_iter().zip(t.to_array()) {
                count(out, tag, v);
            }
        }
    }
    for (tag, v) in ROW_TIERS.into_iter().zip(tiers.to_array()) {
        count(out, tag, v);
    }
}

/// A `TierCounts` message's length: the non-zero counts.
fn tiers_len(t: &TierCounts) -> usize {
    (t.to_array().into_iter())
        .map(|v| if v == 0 { 0 } else { 1 + varint_len(v) })
        .sum()
}

/// A length-delimited field (one-byte key) of `n` bytes.
fn field_len(n: usize) -> usize {
    1 + varint_len(n as u64) + n
}

/// A varint field holding a count, omitted when 0. Counts are `u64` here and `int64` on the
/// wire: the varint of `v as i64` is the varint of `v`.
#[inline]
fn count(out: &mut Vec<u8>, key: u8, v: u64) {
    if v != 0 {
        out.push(key);
        varint(out, v);
    }
}

#[inline]
fn varint_len(v: u64) -> usize {
    // 7 bits per byte; 0 takes one byte.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

#[inline]
fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_lengths_match_prost() {
        for v in [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            1 << 35,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut ours = Vec::new();
            varint(&mut ours, v);
            assert_eq!(ours.len(), varint_len(v), "{v}");
            assert_eq!(ours.len(), prost::encoding::encoded_len_varint(v), "{v}");
            let mut theirs = Vec::new();
            prost::encoding::encode_varint(v, &mut theirs);
            assert_eq!(ours, theirs, "{v}");
        }
    }
}
