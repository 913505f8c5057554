//! Query answers of the HTTP API serialized straight from the walk's answer ([`AnswerView`]), in
//! the reference's layout, without a `serde_json::Value` per number nor a map per row. Requests
//! are decoded in [`super::request`].

use super::repeated_rows::Recent;
use crate::index::{AnswerView, RowView, TierCounts};

/// A query answer serialized straight from an [`AnswerView`] (JSON or msgpack), without building
/// a JSON tree per response. The reference's layout: instances by id, ranks in numeric order
/// ("2" before "10"), row fields `longest_matched, dp, rank_matches` then the tiers from
/// `device` to `disk`; `longest_matched` equals `disk`, and a row's tiers are its ranks' maxima.
pub struct HitsBody<'a>(pub AnswerView<'a>);

/// [`HitsBody`] with further entries after `instances`: the engines' load figures, `loads` (a
/// query's `include_load`), and how sure the answer is, `status` (`include_status`).
pub struct HitsWith<'a>(
    pub AnswerView<'a>,
    pub &'a [(&'static str, serde_json::Value)],
);

impl serde::Serialize for HitsBody<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("instances", &Instances(self.0))?;
        m.end()
    }
}

impl serde::Serialize for HitsWith<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(1 + self.1.len()))?;
        m.serialize_entry("instances", &Instances(self.0))?;
        for (name, value) in self.1 {
            m.serialize_entry(name, value)?;
        }
        m.end()
    }
}

struct Instances<'a>(AnswerView<'a>);

impl serde::Serialize for Instances<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.rows().map(|r| (r.id, Row(r))))
    }
}

struct Row<'a>(RowView<'a>);

impl serde::Serialize for Row<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Dp<'a>(RowView<'a>);
        impl serde::Serialize for Dp<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.ranks().map(|(r, t)| (r.to_string(), t.device)))
            }
        }
        struct Ranks<'a>(RowView<'a>);
        impl serde::Serialize for Ranks<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map((self.0.ranks()).map(|(r, t)| (r.to_string(), TierCountsBody(t))))
            }
        }
        let t = self.0.tiers();
        let mut m = s.serialize_map(Some(7))?;
        m.serialize_entry("longest_matched", &t.disk)?;
        m.serialize_entry("dp", &Dp(self.0))?;
        m.serialize_entry("rank_matches", &Ranks(self.0))?;
        m.serialize_entry("device", &t.device)?;
        m.serialize_entry("cpu_local", &t.cpu_local)?;
        m.serialize_entry("cpu_share", &t.cpu_share)?;
        m.serialize_entry("disk", &t.disk)?;
        m.end()
    }
}

impl serde::Serialize for TierCountsBody {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let t = &self.0;
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("device", &t.device)?;
        m.serialize_entry("cpu_local", &t.cpu_local)?;
        m.serialize_entry("cpu_share", &t.cpu_share)?;
        m.serialize_entry("disk", &t.disk)?;
        m.end()
    }
}

struct TierCountsBody(TierCounts);

/// The msgpack bytes of [`HitsBody`], written by hand: the same bytes `rmp_serde` gives (the
/// smallest marker for every length and integer, keys in [`HitsBody`]'s order), without going
/// through `std::io::Write` for every marker and key. Field names are written pre-encoded.
pub fn hits_msgpack(answer: AnswerView<'_>) -> Vec<u8> {
    hits_msgpack_with(answer, &[])
}

