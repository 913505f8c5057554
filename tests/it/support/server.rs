//! The real `mooncake_conductor` binary on free loopback ports with a temp config.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mooncake_conductor::gateway::pb::conductor_client::ConductorClient;
use tonic::transport::Channel;

use super::{until, until_blocking};

/// The ports a service started with port 0 bound, from its log line "sockets bound: http ADDR
/// grpc ADDR" (logged before recovery); panics with the log if it exits first or takes 30 s.
fn bound_ports(log: &std::path::Path, child: &mut Child) -> (u16, u16) {
    until_blocking(Duration::from_secs(30), || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        // Whole lines only: the last one may still be being written.
        let whole = text.split_inclusive('\n').filter(|l| l.ends_with('\n'));
        if let Some(ports) = whole.map(str::trim_end).find_map(parse_bound) {
            return Ok(ports);
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("server exited before binding its ports, with {status}:\n{text}");
        }
        Err(format!("waiting for the server to bind its ports:\n{text}"))
    })
}

fn parse_bound(line: &str) -> Option<(u16, u16)> {
    let rest = &line[line.find("sockets bound: http ")? + "sockets bound: http ".len()..];
    let mut words = rest.split_whitespace();
    let port = |addr: &str| addr.rsplit(':').next()?.parse::<u16>().ok();
    let http = port(words.next()?)?;
    (words.next()? == "grpc").then_some(())?;
    let rpc = port(words.next()?)?;
    Some((http, rpc))
}

pub struct Server {
    pub http_port: u16,
    pub rpc_port: u16,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Server {
    /// Start with an empty service list.
    pub async fn start() -> Server {
        Server::start_with(serde_json::json!({})).await
    }

    /// Start with extra config keys (e.g. `kvevent_instance`) merged into the temp config.
    pub async fn start_with(extra: serde_json::Value) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        Server::start_in(dir, extra).await
    }

    /// Start in an existing data directory (restart tests).
    pub async fn start_in(dir: tempfile::TempDir, extra: serde_json::Value) -> Server {
        Server::start_in_env::<&str>(dir, extra, &[]).await
    }

    /// Like [`Server::start_in`], with extra environment variables for the service.
    pub async fn start_in_with_env(
        dir: tempfile::TempDir,
        extra: serde_json::Value,
        env: &[(&str, &std::path::Path)],
    ) -> Server {
        Server::start_in_env(dir, extra, env).await
    }

    /// Start with extra config keys and environment variables (the token variable is only ever
    /// set from `env`, never inherited from the test runner).
    pub async fn start_with_env(extra: serde_json::Value, env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        Server::start_in_env(dir, extra, env).await
    }

    async fn start_in_env<V: AsRef<std::ffi::OsStr> + Copy>(
        dir: tempfile::TempDir,
        extra: serde_json::Value,
        env: &[(&str, V)],
    ) -> Server {
        let mut server = Server::spawn_in_env(dir, extra, env);
        server.wait_ready().await;
        server
    }

