//! A request's fields as [`super::request`] decodes them, and typed field readers whose errors
//! carry the HTTP API's reasons (`missing`, `invalid_type`, `invalid_value`, `out_of_range`) and
//! the offending field. One set of rules for both encodings.

use crate::error::OpError;

/// One field's decoded value. Only what the field can use is kept: a scalar field given an
/// array keeps the word "array", never the array.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Null,
    Bool(bool),
    /// Any integer (JSON or msgpack); `i128` holds both `u64` and `i64` without loss.
    Int(i128),
    Float(f64),
    Str(String),
    /// A bin, array or map given to a field that takes none: its type name only.
    Other(&'static str),
    /// `token_ids`, already checked element by element.
    Tokens(Vec<i32>),
    /// `block_hashes`, already checked element by element.
    Hashes(Vec<u64>),
    /// `hash_profile`'s pairs in document order (see `request::PAIRS_KEPT`); `None` for a
    /// value that is not a string.
    Pairs(Vec<(String, Option<String>)>),
    /// A value its decoder already found wrong. The error is reported when validation reads the
    /// field, so errors come in the order fields are checked, whatever the document order.
    Invalid(OpError),
}

/// A request body's known fields (a key given twice is refused while decoding), with typed
/// access.
#[derive(Debug, Default)]
pub struct Fields {
    entries: Vec<(&'static str, Val)>,
}

impl Fields {
    /// Set `key`, replacing an earlier value.
    pub fn set(&mut self, key: &'static str, value: Val) {
        match self.entries.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => self.entries.push((key, value)),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Val> {
        self.entries.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    pub fn take(&mut self, key: &str) -> Option<Val> {
        let position = self.entries.iter().position(|(k, _)| *k == key)?;
        Some(self.entries.swap_remove(position).1)
    }

    /// An optional string; `null` is a type error (optional strings are omitted, not nulled).
    pub fn opt_str(&self, key: &str) -> Result<Option<String>, OpError> {
        match self.get(key) {
            None => Ok(None),
            Some(Val::Str(s)) => Ok(Some(s.clone())),
            Some(_) => Err(OpError::invalid(
                key,
                "invalid_type",
                format!("{key} must be a string"),
            )),
        }
    }

    /// A required, non-empty string.
    pub fn req_str(&self, key: &str) -> Result<String, OpError> {
        match self.opt_str(key)? {
            None => Err(OpError::invalid(
                key,
                "missing",
                format!("{key} is required"),
            )),
            Some(s) if s.is_empty() => Err(OpError::invalid(
                key,
                "invalid_value",
                format!("{key} must not be empty"),
            )),
            Some(s) => Ok(s),
        }
    }

    /// An optional integer (floats and booleans are type errors).
    pub fn opt_int(&self, key: &str) -> Result<Option<i128>, OpError> {
        match self.get(key) {
            None => Ok(None),
            Some(Val::Int(i)) => Ok(Some(*i)),
            Some(_) => Err(OpError::invalid(
                key,
                "invalid_type",
                format!("{key} must be an integer"),
            )),
        }
    }
}
