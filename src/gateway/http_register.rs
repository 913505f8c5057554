//! HTTP `/register` bodies and static config entries (HTTP names), checked in the reference's
//! order with its texts (`docs/http-compat.md`), into a [`RegistrationInput`] whose remaining
//! rules (endpoint form, block size bound, strategy / algorithm pairs) are the shared ones of
//! [`RegistrationInput::validate`].
//!
//! The order: required strings `endpoint`, `type`, `modelname`, `instance_id`; `block_size`;
//! optional strings `replay_endpoint`, `lora_name`, `tenant_id`; `cache_group`; `hash_profile`;
//! the value of `type`; `dp_rank`.

use crate::error::OpError;
use crate::gateway::registration::RegistrationInput;
use crate::gateway::value::{Fields, Val};
use crate::model::PublisherType;

/// Read a `/register` body decoded with `HTTP_REGISTER_SCHEMA`.
pub fn registration_from_http(mut f: Fields) -> Result<RegistrationInput, OpError> {
    let endpoint = f.req_str("endpoint")?;
    let type_name = f.req_str("type")?;
    let model_name = f.req_str("modelname")?;
    // A store publisher is not a routing target: without an id its endpoint names it (see
    // `RegistrationInput::validate`).
    let instance_id = match f.opt_str("instance_id")? {
        None if type_name == PublisherType::Mooncake.as_str() => None,
        _ => Some(f.req_str("instance_id")?),
    };
    let block_size = match f.get("block_size") {
        None => {
            let message = "block_size is required";
            return Err(OpError::invalid("block_size", "missing", message));
        }
        Some(Val::Int(b)) if *b <= 0 => {
            let message = "block_size must be greater than zero";
            return Err(OpError::invalid("block_size", "out_of_range", message));
        }
        Some(Val::Int(b)) => *b,
        Some(_) => {
            let message = "block_size must be an integer";
            return Err(OpError::invalid("block_size", "invalid_type", message));
        }
    };
    let replay_endpoint = f.opt_str("replay_endpoint")?;
    let lora_name = f.opt_str("lora_name")?;
    let tenant_id = f.opt_str("tenant_id")?;
    let cache_group = match f.get("cache_group") {
        None | Some(Val::Null) => None,
        // Checked here as well as by `validate`: HTTP reports it before `dp_rank`.
        Some(Val::Int(g)) => Some(crate::gateway::registration::cache_group(*g)?.into()),
        Some(_) => {
            let message = "cache_group must be an integer or null";
            return Err(OpError::invalid("cache_group", "invalid_type", message));
        }
    };
    let hash_profile = match f.take("hash_profile") {
        None => {
            let message = "hash_profile is required";
            return Err(OpError::invalid("hash_profile", "missing", message));
        }
        Some(Val::Pairs(pairs)) => check_profile(pairs)?,
        Some(Val::Invalid(e)) => return Err(e),
        Some(_) => {
            let message = "hash_profile must be a map";
            return Err(OpError::invalid("hash_profile", "invalid_type", message));
        }
    };
    if PublisherType::parse(&type_name).is_none() {
        let message = "type must be vLLM, SGLang or Mooncake";
        return Err(OpError::invalid("type", "invalid_value", message));
    }
    let dp_rank = match f.get("dp_rank") {
        None => {
            let message = "dp_rank is required";
            return Err(OpError::invalid("dp_rank", "missing", message));
        }
        Some(Val::Int(r)) if (0..=i32::MAX as i128).contains(r) => *r,
        Some(Val::Int(_)) => {
            let message = "dp_rank must be a non-negative int";
            return Err(OpError::invalid("dp_rank", "out_of_range", message));
        }
        Some(_) => {
            let message = "dp_rank must be an integer";
            return Err(OpError::invalid("dp_rank", "invalid_type", message));
        }
    };
    Ok(RegistrationInput {
        instance_id,
        endpoint: Some(endpoint),
        replay_endpoint,
        publisher_type: Some(type_name),
        model_name: Some(model_name),
        lora_name,
        tenant_id,
        block_size: Some(block_size),
        dp_rank: Some(dp_rank),
        cache_group,
        hybrid_parts: match f.get("hybrid_parts") {
            None | Some(Val::Null) => None,
            Some(_) => f.opt_str("hybrid_parts")?,
        },
        hash_profile: Some(hash_profile),
    })
}

