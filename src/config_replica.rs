//! The configuration keys of a replica: its id, where and how it bootstraps (`bootstrap_from`,
//! its bounds, its TLS towards the peer) and who may take its own snapshot. `config` parses every
//! other key; `docs/replicas.md` says what each bound protects against.

use serde_json::Value;

/// Snapshot attempts before an empty start: with the back-off between them (1, 2, 4, 8, 16 s),
/// about half a minute for a peer to come back, or for the first replica of a new fleet to find
/// there is none (see docs/replicas.md).
pub const DEFAULT_BOOTSTRAP_ATTEMPTS: u32 = 6;

const MAX_BOOTSTRAP_ATTEMPTS: u32 = 1_000_000;
/// One snapshot pull, connection to end mark: 10 M pairs take about 10 s on a busy two-core
/// machine, so five minutes is far above any honest peer and bounds a trickling one (see
/// docs/replicas.md, "Bounds of a bootstrap").
pub const DEFAULT_BOOTSTRAP_DEADLINE_MS: u64 = 300_000;
/// Bytes of records one pull takes at most: about a billion pairs at 29 bytes each.
pub const DEFAULT_BOOTSTRAP_MAX_BYTES: u64 = 32 << 30;

/// A replica's settings (config keys of the same names, `snapshot_export` as
/// `snapshot_export_open`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// A peer replica (`https://host:grpc_port`, or `http://`) to take a snapshot from when the
    /// data directory holds nothing.
    pub bootstrap_from: Option<String>,
    /// Attempts at that snapshot before the replica starts empty; 0: attempt until one succeeds.
    pub bootstrap_attempts: u32,
    /// This replica's id in `/metrics` and in the snapshots it serves; `None`: the host name.
    pub replica_id: Option<String>,
    /// The CA (and name) an `https://` `bootstrap_from` is checked against.
    pub bootstrap_tls: Option<crate::gateway::tls::PeerTlsFiles>,
    /// A plain `http://` `bootstrap_from` to a peer off this host is accepted (trusted network).
    pub bootstrap_allow_plain_http: bool,
    /// One snapshot pull is abandoned (a failed attempt) past this long.
    pub bootstrap_deadline_ms: u64,
    /// Bytes of records one snapshot pull takes at most; a peer sending more is refused.
    pub bootstrap_max_bytes: u64,
    /// Without a configured token, whether `Replica.Snapshot` is served to anyone (`"open"`)
    /// or refused (`"auth"`, the default). With a token it always needs the token.
    pub snapshot_export_open: bool,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            bootstrap_from: None,
            bootstrap_attempts: DEFAULT_BOOTSTRAP_ATTEMPTS,
            replica_id: None,
            bootstrap_tls: None,
            bootstrap_allow_plain_http: false,
            bootstrap_deadline_ms: DEFAULT_BOOTSTRAP_DEADLINE_MS,
            bootstrap_max_bytes: DEFAULT_BOOTSTRAP_MAX_BYTES,
            snapshot_export_open: false,
        }
    }
}

impl ReplicaConfig {
    /// Set key `key` from `value`; `None` when `key` is not a replica key. An error names the
    /// field (a nested one such as `bootstrap_tls.ca_file` where it is) and says why.
    pub fn set(&mut self, key: &str, value: &Value) -> Option<Result<(), (String, String)>> {
        let named = |message: String| (key.to_owned(), message);
        let set = match key {
            "bootstrap_from" => value
                .as_str()
                .filter(|s| s.starts_with("http://") || s.starts_with("https://"))
                .map(|text| self.bootstrap_from = Some(text.to_owned()))
                .ok_or_else(|| {
                    named(
                        "must be a peer's gRPC address, https://host:port or http://host:port"
                            .into(),
                    )
                }),
            "bootstrap_attempts" => value
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|&n| n <= MAX_BOOTSTRAP_ATTEMPTS)
                .map(|n| self.bootstrap_attempts = n)
                .ok_or_else(|| {
                    named(format!(
                        "must be an integer in 0..={MAX_BOOTSTRAP_ATTEMPTS} (0: attempt until one \
                         succeeds)"
                    ))
                }),
            "replica_id" => value
                .as_str()
                .filter(|s| !s.is_empty() && s.len() <= 256)
                .map(|text| self.replica_id = Some(text.to_owned()))
                .ok_or_else(|| named("must be a string of 1 to 256 bytes".into())),
            "bootstrap_tls" => crate::gateway::tls::PeerTlsFiles::parse(value)
                .map(|files| self.bootstrap_tls = Some(files)),
            "bootstrap_allow_plain_http" => value
                .as_bool()
                .map(|allow| self.bootstrap_allow_plain_http = allow)
                .ok_or_else(|| named("must be true or false".into())),
            "bootstrap_deadline_ms" => positive(value, u32::MAX as u64)
                .map(|ms| self.bootstrap_deadline_ms = ms)
                .map_err(named),
            "bootstrap_max_bytes" => positive(value, 1 << 44)
                .map(|bytes| self.bootstrap_max_bytes = bytes)
                .map_err(named),
            "snapshot_export" => match value.as_str() {
                Some(who @ ("auth" | "open")) => {
                    self.snapshot_export_open = who == "open";
                    Ok(())
                }
                _ => Err(named(
                    "must be \"auth\" (a token is needed) or \"open\" (anyone may take a \
                     snapshot when no token is configured)"
                        .into(),
                )),
            },
            _ => return None,
        };
        Some(set)
    }
}

/// An integer in 1..=`max` (the error says so); `config` reads its bounds with it too.
pub(crate) fn positive(value: &Value, max: u64) -> Result<u64, String> {
    match value.as_u64() {
        Some(n) if (1..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be an integer in 1..={max}")),
    }
}