    /// Start with extra config keys and `RLIMIT_NOFILE` set to `nofile` (soft and hard), as a
    /// service manager may start it.
    pub async fn start_with_nofile(extra: serde_json::Value, nofile: u64) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = Server::spawn_with::<&str>(dir, extra, &[], Some(nofile));
        server.wait_ready().await;
        server
    }

    /// Start in an existing data directory without waiting until it is ready (tests of what it
    /// reports while starting).
    pub fn spawn_in(dir: tempfile::TempDir, extra: serde_json::Value) -> Server {
        Server::spawn_in_env::<&str>(dir, extra, &[])
    }

    /// [`Server::spawn_in`] with extra environment variables (a failpoint, say).
    pub fn spawn_in_with_env(
        dir: tempfile::TempDir,
        extra: serde_json::Value,
        env: &[(&str, &str)],
    ) -> Server {
        Server::spawn_in_env(dir, extra, env)
    }

    /// The process has exited (a failpoint killed it, say).
    pub fn exited(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => !matches!(child.try_wait(), Ok(None)),
            None => true,
        }
    }

    /// Wait until `/health` answers 200 (`true`) or the process exits (`false`), at most 30 s.
    pub async fn ready_or_exited(&mut self) -> bool {
        until(Duration::from_secs(30), async || {
            if self.exited() {
                return Ok(false);
            }
            let r = super::http::try_request(self.http_port, "GET", "/health", &[], b"");
            if let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(1), r).await
                && resp.status == 200
            {
                return Ok(true);
            }
            Err(format!(
                "waiting for the server to be ready or exit:\n{}",
                self.log()
            ))
        })
        .await
    }

    fn spawn_in_env<V: AsRef<std::ffi::OsStr> + Copy>(
        dir: tempfile::TempDir,
        extra: serde_json::Value,
        env: &[(&str, V)],
    ) -> Server {
        Server::spawn_with(dir, extra, env, None)
    }

    fn spawn_with<V: AsRef<std::ffi::OsStr> + Copy>(
        dir: tempfile::TempDir,
        extra: serde_json::Value,
        env: &[(&str, V)],
        nofile: Option<u64>,
    ) -> Server {
        // Port 0: the service binds free ports itself and logs them (`bound_ports`). Choosing
        // free ports here and handing them over left a moment in which another process could
        // take one, and the service then failed to start.
        let mut config = serde_json::json!({
            "http_server_port": 0,
            "rpc_server_port": 0,
            "bind_address": "127.0.0.1",
            "kvevent_instance": {},
            "data_dir": dir.path().join("data"),
            // The tests' engines serve on loopback; the default refusal has its own test.
            "allow_local_engine_addresses": true,
        });
        if let (Some(base), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
            for (k, v) in extra {
                base.insert(k.clone(), v.clone());
            }
        }
        let config_path = dir.path().join("conductor.json");
        std::fs::write(
            &config_path,
            serde_json::to_vec_pretty(&config).expect("config"),
        )
        .expect("write config");
        let log_path = dir.path().join("server.log");
        let log = std::fs::File::create(&log_path).expect("log file");
        let binary = env!("CARGO_BIN_EXE_mooncake_conductor");
        // `prlimit` sets the limit and then becomes the service (same process id).
        let mut command = match nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg(binary);
                c
            }
            None => Command::new(binary),
        };
        let mut child = command
            .env("CONDUCTOR_CONFIG_PATH", &config_path)
            .env("CONDUCTOR_LOG_LEVEL", "debug")
            .env_remove("CONDUCTOR_AUTH_TOKEN")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn mooncake_conductor");
        let configured = |key: &str| config.get(key).and_then(|v| v.as_u64()).unwrap_or(0);
        let (http_port, rpc_port) = match (
            configured("http_server_port"),
            configured("rpc_server_port"),
        ) {
            (0, 0) => bound_ports(&log_path, &mut child),
            (http, rpc) => (http as u16, rpc as u16),
        };
        Server {
            http_port,
            rpc_port,
            dir,
            child: Some(child),
        }
    }

    /// Wait until `/health` answers 200, at most 30 s.
    pub async fn wait_ready(&mut self) {
        until(Duration::from_secs(30), async || {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("server exited early with {status}:\n{}", self.log());
            }
            let r = super::http::try_request(self.http_port, "GET", "/health", &[], b"");
            let health = match tokio::time::timeout(Duration::from_secs(1), r).await {
                Ok(Ok(resp)) if resp.status == 200 => return Ok(()),
                Ok(Ok(resp)) => format!("{} {}", resp.status, resp.text()),
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no answer within 1 s".to_owned(),
            };
            Err(format!(
                "waiting for the server to be ready (/health: {health}):\n{}",
                self.log()
            ))
        })
        .await;
    }

    /// The running service's process id (for `/proc/<pid>/…`).
    /// The `/services/status` row of `service`, or `null` while the server does not list it.
    pub async fn service_status(&self, service: &str) -> serde_json::Value {
        let s = super::http::get(self.http_port, "/services/status")
            .await
            .json();
        s["services"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["service"] == service).cloned())
            .unwrap_or(serde_json::Value::Null)
    }

    /// `POST /unregister` of `instance`, rank 0, without credentials.
    pub async fn http_unregister(&self, instance: &str) -> super::http::HttpResponse {
        let body = serde_json::json!({"instance_id": instance, "dp_rank": 0});
        super::http::post_json(self.http_port, "/unregister", &body).await
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    pub async fn grpc(&self) -> ConductorClient<Channel> {
        ConductorClient::connect(format!("http://127.0.0.1:{}", self.rpc_port))
            .await
            .expect("gRPC connect")
    }

    /// Run the binary's offline command `args` on this server's config and data directory.
    pub fn offline(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_mooncake_conductor"))
            .args(args)
            .env(
                "CONDUCTOR_CONFIG_PATH",
                self.dir.path().join("conductor.json"),
            )
            .output()
            .expect("run mooncake_conductor")
    }

    /// SIGTERM and wait; returns the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        signal(&child, "TERM");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Give the data directory back for a restart.
    pub fn into_dir(mut self) -> tempfile::TempDir {
        self.kill();
        let dir = tempfile::tempdir().expect("temp dir");
        std::mem::replace(&mut self.dir, dir)
    }
}

fn signal(child: &Child, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status();
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}
