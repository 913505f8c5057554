//! Packed column families: how the RocksDB store keeps the `pairs` and `aliases` records, many
//! to a RocksDB value, while [`super::KvStore`] still reads and writes them one by one.
//!
//! # Why
//!
//! A restart reads every pair and alias, and RocksDB's iterator costs about 100 ns of CPU per
//! record whatever the column family's options (block size, compression, checksums: measured,
//! see `docs/durability.md`): 2 CPU seconds for 10 M pairs with their 10 M aliases. Stored
//! about 20 pairs or 150 aliases to a value (in the storage benchmark's store), the 20 M records
//! are 600 k values to the iterator.
//!
//! # Layout
//!
//! A record whose key has its column family's full length ([`logical_len`]: 20 bytes for a
//! pair, 16 for an alias) lives in the *bucket* named by all but the last [`ENTRY_KEY`] bytes of
//! its key: a context id and holder id with the block's top 2 bytes, or a context id with the
//! engine hash's top 2 bytes. A bucket's value is a run of entries sorted by their key:
//!
//! ```text
//! entry = key tail (6 B) · tag (1 B) · value (tag bytes)   tag 0..=254: a record of that length
//!                                                           tag 255: a removed record (no value)
//! ```
//!
//! Writes do not read the bucket: each put or delete is a RocksDB merge operand of one entry
//! (so a checkpoint still writes what changed and nothing else), and RocksDB folds the operands
//! into the bucket when it reads or compacts it ([`merge`]). Removed records are kept while
//! older data may still be below them (a partial merge) and dropped once nothing is (a full
//! merge). Keys of any other length are stored as they are; so are schema 3's records until
//! migration 4 moves them (a scan reads them where they are stored, among the buckets: only the
//! migration's own batches ever see that order).

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Cf, StorageError};

/// Key bytes an entry keeps; the rest of the key names its bucket.
pub const ENTRY_KEY: usize = 6;

/// The tag of a removed record.
const REMOVED: u8 = 255;

/// The longest value an entry holds (a pair value is its tier bits and a 5-byte count per tier,
/// an alias value 8 bytes).
pub const MAX_VALUE: usize = 254;

/// The key length of the records a column family keeps packed, if it packs any.
pub const fn logical_len(cf: Cf) -> Option<usize> {
    match cf {
        Cf::Pairs => Some(20),
        Cf::Aliases => Some(16),
        _ => None,
    }
}

/// The bucket a record of `cf` with this key lives in, when `cf` packs keys of its length.
pub fn bucket_of(cf: Cf, key: &[u8]) -> Option<&[u8]> {
    match logical_len(cf) {
        Some(len) if key.len() == len => Some(&key[..len - ENTRY_KEY]),
        _ => None,
    }
}

/// Whether a stored key of `cf` is a bucket (not a record stored as it is).
pub fn is_bucket(cf: Cf, stored_key: &[u8]) -> bool {
    logical_len(cf).is_some_and(|len| stored_key.len() == len - ENTRY_KEY)
}

/// Append an entry setting the record whose key ends in `tail` to `value`.
pub fn put_entry(out: &mut Vec<u8>, cf: Cf, tail: &[u8], value: &[u8]) -> Result<(), StorageError> {
    if value.len() > MAX_VALUE {
        return Err(StorageError::Io(format!(
            "a {} record's value is {} bytes, more than the {MAX_VALUE} a packed record holds",
            cf.name(),
            value.len()
        )));
    }
    out.extend_from_slice(tail);
    out.push(value.len() as u8);
    out.extend_from_slice(value);
    Ok(())
}

/// Append an entry removing the record whose key ends in `tail`.
pub fn removed_entry(out: &mut Vec<u8>, tail: &[u8]) {
    out.extend_from_slice(tail);
    out.push(REMOVED);
}

/// One entry: its key tail and its value (`None`: removed).
pub type Entry<'a> = (&'a [u8], Option<&'a [u8]>);

/// The entries of a bucket value or merge operand, in order; an error for bytes that are not
/// whole entries.
pub fn entries(bytes: &[u8]) -> Entries<'_> {
    Entries { rest: bytes }
}

