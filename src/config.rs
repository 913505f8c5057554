//! Service configuration: a JSON file named by `CONDUCTOR_CONFIG_PATH`, else
//! `$HOME/.mooncake/conductor_config.json`, else the default embedded from `config/default.json`.
//!
//! Unlike the reference (which silently turns a non-numeric port into port 0 and ignores unknown
//! keys), every problem in a file is a startup error naming the file and the field. A missing port
//! means the default port, never 0; an explicit 0 asks the OS for a free port (the listener logs the
//! port it got). Static registrations (`kvevent_instance`) are kept as raw JSON here and validated
//! one by one at start-up with the same rules as HTTP `/register`, so a bad entry is skipped alone.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use crate::config_replica::positive;
pub use crate::config_replica::{
    DEFAULT_BOOTSTRAP_ATTEMPTS, DEFAULT_BOOTSTRAP_DEADLINE_MS, DEFAULT_BOOTSTRAP_MAX_BYTES,
};
use crate::durability::OnCorruptData;
use crate::gateway::auth::Tokens;
use crate::registry::policy::{
    DEFAULT_MAX_NAME_BYTES, DEFAULT_MAX_SUBSCRIPTIONS, HostRule, RegistrationPolicy,
};
use crate::subscription::settings::{
    DEFAULT_HEARTBEAT_INTERVAL, DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_UNREACHABLE_GRACE,
    SocketTimings, SubscriptionSettings,
};
use crate::subscription::zmtp::Heartbeat;

/// The embedded default configuration.
pub const DEFAULT_CONFIG_JSON: &str = include_str!("../config/default.json");

pub const CONFIG_PATH_ENV: &str = "CONDUCTOR_CONFIG_PATH";
pub const LOG_LEVEL_ENV: &str = "CONDUCTOR_LOG_LEVEL";
/// Overrides the file's `auth_token` when set and not empty, so the secret need not be written
/// into a configuration file (the Python client reads the same variable).
pub const AUTH_TOKEN_ENV: &str = "CONDUCTOR_AUTH_TOKEN";

const DEFAULT_HTTP_PORT: u16 = 8080;
const DEFAULT_RPC_PORT: u16 = 50052;
const DEFAULT_DATA_DIR: &str = "./conductor-data";
const DEFAULT_CHECKPOINT_INTERVAL_MS: u64 = 1000;
const DEFAULT_HTTP_BODY_LIMIT: u64 = 64 * 1024 * 1024;
const DEFAULT_RPC_MESSAGE_LIMIT: u64 = 64 * 1024 * 1024;
/// The largest real vLLM batch is about 10 MB (a 1 M-token prefill step stored at once, see
/// `docs/zmtp.md`); 64 MiB leaves room for larger engines and equals the HTTP body limit.
pub const DEFAULT_PUBLISHER_MESSAGE_LIMIT: u64 = 64 * 1024 * 1024;
/// Four largest messages: a replay of 30 s at most rarely holds more than a few batches.
pub const DEFAULT_REPLAY_HELD_LIMIT: u64 = 256 * 1024 * 1024;
pub const DEFAULT_WARNING_INTERVAL_MS: u64 = 10_000;
/// 4 Mi tokens: longer than any model's context today, and 16 MiB as `Vec<i32>`.
const DEFAULT_MAX_QUERY_TOKENS: u64 = 4 << 20;
/// Four bodies at the default body limit.
const DEFAULT_INFLIGHT_BODY_BYTES: u64 = 256 * 1024 * 1024;
/// Heartbeat interval and timeout at most: the TTL a PING carries holds 6553.5 s.
const MAX_PUBLISHER_TIMING_MS: u64 = 6_553_500;
/// A base model, a few dozen adapters and block sizes: more is a misconfigured or hostile
/// publisher (each context is an actor and an index of its own).
pub const DEFAULT_MAX_CONTEXTS_PER_SOURCE: u64 = 64;
/// Default of `max_holders_per_context`: a store has one holder (backend) per node or rank, so a
/// real fleet has hundreds at most (see `docs/engine-events.md`).
pub const DEFAULT_MAX_HOLDERS_PER_CONTEXT: u64 = 1024;
/// Smaller memory budgets are a mistake (a few thousand blocks), not a bound.
const MIN_INDEX_BYTES: u64 = 1 << 20;
const MAX_INDEX_BYTES: u64 = 1 << 50;
/// Block ids of a context's table fit 32 bits.
const MAX_CONTEXT_BLOCKS: u64 = u32::MAX as u64;

