//! Request bodies decoded field by field against the endpoint's schema, in one pass and without
//! a document tree, so that memory stays a small multiple of the body whatever it holds.
//!
//! The root map is read key by key: a key the endpoint does not know has its value skipped
//! unread (only the first such name is kept, for the `unknown_field` error); a known key's value
//! is decoded by its field's [`Kind`], which keeps only what the field can use. `token_ids` and
//! `block_hashes` go straight into `Vec<i32>` / `Vec<u64>`, never holding more than the
//! configured `max_query_tokens` elements; an array a scalar field cannot take is skipped and
//! remembered by its type name. Field errors found while decoding are stored as
//! [`Val::Invalid`] and reported in the order the endpoint validates its fields, so the first
//! error a caller sees does not depend on the order of keys in the document.
//!
//! Precedence is the tree decoder's: a syntax error anywhere, then "not a map", then the first
//! unknown key (in document order), then field errors.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::error::OpError;
use crate::gateway::value::{Fields, Val};

/// How a field's value is decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Null, a boolean, a number or a string.
    Scalar,
    /// Prompt token ids: an array of int32, or a bin of little-endian int32.
    Tokens,
    /// An array of 64-bit block hashes (signed or unsigned).
    Hashes,
    /// A map of strings (`hash_profile`).
    Pairs,
}

/// An endpoint's fields and how each is decoded.
pub type Schema = &'static [(&'static str, Kind)];

/// `HashProfile::from_pairs` stops at the first unknown or repeated key; with four known keys it
/// never reads past the fifth pair, so later pairs are only type-checked, not kept.
pub const PAIRS_KEPT: usize = 5;

/// Bounds applied while decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most elements of `token_ids` or `block_hashes` (config `max_query_tokens`).
    pub max_tokens: usize,
}

/// The error for a token or hash array longer than the limit, naming the field and the setting.
pub fn too_many(field: &str, count: usize, max: usize) -> OpError {
    OpError::invalid(
        field,
        "too_large",
        format!("{field} has {count} elements; at most {max} are accepted (max_query_tokens)"),
    )
}

/// A decoded root: the known fields and the first unknown key, or a root that is not a map.
#[derive(Debug)]
pub enum Root {
    Map {
        fields: Fields,
        unknown: Option<String>,
        /// The first key given twice.
        duplicate: Option<&'static str>,
    },
    NotAMap,
}

impl Root {
    /// The fields, or the `unknown_field` error, or the `duplicate_field` error; `not_a_map` is
    /// the format's own error.
    pub fn into_fields(self, not_a_map: impl FnOnce() -> OpError) -> Result<Fields, OpError> {
        match self {
            Root::Map {
                unknown: Some(key), ..
            } => Err(OpError::invalid(
                key.clone(),
                "unknown_field",
                format!("unsupported request field: {key}"),
            )),
            Root::Map {
                duplicate: Some(key),
                ..
            } => Err(OpError::invalid(
                key,
                "duplicate_field",
                format!("{key} is given more than once"),
            )),
            Root::Map { fields, .. } => Ok(fields),
            Root::NotAMap => Err(not_a_map()),
        }
    }
}

/// Decodes a root value against a schema (works with any serde deserializer).
#[derive(Clone, Copy)]
pub struct RootSeed {
    pub schema: Schema,
    pub limits: Limits,
}

/// Read every remaining element of a sequence without keeping any; returns how many there were.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<usize, A::Error> {
    let mut n = 0;
    while seq.next_element::<IgnoredAny>()?.is_some() {
        n += 1;
    }
    Ok(n)
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// Visitor methods for the scalar types a decoder does not take: each gives `$out(self)`.
macro_rules! refuse_scalars {
    ($out:expr; $($method:ident $(($arg:ty))?),*) => {
        $(fn $method<E: de::Error>(self $(, _: $arg)?) -> Result<Self::Value, E> {
            Ok(($out)(self))
        })*
    };
}

