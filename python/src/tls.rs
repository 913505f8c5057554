//! TLS towards a service started with `tls`: on when `CONDUCTOR_TLS_CA` names a CA (PEM), since
//! `setup()` takes only `host:port`. The certificate must chain to that CA and carry the name in
//! `CONDUCTOR_TLS_DOMAIN`, else the host of the address. ALPN offers `h2`, as gRPC needs.

use std::sync::Arc;

use tokio_rustls::TlsConnector;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::pki_types::pem::PemObject;

pub(crate) const TLS_CA_ENV: &str = "CONDUCTOR_TLS_CA";
pub(crate) const TLS_DOMAIN_ENV: &str = "CONDUCTOR_TLS_DOMAIN";

/// What a connection needs for its handshake.
#[derive(Clone)]
pub(crate) struct ClientTls {
    pub connector: TlsConnector,
    pub name: ServerName<'static>,
}

/// From the environment: `Ok(None)` when `CONDUCTOR_TLS_CA` is unset or empty; `Err` when the CA
/// cannot be read or holds no certificate, or the name is not a host name or address.
pub(crate) fn from_env(host: &str) -> Result<Option<ClientTls>, String> {
    let Some(ca) = std::env::var_os(TLS_CA_ENV).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let mut roots = rustls::RootCertStore::empty();
    let certs = rustls::pki_types::CertificateDer::pem_file_iter(&ca)
        .map_err(|e| format!("{TLS_CA_ENV}: {e}"))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("{TLS_CA_ENV}: {e}"))?;
        roots.add(cert).map_err(|e| format!("{TLS_CA_ENV}: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("{TLS_CA_ENV}: no certificate"));
    }
    let domain = std::env::var(TLS_DOMAIN_ENV).ok().filter(|d| !d.is_empty());
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(domain.as_deref().unwrap_or(host).to_owned())
        .map_err(|e| format!("{TLS_DOMAIN_ENV}: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Some(ClientTls {
        connector: TlsConnector::from(Arc::new(config)),
        name,
    }))
}
