//! `register(config)`: the client-side checks of the configuration dictionary.
//!
//! The client rejects only what it can judge without the server (`docs/python-api.md`, "Who rejects
//! what"): a non-dict, unknown or non-string keys, wrong value types, integers outside int64 and
//! unknown publisher types, with the same key/type rules inside `hash_profile`. Everything about
//! values (missing required fields, empty names, negative ranks, unsupported hash recipes) is the
//! server's to judge, so absent fields stay absent on the wire and the server answers INVALID_PARAMS.

use std::collections::HashMap;

use pyo3::exceptions::{PyOverflowError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString, PyTuple};

use crate::pb::RegisterRequest;

const STRING_FIELDS: [&str; 7] = [
    "instance_id",
    "endpoint",
    "replay_endpoint",
    "publisher_type",
    "model_name",
    "lora_name",
    "tenant_id",
];
const INT_FIELDS: [&str; 2] = ["block_size", "dp_rank"];
const PUBLISHER_TYPES: [&str; 3] = ["vLLM", "SGLang", "Mooncake"];
const HASH_PROFILE_KEYS: [&str; 4] = [
    "strategy",
    "algorithm",
    "python_hash_seed",
    "index_projection",
];

/// Validates `config` and builds the request; `ValueError` names the offending field.
pub fn parse(config: &Bound<'_, PyAny>) -> PyResult<RegisterRequest> {
    let dict = config.cast::<PyDict>().map_err(|_| {
        PyValueError::new_err(format!(
            "register() config must be a dict, got {}",
            type_name(config)
        ))
    })?;
    let mut req = RegisterRequest::default();
    for (key, value) in dict.iter() {
        let key = key_str(&key, "register() config")?;
        match key.as_str() {
            "cache_group" => {
                req.cache_group = if value.is_none() {
                    None
                } else {
                    Some(int64(&key, &value, "an int or None")?)
                };
            }
            "hybrid_parts" => req.hybrid_parts = hybrid_parts(&value)?,
            "hash_profile" => {
                req.hash_profile = hash_profile(&value)?;
                req.has_hash_profile = true;
            }
            k if INT_FIELDS.contains(&k) => {
                let v = Some(int64(k, &value, "an int")?);
                match k {
                    "block_size" => req.block_size = v,
                    _ => req.dp_rank = v,
                }
            }
            k if STRING_FIELDS.contains(&k) => {
                let v = string(k, &value)?;
                if k == "publisher_type" && !PUBLISHER_TYPES.contains(&v.as_str()) {
                    return Err(PyValueError::new_err(format!(
                        "unknown publisher_type {v:?}: expected one of \"vLLM\", \"SGLang\", \"Mooncake\" (case-sensitive)"
                    )));
                }
                let slot = match k {
                    "instance_id" => &mut req.instance_id,
                    "endpoint" => &mut req.endpoint,
                    "replay_endpoint" => &mut req.replay_endpoint,
                    "publisher_type" => &mut req.publisher_type,
                    "model_name" => &mut req.model_name,
                    "lora_name" => &mut req.lora_name,
                    _ => &mut req.tenant_id,
                };
                *slot = Some(v);
            }
            other => return Err(unknown_field(other)),
        }
    }
    Ok(req)
}

/// `hybrid_parts`: a str sent as written, a list or tuple of str joined with ",", or None (absent
/// on the wire). The part names are the server's to judge.
pub fn hybrid_parts(value: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
    const EXPECTED: &str = "a str, a list or tuple of str, or None";
    if value.is_none() {
        return Ok(None);
    }
    if let Ok(s) = value.cast::<PyString>() {
        return Ok(Some(s.to_cow()?.into_owned()));
    }
    if !(value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>()) {
        return Err(PyValueError::new_err(format!(
            "hybrid_parts must be {EXPECTED}, got {}",
            type_name(value)
        )));
    }
    let mut names = Vec::new();
    for item in value.try_iter()? {
        let item = item?;
        let Ok(name) = item.cast::<PyString>() else {
            return Err(PyValueError::new_err(format!(
                "hybrid_parts must be {EXPECTED}, got a {} containing {}",
                type_name(value),
                type_name(&item)
            )));
        };
        names.push(name.to_cow()?.into_owned());
    }
    Ok(Some(names.join(",")))
}

pub fn hash_profile(value: &Bound<'_, PyAny>) -> PyResult<HashMap<String, String>> {
    let dict = value.cast::<PyDict>().map_err(|_| {
        PyValueError::new_err(format!(
            "hash_profile must be a dict of strings, got {}",
            type_name(value)
        ))
    })?;
    let mut profile = HashMap::with_capacity(dict.len());
    for (key, value) in dict.iter() {
        let key = key_str(&key, "hash_profile")?;
        if !HASH_PROFILE_KEYS.contains(&key.as_str()) {
            return Err(PyValueError::new_err(format!(
                "unknown hash_profile field {key:?}: expected strategy, algorithm, python_hash_seed, index_projection{}",
                if key == "root_digest" {
                    " (root_digest is derived by the server)"
                } else {
                    ""
                }
            )));
        }
        let v = string(&format!("hash_profile.{key}"), &value)?;
        profile.insert(key, v);
    }
    Ok(profile)
}

fn key_str(key: &Bound<'_, PyAny>, what: &str) -> PyResult<String> {
    match key.cast::<PyString>() {
        Ok(s) => Ok(s.to_cow()?.into_owned()),
        Err(_) => Err(PyValueError::new_err(format!(
            "{what} keys must be strings, got {} key {}",
            type_name(key),
            key.repr().map(|r| r.to_string()).unwrap_or_default()
        ))),
    }
}

fn string(field: &str, value: &Bound<'_, PyAny>) -> PyResult<String> {
    match value.cast::<PyString>() {
        Ok(s) => Ok(s.to_cow()?.into_owned()),
        Err(_) => Err(PyValueError::new_err(format!(
            "{field} must be a str, got {}",
            type_name(value)
        ))),
    }
}

/// A Python `int` (not `bool`, which is an `int` subclass but never a count) that fits int64.
fn int64(field: &str, value: &Bound<'_, PyAny>, expected: &str) -> PyResult<i64> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(PyValueError::new_err(format!(
            "{field} must be {expected}, got {}",
            type_name(value)
        )));
    }
    value.extract::<i64>().map_err(|e| {
        if e.is_instance_of::<PyOverflowError>(value.py()) {
            PyValueError::new_err(format!("{field} is outside the int64 range"))
        } else {
            e
        }
    })
}

fn unknown_field(name: &str) -> PyErr {
    // The HTTP API spells two fields differently; say which name register() expects.
    let hint = match name {
        "modelname" => " (use model_name)",
        "type" => " (use publisher_type)",
        _ => "",
    };
    PyValueError::new_err(format!("unknown register() field {name:?}{hint}"))
}

fn type_name(value: &Bound<'_, PyAny>) -> String {
    value
        .get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "object".to_owned())
}
