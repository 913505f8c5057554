//! Query answers of the HTTP API serialized straight from [`QueryHits`] (the same bytes the
//! reference layout gives, built without a `serde_json::Value` per number). Requests are
//! decoded in [`super::request`].

use crate::index::{InstanceHits, QueryHits, SortedMap, TierCounts};

/// A query answer serialized straight from [`QueryHits`] (JSON or msgpack), without building a
/// JSON tree per response. The layout is what a `serde_json::Map` tree gives: every map's keys
/// sorted as strings, so rank "10" comes before rank "2", and the row fields alphabetically.
pub struct HitsBody<'a>(pub &'a QueryHits);

impl serde::Serialize for HitsBody<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Instances<'a>(&'a SortedMap<String, InstanceHits>);
        impl serde::Serialize for Instances<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_map(self.0.iter().map(|(id, h)| (id, Row(h))))
            }
        }
        let mut m = s.serialize_map(Some(1))?;
        m.serialize_entry("instances", &Instances(&self.0.hits))?;
        m.end()
    }
}

struct Row<'a>(&'a InstanceHits);

impl serde::Serialize for Row<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let h = self.0;
        let mut m = s.serialize_map(Some(7))?;
        m.serialize_entry("cpu_local", &h.cpu_local)?;
        m.serialize_entry("cpu_share", &h.cpu_share)?;
        m.serialize_entry("device", &h.device)?;
        m.serialize_entry("disk", &h.disk)?;
        m.serialize_entry("dp", &ByRank(&h.dp, |v| *v))?;
        m.serialize_entry("longest_matched", &h.longest_matched)?;
        m.serialize_entry("rank_matches", &ByRank(&h.rank_matches, TierCountsBody))?;
        m.end()
    }
}

impl serde::Serialize for TierCountsBody<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let t = self.0;
        let mut m = s.serialize_map(Some(4))?;
        m.serialize_entry("cpu_local", &t.cpu_local)?;
        m.serialize_entry("cpu_share", &t.cpu_share)?;
        m.serialize_entry("device", &t.device)?;
        m.serialize_entry("disk", &t.disk)?;
        m.end()
    }
}

struct TierCountsBody<'a>(&'a TierCounts);

/// A rank-keyed map with decimal string keys in string order, values mapped by `.1`.
struct ByRank<'a, V, W>(&'a SortedMap<u32, V>, fn(&'a V) -> W);

impl<'a, V, W: serde::Serialize> serde::Serialize for ByRank<'a, V, W> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut keyed: Vec<(String, &'a V)> =
            self.0.iter().map(|(r, v)| (r.to_string(), v)).collect();
        // Numeric order is string order only while every rank has one digit.
        if self.0.keys().next_back().is_some_and(|r| *r >= 10) {
            keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        }
        s.collect_map(keyed.iter().map(|(k, v)| (k, (self.1)(v))))
    }
}

/// The msgpack bytes of [`HitsBody`], written by hand: the same bytes `rmp_serde` gives (the
/// smallest marker for every length and integer, keys in [`HitsBody`]'s order), without going
/// through `std::io::Write` for every marker and key. Field names are written pre-encoded.
pub fn hits_msgpack(hits: &QueryHits) -> Vec<u8> {
    // About 150 bytes per row of two ranks; a little spare saves a reallocation.
    let mut out = Vec::with_capacity(16 + hits.hits.len() * 192);
    map_len(&mut out, 1);
    out.extend_from_slice(b"\xa9instances");
    map_len(&mut out, hits.hits.len());
    for (id, h) in &hits.hits {
        str(&mut out, id.as_bytes());
        map_len(&mut out, 7);
        tier_fields(&mut out, &h.tiers());
        out.extend_from_slice(b"\xa2dp");
        by_rank(&mut out, &h.dp, |out, v| uint(out, *v));
        out.extend_from_slice(b"\xaflongest_matched");
        uint(&mut out, h.longest_matched);
        out.extend_from_slice(b"\xacrank_matches");
        by_rank(&mut out, &h.rank_matches, |out, t| {
            map_len(out, 4);
            tier_fields(out, t);
        });
    }
    out
}

