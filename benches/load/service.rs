//! The service: in-process on its own thread and runtime, a child process of a built binary
//! (`--binary`, e.g. a release build with RocksDB), or alone for `serve`.

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
        let (dir, http_port, rpc_port, text) = service_config(extra);
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

    /// Wait until `/health` answers 200, at most 60 s.
    pub(crate) async fn wait_ready(&self) {
        wait_ready(self.http_port).await
    }

    pub(crate) fn stop(self) {
        self.shutdown.cancel();
        let _ = self.thread.join();
    }
}

/// A service's temp directory, its two loopback ports, and its configuration: the bench's
/// defaults with `extra`'s keys over them. Without RocksDB checkpoints go to an in-memory store;
/// its cost is part of ingest.
fn service_config(extra: serde_json::Value) -> (tempfile::TempDir, u16, u16, serde_json::Value) {
    let dir = tempfile::tempdir().expect("temp dir");
    let (http_port, rpc_port) = (free_port(), free_port());
    let mut text = serde_json::json!({
        "http_server_port": http_port, "rpc_server_port": rpc_port,
        "bind_address": "127.0.0.1", "data_dir": dir.path().join("data"),
        "checkpoint_interval_ms": opt("checkpoint-ms", 1000u64),
    });
    if let (Some(base), Some(extra)) = (text.as_object_mut(), extra.as_object()) {
        base.extend(extra.clone());
    }
    (dir, http_port, rpc_port, text)
}

/// The real binary as a child process, configured through a file in its temp directory; its log
/// goes to a file there, of which [`Spawned::stop`] prints the bootstrap's lines.
pub(crate) struct Spawned {
    pub(crate) http_port: u16,
    pub(crate) rpc_port: u16,
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl Spawned {
    /// Start `binary` with extra configuration keys, without waiting for it.
    pub(crate) fn spawn(binary: &str, extra: serde_json::Value) -> Spawned {
        let (dir, http_port, rpc_port, text) = service_config(extra);
        let config = dir.path().join("config.json");
        std::fs::write(&config, text.to_string()).expect("write the config");
        let log = std::fs::File::create(dir.path().join("log")).expect("log file");
        let child = std::process::Command::new(binary)
            .env(mooncake_conductor::config::CONFIG_PATH_ENV, &config)
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {binary}: {e}"));
        Spawned {
            http_port,
            rpc_port,
            child,
            dir,
        }
    }

    /// Stop it (SIGTERM, then SIGKILL after 10 s) and print its log's snapshot lines.
    pub(crate) fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default();
        for line in log.lines().filter(|l| l.contains("snapshot")) {
            eprintln!("  {line}");
        }
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        // A panicking bench must not leave a server behind.
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The service under test, in this process or a child process.
pub(crate) enum Node {
    InProcess(InProcess),
    Spawned(Spawned),
}

impl Node {
    /// In this process, or as a child of `binary` when one is given; not waited for.
    pub(crate) fn spawn(binary: Option<&str>, extra: serde_json::Value) -> Node {
        match binary {
            Some(binary) => Node::Spawned(Spawned::spawn(binary, extra)),
            None => Node::InProcess(InProcess::spawn(extra)),
        }
    }

    pub(crate) fn http_port(&self) -> u16 {
        match self {
            Node::InProcess(s) => s.http_port,
            Node::Spawned(s) => s.http_port,
        }
    }

    pub(crate) fn rpc_port(&self) -> u16 {
        match self {
            Node::InProcess(s) => s.rpc_port,
            Node::Spawned(s) => s.rpc_port,
        }
    }

    pub(crate) async fn health(&self) -> Option<(u16, String)> {
        health(self.http_port()).await
    }

    pub(crate) async fn wait_ready(&self) {
        wait_ready(self.http_port()).await
    }

    pub(crate) fn stop(self) {
        match self {
            Node::InProcess(s) => s.stop(),
            Node::Spawned(s) => s.stop(),
        }
    }
}

/// `/health` on `port`: its status and body, once the server answers.
async fn health(port: u16) -> Option<(u16, String)> {
    let mut c = HttpConn::connect(port).await.ok()?;
    let (code, body) = c.call("GET", "/health", "", b"").await.ok()?;
    Some((code, String::from_utf8_lossy(&body).into_owned()))
}

/// Wait until `/health` on `port` answers 200, at most 60 s.
async fn wait_ready(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while health(port).await.is_none_or(|(code, _)| code != 200) {
        assert!(Instant::now() < deadline, "service not ready in 60 s");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

pub(crate) fn serve() {
    let (config, origin) = Config::load().unwrap_or_else(|e| panic!("{e}"));
    let limit = Duration::from_secs(opt("serve-secs", 600));
    eprintln!("serving ({origin}) for at most {limit:?}");
    run_service(config, CancellationToken::new(), Some(limit));
}
