//! The configuration keys of engines registered by URL (docs/engine-discovery.md,
//! "Configuration"): a list (`engines`), a name whose addresses are engines (`engines_dns`),
//! and the bounds and intervals of reading their descriptions. Each entry is checked at start
//! with the rules of `POST /engines`, and an error names the entry and its field.

use std::time::Duration;

use serde_json::Value;

use crate::engines::EngineSettings;
use crate::engines::dns::DnsFleet;
use crate::engines::spec::{EngineSpec, Origin};
use crate::gateway::engines_api::EngineRequest;
use crate::gateway::http_engines::{self, ENGINE_SCHEMA};
use crate::gateway::http_register::PROFILE_KEYS;
use crate::gateway::request::{Limits, RootSeed, from_json_map};

/// The engine keys, with their defaults.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EngineConfig {
    /// `engines`, in file order.
    pub entries: Vec<EngineSpec>,
    pub dns: Option<DnsFleet>,
    pub settings: EngineSettings,
}

/// A day: the longest interval these keys take.
const MAX_MS: u64 = 86_400_000;

impl EngineConfig {
    /// Set `key` from `value`; `None`: not one of these keys. The error is (field, message).
    pub fn set(&mut self, key: &str, value: &Value) -> Option<Result<(), (String, String)>> {
        let s = &mut self.settings;
        let ms = |min: u64| match value.as_u64() {
            Some(n) if (min..=MAX_MS).contains(&n) => Ok(Duration::from_millis(n)),
            _ => Err((
                key.to_owned(),
                format!("must be an integer in {min}..={MAX_MS}"),
            )),
        };
        let count = |max: u64| match value.as_u64() {
            Some(n) if (1..=max).contains(&n) => Ok(n as usize),
            _ => Err((key.to_owned(), format!("must be an integer in 1..={max}"))),
        };
        Some(match key {
            "engines" => self.set_entries(value),
            "engines_dns" => self.set_dns(value),
            "engine_refresh_ms" => ms(100).map(|d| s.refresh = d),
            "engine_load_refresh_ms" => ms(100).map(|d| s.load_refresh = d),
            "engine_unreadable_grace_ms" => ms(0).map(|d| s.unreadable_grace = d),
            "engine_read_timeout_ms" => ms(10).map(|d| s.fetch.deadline = d),
            "allow_local_engine_addresses" => match value.as_bool() {
                Some(allow) => {
                    s.fetch.allow_local = allow;
                    Ok(())
                }
                None => Err((key.to_owned(), "must be a boolean".to_owned())),
            },
            "max_description_bytes" => count(1 << 30).map(|n| s.fetch.max_body_bytes = n),
            "max_ranks_per_engine" => count(1 << 16).map(|n| s.max_ranks_per_engine = n),
            "max_engines" => count(1 << 20).map(|n| s.max_engines = n),
            _ => return None,
        })
    }

    fn set_entries(&mut self, value: &Value) -> Result<(), (String, String)> {
        let Value::Array(list) = value else {
            return Err((
                "engines".into(),
                "must be a list of {\"url\": ...} objects".into(),
            ));
        };
        for (i, entry) in list.iter().enumerate() {
            let at = format!("engines[{i}]");
            let request = engine_request(entry, &at)?;
            let spec = EngineSpec::from_request(request, "type", Origin::Config)
                .map_err(|e| (format!("{at}.{}", e.field.unwrap_or_default()), e.message))?;
            if self.entries.iter().any(|s| s.key() == spec.key()) {
                let message = format!("instance {:?} is listed twice", spec.instance_id);
                return Err((at, message));
            }
            self.entries.push(spec);
        }
        Ok(())
    }

    fn set_dns(&mut self, value: &Value) -> Result<(), (String, String)> {
        let at = "engines_dns";
        let Value::Object(map) = value else {
            return Err((
                at.into(),
                "must be an object with a `name` (host:port)".into(),
            ));
        };
        let name = match map.get("name") {
            Some(Value::String(n)) if n.contains(':') => n.clone(),
            _ => {
                return Err((
                    format!("{at}.name"),
                    "must be a \"host:port\" string".into(),
                ));
            }
        };
        let refresh = match map.get("refresh_ms") {
            None => Duration::from_millis(crate::engines::DEFAULT_REFRESH_MS),
            Some(v) => match v.as_u64() {
                Some(n) if (100..=MAX_MS).contains(&n) => Duration::from_millis(n),
                _ => {
                    let message = format!("must be an integer in 100..={MAX_MS}");
                    return Err((format!("{at}.refresh_ms"), message));
                }
            },
        };
        let mut template = map.clone();
        template.remove("name");
        template.remove("refresh_ms");
        for key in ["url", "instance_id"] {
            if template.contains_key(key) {
                let message = "is set per address and cannot be given".to_owned();
                return Err((format!("{at}.{key}"), message));
            }
        }
        // The template is read as an entry; each address then gets its own URL.
        template.insert("url".into(), Value::String(format!("http://{name}")));
        let request = engine_request(&Value::Object(template), at)?;
        let dns = DnsFleet {
            name,
            template: request,
            refresh,
        };
        dns.check()
            .map_err(|e| (format!("{at}.{}", e.field.unwrap_or_default()), e.message))?;
        self.dns = Some(dns);
        Ok(())
    }
}

