//! Decoder tests: recorded fixtures (`fixtures`), rejection rules for engines (`engine`) and the
//! Mooncake store (`store`), and never-panic checks on random and truncated input (`fuzz`).
//!
//! Hand-built payloads use the small [`V`] tree below so a test reads like the msgpack it sends.

mod engine;
mod extras;
mod fixtures;
mod fuzz;
mod store;

use super::{EnvelopeError, decode};
use crate::events::DecodedBatch;
use crate::hashing::IndexProjection;
use crate::model::PublisherType;

/// A msgpack value to encode.
#[derive(Debug, Clone)]
pub(super) enum V {
    Nil,
    Bool(bool),
    Int(i128),
    F(f64),
    S(String),
    B(Vec<u8>),
    A(Vec<V>),
    M(Vec<(V, V)>),
}

pub(super) fn s(v: &str) -> V {
    V::S(v.to_owned())
}

pub(super) fn i(v: i128) -> V {
    V::Int(v)
}

pub(super) fn arr<const N: usize>(items: [V; N]) -> V {
    V::A(items.into())
}

pub(super) fn ints(items: &[i128]) -> V {
    V::A(items.iter().map(|&v| V::Int(v)).collect())
}

/// A map with string keys, in this order (duplicates allowed on purpose).
pub(super) fn map(entries: &[(&str, V)]) -> V {
    V::M(entries.iter().map(|(k, v)| (s(k), v.clone())).collect())
}

impl V {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }

    fn write(&self, out: &mut Vec<u8>) {
        use rmp::encode as e;
        // Writing into a Vec cannot fail.
        match self {
            V::Nil => e::write_nil(out).unwrap(),
            V::Bool(b) => e::write_bool(out, *b).unwrap(),
            V::Int(v) if *v >= 0 => {
                e::write_uint(out, u64::try_from(*v).unwrap()).unwrap();
            }
            V::Int(v) => {
                e::write_sint(out, i64::try_from(*v).unwrap()).unwrap();
            }
            V::F(f) => e::write_f64(out, *f).unwrap(),
            V::S(v) => e::write_str(out, v).unwrap(),
            V::B(v) => e::write_bin(out, v).unwrap(),
            V::A(items) => {
                e::write_array_len(out, items.len() as u32).unwrap();
                items.iter().for_each(|v| v.write(out));
            }
            V::M(entries) => {
                e::write_map_len(out, entries.len() as u32).unwrap();
                for (k, v) in entries {
                    k.write(out);
                    v.write(out);
                }
            }
        }
    }
}

/// Edit a map value: replace (or append) `key`, or remove it with `None`.
pub(super) fn with(ev: &V, key: &str, value: Option<V>) -> V {
    let V::M(entries) = ev else {
        panic!("not a map")
    };
    let mut entries: Vec<(V, V)> = entries
        .iter()
        .filter(|(k, _)| !matches!(k, V::S(n) if n == key))
        .cloned()
        .collect();
    if let Some(v) = value {
        entries.push((s(key), v));
    }
    V::M(entries)
}

pub(super) fn decode_vllm(payload: &[u8]) -> Result<DecodedBatch, EnvelopeError> {
    decode(PublisherType::Vllm, payload, IndexProjection::Low64Be)
}

pub(super) fn decode_sglang(payload: &[u8]) -> Result<DecodedBatch, EnvelopeError> {
    decode(PublisherType::Sglang, payload, IndexProjection::First64Be)
}

pub(super) fn decode_store(payload: &[u8]) -> Result<DecodedBatch, EnvelopeError> {
    decode(PublisherType::Mooncake, payload, IndexProjection::Low64Be)
}

/// `[ts, events, rank]` as an engine sends it.
pub(super) fn batch(events: Vec<V>) -> Vec<u8> {
    V::A(vec![V::F(1.5), V::A(events), i(0)]).encode()
}

/// The (index, field) of each rejected event, parsed back from the messages.
pub(super) fn invalid_fields(b: &DecodedBatch) -> Vec<(usize, String)> {
    b.invalid
        .iter()
        .map(|msg| {
            let rest = msg.strip_prefix("event ").expect("message names the event");
            let (index, rest) = rest.split_once(": ").expect("index then field");
            let (field, _) = rest.split_once(": ").expect("field then problem");
            (index.parse().expect("numeric index"), field.to_owned())
        })
        .collect()
}