/// The four tier counts, keys in string order (as [`TierCountsBody`] and [`Row`] write them).
fn tier_fields(out: &mut Vec<u8>, t: &TierCounts) {
    out.extend_from_slice(b"\xa9cpu_local");
    uint(out, t.cpu_local);
    out.extend_from_slice(b"\xa9cpu_share");
    uint(out, t.cpu_share);
    out.extend_from_slice(b"\xa6device");
    uint(out, t.device);
    out.extend_from_slice(b"\xa4disk");
    uint(out, t.disk);
}

/// A rank-keyed map in [`ByRank`]'s order: decimal keys in string order.
fn by_rank<V>(out: &mut Vec<u8>, ranks: &SortedMap<u32, V>, value: impl Fn(&mut Vec<u8>, &V)) {
    map_len(out, ranks.len());
    let mut digits = [0; 10];
    if ranks.keys().next_back().is_some_and(|r| *r >= 10) {
        let mut keyed: Vec<(String, &V)> = ranks.iter().map(|(r, v)| (r.to_string(), v)).collect();
        keyed.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        for (key, v) in keyed {
            str(out, key.as_bytes());
            value(out, v);
        }
    } else {
        for (rank, v) in ranks {
            str(out, super::rank_key(*rank, &mut digits));
            value(out, v);
        }
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
    use serde_json::{Value as Json, json};

    /// The JSON tree the answers were built from before `HitsBody`: the reference layout.
    fn reference(hits: &QueryHits) -> Json {
        let tiers = |t: &TierCounts| json!({"device": t.device, "cpu_local": t.cpu_local, "cpu_share": t.cpu_share, "disk": t.disk});
        let instances: serde_json::Map<String, Json> = (hits.hits.iter())
            .map(|(id, h)| {
                let dp: serde_json::Map<String, Json> = h.dp.iter().map(|(r, v)| (r.to_string(), json!(v))).collect();
                let ranks: serde_json::Map<String, Json> = h.rank_matches.iter().map(|(r, t)| (r.to_string(), tiers(t))).collect();
                let row = json!({
                    "longest_matched": h.longest_matched, "dp": dp, "rank_matches": ranks,
                    "device": h.device, "cpu_local": h.cpu_local, "cpu_share": h.cpu_share, "disk": h.disk,
                });
                (id.clone(), row)
            })
            .collect();
        json!({ "instances": instances })
    }

    #[test]
    fn answers_are_byte_identical_to_the_json_tree() {
        let mut hits = QueryHits::default();
        for (n, id) in ["b", "a", "inst-10", "inst-2", ""].iter().enumerate() {
            let n = n as u64;
            let ranks: Vec<u32> = [0, 1, 2, 10, 11, 100]
                .into_iter()
                .take(n as usize + 1)
                .collect();
            let t = |r: u32| TierCounts {
                device: n + r as u64,
                cpu_local: 300,
                cpu_share: u64::MAX,
                disk: 1 << 40,
            };
            let row = InstanceHits {
                longest_matched: n * 16,
                dp: ranks.iter().map(|r| (*r, n * 1000 + *r as u64)).collect(),
                rank_matches: ranks.iter().map(|r| (*r, t(*r))).collect(),
                device: n,
                cpu_local: 128,
                cpu_share: 70_000,
                disk: 5_000_000_000,
            };
            hits.hits.insert(id.to_string(), row);
        }
        for h in [QueryHits::default(), hits] {
            let old = reference(&h);
            assert_eq!(
                serde_json::to_vec(&HitsBody(&h)).unwrap(),
                serde_json::to_vec(&old).unwrap()
            );
            let new = rmp_serde::to_vec_named(&HitsBody(&h)).unwrap();
            assert_eq!(new, rmp_serde::to_vec_named(&old).unwrap());
            assert_eq!(hits_msgpack(&h), new);
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
            let expected = rmp_serde::to_vec_named(&HitsBody(&hits)).unwrap();
            assert_eq!(hits_msgpack(&hits), expected, "case {case}");
        }
    }
}