/// The msgpack bytes of [`HitsWith`].
pub fn hits_msgpack_with(
    answer: AnswerView<'_>,
    extra: &[(&'static str, serde_json::Value)],
) -> Vec<u8> {
    // About 150 bytes per row of two ranks; a little spare saves a reallocation.
    let mut out = Vec::with_capacity(16 + answer.len() * 64 + answer.rank_total() * 72);
    map_len(&mut out, 1 + extra.len());
    out.extend_from_slice(b"\xa9instances");
    map_len(&mut out, answer.len());
    let mut recent = Recent::default();
    for row in answer.rows() {
        str(&mut out, row.id.as_bytes());
        // Everything after the id depends on the row's values alone (see `repeated_rows`).
        if let Some((from, len)) = recent.find(&row) {
            out.extend_from_within(from..from + len);
            continue;
        }
        let at = out.len();
        let tiers = row.tiers();
        map_len(&mut out, 7);
        out.extend_from_slice(b"\xaflongest_matched");
        uint(&mut out, tiers.disk);
        out.extend_from_slice(b"\xa2dp");
        by_rank(&mut out, &row, |out, t| uint(out, t.device));
        out.extend_from_slice(b"\xacrank_matches");
        by_rank(&mut out, &row, |out, t| {
            map_len(out, 4);
            tier_fields(out, t);
        });
        tier_fields(&mut out, &tiers);
        recent.remember(row, at, out.len() - at);
    }
    for (name, value) in extra {
        str(&mut out, name.as_bytes());
        // Writing into a Vec cannot fail, and a JSON value always encodes.
        let _ = rmp_serde::encode::write_named(&mut out, value);
    }
    out
}

/// The four tier counts from `device` to `disk` (as [`TierCountsBody`] and [`Row`] write them).
fn tier_fields(out: &mut Vec<u8>, t: &TierCounts) {
    out.extend_from_slice(b"\xa6device");
    uint(out, t.device);
    out.extend_from_slice(b"\xa9cpu_local");
    uint(out, t.cpu_local);
    out.extend_from_slice(b"\xa9cpu_share");
    uint(out, t.cpu_share);
    out.extend_from_slice(b"\xa4disk");
    uint(out, t.disk);
}

/// A row's ranks as a map with decimal keys in numeric order, as [`Row`] writes them.
fn by_rank(out: &mut Vec<u8>, row: &RowView<'_>, value: impl Fn(&mut Vec<u8>, &TierCounts)) {
    map_len(out, row.rank_count());
    let mut digits = [0; 10];
    for (rank, t) in row.ranks() {
        str(out, super::rank_key(rank, &mut digits));
        value(out, &t);
    }
}

fn map_len(out: &mut Vec<u8>, n: usize) {
    match n {
        0..16 => out.push(0x80 | n as u8),
        16..=0xffff => {
            out.push(0xde);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            out.push(0xdf);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
}

fn str(out: &mut Vec<u8>, s: &[u8]) {
    let n = s.len();
    match n {
        0..32 => out.push(0xa0 | n as u8),
        32..256 => out.extend_from_slice(&[0xd9, n as u8]),
        256..=0xffff => {
            out.push(0xda);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            out.push(0xdb);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
    }
    out.extend_from_slice(s);
}

fn uint(out: &mut Vec<u8>, v: u64) {
    match v {
        0..128 => out.push(v as u8),
        128..256 => out.extend_from_slice(&[0xcc, v as u8]),
        256..=0xffff => {
            out.push(0xcd);
            out.extend_from_slice(&(v as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(0xce);
            out.extend_from_slice(&(v as u32).to_be_bytes());
        }
        _ => {
            out.push(0xcf);
            out.extend_from_slice(&v.to_be_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{FlatAnswer, InstanceHits, QueryHits};

    /// One instance with ranks 0, 2 and 10: ranks in numeric order, row fields in the
    /// reference's order.
    #[test]
    fn answers_have_the_reference_layout() {
        let t = |device| TierCounts {
            device,
            cpu_local: 32,
            cpu_share: 48,
            disk: 64,
        };
        let row = InstanceHits {
            longest_matched: 64,
            dp: [(10, 16), (2, 0), (0, 32)].into_iter().collect(),
            rank_matches: [(10, t(16)), (2, t(0)), (0, t(32))].into_iter().collect(),
            device: 32,
            cpu_local: 32,
            cpu_share: 48,
            disk: 64,
        };
        let mut hits = QueryHits::default();
        hits.hits.insert("b".into(), row.clone());
        hits.hits.insert("a".into(), row);
        let tiers = |d| format!(r#"{{"device":{d},"cpu_local":32,"cpu_share":48,"disk":64}}"#);
        let one = format!(
            r#"{{"longest_matched":64,"dp":{{"0":32,"2":0,"10":16}},"rank_matches":{{"0":{},"2":{},"10":{}}},"device":32,"cpu_local":32,"cpu_share":48,"disk":64}}"#,
            tiers(32),
            tiers(0),
            tiers(16)
        );
        let expected = format!(r#"{{"instances":{{"a":{one},"b":{one}}}}}"#);
        let flat = FlatAnswer::from_hits(&hits);
        let json = serde_json::to_string(&HitsBody(flat.view())).unwrap();
        assert_eq!(json, expected);
        let msgpack = hits_msgpack(flat.view());
        assert_eq!(
            msgpack,
            rmp_serde::to_vec_named(&HitsBody(flat.view())).unwrap()
        );
        // The same document, in the same order, in both encodings.
        let back = rmpv::decode::read_value(&mut msgpack.as_slice()).unwrap();
        let mut text = Vec::new();
        write_json(&back, &mut text);
        assert_eq!(String::from_utf8(text).unwrap(), expected);
        assert_eq!(hits_msgpack(AnswerView::empty()), b"\x81\xa9instances\x80");
    }

    /// A decoded msgpack value as compact JSON text, keys in their msgpack order.
    fn write_json(v: &rmpv::Value, out: &mut Vec<u8>) {
        match v {
            rmpv::Value::Map(entries) => {
                out.push(b'{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    out.extend_from_slice(format!("{:?}", k.as_str().unwrap()).as_bytes());
                    out.push(b':');
                    write_json(v, out);
                }
                out.push(b'}');
            }
            other => out.extend_from_slice(other.to_string().as_bytes()),
        }
    }

    #[test]
    fn hand_written_msgpack_matches_rmp_serde_at_every_length_boundary() {
        let mut rng = crate::test_rng::Rng(0x5eed_0005);
        let counts = [
            0,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            u32::MAX as u64,
            1 << 32,
            u64::MAX,
        ];
        let id_lengths: [usize; 8] = [0, 1, 31, 32, 255, 256, 65_535, 65_536];
        for case in 0..200 {
            let mut hits = QueryHits::default();
            let rows = *rng.pick(&[0, 1, 2, 15, 16, 17, 40]);
            for i in 0..rows {
                let len = *rng.pick(&id_lengths);
                // Unique by row, exactly `len` bytes long where `len` leaves room for the row.
                let mut id = if len == 0 {
                    String::new()
                } else {
                    format!("{i}-")
                };
                id.extend(std::iter::repeat_n('x', len.saturating_sub(id.len())));
                let mut row = InstanceHits {
                    longest_matched: *rng.pick(&counts),
                    device: *rng.pick(&counts),
                    cpu_local: *rng.pick(&counts),
                    cpu_share: *rng.pick(&counts),
                    disk: *rng.pick(&counts),
                    ..InstanceHits::default()
                };
                for _ in 0..rng.below(20) {
                    let rank = *rng.pick(&[0, 1, 9, 10, 11, 100, u32::MAX]);
                    let t = |rng: &mut crate::test_rng::Rng| *rng.pick(&counts);
                    let tiers = TierCounts {
                        device: t(&mut rng),
                        cpu_local: t(&mut rng),
                        cpu_share: t(&mut rng),
                        disk: t(&mut rng),
                    };
                    row.dp.insert(rank, t(&mut rng));
                    row.rank_matches.insert(rank, tiers);
                }
                hits.hits.insert(id, row);
            }
            let flat = FlatAnswer::from_hits(&hits);
            let expected = rmp_serde::to_vec_named(&HitsBody(flat.view())).unwrap();
            assert_eq!(hits_msgpack(flat.view()), expected, "case {case}");
        }
    }

    /// Rows repeating an earlier row's values are copied (see `repeated_rows`), also once more
    /// distinct values went by than are remembered: the bytes stay `rmp_serde`'s.
    #[test]
    fn repeated_rows_give_the_same_bytes_as_rmp_serde() {
        let mut rng = crate::test_rng::Rng(0x5eed_0007);
        let counts = [0, 16, 128, 4096, u64::MAX];
        for case in 0..200 {
            let distinct: Vec<Vec<(u32, [u64; 4])>> = (0..1 + rng.below(7))
                .map(|_| {
                    (0..rng.below(4) as u32)
                        .map(|r| (r * 3, [0; 4].map(|_| *rng.pick(&counts))))
                        .collect()
                })
                .collect();
            let mut hits = QueryHits::default();
            for i in 0..rng.below(60) {
                let ranks = rng.pick(&distinct);
                let row = hits.hits.get_or_insert_default(format!("inst-{i}"));
                for &(r, c) in ranks {
                    row.rank_matches.insert(r, TierCounts::from_array(c));
                }
            }
            let flat = FlatAnswer::from_hits(&hits);
            let expected = rmp_serde::to_vec_named(&HitsBody(flat.view())).unwrap();
            assert_eq!(hits_msgpack(flat.view()), expected, "case {case}");
        }
    }
}
