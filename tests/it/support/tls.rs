//! TLS for the tests: a CA and a server certificate for `localhost` and 127.0.0.1, made at test
//! time with the `openssl` command, and clients that trust that CA.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

/// The files of a CA and of a server certificate it signed.
pub struct Certs {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (the TLS tests make their certificates with it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A new CA and a server certificate for `localhost` and 127.0.0.1, written into `dir`.
pub fn make_certs(dir: &Path) -> Certs {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=test-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign",
    ]);
    openssl(dir, &ca);
    let mut csr = vec!["req", "-new"];
    csr.extend(ec);
    csr.extend([
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(dir, &csr);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write ext.cnf");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ],
    );
    Certs {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    }
}

/// A TLS connector that trusts only `ca`, offering `alpn`.
pub fn connector(ca: &Path, alpn: &[&[u8]]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("read CA") {
        roots.add(cert.expect("CA PEM")).expect("add CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// One HTTPS request to 127.0.0.1:`port`, checked against `ca` as `localhost`.
pub async fn https_request(
    ca: &Path,
    port: u16,
    method: &str,
    path: &str,
    body: &[u8],
) -> std::io::Result<super::http::HttpResponse> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let name = ServerName::try_from("localhost").expect("name");
    let stream = connector(ca, &[b"http/1.1".as_slice()])
        .connect(name, tcp)
        .await?;
    super::http::request_over(
        stream,
        method,
        path,
        &[("Content-Type", "application/json")],
        body,
    )
    .await
}

/// A gRPC channel to 127.0.0.1:`port` over TLS, checked against `ca` as `localhost`.
pub async fn grpc_channel(
    ca: &Path,
    port: u16,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    let pem = std::fs::read(ca).expect("read CA");
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(pem))
        .domain_name("localhost");
    tonic::transport::Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .expect("endpoint")
        .tls_config(tls)?
        .connect()
        .await
}
