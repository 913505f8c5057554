//! Wire shapes of the HTTP API that skip intermediate trees: JSON request documents decoded
//! straight into [`Val`], and query answers serialized straight from [`QueryHits`] (the same
//! bytes the reference layout gives, built without a `serde_json::Value` per number).

use crate::gateway::value::Val;
use crate::index::{InstanceHits, QueryHits, TierCounts};

/// A JSON request document decoded straight into a [`Val`], without a `serde_json::Value` tree
/// in between (a 2k-token prompt was 2k `Value`s, then 2k `Val`s). Same result as
/// `Val::from_json(serde_json::from_slice(..))`: objects keep `serde_json::Map`'s semantics
/// (keys sorted, the last duplicate wins), integers stay integers, a non-finite float is null.
pub(super) struct JsonVal(pub(super) Val);

impl<'de> serde::Deserialize<'de> for JsonVal {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonValVisitor).map(JsonVal)
    }
}

struct JsonValVisitor;

impl<'de> serde::de::Visitor<'de> for JsonValVisitor {
    type Value = Val;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, b: bool) -> Result<Val, E> {
        Ok(Val::Bool(b))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Val, E> {
        Ok(Val::Int(i.into()))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Val, E> {
        Ok(Val::Int(u.into()))
    }
    fn visit_f64<E>(self, f: f64) -> Result<Val, E> {
        Ok(if f.is_finite() {
            Val::Float(f)
        } else {
            Val::Null
        })
    }
    fn visit_str<E>(self, s: &str) -> Result<Val, E> {
        Ok(Val::Str(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Val, E> {
        Ok(Val::Str(s))
    }
    fn visit_unit<E>(self) -> Result<Val, E> {
        Ok(Val::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Val, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(JsonVal(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Val::Array(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Val, A::Error> {
        let mut entries = std::collections::BTreeMap::new();
        while let Some((k, JsonVal(v))) = map.next_entry::<String, JsonVal>()? {
            entries.insert(k, v);
        }
        Ok(Val::Map(entries.into_iter().collect()))
    }
}

/// A query answer serialized straight from [`QueryHits`] (JSON or msgpack), without building a
/// JSON tree per response. The layout is what a `serde_json::Map` tree gives: every map's keys
/// sorted as strings, so rank "10" comes before rank "2", and the row fields alphabetically.
pub(super) struct HitsBody<'a>(pub(super) &'a QueryHits);

impl serde::Serialize for HitsBody<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Instances<'a>(&'a std::collections::BTreeMap<String, InstanceHits>);
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
struct ByRank<'a, V, W>(&'a std::collections::BTreeMap<u32, V>, fn(&'a V) -> W);

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
        }
    }

    #[test]
    fn json_requests_decode_as_through_a_json_tree() {
        let docs = [
            r#"{"model":"m","block_size":16,"token_ids":[1,-2,2147483647,-2147483648,1e3,0.5]}"#,
            r#"{"z":1,"a":{"y":[true,false,null,"s\u00e9"],"b":{}},"a":2,"m":[]}"#,
            r#"[18446744073709551615,18446744073709551616,-9223372036854775808,-0,-0.0,1.5e300]"#,
            r#""just a string""#,
            r#"{"bad": }"#,
            r#"{"a":1} trailing"#,
            "",
        ];
        for doc in docs {
            let old = serde_json::from_slice::<Json>(doc.as_bytes()).map(Val::from_json);
            let new = serde_json::from_slice::<JsonVal>(doc.as_bytes()).map(|v| v.0);
            match (old, new) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{doc}"),
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string(), "{doc}"),
                (a, b) => panic!("{doc}: {a:?} vs {b:?}"),
            }
        }
    }
}
