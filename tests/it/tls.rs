//! TLS on both servers and on a replica's bootstrap: with `tls` configured, a client that trusts
//! the CA registers and queries over gRPC and HTTPS, and a plain client is refused on both ports
//! (and counted); a bad certificate file, or a plain `http://` bootstrap to another host, stops
//! the start with an error naming the key; a replica bootstraps from a TLS peer over `https://`;
//! clients that never finish a handshake hold no descriptors beyond `max_connections`.
//! The certificates are made at test time with the `openssl` command.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use mooncake_conductor::gateway::pb;
use mooncake_conductor::gateway::pb::conductor_client::ConductorClient;
use serde_json::json;

use crate::support::engine::Registration;
use crate::support::flood::{idle_flood, open_descriptors};
use crate::support::grpc::register_request;
use crate::support::player::Player;
use crate::support::server::Server;
use crate::support::tls::{Certs, grpc_channel, https_request, make_certs};
use crate::support::tool::Tool;
use crate::support::{WAIT, eventually, http};

/// Start a TLS server (with `extra` config keys) and wait until `/health` answers 200 over HTTPS.
async fn start_tls(certs: &Certs, extra: serde_json::Value) -> Server {
    let mut config = json!({"tls": {"cert_file": certs.cert, "key_file": certs.key}});
    for (k, v) in extra.as_object().expect("object") {
        config[k] = v.clone();
    }
    let server = Server::spawn_in(tempfile::tempdir().expect("temp dir"), config);
    eventually("the TLS server is ready over HTTPS", WAIT, || async {
        let r = https_request(&certs.ca, server.http_port, "GET", "/health", b"").await;
        r.ok().filter(|r| r.status == 200).map(|_| ())
    })
    .await;
    server
}

/// The value of the `/metrics` line that starts with `line_start`, read over HTTPS.
async fn tls_metric(ca: &Path, server: &Server, line_start: &str) -> u64 {
    let text = https_request(ca, server.http_port, "GET", "/metrics", b"")
        .await
        .expect("/metrics over HTTPS")
        .text();
    text.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in:\n{text}"))
}