/// The loaded configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub http_server_port: u16,
    pub rpc_server_port: u16,
    /// Address both servers listen on (default all interfaces, like the reference).
    pub bind_address: IpAddr,
    /// Static registrations by stream key, in file order; fields as HTTP `/register` takes them.
    pub kvevent_instance: Vec<(String, Map<String, Value>)>,
    pub data_dir: PathBuf,
    pub checkpoint_interval_ms: u64,
    /// Largest HTTP request body accepted (413 above it).
    pub http_body_limit_bytes: u64,
    /// Largest gRPC message decoded or encoded.
    pub rpc_message_limit_bytes: u64,
    /// What to do when the data directory cannot be opened or read: stop (default), or move it
    /// aside and start empty.
    pub move_corrupt_data_aside: bool,
    /// The most one publisher or replay message may take; a larger one drops that connection.
    pub max_publisher_message_bytes: u64,
    /// The most live batches held during a replay may take; beyond it the replay is abandoned.
    pub max_replay_held_bytes: u64,
    /// Each kind of per-subscription warning is logged at most once per interval.
    pub warning_interval_ms: u64,
    /// How often a publisher speaking ZMTP 3.1 is pinged (and the TCP keepalive interval).
    pub publisher_heartbeat_ms: u64,
    /// A pinged publisher silent this long is disconnected and reconnected.
    pub publisher_timeout_ms: u64,
    /// A publisher without a live connection this long has its source dropped.
    pub publisher_unreachable_grace_ms: u64,
    /// Most token ids in one query (and block hashes in one query by hash), both transports.
    pub max_query_tokens: usize,
    /// Bytes of large HTTP request bodies (over 1 MiB each) held at once; a request that cannot
    /// get its share in time is answered 503.
    pub http_inflight_body_bytes: u64,
    /// Accepted tokens (`auth_token`, or `CONDUCTOR_AUTH_TOKEN`); empty: no authentication.
    pub auth_tokens: Tokens,
    /// Reads (queries, listings, status, metrics) need the token too.
    pub auth_reads: bool,
    /// Hosts and CIDR blocks registrations may name in endpoints; `None`: any.
    pub allowed_endpoint_hosts: Option<Vec<HostRule>>,
    pub max_subscriptions: u64,
    /// Longest id or name (instance, tenant, model, adapter, endpoint) a registration or a
    /// publisher's event may carry.
    pub max_name_bytes: u64,
    /// The most contexts one subscription's events may feed.
    pub max_contexts_per_source: u64,
    /// The most holders (store backends) one subscription's events may create in one context.
    pub max_holders_per_context: u64,
    /// The memory budget of the whole index, in estimated bytes: `None` sizes it from the
    /// machine at start ([`crate::index::budget::default_max_index_bytes`]), 0 is no bound.
    pub max_index_bytes: Option<u64>,
    /// The most blocks one context keeps (0: no bound of its own).
    pub max_context_blocks: u64,
    /// Registrations shared with other replicas through etcd; `None`: this replica's own store.
    pub shared_registry: Option<crate::registry::shared::EtcdConfig>,
    /// A replica's id, bootstrap and snapshot export (`config_replica`).
    pub replica: crate::config_replica::ReplicaConfig,
    /// TLS on both servers (`tls`); `None`: plain TCP.
    pub tls: Option<crate::gateway::tls::ServerTlsFiles>,
    /// Connection cap, timeouts and gRPC keepalive (`docs/connections.md`).
    pub connections: crate::config_connections::ConnectionConfig,
    /// Engines registered by URL and how they are read (`config_engines`).
    pub engines: crate::config_engines::EngineConfig,
}

/// Where the configuration came from, for the start-up log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigOrigin {
    File(PathBuf),
    Embedded,
}

impl fmt::Display for ConfigOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigOrigin::File(p) => write!(f, "{}", p.display()),
            ConfigOrigin::Embedded => f.write_str("embedded default"),
        }
    }
}

