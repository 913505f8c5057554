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
        let dir = tempfile::tempdir().expect("temp dir");
        let (http_port, rpc_port) = (free_port(), free_port());
        let text = serde_json::json!({
            "http_server_port": http_port, "rpc_server_port": rpc_port,
            "bind_address": "127.0.0.1", "data_dir": dir.path().join("data"),
            // Without RocksDB checkpoints go to an in-memory store; its cost is part of ingest.
            "checkpoint_interval_ms": opt("checkpoint-ms", 1000u64),
        });
        let config = Config::parse(&text.to_string(), "load bench").expect("config");
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let thread = std::thread::spawn(move || run_service(config, token, None));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut c) = HttpConn::connect(http_port).await
                && c.call("GET", "/health", "", b"")
                    .await
                    .is_ok_and(|r| r.0 == 200)
            {
                let _dir = dir;
                return InProcess {
                    http_port,
                    rpc_port,
                    shutdown,
                    thread,
                    _dir,
                };
            }
            assert!(Instant::now() < deadline, "service not ready in 30 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
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
