//! A request document decoded from JSON or msgpack, and typed field readers whose errors carry
//! the HTTP API's reasons (`missing`, `invalid_type`, `invalid_value`, `out_of_range`,
//! `unknown_field`) and the offending field. One set of rules for both encodings.

use crate::error::OpError;

/// A decoded request value. Map keys stay in document order; only string keys are accepted.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Null,
    Bool(bool),
    /// Any integer (JSON or msgpack); `i128` holds both `u64` and `i64` without loss.
    Int(i128),
    Float(f64),
    Str(String),
    Bin(Vec<u8>),
    Array(Vec<Val>),
    Map(Vec<(String, Val)>),
}

impl Val {
    pub fn type_name(&self) -> &'static str {
        match self {
            Val::Null => "null",
            Val::Bool(_) => "boolean",
            Val::Int(_) => "integer",
            Val::Float(_) => "float",
            Val::Str(_) => "string",
            Val::Bin(_) => "binary",
            Val::Array(_) => "array",
            Val::Map(_) => "map",
        }
    }

    /// Convert a JSON document. Numbers that are integral in the text stay integers.
    pub fn from_json(value: serde_json::Value) -> Val {
        use serde_json::Value as J;
        match value {
            J::Null => Val::Null,
            J::Bool(b) => Val::Bool(b),
            J::Number(n) => match (n.as_i64(), n.as_u64()) {
                (Some(i), _) => Val::Int(i as i128),
                (None, Some(u)) => Val::Int(u as i128),
                _ => Val::Float(n.as_f64().unwrap_or(f64::NAN)),
            },
            J::String(s) => Val::Str(s),
            J::Array(items) => Val::Array(items.into_iter().map(Val::from_json).collect()),
            J::Object(map) => Val::Map(
                map.into_iter()
                    .map(|(k, v)| (k, Val::from_json(v)))
                    .collect(),
            ),
        }
    }

    /// Convert a msgpack document. Non-string map keys and invalid UTF-8 strings are rejected.
    pub fn from_msgpack(value: rmpv::Value) -> Result<Val, String> {
        use rmpv::Value as M;
        Ok(match value {
            M::Nil => Val::Null,
            M::Boolean(b) => Val::Bool(b),
            M::Integer(i) => match (i.as_i64(), i.as_u64()) {
                (Some(v), _) => Val::Int(v as i128),
                (None, Some(v)) => Val::Int(v as i128),
                _ => return Err("integer out of range".into()),
            },
            M::F32(f) => Val::Float(f as f64),
            M::F64(f) => Val::Float(f),
            M::String(s) => Val::Str(s.into_str().ok_or("strings must be valid UTF-8")?),
            M::Binary(b) => Val::Bin(b),
            M::Array(items) => Val::Array(
                items
                    .into_iter()
                    .map(Val::from_msgpack)
                    .collect::<Result<_, _>>()?,
            ),
            M::Map(pairs) => {
                let mut out = Vec::with_capacity(pairs.len());
                for (k, v) in pairs {
                    let M::String(k) = k else {
                        return Err("map keys must be strings".into());
                    };
                    let k = k.into_str().ok_or("map keys must be valid UTF-8")?;
                    out.push((k, Val::from_msgpack(v)?));
                }
                Val::Map(out)
            }
            M::Ext(..) => return Err("msgpack extension types are not accepted".into()),
        })
    }
}

/// A request body's root map with typed, validated access to its fields.
pub struct Fields {
    entries: Vec<(String, Val)>,
}

impl Fields {
    /// Take the root map and reject keys outside `allowed` (the first unknown key is reported).
    pub fn new(root: Val, allowed: &[&str]) -> Result<Fields, OpError> {
        let Val::Map(entries) = root else {
            return Err(OpError::invalid(
                "",
                "invalid_type",
                "request body must be a map",
            ));
        };
        if let Some((key, _)) = entries.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
            return Err(OpError::invalid(
                key.clone(),
                "unknown_field",
                format!("unsupported request field: {key}"),
            ));
        }
        Ok(Fields { entries })
    }

    /// The last value given for `key` (duplicate keys: the last wins, like a JSON object).
    pub fn get(&self, key: &str) -> Option<&Val> {
        self.entries
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    pub fn take(&mut self, key: &str) -> Option<Val> {
        let position = self.entries.iter().rposition(|(k, _)| k == key)?;
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