fn query() -> pb::QueryRequest {
    pb::QueryRequest {
        model_name: "m".into(),
        block_size: 4,
        token_ids: (1..9).collect(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_ports_speak_tls_only_and_refuse_plain_clients() {
    let certs_dir = tempfile::tempdir().expect("temp dir");
    let certs = make_certs(certs_dir.path());
    let server = start_tls(&certs, json!({})).await;
    let player = Player::start(false, 0).await;
    let registration = Registration::vllm("tls-0", &player.endpoint).json();

    // gRPC over TLS: register and query.
    let channel = grpc_channel(&certs.ca, server.rpc_port)
        .await
        .expect("TLS channel");
    let mut client = ConductorClient::new(channel);
    let reply = client
        .register(register_request(&registration))
        .await
        .expect("register over TLS")
        .into_inner();
    assert_eq!(reply.ret, 0, "{:?}", reply.error);
    client.query(query()).await.expect("query over TLS");

    // HTTPS: the registration is listed, and a query answers.
    let status = https_request(&certs.ca, server.http_port, "GET", "/services/status", b"")
        .await
        .expect("status over HTTPS");
    assert_eq!(status.status, 200, "{}", status.text());
    assert!(status.text().contains("tls-0"), "{}", status.text());
    let body = json!({"model": "m", "block_size": 4, "token_ids": (1..9).collect::<Vec<i32>>()});
    let body = serde_json::to_vec(&body).expect("JSON");
    let answer = https_request(&certs.ca, server.http_port, "POST", "/query", &body)
        .await
        .expect("query over HTTPS");
    assert_eq!(answer.status, 200, "{}", answer.text());

    // Plain clients get no answer on either port.
    let plain_http = http::try_request(server.http_port, "GET", "/health", &[], b"").await;
    assert!(plain_http.is_err(), "plain HTTP answered: {plain_http:?}");
    let plain_grpc = async {
        let mut plain = ConductorClient::connect(format!("http://127.0.0.1:{}", server.rpc_port))
            .await
            .map_err(|e| e.to_string())?;
        plain.query(query()).await.map_err(|e| e.to_string())
    };
    let plain_grpc = tokio::time::timeout(Duration::from_secs(20), plain_grpc)
        .await
        .expect("the plain gRPC client is refused, not left waiting");
    assert!(plain_grpc.is_err(), "plain gRPC answered: {plain_grpc:?}");
    for port in ["http", "grpc"] {
        let line =
            format!("conductor_tls_handshakes_failed_total{{port=\"{port}\",reason=\"refused\"}}");
        eventually(
            &format!("the plain {port} client is counted"),
            WAIT,
            || async { (tls_metric(&certs.ca, &server, &line).await >= 1).then_some(()) },
        )
        .await;
    }
    // The TLS clients still work after the refusals.
    client.query(query()).await.expect("query over TLS");
}

/// Run the binary on `config` (merged into a loopback config) and wait for it to exit: its
/// stderr, which must say why.
fn start_fails(extra: serde_json::Value) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut config = json!({
        "http_server_port": 0, "rpc_server_port": 0, "bind_address": "127.0.0.1",
        "data_dir": dir.path().join("data"),
    });
    for (k, v) in extra.as_object().expect("object") {
        config[k] = v.clone();
    }
    let path = dir.path().join("conductor.json");
    std::fs::write(&path, config.to_string()).expect("write config");
    let child = Command::new(env!("CARGO_BIN_EXE_mooncake_conductor"))
        .env("CONDUCTOR_CONFIG_PATH", &path)
        .env_remove("CONDUCTOR_AUTH_TOKEN")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let what = format!("the service started with {config}");
    let out = Tool::from_child(child, &what).finish_blocking(Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "started anyway:\n{stderr}");
    stderr
}

#[test]
fn a_bad_tls_file_or_a_plain_bootstrap_to_another_host_stops_the_start() {
    let certs_dir = tempfile::tempdir().expect("temp dir");
    let certs = make_certs(certs_dir.path());
    let missing = certs_dir.path().join("missing.pem");
    let err = start_fails(json!({"tls": {"cert_file": missing, "key_file": certs.key}}));
    assert!(
        err.contains("tls.cert_file") && err.contains("missing.pem"),
        "{err}"
    );
    // The CA's key does not belong to the server's certificate.
    let err = start_fails(
        json!({"tls": {"cert_file": certs.cert, "key_file": certs_dir.path().join("ca.key")}}),
    );
    assert!(err.contains("tls.key_file"), "{err}");
    let err = start_fails(json!({"bootstrap_from": "http://10.0.0.5:50052"}));
    assert!(
        err.contains("bootstrap_from") && err.contains("bootstrap_allow_plain_http"),
        "{err}"
    );
    let err = start_fails(json!({"bootstrap_from": "https://127.0.0.1:1",
        "bootstrap_tls": {"ca_file": missing}}));
    assert!(err.contains("bootstrap_tls.ca_file"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_bootstraps_from_a_tls_peer_over_https() {
    let certs_dir = tempfile::tempdir().expect("temp dir");
    let certs = make_certs(certs_dir.path());
    // No token here: the peer's snapshot export is opened explicitly.
    let a = start_tls(&certs, json!({"snapshot_export": "open"})).await;
    let player = Player::start(false, 0).await;
    let registration = Registration::vllm("boot-0", &player.endpoint).json();
    let channel = grpc_channel(&certs.ca, a.rpc_port)
        .await
        .expect("TLS channel");
    let reply = ConductorClient::new(channel)
        .register(register_request(&registration))
        .await
        .expect("register over TLS")
        .into_inner();
    assert_eq!(reply.ret, 0, "{:?}", reply.error);

    // The replica reports ready only once its subscription is live again, which takes a
    // publisher that sends: this one does not, so the test waits for the bootstrap itself.
    let b = Server::spawn_in(
        tempfile::tempdir().expect("temp dir"),
        json!({
            "bootstrap_from": format!("https://127.0.0.1:{}", a.rpc_port),
            "bootstrap_tls": {"ca_file": certs.ca},
            "bootstrap_attempts": 1,
        }),
    );
    eventually("the replica bootstraps over https", WAIT, || async {
        b.log()
            .contains("bootstrapped from a peer's snapshot")
            .then_some(())
    })
    .await;
    assert_ne!(
        b.service_status("boot-0|default|0").await,
        serde_json::Value::Null,
        "{}",
        b.log()
    );
}

/// Descriptors the service may hold beyond `max_connections` and those it holds without clients:
/// up to 8 connections closed to make room whose worker has not yet dropped them, one socket in
/// each accept loop, and slack for the service's own files (`docs/connections.md`).
const DESCRIPTOR_MARGIN: usize = 16;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_handshakes_keep_descriptors_within_the_cap_and_health_answers() {
    let certs_dir = tempfile::tempdir().expect("temp dir");
    let certs = make_certs(certs_dir.path());
    let server = start_tls(&certs, json!({"max_connections": 32})).await;
    let pid = server.pid();
    let allowed = open_descriptors(pid) + 32 + DESCRIPTOR_MARGIN;
    let ports = [server.http_port, server.rpc_port];
    // Connections that never send a byte: each waits for a handshake that never comes.
    let flood =
        tokio::spawn(async move { idle_flood(&ports, 1_000, Duration::from_secs(3), 512).await });
    let (done, most) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let sampler = tokio::spawn({
        let (done, most) = (done.clone(), most.clone());
        async move {
            while !done.load(Ordering::Relaxed) {
                most.fetch_max(open_descriptors(pid), Ordering::Relaxed);
                // The sampling's pacing.
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    });
    let (mut probes, mut answered) = (0u32, 0u32);
    while !flood.is_finished() {
        let probe = https_request(&certs.ca, server.http_port, "GET", "/health", b"");
        // A bound on a probe that is never answered, not a latency requirement.
        let ok = matches!(
            tokio::time::timeout(Duration::from_secs(5), probe).await,
            Ok(Ok(r)) if r.status == 200
        );
        probes += 1;
        answered += u32::from(ok);
    }
    let flooded = flood.await.expect("flood task");
    done.store(true, Ordering::Relaxed);
    sampler.await.expect("sampler");
    let most = most.load(Ordering::Relaxed);
    assert!(
        most <= allowed,
        "{most} descriptors open during {flooded:?}, more than {allowed}"
    );
    assert!(
        f64::from(answered) >= 0.8 * f64::from(probes),
        "/health over TLS answered {answered} of {probes} probes during {flooded:?}:\n{}",
        server.log()
    );
}