/// A configuration that cannot be used; names the file and, when it applies, the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config {origin}: {}{message}", field.as_ref().map(|f| format!("field `{f}`: ")).unwrap_or_default())]
pub struct ConfigError {
    pub origin: String,
    pub field: Option<String>,
    pub message: String,
}

impl Config {
    /// Resolve the configuration from the environment (see the module doc).
    pub fn load() -> Result<(Config, ConfigOrigin), ConfigError> {
        let explicit = std::env::var(CONFIG_PATH_ENV)
            .ok()
            .filter(|p| !p.is_empty());
        let (mut config, origin) = if let Some(path) = explicit {
            let path = PathBuf::from(path);
            (Config::from_file(&path)?, ConfigOrigin::File(path))
        } else {
            let home = std::env::var_os("HOME").filter(|h| !h.is_empty());
            let path = home.map(|h| {
                Path::new(&h)
                    .join(".mooncake")
                    .join("conductor_config.json")
            });
            match path {
                Some(path) if path.exists() => {
                    (Config::from_file(&path)?, ConfigOrigin::File(path))
                }
                _ => (Config::embedded_default(), ConfigOrigin::Embedded),
            }
        };
        config.apply_token_env(std::env::var(AUTH_TOKEN_ENV).ok().as_deref())?;
        if let Some(etcd) = &mut config.shared_registry {
            use crate::registry::shared::ETCD_PASSWORD_ENV;
            etcd.apply_password_env(std::env::var(ETCD_PASSWORD_ENV).ok().as_deref())
                .map_err(|message| ConfigError {
                    origin: format!("environment variable {ETCD_PASSWORD_ENV}"),
                    field: None,
                    message,
                })?;
        }
        Ok((config, origin))
    }

    pub fn registration_policy(&self) -> RegistrationPolicy {
        RegistrationPolicy {
            allowed_hosts: self.allowed_endpoint_hosts.clone(),
            max_subscriptions: self.max_subscriptions as usize,
            max_name_bytes: self.max_name_bytes as usize,
        }
    }

    /// The environment's token list (`value`) replaces the file's when set and not empty; then
    /// `auth_reads` must have a token to ask for.
    pub fn apply_token_env(&mut self, value: Option<&str>) -> Result<(), ConfigError> {
        if let Some(text) = value.filter(|v| !v.trim().is_empty()) {
            self.auth_tokens = Tokens::parse(text).map_err(|message| ConfigError {
                origin: format!("environment variable {AUTH_TOKEN_ENV}"),
                field: None,
                message,
            })?;
        }
        if self.auth_reads && self.auth_tokens.is_empty() {
            return Err(ConfigError {
                origin: "configuration".into(),
                field: Some("auth_reads".into()),
                message: format!("needs `auth_token` or {AUTH_TOKEN_ENV}"),
            });
        }
        Ok(())
    }

    /// The embedded default. It is checked by a unit test, so parsing cannot fail at run time.
    pub fn embedded_default() -> Config {
        Config::parse(DEFAULT_CONFIG_JSON, "embedded default").unwrap_or_else(|e| panic!("{e}"))
    }

