//! TLS on both servers (config `tls`), and the client side a replica uses towards its peer
//! (config `bootstrap_tls`). What TLS protects against, and what it does not, is in
//! `docs/security.md`.
//!
//! The certificate chain and key are read once at start, so a restart picks up renewed files.
//! With TLS configured, each port speaks only TLS: the accept loops hand raw TCP streams to the
//! workers as before, and on its worker every connection first runs [`ServerTls::handshake`] in
//! its own task (a slow or silent client holds up no other connection, and never the accept
//! loop), bounded by the handshake timeout. A client that does
//! not complete a handshake in time, or that speaks plain HTTP or gRPC, has its connection
//! closed and is counted in `conductor_tls_handshakes_failed_total`.
//!
//! ALPN: the gRPC port offers `h2` only; the HTTP port `http/1.1` only, the one protocol its
//! server speaks (a client that insists on `h2` there fails the handshake instead of failing
//! later on a protocol mismatch).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::gateway::connections::Watched;

/// A handshake must complete within this by default: a client on a slow link needs a few round
/// trips; a client that sends nothing holds a task and a socket until then.
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
const MAX_HANDSHAKE_TIMEOUT_MS: u64 = 600_000;

/// Config `tls`: the servers' certificate chain and key (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub handshake_timeout_ms: u64,
}

/// Config `bootstrap_tls`: how a replica checks its peer for an `https://` `bootstrap_from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTlsFiles {
    /// The CA (PEM) the peer's certificate must chain to.
    pub ca_file: PathBuf,
    /// The name the peer's certificate must carry; `None`: the host of `bootstrap_from`.
    pub domain: Option<String>,
}

/// An object of string fields, each checked by `accept`; errors name `prefix.key`.
fn parse_object(
    prefix: &str,
    value: &Value,
    mut accept: impl FnMut(&str, &Value) -> Result<(), String>,
) -> Result<(), (String, String)> {
    let Value::Object(fields) = value else {
        return Err((prefix.to_owned(), "must be an object".into()));
    };
    for (key, v) in fields {
        accept(key, v).map_err(|m| (format!("{prefix}.{key}"), m))?;
    }
    Ok(())
}

fn path(v: &Value) -> Result<PathBuf, String> {
    let text = v.as_str().filter(|s| !s.is_empty());
    Ok(PathBuf::from(text.ok_or("must be a non-empty file path")?))
}

impl ServerTlsFiles {
    /// Parse config `tls`; an error names the field (`tls.cert_file`, ...).
    pub fn parse(value: &Value) -> Result<ServerTlsFiles, (String, String)> {
        let (mut cert_file, mut key_file) = (None, None);
        let mut handshake_timeout_ms = DEFAULT_HANDSHAKE_TIMEOUT_MS;
        parse_object("tls", value, |key, v| {
            match key {
                "cert_file" => cert_file = Some(path(v)?),
                "key_file" => key_file = Some(path(v)?),
                "handshake_timeout_ms" => {
                    handshake_timeout_ms = v
                        .as_u64()
                        .filter(|n| (1..=MAX_HANDSHAKE_TIMEOUT_MS).contains(n))
                        .ok_or(format!(
                            "must be an integer in 1..={MAX_HANDSHAKE_TIMEOUT_MS}"
                        ))?
                }
                _ => return Err("unknown key".into()),
            }
            Ok(())
        })?;
        let missing = |k: &str| (format!("tls.{k}"), "is required".to_owned());
        Ok(ServerTlsFiles {
            cert_file: cert_file.ok_or_else(|| missing("cert_file"))?,
            key_file: key_file.ok_or_else(|| missing("key_file"))?,
            handshake_timeout_ms,
        })
    }
}

