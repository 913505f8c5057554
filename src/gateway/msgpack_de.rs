//! A serde `Deserializer` over a msgpack request body, so that one set of field decoders
//! ([`super::request`]) reads both JSON (through `serde_json`) and msgpack, value by value,
//! without a document tree.
//!
//! It applies the HTTP API's msgpack rules where the reference applies them: map keys must be
//! strings, strings valid UTF-8, extension types are refused. Strings and bins are borrowed from
//! the body. Values a decoder ignores (`IgnoredAny`: an unknown field, the rest of an array
//! already refused) are skipped by the reader's iterative skip, so neither their size nor their
//! nesting costs memory or stack; their contents are not checked further.

use std::fmt;

use serde::de::{self, DeserializeSeed, Visitor};

use crate::wire::msgpack::{Fail, Kind, Reader};

/// Nesting the decoders may visit (they visit at most three levels; skipped values do not count).
const MAX_DEPTH: u32 = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

fn malformed(fail: Fail) -> Error {
    match fail {
        Fail::Malformed { offset } => Error(format!("truncated or malformed at byte {offset}")),
        Fail::Type { got } => Error(format!("unexpected {got}")),
    }
}

/// Decode one value from `body` with `seed`; bytes after it are an error.
pub fn from_slice<'a, S: DeserializeSeed<'a>>(body: &'a [u8], seed: S) -> Result<S::Value, Error> {
    let mut de = Deserializer {
        r: Reader::new(body),
        depth: 0,
    };
    let value = seed.deserialize(&mut de)?;
    if de.r.remaining() != 0 {
        return Err(Error("trailing bytes after the msgpack object".into()));
    }
    Ok(value)
}

pub struct Deserializer<'a> {
    r: Reader<'a>,
    depth: u32,
}

impl Deserializer<'_> {
    fn enter(&mut self) -> Result<(), Error> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(Error(format!("nesting deeper than {MAX_DEPTH}")));
        }
        Ok(())
    }
}

impl<'de> de::Deserializer<'de> for &mut Deserializer<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        let r = &mut self.r;
        match r.peek().map_err(malformed)? {
            Kind::Nil => {
                r.nil().map_err(malformed)?;
                v.visit_unit()
            }
            Kind::Bool => v.visit_bool(r.bool().map_err(malformed)?),
            Kind::Int => {
                let i = r.int().map_err(malformed)?;
                match i64::try_from(i) {
                    Ok(i) => v.visit_i64(i),
                    // Every msgpack integer fits in i64 or u64.
                    Err(_) => v.visit_u64(i as u64),
                }
            }
            Kind::Float => v.visit_f64(r.float().map_err(malformed)?),
            Kind::Str => match r.str() {
                Ok(s) => v.visit_borrowed_str(s),
                Err(Fail::Type { .. }) => Err(Error("strings must be valid UTF-8".into())),
                Err(e) => Err(malformed(e)),
            },
            Kind::Bin => v.visit_borrowed_bytes(r.bin().map_err(malformed)?),
            Kind::Array => {
                let left = r.array_len().map_err(malformed)?;
                self.enter()?;
                let value = v.visit_seq(Items { de: self, left })?;
                self.depth -= 1;
                Ok(value)
            }
            Kind::Map => {
                let left = r.map_len().map_err(malformed)?;
                self.enter()?;
                let value = v.visit_map(Items { de: self, left })?;
                self.depth -= 1;
                Ok(value)
            }
            Kind::Ext => Err(Error("msgpack extension types are not accepted".into())),
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Error> {
        self.r.skip().map_err(malformed)?;
        v.visit_unit()
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier
    }
}

/// The elements of an array, or the entries of a map, still to read.
struct Items<'a, 'de> {
    de: &'a mut Deserializer<'de>,
    left: u32,
}

impl<'de> de::SeqAccess<'de> for Items<'_, 'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        seed.deserialize(&mut *self.de).map(Some)
    }

    /// The declared length, but never more than the bytes left (each element takes at least
    /// one), so that a lying header cannot drive an allocation.
    fn size_hint(&self) -> Option<usize> {
        Some(self.de.r.capacity_for(self.left))
    }
}

impl<'de> de::MapAccess<'de> for Items<'_, 'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        if self.left == 0 {
            return Ok(None);
        }
        self.left -= 1;
        if self.de.r.peek().map_err(malformed)? != Kind::Str {
            return Err(Error("map keys must be strings".into()));
        }
        seed.deserialize(&mut *self.de).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(&mut *self.de)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.de.r.capacity_for(self.left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::IgnoredAny;

    fn decode(bytes: &[u8]) -> Result<serde_json::Value, Error> {
        from_slice(bytes, std::marker::PhantomData::<serde_json::Value>)
    }

    #[test]
    fn decodes_what_rmp_serde_encodes() {
        let doc = serde_json::json!({
            "s": "x\u{e9}", "i": -5, "u": u64::MAX, "f": 1.5, "b": true, "n": null,
            "a": [1, [2, {"k": []}], 300_000], "m": {"deep": {"deeper": "v"}},
        });
        let bytes = rmp_serde::to_vec_named(&doc).unwrap();
        assert_eq!(decode(&bytes).unwrap(), doc);
    }

    #[test]
    fn refuses_what_the_api_refuses() {
        let cases: [(&[u8], &str); 6] = [
            (&[0x81, 0x01, 0x01], "map keys must be strings"),
            (&[0xa1, 0xff], "strings must be valid UTF-8"),
            (
                &[0xd4, 0x01, 0x00],
                "msgpack extension types are not accepted",
            ),
            (&[0xc0, 0xc0], "trailing bytes after the msgpack object"),
            (&[0xc1], "truncated or malformed at byte 0"),
            (&[0x92, 0x01], "truncated or malformed at byte 2"),
        ];
        for (bytes, message) in cases {
            assert_eq!(decode(bytes).unwrap_err().0, message, "{bytes:x?}");
        }
        let deep = [vec![0x91; 65], vec![0xc0]].concat();
        assert_eq!(decode(&deep).unwrap_err().0, "nesting deeper than 64");
        assert!(decode(&[vec![0x91; 64], vec![0xc0]].concat()).is_ok());
    }

    #[test]
    fn ignored_values_are_skipped_whatever_their_nesting() {
        // A million nested arrays: skipped iteratively, never visited.
        let deep = [vec![0xdd, 0, 0, 0, 1], vec![0x91; 1 << 20], vec![0x01]].concat();
        assert!(from_slice(&deep, std::marker::PhantomData::<IgnoredAny>).is_ok());
        let cut = &deep[..deep.len() - 1];
        assert!(from_slice(cut, std::marker::PhantomData::<IgnoredAny>).is_err());
    }

    #[test]
    fn a_lying_length_is_no_size_hint() {
        struct Hint;
        impl<'de> Visitor<'de> for Hint {
            type Value = Option<usize>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Option<usize>, A::Error> {
                Ok(seq.size_hint())
            }
        }
        let mut de = Deserializer {
            r: Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff, 1, 2, 3]),
            depth: 0,
        };
        assert_eq!(
            de::Deserializer::deserialize_any(&mut de, Hint),
            Ok(Some(3))
        );
    }
}