    pub fn from_file(path: &Path) -> Result<Config, ConfigError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            origin: origin.clone(),
            field: None,
            message: format!("cannot read: {e}"),
        })?;
        Config::parse(&text, &origin)
    }

    /// Parse a configuration document; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let err = |field: Option<&str>, message: String| ConfigError {
            origin: origin.to_owned(),
            field: field.map(str::to_owned),
            message,
        };
        let root: Value =
            serde_json::from_str(text).map_err(|e| err(None, format!("invalid JSON: {e}")))?;
        let Value::Object(root) = root else {
            return Err(err(None, "the root must be a JSON object".into()));
        };
        let mut config = Config {
            http_server_port: DEFAULT_HTTP_PORT,
            rpc_server_port: DEFAULT_RPC_PORT,
            bind_address: IpAddr::from([0, 0, 0, 0]),
            kvevent_instance: Vec::new(),
            data_dir: PathBuf::from(DEFAULT_DATA_DIR),
            checkpoint_interval_ms: DEFAULT_CHECKPOINT_INTERVAL_MS,
            http_body_limit_bytes: DEFAULT_HTTP_BODY_LIMIT,
            rpc_message_limit_bytes: DEFAULT_RPC_MESSAGE_LIMIT,
            move_corrupt_data_aside: false,
            max_publisher_message_bytes: DEFAULT_PUBLISHER_MESSAGE_LIMIT,
            max_replay_held_bytes: DEFAULT_REPLAY_HELD_LIMIT,
            warning_interval_ms: DEFAULT_WARNING_INTERVAL_MS,
            publisher_heartbeat_ms: DEFAULT_HEARTBEAT_INTERVAL.as_millis() as u64,
            publisher_timeout_ms: DEFAULT_HEARTBEAT_TIMEOUT.as_millis() as u64,
            publisher_unreachable_grace_ms: DEFAULT_UNREACHABLE_GRACE.as_millis() as u64,
            max_query_tokens: DEFAULT_MAX_QUERY_TOKENS as usize,
            http_inflight_body_bytes: DEFAULT_INFLIGHT_BODY_BYTES,
            auth_tokens: Tokens::default(),
            auth_reads: false,
            allowed_endpoint_hosts: None,
            max_subscriptions: DEFAULT_MAX_SUBSCRIPTIONS as u64,
            max_name_bytes: DEFAULT_MAX_NAME_BYTES as u64,
            max_contexts_per_source: DEFAULT_MAX_CONTEXTS_PER_SOURCE,
            max_holders_per_context: DEFAULT_MAX_HOLDERS_PER_CONTEXT,
            max_index_bytes: None,
            max_context_blocks: 0,
            shared_registry: None,
            replica: Default::default(),
            tls: None,
            connections: Default::default(),
            engines: Default::default(),
        };
        for (key, value) in &root {
            let field = Some(key.as_str());
            match key.as_str() {
                "http_server_port" => {
                    config.http_server_port = port(value).map_err(|m| err(field, m))?
                }
                "rpc_server_port" => {
                    config.rpc_server_port = port(value).map_err(|m| err(field, m))?
                }
                "bind_address" => {
                    let text = value
                        .as_str()
                        .ok_or_else(|| err(field, "must be a string".into()))?;
                    config.bind_address = text
                        .parse()
                        .map_err(|_| err(field, format!("not an IP address: {text:?}")))?;
                }
                "kvevent_instance" => {
                    let Value::Object(entries) = value else {
                        return Err(err(
                            field,
                            "must be an object of stream key -> registration".into(),
                        ));
                    };
                    for (stream_key, entry) in entries {
                        let Value::Object(entry) = entry else {
                            let name = format!("kvevent_instance.{stream_key}");
                            return Err(err(Some(&name), "must be an object".into()));
                        };
                        config
                            .kvevent_instance
                            .push((stream_key.clone(), entry.clone()));
                    }
                }
                "data_dir" => {
                    let text = value.as_str().filter(|s| !s.is_empty());
                    let text =
                        text.ok_or_else(|| err(field, "must be a non-empty string".into()))?;
                    config.data_dir = PathBuf::from(text);
                }
                "checkpoint_interval_ms" => {
                    config.checkpoint_interval_ms =
                        positive(value, u32::MAX as u64).map_err(|m| err(field, m))?
                }
                "http_body_limit_bytes" => {
                    config.http_body_limit_bytes =
                        positive(value, 1 << 32).map_err(|m| err(field, m))?
                }
                "rpc_message_limit_bytes" => {
                    config.rpc_message_limit_bytes =
                        positive(value, 1 << 31).map_err(|m| err(field, m))?
                }
                "max_publisher_message_bytes" => {
                    config.max_publisher_message_bytes =
                        positive(value, 1 << 32).map_err(|m| err(field, m))?
                }
                "max_replay_held_bytes" => {
                    config.max_replay_held_bytes =
                        positive(value, 1 << 40).map_err(|m| err(field, m))?
                }
                "warning_interval_ms" => {
                    config.warning_interval_ms =
                        positive(value, u32::MAX as u64).map_err(|m| err(field, m))?
                }
                "publisher_heartbeat_ms" => {
                    config.publisher_heartbeat_ms =
                        positive(value, MAX_PUBLISHER_TIMING_MS).map_err(|m| err(field, m))?
                }
                "publisher_timeout_ms" => {
                    config.publisher_timeout_ms =
                        positive(value, MAX_PUBLISHER_TIMING_MS).map_err(|m| err(field, m))?
                }
                "publisher_unreachable_grace_ms" => {
                    config.publisher_unreachable_grace_ms =
                        positive(value, u32::MAX as u64).map_err(|m| err(field, m))?
                }
                "max_query_tokens" => {
                    config.max_query_tokens =
                        positive(value, 1 << 30).map_err(|m| err(field, m))? as usize
                }
                "http_inflight_body_bytes" => {
                    config.http_inflight_body_bytes =
                        positive(value, 1 << 40).map_err(|m| err(field, m))?
                }
                "auth_token" => {
                    let text = value
                        .as_str()
                        .ok_or_else(|| err(field, "must be a string".into()))?;
                    config.auth_tokens = Tokens::parse(text).map_err(|m| err(field, m))?;
                }
                "auth_reads" => {
                    config.auth_reads = value
                        .as_bool()
                        .ok_or_else(|| err(field, "must be true or false".into()))?
                }
                "allowed_endpoint_hosts" => {
                    let Value::Array(items) = value else {
                        return Err(err(
                            field,
                            "must be an array of hosts or CIDR blocks".into(),
                        ));
                    };
                    if items.is_empty() {
                        return Err(err(
                            field,
                            "must list at least one host; leave it out to allow any".into(),
                        ));
                    }
                    let mut rules = Vec::with_capacity(items.len());
                    for (i, item) in items.iter().enumerate() {
                        let name = format!("allowed_endpoint_hosts[{i}]");
                        let text = item
                            .as_str()
                            .ok_or_else(|| err(Some(&name), "must be a string".into()))?;
                        rules.push(HostRule::parse(text).map_err(|m| err(Some(&name), m))?);
                    }
                    config.allowed_endpoint_hosts = Some(rules);
                }
                "max_subscriptions" => {
                    config.max_subscriptions =
                        positive(value, 1 << 20).map_err(|m| err(field, m))?
                }
                "max_name_bytes" => {
                    config.max_name_bytes = positive(value, 1 << 16).map_err(|m| err(field, m))?
                }
                "max_contexts_per_source" => {
                    config.max_contexts_per_source =
                        positive(value, 1 << 16).map_err(|m| err(field, m))?
                }
                "max_holders_per_context" => {
                    config.max_holders_per_context =
                        positive(value, 1 << 20).map_err(|m| err(field, m))?
                }
                "max_index_bytes" => {
                    config.max_index_bytes = Some(
                        value
                            .as_u64()
                            .filter(|&n| n == 0 || (MIN_INDEX_BYTES..=MAX_INDEX_BYTES).contains(&n))
                            .ok_or_else(|| {
                                err(
                                    field,
                                    format!(
                                        "must be 0 (no bound) or an integer in \
                                         {MIN_INDEX_BYTES}..={MAX_INDEX_BYTES}"
                                    ),
                                )
                            })?,
                    )
                }
                "max_context_blocks" => {
                    config.max_context_blocks = value
                        .as_u64()
                        .filter(|&n| n <= MAX_CONTEXT_BLOCKS)
                        .ok_or_else(|| {
                            err(
                                field,
                                format!(
                                    "must be 0 (no bound) or an integer in 1..={MAX_CONTEXT_BLOCKS}"
                                ),
                            )
                        })?
                }
                "registry" => {
                    let etcd = crate::registry::shared::EtcdConfig::parse(value)
                        .map_err(|(f, m)| err(Some(f.as_str()), m))?;
                    config.shared_registry = Some(etcd);
                }
                "tls" => {
                    let files = crate::gateway::tls::ServerTlsFiles::parse(value)
                        .map_err(|(f, m)| err(Some(f.as_str()), m))?;
                    config.tls = Some(files);
                }
                "on_corrupt_data" => {
                    config.move_corrupt_data_aside = match value.as_str() {
                        Some("refuse") => false,
                        Some("move_aside") => true,
                        _ => return Err(err(field, "must be \"refuse\" or \"move_aside\"".into())),
                    }
                }
                other => match config.replica.set(other, value) {
                    Some(set) => set.map_err(|(f, m)| err(Some(f.as_str()), m))?,
                    None => match config.connections.set(other, value) {
                        Some(set) => set.map_err(|m| err(field, m))?,
                        None => match config.engines.set(other, value) {
                            Some(set) => set.map_err(|(f, m)| err(Some(f.as_str()), m))?,
                            None => return Err(err(field, "unknown configuration key".into())),
                        },
                    },
                },
            }
        }
        if config.publisher_timeout_ms <= config.publisher_heartbeat_ms {
            return Err(err(
                Some("publisher_timeout_ms"),
                format!(
                    "must be longer than publisher_heartbeat_ms ({}): a publisher needs a PING \
                     to answer before it counts as silent",
                    config.publisher_heartbeat_ms
                ),
            ));
        }
        crate::gateway::tls::check_bootstrap_transport(
            config.replica.bootstrap_from.as_deref(),
            config.replica.bootstrap_tls.is_some(),
            config.replica.bootstrap_allow_plain_http,
        )
        .map_err(|(f, m)| err(Some(f), m))?;
        Ok(config)
    }
}

