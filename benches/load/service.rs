//! The service: in-process on its own thread and runtime, or alone for `serve`.

use std::time::{Duration, Instant};

use mooncake_conductor::config::Config;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

use crate::client::HttpConn;
use crate::opt;

/// Run the service as `run_until_signal` does, until `shutdown` is cancelled or, with a `limit`,
/// also until SIGINT, SIGTERM or the limit (so a forgotten server still stops by itself).
fn run_service(config: Config, shutdown: CancellationToken, limit: Option<Duration>) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    let system = actix_rt::System::with_tokio_rt(move || runtime.expect("service runtime"));
    let result = system.block_on(async move {
        if let Some(limit) = limit {
            let (stop, mut term) = (
                shutdown.clone(),
                signal(SignalKind::terminate()).expect("SIGTERM"),
            );
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                    _ = tokio::time::sleep(limit) => {}
                }
                stop.cancel();
            });
        }
        mooncake_conductor::service::run(config, shutdown).await
    });
    result.unwrap_or_else(|e| panic!("service failed: {e}"));
}

pub(crate) struct InProcess {
    pub(crate) http_port: u16,
    pub(crate) rpc_port: u16,
    shutdown: CancellationToken,
    thread: std::thread::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

impl InProcess {
    pub(crate) async fn start() -> InProcess {
        InProcess::start_with(serde_json::json!({})).await
    }

    /// Start with extra configuration keys; returns once `/health` says ready.
    pub(crate) async fn start_with(extra: serde_json::Value) -> InProcess {
        let service = InProcess::spawn(extra);
        service.wait_ready().await;
        service
    }

    /// Start with extra configuration keys, without waiting for it.
    pub(crate) fn spawn(extra: serde_json::Value) -> InProcess {
        let dir = tempfile::tempdir().expect("temp dir");
        let (http_port, rpc_port) = (free_port(), free_port());
        let mut text = serde_json::json!({
            "http_server_port": http_port, "rpc_server_port": rpc_port,
            "bind_address": "127.0.0.1", "data_dir": dir.path().join("data"),
            // Without RocksDB checkpoints go to an in-memory store; its cost is part of ingest.
            "checkpoint_interval_ms": opt("checkpoint-ms", 1000u64),
        });
        if let (Some(base), Some(extra)) = (text.as_object_mut(), extra.as_object()) {
            base.extend(extra.clone());
        }
        let config = Config::parse(&text.to_string(), "load bench").expect("config");
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let thread = std::thread::spawn(move || run_service(config, token, None));
        InProcess {
            http_port,
            rpc_port,
            shutdown,
            thread,
            _dir: dir,
        }
    }

    /// `/health`: its status and body, once the server answers.
    pub(crate) async fn health(&self) -> Option<(u16, String)> {
        let mut c = HttpConn::connect(self.http_port).await.ok()?;
        let (code, body) = c.call("GET", "/health", "", b"").await.ok()?;
        Some((code, String::from_utf8_lossy(&body).into_owned()))
    }

    /// Wait until `/health` answers 200, at most 60 s.
    pub(crate) async fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.health().await.is_none_or(|(code, _)| code != 200) {
            assert!(Instant::now() < deadline, "service not ready in 60 s");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub(crate) fn stop(self) {
        self.shutdown.cancel();
        let _ = self.thread.join();
    }
}

pub(crate) fn serve() {
    let (config, origin) = Config::load().unwrap_or_else(|e| panic!("{e}"));
    let limit = Duration::from_secs(opt("serve-secs", 600));
    eprintln!("serving ({origin}) for at most {limit:?}");
    run_service(config, CancellationToken::new(), Some(limit));
}
