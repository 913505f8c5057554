//! Registrations shared by replicas through etcd (`registry: {"etcd": {...}}`).
//!
//! etcd holds one key per registration under `<prefix>registrations/`. A register or unregister
//! on any replica is a transaction on that key (created only if absent, so two replicas cannot
//! race one key into two configurations); every replica watches the prefix and starts or stops
//! the subscription. Each replica still keeps its own copy in RocksDB, with its index and
//! watermarks, so a replica restarted while etcd is down serves what it knew.
//!
//! A replica switched from its own registrations to etcd brings them along: at its first
//! listing, if etcd holds no registration under the prefix and this store never synchronised
//! with it (`marker`), each is created in etcd as a register would; otherwise etcd's listing
//! decides, as always.
//!
//! An etcd that comes back without the fleet's registrations (wiped, reinstalled, restored from
//! an older backup, another cluster on the same endpoints) is told from the fleet's own removals
//! by the history a replica followed ([`reset`]): such a listing removes nothing. The replica
//! keeps running what etcd lost (*held*), reports it ([`report`]), and writes it back into etcd
//! (`on_reset: "reupload"`, the default) or waits for an operator (`"hold"`), who writes it back
//! or confirms the removal ([`command::Command`]).

pub mod command;
pub mod etcd;
pub mod follow;
pub mod marker;
pub mod report;
pub mod reset;
pub mod sync;

use std::fmt;
use std::path::PathBuf;

use serde_json::Value;

pub const DEFAULT_PREFIX: &str = "/mooncake-conductor/";
const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 3000;
const DEFAULT_CONNECT_TIMEOUT_MS: u64 = 2000;
/// Overrides the file's `registry.etcd.password` when set and not empty.
pub const ETCD_PASSWORD_ENV: &str = "CONDUCTOR_ETCD_PASSWORD";

/// Client TLS for `https://` endpoints: the files are read at start-up.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EtcdTls {
    /// PEM certificate(s) of the authority that signed etcd's server certificate.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, for etcd's `--client-cert-auth`.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The name to verify the server certificate against, when it is not the endpoint's host.
    pub domain: Option<String>,
}

/// What a replica does when a listing suggests etcd lost the fleet's registrations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnReset {
    /// Write the held registrations back (each created only if absent).
    #[default]
    Reupload,
    /// Keep them held and reported until an operator writes them back or confirms the removal.
    Hold,
}

impl OnReset {
    pub const fn as_str(self) -> &'static str {
        match self {
            OnReset::Reupload => "reupload",
            OnReset::Hold => "hold",
        }
    }
}

/// How to reach etcd. `Debug` never prints the password.
#[derive(Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    pub endpoints: Vec<String>,
    pub prefix: String,
    /// etcd user authentication (`etcdctl user add`).
    pub user: Option<(String, String)>,
    pub tls: Option<EtcdTls>,
    /// A register or unregister that etcd has not answered by then fails as unavailable.
    pub request_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub on_reset: OnReset,
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("tls", &self.tls)
            .field("request_timeout_ms", &self.request_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("on_reset", &self.on_reset)
            .finish()
    }
}