fn port(value: &Value) -> Result<u16, String> {
    let n = value
        .as_u64()
        .ok_or_else(|| "must be an integer in 0..=65535".to_owned())?;
    u16::try_from(n).map_err(|_| format!("{n} is outside 0..=65535"))
}

/// Log levels accepted by `CONDUCTOR_LOG_LEVEL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warn,
    Error,
}

impl Config {
    pub fn connection_limits(&self) -> crate::gateway::connections::ConnectionLimits {
        self.connections.limits()
    }

    pub fn on_corrupt_data(&self) -> OnCorruptData {
        if self.move_corrupt_data_aside {
            OnCorruptData::MoveAside
        } else {
            OnCorruptData::Stop
        }
    }

    /// What every subscription is started with (of the socket timings, only the heartbeat is
    /// configurable).
    /// The index's memory budget (see "Memory budget" in `docs/durability.md`), sized from the
    /// machine when `max_index_bytes` is not set.
    pub fn index_budget(&self) -> crate::index::Budget {
        let bytes = self
            .max_index_bytes
            .unwrap_or_else(crate::index::budget::default_max_index_bytes);
        crate::index::Budget::new(bytes, self.max_context_blocks)
    }

    pub fn subscription_settings(&self) -> SubscriptionSettings {
        let ms = std::time::Duration::from_millis;
        SubscriptionSettings {
            timings: SocketTimings {
                heartbeat: Heartbeat {
                    interval: ms(self.publisher_heartbeat_ms),
                    timeout: ms(self.publisher_timeout_ms),
                },
                ..SocketTimings::default()
            },
            unreachable_grace: ms(self.publisher_unreachable_grace_ms),
            max_message_bytes: self.max_publisher_message_bytes as usize,
            max_held_bytes: self.max_replay_held_bytes as usize,
            warn_interval: std::time::Duration::from_millis(self.warning_interval_ms),
            max_contexts: self.max_contexts_per_source as usize,
            max_holders: self.max_holders_per_context as usize,
            max_name_bytes: self.max_name_bytes as usize,
        }
    }
}

impl LogLevel {
    /// Parse `CONDUCTOR_LOG_LEVEL`, case-insensitively. Empty or unset is INFO; anything else is
    /// returned as an error so the caller can warn and fall back to INFO.
    pub fn parse(text: Option<&str>) -> Result<LogLevel, String> {
        let text = text.unwrap_or("").trim();
        match text.to_ascii_uppercase().as_str() {
            "" | "INFO" => Ok(LogLevel::Info),
            "DEBUG" => Ok(LogLevel::Debug),
            "WARN" | "WARNING" => Ok(LogLevel::Warn),
            "ERROR" => Ok(LogLevel::Error),
            _ => Err(format!(
                "{LOG_LEVEL_ENV}={text:?} is not DEBUG, INFO, WARN or ERROR; using INFO"
            )),
        }
    }

    pub const fn as_filter(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warn => "warn",
            LogLevel::Error => "error",
        }
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
