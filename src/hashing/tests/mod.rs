//! Tests of the hashing module: the reference fixtures and the Python-generated vectors
//! (`fixtures`), the per-request chain and step API (`chain`), profile validation (`profile`) and
//! property tests of the two encoders at every integer and length boundary (`props`).

mod chain;
mod fixtures;
mod profile;
mod props;

use std::path::PathBuf;

use serde_json::Value;

/// Read a JSON fixture from `tests/fixtures/hashing/`.
fn load_fixture(name: &str) -> Value {
    let path: PathBuf = [
        env!("CARGO_MANIFEST_DIR"),
        "tests",
        "fixtures",
        "hashing",
        name,
    ]
    .iter()
    .collect();
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

fn hex(bytes: &[u8]) -> String {
    crate::hashing::hex_lower(bytes)
}

fn unhex(text: &str) -> Vec<u8> {
    assert!(text.len().is_multiple_of(2), "odd hex length");
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex digit"))
        .collect()
}

fn digest32(text: &str) -> [u8; 32] {
    unhex(text).try_into().expect("32-byte digest")
}

/// The 64-bit LCG `generate_vectors.py` expands `{lcg, count, modulus}` token specs with.
fn lcg_tokens(count: u64, seed: u64, modulus: u64) -> Vec<i64> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % modulus) as i64
        })
        .collect()
}

/// Expand a token spec: a list, `{repeat|value, count}`, or `{lcg, count, modulus}`.
fn spec_tokens(spec: &Value) -> Vec<i64> {
    if let Some(list) = spec.as_array() {
        return list
            .iter()
            .map(|v| v.as_i64().expect("i64 token"))
            .collect();
    }
    let count = spec["count"].as_u64().expect("count");
    if let Some(v) = spec.get("repeat").or_else(|| spec.get("value")) {
        return vec![v.as_i64().expect("i64 token"); count as usize];
    }
    lcg_tokens(
        count,
        spec["lcg"].as_u64().expect("lcg"),
        spec["modulus"].as_u64().expect("modulus"),
    )
}

/// Expand a string spec: `null` (empty), a string, or `{repeat|value, count}`.
fn spec_text(spec: &Value) -> String {
    match spec {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        _ => {
            let unit = spec
                .get("repeat")
                .or_else(|| spec.get("value"))
                .and_then(Value::as_str)
                .expect("repeat");
            unit.repeat(spec["count"].as_u64().expect("count") as usize)
        }
    }
}

/// A profile given as a JSON object of strings.
fn profile_of(obj: &Value) -> crate::hashing::HashProfile {
    let map = obj.as_object().expect("profile object");
    let pairs: Vec<(&str, &str)> = map
        .iter()
        .filter(|(k, _)| k.as_str() != "root_digest")
        .map(|(k, v)| (k.as_str(), v.as_str().expect("string value")))
        .collect();
    crate::hashing::HashProfile::from_pairs(pairs).expect("fixture profile resolves")
}