impl EtcdConfig {
    /// Parse the `registry` value; the error names the offending sub-field.
    pub fn parse(value: &Value) -> Result<EtcdConfig, (String, String)> {
        let bad = |field: &str, m: &str| (format!("registry.{field}"), m.to_owned());
        let Some(Value::Object(etcd)) = value
            .as_object()
            .and_then(|o| (o.len() == 1).then(|| o.get("etcd")).flatten())
        else {
            return Err((
                "registry".into(),
                "must be {\"etcd\": {\"endpoints\": [...], ...}} (leave it out for the local registry)"
                    .into(),
            ));
        };
        let mut config = EtcdConfig {
            endpoints: Vec::new(),
            prefix: DEFAULT_PREFIX.to_owned(),
            user: None,
            tls: None,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            connect_timeout_ms: DEFAULT_CONNECT_TIMEOUT_MS,
            on_reset: OnReset::default(),
        };
        let (mut user, mut password) = (None, None);
        for (key, v) in etcd {
            let field = format!("etcd.{key}");
            let text = || {
                v.as_str()
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .ok_or_else(|| bad(&field, "must be a non-empty string"))
            };
            match key.as_str() {
                "endpoints" => {
                    let list = v.as_array().filter(|l| !l.is_empty());
                    let list =
                        list.ok_or_else(|| bad(&field, "must be a non-empty list of URLs"))?;
                    for e in list {
                        let e = e.as_str().unwrap_or_default();
                        let scheme_ok = e.starts_with("http://") || e.starts_with("https://");
                        if !scheme_ok || e.len() <= "https://".len() {
                            return Err(bad(
                                &field,
                                "each endpoint must be an http:// or https:// URL (host:port)",
                            ));
                        }
                        config.endpoints.push(e.to_owned());
                    }
                }
                "prefix" => config.prefix = text()?,
                "user" => user = Some(text()?),
                "password" => password = Some(text()?),
                "request_timeout_ms" | "connect_timeout_ms" => {
                    let n = v
                        .as_u64()
                        .filter(|n| (1..=600_000).contains(n))
                        .ok_or_else(|| bad(&field, "must be an integer in 1..=600000"))?;
                    if key == "request_timeout_ms" {
                        config.request_timeout_ms = n;
                    } else {
                        config.connect_timeout_ms = n;
                    }
                }
                "tls" => config.tls = Some(parse_tls(v).map_err(|(f, m)| bad(&f, &m))?),
                "on_reset" => {
                    config.on_reset = match v.as_str() {
                        Some("reupload") => OnReset::Reupload,
                        Some("hold") => OnReset::Hold,
                        _ => return Err(bad(&field, "must be \"reupload\" or \"hold\"")),
                    }
                }
                _ => return Err(bad(&field, "unknown key")),
            }
        }
        if config.endpoints.is_empty() {
            return Err(bad("etcd.endpoints", "is required"));
        }
        config.user = match (user, password) {
            (Some(u), Some(p)) => Some((u, p)),
            (None, None) => None,
            (Some(u), None) => Some((u, String::new())),
            (None, Some(_)) => return Err(bad("etcd.user", "is required with a password")),
        };
        let https = config.endpoints.iter().any(|e| e.starts_with("https://"));
        let http = config.endpoints.iter().any(|e| e.starts_with("http://"));
        if config.tls.is_some() && http {
            return Err(bad("etcd.tls", "needs https:// endpoints (all of them)"));
        }
        if https && config.tls.as_ref().is_none_or(|t| t.ca_file.is_none()) {
            return Err(bad(
                "etcd.tls.ca_file",
                "is required with https:// endpoints (the authority that signed etcd's certificate)",
            ));
        }
        if https && http {
            return Err(bad(
                "etcd.endpoints",
                "mixes http:// and https:// endpoints",
            ));
        }
        Ok(config)
    }

    /// `CONDUCTOR_ETCD_PASSWORD`, when set and not empty, replaces the file's password.
    pub fn apply_password_env(&mut self, value: Option<&str>) -> Result<(), String> {
        let Some(password) = value.filter(|v| !v.is_empty()) else {
            return Ok(());
        };
        match &mut self.user {
            Some((_, p)) => {
                *p = password.to_owned();
                Ok(())
            }
            None => Err(format!(
                "{ETCD_PASSWORD_ENV} is set but registry.etcd.user is not"
            )),
        }
    }
}