impl PeerTlsFiles {
    /// Parse config `bootstrap_tls`; an error names the field.
    pub fn parse(value: &Value) -> Result<PeerTlsFiles, (String, String)> {
        let (mut ca_file, mut domain) = (None, None);
        parse_object("bootstrap_tls", value, |key, v| {
            match key {
                "ca_file" => ca_file = Some(path(v)?),
                "domain" => {
                    let text = v.as_str().filter(|s| !s.is_empty());
                    domain = Some(text.ok_or("must be a non-empty host name")?.to_owned());
                }
                _ => return Err("unknown key".into()),
            }
            Ok(())
        })?;
        Ok(PeerTlsFiles {
            ca_file: ca_file
                .ok_or_else(|| ("bootstrap_tls.ca_file".into(), "is required".into()))?,
            domain,
        })
    }

    /// The tonic client settings, with the CA read now: a missing or unusable file is a
    /// start-up error naming `bootstrap_tls.ca_file`.
    pub fn client_config(&self) -> Result<tonic::transport::ClientTlsConfig, String> {
        let named = |e: String| format!("`bootstrap_tls.ca_file` {}: {e}", self.ca_file.display());
        let pem = std::fs::read(&self.ca_file).map_err(|e| named(e.to_string()))?;
        let certs = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| named(format!("not PEM: {e}")))?;
        let mut roots = rustls::RootCertStore::empty();
        for cert in certs {
            roots.add(cert).map_err(|e| named(e.to_string()))?;
        }
        if roots.is_empty() {
            return Err(named("holds no certificate".into()));
        }
        let mut config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(pem));
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        Ok(config)
    }
}

/// Which server a connection came to (the ALPN protocols and the counter's label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    Http,
    Grpc,
}

impl Port {
    const ALL: [Port; 2] = [Port::Http, Port::Grpc];

    fn as_str(self) -> &'static str {
        match self {
            Port::Http => "http",
            Port::Grpc => "grpc",
        }
    }

    fn alpn(self) -> Vec<Vec<u8>> {
        match self {
            Port::Http => vec![b"http/1.1".to_vec()],
            Port::Grpc => vec![b"h2".to_vec()],
        }
    }
}

/// Handshakes that did not complete, by port and reason.
#[derive(Debug, Default)]
pub struct HandshakeCounters {
    /// `[port][0: refused (not TLS, bad TLS, no common protocol), 1: timed out]`
    failed: [[AtomicU64; 2]; 2],
}