/// One entry's fields, read as `POST /engines` reads its body (the same schema and checks),
/// with an error's field named inside the entry (`engines[1].type`).
fn engine_request(entry: &Value, at: &str) -> Result<EngineRequest, (String, String)> {
    let Value::Object(map) = entry else {
        return Err((at.to_owned(), "must be an object".into()));
    };
    let seed = RootSeed {
        schema: ENGINE_SCHEMA,
        limits: Limits { max_tokens: 0 },
    };
    let request = from_json_map(map.clone(), seed).and_then(http_engines::engine_request);
    request.map_err(|e| {
        let field = e.field.unwrap_or_default();
        // The profile's checks name its keys alone, as `/register`'s do.
        let field = match PROFILE_KEYS.contains(&field.as_str()) {
            true => format!("hash_profile.{field}"),
            false => field,
        };
        (format!("{at}.{field}"), e.message)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entries_are_checked_with_the_field_named() {
        let mut c = EngineConfig::default();
        let ok =
            json!([{"url": "http://10.0.0.1:8000", "type": "SGLang"}, {"url": "http://e2:8000"}]);
        assert_eq!(c.set("engines", &ok), Some(Ok(())));
        assert_eq!(c.entries.len(), 2);
        assert_eq!(c.entries[0].instance_id, "10.0.0.1:8000");
        assert_eq!(c.entries[1].origin, Origin::Config);
        for (bad, field) in [
            (json!({}), "engines"),
            (json!([5]), "engines[0]"),
            (json!([{"url": "ftp://x"}]), "engines[0].url"),
            (
                json!([{"url": "http://x:1", "type": "Mooncake"}]),
                "engines[0].type",
            ),
            (
                json!([{"url": "http://x:1", "block_size": 0}]),
                "engines[0].block_size",
            ),
            (
                json!([{"url": "http://x:1", "colour": 1}]),
                "engines[0].colour",
            ),
            (
                json!([{"url": "http://x:1", "hash_profile": {"strategy": 1}}]),
                "engines[0].hash_profile.strategy",
            ),
            (
                json!([{"url": "http://x:1"}, {"url": "http://x:1"}]),
                "engines[1]",
            ),
        ] {
            let (f, m) = EngineConfig::default()
                .set("engines", &bad)
                .unwrap()
                .unwrap_err();
            assert_eq!(f, field, "{bad}: {m}");
        }
    }

    #[test]
    fn dns_and_bounds() {
        let mut c = EngineConfig::default();
        let dns = json!({"name": "vllm-headless.ns.svc:8000", "type": "vLLM", "refresh_ms": 5000, "block_size": 32});
        assert_eq!(c.set("engines_dns", &dns), Some(Ok(())));
        let d = c.dns.as_ref().unwrap();
        assert_eq!(
            (d.name.as_str(), d.refresh.as_millis()),
            ("vllm-headless.ns.svc:8000", 5000)
        );
        assert_eq!(d.template.block_size, Some(32));
        for (bad, field) in [
            (json!({"name": "no-port"}), "engines_dns.name"),
            (json!({"name": "a:1", "url": "http://b"}), "engines_dns.url"),
            (
                json!({"name": "a:1", "refresh_ms": 5}),
                "engines_dns.refresh_ms",
            ),
            (json!({"name": "a:1", "type": "x"}), "engines_dns.type"),
        ] {
            let (f, _) = EngineConfig::default()
                .set("engines_dns", &bad)
                .unwrap()
                .unwrap_err();
            assert_eq!(f, field, "{bad}");
        }
        assert_eq!(c.set("engine_refresh_ms", &json!(250)), Some(Ok(())));
        assert_eq!(c.settings.refresh, Duration::from_millis(250));
        assert_eq!(c.set("engine_load_refresh_ms", &json!(300)), Some(Ok(())));
        assert_eq!(c.settings.load_refresh, Duration::from_millis(300));
        assert!(
            c.set("engine_load_refresh_ms", &json!(10))
                .unwrap()
                .is_err()
        );
        assert!(c.set("max_ranks_per_engine", &json!(0)).unwrap().is_err());
        assert_eq!(c.set("other", &json!(1)), None);
    }
}