fn parse_tls(v: &Value) -> Result<EtcdTls, (String, String)> {
    let Value::Object(fields) = v else {
        return Err(("etcd.tls".into(), "must be an object".into()));
    };
    let mut tls = EtcdTls::default();
    for (key, v) in fields {
        let field = format!("etcd.tls.{key}");
        let text = v
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| (field.clone(), "must be a non-empty string".to_owned()))?;
        match key.as_str() {
            "ca_file" => tls.ca_file = Some(PathBuf::from(text)),
            "cert_file" => tls.cert_file = Some(PathBuf::from(text)),
            "key_file" => tls.key_file = Some(PathBuf::from(text)),
            "domain" => tls.domain = Some(text.to_owned()),
            _ => return Err((field, "unknown key".into())),
        }
    }
    if tls.cert_file.is_some() != tls.key_file.is_some() {
        return Err((
            "etcd.tls".into(),
            "cert_file and key_file go together".into(),
        ));
    }
    Ok(tls)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_documented_form_parses_with_defaults() {
        let c =
            EtcdConfig::parse(&json!({"etcd": {"endpoints": ["http://127.0.0.1:2379"]}})).unwrap();
        assert_eq!(c.endpoints, vec!["http://127.0.0.1:2379"]);
        assert_eq!(c.prefix, DEFAULT_PREFIX);
        assert_eq!(c.request_timeout_ms, DEFAULT_REQUEST_TIMEOUT_MS);
        assert!(c.user.is_none() && c.tls.is_none());
        assert_eq!(c.on_reset, OnReset::Reupload);
    }

    #[test]
    fn every_option_is_taken_and_the_password_is_never_printed() {
        let mut c = EtcdConfig::parse(&json!({"etcd": {
            "endpoints": ["https://a:2379", "https://b:2379"], "prefix": "/x/",
            "user": "conductor", "password": "s3cret", "request_timeout_ms": 500,
            "connect_timeout_ms": 700, "on_reset": "hold",
            "tls": {"ca_file": "ca.pem", "cert_file": "c.pem", "key_file": "k.pem", "domain": "etcd"}
        }}))
        .unwrap();
        assert_eq!(c.prefix, "/x/");
        assert_eq!(c.user, Some(("conductor".into(), "s3cret".into())));
        assert_eq!((c.request_timeout_ms, c.connect_timeout_ms), (500, 700));
        assert_eq!(c.on_reset, OnReset::Hold);
        let tls = c.tls.clone().unwrap();
        assert_eq!(tls.domain.as_deref(), Some("etcd"));
        assert_eq!(tls.ca_file, Some(PathBuf::from("ca.pem")));
        assert!(!format!("{c:?}").contains("s3cret"));
        c.apply_password_env(Some("from-env")).unwrap();
        assert_eq!(c.user.unwrap().1, "from-env");
    }

    #[test]
    fn bad_values_name_their_field() {
        let cases = [
            (json!("etcd"), "registry"),
            (json!({"etcd": {}, "other": 1}), "registry"),
            (json!({"etcd": {}}), "registry.etcd.endpoints"),
            (
                json!({"etcd": {"endpoints": []}}),
                "registry.etcd.endpoints",
            ),
            (
                json!({"etcd": {"endpoints": ["127.0.0.1:2379"]}}),
                "registry.etcd.endpoints",
            ),
            (
                json!({"etcd": {"endpoints": [7]}}),
                "registry.etcd.endpoints",
            ),
            (
                json!({"etcd": {"endpoints": ["http://a:1"], "prefix": ""}}),
                "registry.etcd.prefix",
            ),
            (
                json!({"etcd": {"endpoints": ["http://a:1"], "password": "p"}}),
                "registry.etcd.user",
            ),
            (
                json!({"etcd": {"endpoints": ["http://a:1"], "request_timeout_ms": 0}}),
                "registry.etcd.request_timeout_ms",
            ),
            (
                json!({"etcd": {"endpoints": ["http://a:1"], "tls": {}}}),
                "registry.etcd.tls",
            ),
            (
                json!({"etcd": {"endpoints": ["https://a:1"], "tls": {"cert_file": "c"}}}),
                "registry.etcd.tls",
            ),
            (
                json!({"etcd": {"endpoints": ["https://a:1"], "tls": {"x": "c"}}}),
                "registry.etcd.tls.x",
            ),
            (
                json!({"etcd": {"endpoints": ["https://a:1", "http://b:1"]}}),
                "registry.etcd.tls.ca_file",
            ),
            (
                json!({"etcd": {"endpoints": ["https://a:1"]}}),
                "registry.etcd.tls.ca_file",
            ),
            (
                json!({"etcd": {"endpoints": ["http://a:1"], "typo": 1}}),
                "registry.etcd.typo",
            ),
            (
                json!({"etcd": {"endpoints": ["http://a:1"], "on_reset": "wipe"}}),
                "registry.etcd.on_reset",
            ),
        ];
        for (value, field) in cases {
            let (got, message) = EtcdConfig::parse(&value).unwrap_err();
            assert_eq!(got, field, "{value}: {message}");
            assert!(!message.is_empty());
        }
    }

    #[test]
    fn a_password_from_the_environment_needs_a_user() {
        let mut c = EtcdConfig::parse(&json!({"etcd": {"endpoints": ["http://a:1"]}})).unwrap();
        assert!(c.apply_password_env(Some("p")).is_err());
        assert!(c.apply_password_env(Some("")).is_ok());
        assert!(c.apply_password_env(None).is_ok());
    }
}