pub struct Entries<'a> {
    rest: &'a [u8],
}

/// Bytes that are not whole entries.
#[derive(Debug, PartialEq, Eq)]
pub struct Malformed;

impl<'a> Iterator for Entries<'a> {
    type Item = Result<Entry<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let Some((&tag, after)) = self.rest.get(ENTRY_KEY..).and_then(<[u8]>::split_first) else {
            self.rest = &[];
            return Some(Err(Malformed));
        };
        let tail = &self.rest[..ENTRY_KEY];
        if tag == REMOVED {
            self.rest = after;
            return Some(Ok((tail, None)));
        }
        let len = usize::from(tag);
        if after.len() < len {
            self.rest = &[];
            return Some(Err(Malformed));
        }
        let (value, rest) = after.split_at(len);
        self.rest = rest;
        Some(Ok((tail, Some(value))))
    }
}

/// Bucket values and merge operands found malformed while merging (never written by this
/// code: a disk or memory fault), whose unreadable rest was dropped.
static MALFORMED_MERGES: AtomicU64 = AtomicU64::new(0);

/// Malformed bytes met while merging, so far.
pub fn malformed_merges() -> u64 {
    MALFORMED_MERGES.load(Ordering::Relaxed)
}

/// Fold `operands` (oldest first) into the bucket value `base`. With `full`, nothing older than
/// `base` exists, so removed records are dropped; otherwise (a partial merge, `base` absent)
/// they stay to remove what older data holds. Never fails: RocksDB would stop compacting, and
/// with it writing, on a failed merge. Malformed bytes (never written by [`put_entry`] or
/// [`removed_entry`]) are counted and what follows them in that value is dropped; the records
/// before them stay.
pub fn merge<'a>(
    base: Option<&'a [u8]>,
    operands: impl Iterator<Item = &'a [u8]>,
    full: bool,
) -> Vec<u8> {
    // Keyed by the tail as a number: compared in one instruction instead of a slice compare.
    let mut all: Vec<(u64, Entry<'a>)> = Vec::new();
    let mut malformed = 0u64;
    for value in base.into_iter().chain(operands) {
        for entry in entries(value) {
            match entry {
                Ok(e) => all.push((tail_number(e.0), e)),
                Err(Malformed) => malformed += 1,
            }
        }
    }
    if malformed > 0 {
        let before = MALFORMED_MERGES.fetch_add(malformed, Ordering::Relaxed);
        // Rate-limited: the first time and at every power of two after.
        if (before + malformed).ilog2() != before.checked_ilog2().unwrap_or(u32::MAX) {
            tracing::error!(
                total = before + malformed,
                "packed column family: malformed bytes in a bucket merge were dropped"
            );
        }
    }
    // Stable: of the entries of one key, the newest (last written) stays last. The base is
    // sorted already and the operands few, which the sort finds in one pass.
    all.sort_by_key(|&(key, _)| key);
    let mut out = Vec::with_capacity(
        all.iter()
            .map(|(_, (_, v))| ENTRY_KEY + 1 + v.map_or(0, <[u8]>::len))
            .sum(),
    );
    let mut i = 0;
    while i < all.len() {
        let mut newest = i;
        while newest + 1 < all.len() && all[newest + 1].0 == all[i].0 {
            newest += 1;
        }
        match all[newest].1 {
            (tail, Some(value)) => {
                out.extend_from_slice(tail);
                out.push(value.len() as u8);
                out.extend_from_slice(value);
            }
            (tail, None) if !full => removed_entry(&mut out, tail),
            (_, None) => {}
        }
        i = newest + 1;
    }
    out
}

/// A key tail's bytes as a number, in the same order.
pub fn tail_number(tail: &[u8]) -> u64 {
    let mut bytes = [0u8; 8];
    bytes[8 - ENTRY_KEY..].copy_from_slice(tail);
    u64::from_be_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(tail: u8, value: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        put_entry(&mut v, Cf::Pairs, &[0, 0, 0, 0, 0, tail], value).unwrap();
        v
    }

    fn removed(tail: u8) -> Vec<u8> {
        let mut v = Vec::new();
        removed_entry(&mut v, &[0, 0, 0, 0, 0, tail]);
        v
    }

    fn read(bytes: &[u8]) -> Vec<(u8, Option<Vec<u8>>)> {
        entries(bytes)
            .map(|e| e.map(|(t, v)| (t[5], v.map(<[u8]>::to_vec))).unwrap())
            .collect()
    }

    #[test]
    fn keys_of_the_full_length_pack_and_others_stay_as_they_are() {
        let pair = [7u8; 20];
        assert_eq!(bucket_of(Cf::Pairs, &pair), Some(&pair[..14]));
        assert_eq!(bucket_of(Cf::Aliases, &pair[..16]), Some(&pair[..10]));
        assert_eq!(bucket_of(Cf::Pairs, &pair[..4]), None);
        assert_eq!(bucket_of(Cf::Holders, &pair[..12]), None);
        assert!(is_bucket(Cf::Pairs, &pair[..14]) && !is_bucket(Cf::Pairs, &pair));
        assert!(!is_bucket(Cf::Watermarks, &pair[..14]));
    }

    #[test]
    fn a_full_merge_keeps_the_newest_of_each_key_sorted_and_drops_removals() {
        let base = [put(1, b"a"), put(3, b"c"), put(5, b"e")].concat();
        let ops = [
            put(4, b"d"),
            removed(3),
            put(1, b"A"),
            put(3, b"again"),
            removed(5),
        ];
        let merged = merge(Some(&base), ops.iter().map(Vec::as_slice), true);
        assert_eq!(
            read(&merged),
            [
                (1, Some(b"A".to_vec())),
                (3, Some(b"again".to_vec())),
                (4, Some(b"d".to_vec()))
            ]
        );
        // Removing everything leaves an empty bucket.
        let gone = merge(
            Some(&merged),
            [removed(1), removed(3), removed(4)]
                .iter()
                .map(Vec::as_slice),
            true,
        );
        assert!(gone.is_empty());
    }

    #[test]
    fn a_partial_merge_keeps_removals_for_the_data_below() {
        let ops = [put(2, b"b"), removed(2), removed(9), put(1, b"")];
        let merged = merge(None, ops.iter().map(Vec::as_slice), false);
        assert_eq!(read(&merged), [(1, Some(Vec::new())), (2, None), (9, None)]);
        // Folded later over a base, the kept removals still remove.
        let base = [put(2, b"old"), put(9, b"old"), put(10, b"x")].concat();
        let full = merge(Some(&base), std::iter::once(merged.as_slice()), true);
        assert_eq!(
            read(&full),
            [(1, Some(Vec::new())), (10, Some(b"x".to_vec()))]
        );
    }

    #[test]
    fn malformed_bytes_are_counted_and_the_records_before_them_kept() {
        let before = malformed_merges();
        let mut bad = put(1, b"a");
        bad.extend_from_slice(&[0, 0, 0, 0, 0, 2, 9, b'x']); // claims 9 bytes, has 1
        let short = vec![1u8, 2, 3];
        let merged = merge(
            Some(&bad),
            [put(3, b"c"), short].iter().map(Vec::as_slice),
            true,
        );
        assert_eq!(
            read(&merged),
            [(1, Some(b"a".to_vec())), (3, Some(b"c".to_vec()))]
        );
        assert!(malformed_merges() >= before + 2);
        assert_eq!(entries(&[1, 2]).collect::<Vec<_>>(), [Err(Malformed)]);
    }

    #[test]
    fn a_value_too_long_for_an_entry_is_refused_naming_the_column_family() {
        let mut out = Vec::new();
        let err = put_entry(&mut out, Cf::Aliases, &[0; 6], &[0; 255]).unwrap_err();
        assert!(err.to_string().contains("aliases"), "{err}");
        assert!(out.is_empty());
        put_entry(&mut out, Cf::Aliases, &[0; 6], &[0; MAX_VALUE]).unwrap();
    }
}