pub const PROFILE_KEYS: [&str; 4] = [
    "strategy",
    "algorithm",
    "python_hash_seed",
    "index_projection",
];

/// The reference's profile checks: unknown keys, the four strings, the algorithm, then the
/// strategy, the projection and the seed. What passes is resolved by `HashProfile::from_pairs`
/// (which also refuses a key given twice and a strategy / algorithm pair that does not fit).
pub fn check_profile(
    pairs: Vec<(String, Option<String>)>,
) -> Result<Vec<(String, String)>, OpError> {
    if let Some((key, _)) = pairs
        .iter()
        .find(|(k, _)| !PROFILE_KEYS.contains(&k.as_str()))
    {
        let message = format!("unsupported hash_profile field: {key}");
        return Err(OpError::invalid(key.clone(), "unknown_field", message));
    }
    let value = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v);
    let sglang = matches!(
        value("strategy"),
        Some(Some(s)) if s == "sglang" || s == "sglang_bigram"
    );
    for key in PROFILE_KEYS {
        match value(key) {
            // SGLang does not seed its chain: the seed is optional there.
            None if key == "python_hash_seed" && sglang => {}
            None => {
                let message = format!("{key} is required");
                return Err(OpError::invalid(key, "missing", message));
            }
            Some(None) => {
                let message = format!("{key} must be a string");
                return Err(OpError::invalid(key, "invalid_type", message));
            }
            Some(Some(v)) if v.is_empty() => {
                let message = format!("{key} must not be empty");
                return Err(OpError::invalid(key, "invalid_value", message));
            }
            Some(Some(_)) => {}
        }
    }
    let text = |key: &str| value(key).cloned().flatten().unwrap_or_default();
    let (strategy, algorithm) = (text("strategy"), text("algorithm"));
    if !["sha256", "sha256_cbor", "sha256_raw"].contains(&algorithm.as_str()) {
        let message = format!("unsupported hash algorithm: {algorithm}");
        return Err(OpError::invalid("algorithm", "invalid_value", message));
    }
    let projection = match strategy.as_str() {
        "vllm_v1" => "low64_be",
        "sglang" | "sglang_bigram" => "first64_be",
        _ => {
            let message = format!("unsupported hash strategy: {strategy}");
            return Err(OpError::invalid("strategy", "invalid_value", message));
        }
    };
    let given = text("index_projection");
    if given != projection {
        let message = format!("unsupported index projection: {given}");
        return Err(OpError::invalid(
            "index_projection",
            "invalid_value",
            message,
        ));
    }
    if !sglang {
        check_seed(&text("python_hash_seed"))?;
    }
    Ok(pairs
        .into_iter()
        .map(|(k, v)| (k, v.unwrap_or_default()))
        .collect())
}

/// A vLLM seed: `"random"` or ASCII decimal text in `0..=u32::MAX` (leading zeros allowed).
fn check_seed(seed: &str) -> Result<(), OpError> {
    if seed == "random" {
        return Ok(());
    }
    let invalid = |message: &str| OpError::invalid("python_hash_seed", "invalid_value", message);
    if !seed.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(
            "python_hash_seed must be \"random\" or ASCII decimal text in 0..4294967295",
        ));
    }
    let digits = seed.trim_start_matches('0');
    if digits.len() > 10 || (digits.len() == 10 && digits > "4294967295") {
        return Err(invalid("python_hash_seed must be in range 0..4294967295"));
    }
    Ok(())
}