/// `visit_seq` and `visit_map` for a decoder that takes neither: the value is read to its end
/// (so the document stays in step) and gives `$out(self)`.
macro_rules! drain_compounds {
    ($out:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            drain_seq(seq)?;
            Ok(($out)(self))
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            drain_map(map)?;
            Ok(($out)(self))
        }
    };
}

/// A seed that is its own visitor and lets the document say what comes (`deserialize_any`).
macro_rules! seed_is_visitor {
    ($($seed:ty),*) => {
        $(impl<'de> DeserializeSeed<'de> for $seed {
            type Value = <$seed as Visitor<'de>>::Value;
            fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_any(self)
            }
        })*
    };
}

seed_is_visitor!(RootSeed, Integer, Text);

impl<'de> Visitor<'de> for RootSeed {
    type Value = Root;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Root, A::Error> {
        let mut fields = Fields::default();
        let mut unknown = None;
        let mut duplicate = None;
        while let Some(key) = map.next_key_seed(KeySeed(self.schema))? {
            match key {
                Key::Known(name, _) if fields.get(name).is_some() => {
                    map.next_value::<IgnoredAny>()?;
                    duplicate.get_or_insert(name);
                }
                Key::Known(name, kind) => {
                    let seed = FieldSeed {
                        name,
                        kind,
                        limits: self.limits,
                    };
                    fields.set(name, map.next_value_seed(seed)?);
                }
                Key::Unknown(name) => {
                    map.next_value::<IgnoredAny>()?;
                    unknown.get_or_insert(name);
                }
            }
        }
        Ok(Root::Map {
            fields,
            unknown,
            duplicate,
        })
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Root, A::Error> {
        drain_seq(seq)?;
        Ok(Root::NotAMap)
    }

    refuse_scalars!(
        |_| Root::NotAMap;
        visit_bool(bool), visit_i64(i64), visit_u64(u64), visit_f64(f64), visit_str(&str), visit_bytes(&[u8]), visit_unit
    );
}

/// A root key: one of the schema's (no allocation), or an unknown name.
enum Key {
    Known(&'static str, Kind),
    Unknown(String),
}

struct KeySeed(Schema);

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Key, E> {
        Ok(match self.0.iter().find(|(name, _)| *name == key) {
            Some(&(name, kind)) => Key::Known(name, kind),
            None => Key::Unknown(key.to_owned()),
        })
    }
}

struct FieldSeed {
    name: &'static str,
    kind: Kind,
    limits: Limits,
}

impl<'de> DeserializeSeed<'de> for FieldSeed {
    type Value = Val;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Val, D::Error> {
        match self.kind {
            Kind::Scalar => d.deserialize_any(Scalar),
            Kind::Tokens => d.deserialize_any(Numbers::<i32>::new(self.name, self.limits)),
            Kind::Hashes => d.deserialize_any(Numbers::<u64>::new(self.name, self.limits)),
            Kind::Pairs => d.deserialize_any(Pairs(self.name)),
        }
    }
}

struct Scalar;

impl<'de> Visitor<'de> for Scalar {
    type Value = Val;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any value")
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
        Ok(Val::Float(f))
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
    fn visit_bytes<E>(self, _: &[u8]) -> Result<Val, E> {
        Ok(Val::Other("binary"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Val, A::Error> {
        drain_seq(seq)?;
        Ok(Val::Other("array"))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Val, A::Error> {
        drain_map(map)?;
        Ok(Val::Other("map"))
    }
}

/// The element types of the two number arrays, with their rules and messages.
trait Element: Sized {
    const WHAT: &'static str;
    /// The element, or the error for element `index` given `value` (`None`: not an integer).
    fn from_int(field: &str, index: usize, value: Option<i128>) -> Result<Self, OpError>;
    fn wrap(items: Vec<Self>) -> Val;
    /// Elements of a bin, where the field takes one (`token_ids`: little-endian int32).
    fn from_bin(field: &str, bytes: &[u8], max: usize) -> Val;
}

impl Element for i32 {
    const WHAT: &'static str = "a bin or an array";
    fn from_int(field: &str, index: usize, value: Option<i128>) -> Result<i32, OpError> {
        let Some(value) = value else {
            return Err(OpError::invalid(
                field,
                "invalid_type",
                format!("{field} element must be an integer"),
            )
            .at(index));
        };
        i32::try_from(value).map_err(|_| {
            OpError::invalid(
                field,
                "out_of_range",
                format!("{field} element is outside the int32 range"),
            )
            .at(index)
        })
    }
    fn wrap(items: Vec<i32>) -> Val {
        Val::Tokens(items)
    }
    fn from_bin(field: &str, bytes: &[u8], max: usize) -> Val {
        if !bytes.len().is_multiple_of(4) {
            return Val::Invalid(OpError::invalid(
                field,
                "invalid_value",
                format!("{field} bin size must be a multiple of 4"),
            ));
        }
        if bytes.len() / 4 > max {
            return Val::Invalid(too_many(field, bytes.len() / 4, max));
        }
        let tokens = bytes.chunks_exact(4);
        Val::Tokens(
            tokens
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }
}

impl Element for u64 {
    const WHAT: &'static str = "an array";
    fn from_int(field: &str, index: usize, value: Option<i128>) -> Result<u64, OpError> {
        match value {
            // SGLang's hashes are signed: keep their 64 bits.
            Some(h) if h >= i64::MIN as i128 && h <= u64::MAX as i128 => Ok(h as u64),
            _ => Err(OpError::invalid(
                field,
                "invalid_type",
                format!("{field} element must be a 64-bit integer"),
            )
            .at(index)),
        }
    }
    fn wrap(items: Vec<u64>) -> Val {
        Val::Hashes(items)
    }
    fn from_bin(field: &str, _: &[u8], _: usize) -> Val {
        not_an_array::<u64>(field)
    }
}

fn not_an_array<T: Element>(field: &str) -> Val {
    Val::Invalid(OpError::invalid(
        field,
        "invalid_type",
        format!("{field} must be {}", T::WHAT),
    ))
}

/// An array of numbers, decoded straight into a `Vec<T>` of at most `max` elements. After the
/// first bad element, or past `max`, the rest is only counted; a count over `max` is reported
/// before a bad element (a msgpack array's length is known before its elements).
struct Numbers<T> {
    field: &'static str,
    max: usize,
    _element: std::marker::PhantomData<T>,
}

impl<T> Numbers<T> {
    fn new(field: &'static str, limits: Limits) -> Self {
        Numbers {
            field,
            max: limits.max_tokens,
            _element: std::marker::PhantomData,
        }
    }
}

impl<'de, T: Element> Visitor<'de> for Numbers<T> {
    type Value = Val;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(T::WHAT)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Val, A::Error> {
        let declared = seq.size_hint();
        if let Some(n) = declared.filter(|n| *n > self.max) {
            drain_seq(seq)?;
            return Ok(Val::Invalid(too_many(self.field, n, self.max)));
        }
        let mut items = Vec::with_capacity(declared.unwrap_or(0));
        let mut error = None;
        let mut count = 0;
        loop {
            if error.is_some() || count >= self.max {
                count += drain_seq(seq)?;
                break;
            }
            let Some(value) = seq.next_element_seed(Integer)? else {
                break;
            };
            match T::from_int(self.field, count, value) {
                Ok(v) => items.push(v),
                Err(e) => error = Some(e),
            }
            count += 1;
        }
        Ok(match error {
            _ if count > self.max => Val::Invalid(too_many(self.field, count, self.max)),
            Some(e) => Val::Invalid(e),
            None => T::wrap(items),
        })
    }

    fn visit_bytes<E>(self, bytes: &[u8]) -> Result<Val, E> {
        Ok(T::from_bin(self.field, bytes, self.max))
    }

    refuse_scalars!(
        |s: Self| not_an_array::<T>(s.field);
        visit_bool(bool), visit_i64(i64), visit_u64(u64), visit_f64(f64), visit_str(&str), visit_unit
    );

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Val, A::Error> {
        drain_map(map)?;
        Ok(not_an_array::<T>(self.field))
    }
}

/// One array element: `Some` integer, or `None` for anything else (consumed, not kept).
struct Integer;

impl<'de> Visitor<'de> for Integer {
    type Value = Option<i128>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an integer")
    }
    fn visit_i64<E>(self, i: i64) -> Result<Option<i128>, E> {
        Ok(Some(i.into()))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Option<i128>, E> {
        Ok(Some(u.into()))
    }
    refuse_scalars!(
        |_| None;
        visit_bool(bool), visit_f64(f64), visit_str(&str), visit_bytes(&[u8]), visit_unit
    );
    drain_compounds!(|_| None);
}

/// A map of strings, in document order: the first [`PAIRS_KEPT`] pairs are kept, a value that
/// is not a string as `None` (the registration checks report it in their order).
struct Pairs(&'static str);

impl<'de> Visitor<'de> for Pairs {
    type Value = Val;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Val, A::Error> {
        let mut pairs = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if pairs.len() < PAIRS_KEPT {
                let value = map.next_value_seed(Text)?;
                pairs.push((key, value));
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Val::Pairs(pairs))
    }

    refuse_scalars!(
        |s: Self| s.not_a_map();
        visit_bool(bool), visit_i64(i64), visit_u64(u64), visit_f64(f64), visit_str(&str), visit_bytes(&[u8]), visit_unit
    );

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Val, A::Error> {
        drain_seq(seq)?;
        Ok(self.not_a_map())
    }
}

impl Pairs {
    fn not_a_map(&self) -> Val {
        let field = self.0;
        Val::Invalid(OpError::invalid(
            field,
            "invalid_type",
            format!("{field} must be a map"),
        ))
    }
}

/// A string value, or `None` for anything else (consumed, not kept).
struct Text;

impl<'de> Visitor<'de> for Text {
    type Value = Option<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }
    fn visit_str<E>(self, s: &str) -> Result<Option<String>, E> {
        Ok(Some(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Option<String>, E> {
        Ok(Some(s))
    }
    refuse_scalars!(
        |_| None;
        visit_bool(bool), visit_i64(i64), visit_u64(u64), visit_f64(f64), visit_bytes(&[u8]), visit_unit
    );
    drain_compounds!(|_| None);
}

/// Decode a JSON body (syntax errors: `invalid_json`).
pub fn from_json(body: &[u8], seed: RootSeed) -> Result<Fields, OpError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let root = seed
        .deserialize(&mut de)
        .and_then(|root| de.end().map(|()| root));
    let root =
        root.map_err(|e| OpError::invalid("", "invalid_json", format!("Invalid JSON: {e}")))?;
    root.into_fields(|| OpError::invalid("", "invalid_json", "request body must be a JSON object"))
}

/// Decode a msgpack body (syntax errors: `invalid_msgpack`).
pub fn from_msgpack(body: &[u8], seed: RootSeed) -> Result<Fields, OpError> {
    let invalid = |m: String| OpError::invalid("", "invalid_msgpack", m);
    let root = super::msgpack_de::from_slice(body, seed).map_err(|e| {
        // The reference's two texts: a non-string key, and anything else undecodable.
        let text = e.to_string();
        if text.contains("map keys must be strings") {
            invalid("map keys must be strings".into())
        } else {
            invalid("Invalid msgpack object".into())
        }
    })?;
    root.into_fields(|| invalid("request body must be a msgpack map".into()))
}

/// Decode an already parsed JSON object (a static registration in the config file).
pub fn from_json_map(
    map: serde_json::Map<String, serde_json::Value>,
    seed: RootSeed,
) -> Result<Fields, OpError> {
    let root = seed
        .deserialize(serde_json::Value::Object(map))
        .map_err(|e| OpError::invalid("", "invalid_json", format!("Invalid JSON: {e}")))?;
    root.into_fields(|| OpError::invalid("", "invalid_json", "request body must be a JSON object"))
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