impl HandshakeCounters {
    fn count(&self, port: Port, timed_out: bool) {
        self.failed[port as usize][timed_out as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn failed(&self, port: Port, timed_out: bool) -> u64 {
        self.failed[port as usize][timed_out as usize].load(Ordering::Relaxed)
    }
}

impl crate::metrics::Section for HandshakeCounters {
    fn render(&self, w: &mut String) {
        use std::fmt::Write;
        let _ = writeln!(
            w,
            "# HELP conductor_tls_handshakes_failed_total Connections closed before their TLS \
             handshake completed (a plain client, a bad handshake, or none in time), by port and reason\n\
             # TYPE conductor_tls_handshakes_failed_total counter"
        );
        for port in Port::ALL {
            for (reason, timed_out) in [("refused", false), ("timeout", true)] {
                let _ = writeln!(
                    w,
                    "conductor_tls_handshakes_failed_total{{port=\"{}\",reason=\"{reason}\"}} {}",
                    port.as_str(),
                    self.failed(port, timed_out)
                );
            }
        }
    }
}

/// Both servers' TLS, loaded at start; cheap to clone (one per worker).
#[derive(Clone)]
pub struct ServerTls {
    http: TlsAcceptor,
    grpc: TlsAcceptor,
    timeout: Duration,
    pub counters: Arc<HandshakeCounters>,
}

impl ServerTls {
    /// Read the PEM files; an error names the config field and the file.
    pub fn load(files: &ServerTlsFiles) -> Result<ServerTls, String> {
        let certs = read_pem("tls.cert_file", &files.cert_file, |pem| {
            CertificateDer::pem_slice_iter(pem).collect::<Result<Vec<_>, _>>()
        })?;
        if certs.is_empty() {
            return Err(named(
                "tls.cert_file",
                &files.cert_file,
                "holds no certificate",
            ));
        }
        let key = read_pem(
            "tls.key_file",
            &files.key_file,
            PrivateKeyDer::from_pem_slice,
        )?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let acceptor = |port: Port| -> Result<TlsAcceptor, String> {
            let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_no_client_auth()
                .with_single_cert(certs.clone(), key.clone_key())
                // The key does not fit the certificate, or is of a kind rustls cannot use.
                .map_err(|e| named("tls.key_file", &files.key_file, &e.to_string()))?;
            config.alpn_protocols = port.alpn();
            Ok(TlsAcceptor::from(Arc::new(config)))
        };
        Ok(ServerTls {
            http: acceptor(Port::Http)?,
            grpc: acceptor(Port::Grpc)?,
            timeout: Duration::from_millis(files.handshake_timeout_ms),
            counters: Arc::default(),
        })
    }

    fn acceptor(&self, port: Port) -> &TlsAcceptor {
        match port {
            Port::Http => &self.http,
            Port::Grpc => &self.grpc,
        }
    }
}

/// Config `bootstrap_from` against `bootstrap_tls` and `bootstrap_allow_plain_http`: an error names
/// the field. The token a bootstrapping replica presents, and the snapshot, cross the network in
/// clear text over `http://`: accepted to a peer on this host, or with the explicit opt-in. See
/// docs/security.md.
pub fn check_bootstrap_transport(
    peer: Option<&str>,
    has_tls: bool,
    allow_plain_http: bool,
) -> Result<(), (&'static str, String)> {
    let https = peer.is_some_and(|p| p.starts_with("https://"));
    match (peer, has_tls) {
        (Some(_), false) if https => Err((
            "bootstrap_from",
            "https:// needs `bootstrap_tls` with the `ca_file` the peer's certificate chains to"
                .into(),
        )),
        (_, true) if !https => Err((
            "bootstrap_tls",
            "applies to an https:// `bootstrap_from` only".into(),
        )),
        (Some(peer), false) if !allow_plain_http && !is_loopback_url(peer) => Err((
            "bootstrap_from",
            format!(
                "{peer} is plain http:// to another host: the service token and the snapshot \
                     would cross the network in clear text; use https:// with `bootstrap_tls`, \
                     or set `bootstrap_allow_plain_http: true` on a network you trust"
            ),
        )),
        _ => Ok(()),
    }
}

/// The URL's host is `localhost` or a loopback address.
fn is_loopback_url(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap_or_default();
    let authority = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        authority
            .rsplit_once(':')
            .map_or(authority, |(host, _)| host)
    };
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn named(field: &str, file: &Path, message: &str) -> String {
    format!("config field `{field}` ({}): {message}", file.display())
}

fn read_pem<T, E: std::fmt::Display>(
    field: &str,
    file: &Path,
    parse: impl FnOnce(&[u8]) -> Result<T, E>,
) -> Result<T, String> {
    let pem = std::fs::read(file).map_err(|e| named(field, file, &e.to_string()))?;
    parse(&pem).map_err(|e| named(field, file, &format!("not usable PEM: {e}")))
}

impl ServerTls {
    /// Run `stream`'s handshake, bounded by the handshake timeout; `None` (counted) when it
    /// fails or does not complete in time.
    pub async fn handshake(
        &self,
        stream: Watched<TcpStream>,
        port: Port,
    ) -> Option<tokio_rustls::server::TlsStream<Watched<TcpStream>>> {
        let peer = stream.get_ref().peer_addr().ok();
        let handshake = self.acceptor(port).accept(stream);
        match tokio::time::timeout(self.timeout, handshake).await {
            Ok(Ok(stream)) => Some(stream),
            Ok(Err(e)) => {
                // Debug level: each one is counted, and a plain client retrying in a loop must
                // not flood the log.
                tracing::debug!(?peer, port = port.as_str(), "TLS handshake failed: {e}");
                self.counters.count(port, false);
                None
            }
            Err(_) => {
                tracing::debug!(?peer, port = port.as_str(), "TLS handshake timed out");
                self.counters.count(port, true);
                None
            }
        }
    }
}
